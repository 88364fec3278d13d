"""Normalising PVE config values: what counts as "no change" for the idempotent diff."""
import pytest

from ansible.module_utils.pve_api import normalise_value, parse_property_string, values_match


@pytest.mark.parametrize('key, wanted, current', [
    ('mp1', '/srv/sglang-cache,backup=0,mp=/var/cache/sglang', '/srv/sglang-cache,backup=0,mp=/var/cache/sglang'),
    ('mp1', '/srv/sglang-cache,backup=0,mp=/var/cache/sglang', 'volume=/srv/sglang-cache,mp=/var/cache/sglang,backup=0'),
    ('dev0', '/dev/nvidia0,mode=0666', 'path=/dev/nvidia0,mode=666'),
    ('memory', '4096', 4096),
    ('onboot', '1', True),
    ('tags', 'glm5-managed;prod', 'prod;glm5-managed'),
    ('net0', 'name=eth0,bridge=vmbr0,ip=dhcp', 'bridge=vmbr0,hwaddr=BC:24:11:00:00:01,ip=dhcp,name=eth0,type=veth'),
    ('features', 'nesting=1', 'nesting=true'),
])
def test_same_value_in_another_spelling_matches(key, wanted, current):
    assert values_match(key, wanted, current)


@pytest.mark.parametrize('key, wanted, current', [
    ('mp1', '/srv/a,mp=/x', '/srv/b,mp=/x'),
    ('mp0', '/srv/a,mp=/x,ro=1', '/srv/a,mp=/x'),
    ('dev0', '/dev/nvidia0,mode=0666', '/dev/nvidia1,mode=0666'),
    ('dev0', '/dev/nvidia0,mode=0666', '/dev/nvidia0'),
    ('net0', 'name=eth0,bridge=vmbr1', 'name=eth0,bridge=vmbr0,hwaddr=x'),
    ('memory', '8192', '4096'),
    ('hostname', 'glm5', None),
])
def test_real_differences_do_not_match(key, wanted, current):
    assert not values_match(key, wanted, current)


def test_malformed_property_string_is_an_error():
    with pytest.raises(ValueError):
        parse_property_string('/dev/x,,mode=1', 'path')
    with pytest.raises(ValueError):
        parse_property_string('mode=1,/dev/x', 'path')


def test_normalised_form_is_sorted_with_default_key_first():
    assert normalise_value('mp0', 'mp=/models,volume=/srv/m,backup=0') == '/srv/m,backup=0,mp=/models'
