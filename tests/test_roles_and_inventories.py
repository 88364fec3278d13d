"""Contracts that keep the roles and inventories honest: documented defaults, parseable inventories."""
import glob
import json
import os
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, 'roles', '*')))
BIN = os.path.dirname(sys.executable)


def load(path):
    with open(os.path.join(ROOT, path)) as fh:
        return yaml.safe_load(fh) or {}


@pytest.mark.parametrize('role', ROLES)
def test_every_default_is_in_the_argument_spec_and_back(role):
    defaults = load('roles/{0}/defaults/main.yml'.format(role))
    options = load('roles/{0}/meta/argument_specs.yml'.format(role))['argument_specs']['main']['options']
    assert sorted(defaults) == sorted(options)
    for name, spec in options.items():
        assert spec.get('description') and spec['description'] != name, '{0} has no real description'.format(name)
        assert name.startswith(role + '_'), '{0}: public variables carry the role prefix'.format(name)


@pytest.mark.parametrize('role', ROLES)
def test_every_default_sits_under_a_comment(role):
    """Each group of defaults (lines between blank lines) opens with a comment saying what it is for."""
    text = open(os.path.join(ROOT, 'roles', role, 'defaults', 'main.yml')).read()
    for block in text.split('\n\n'):
        lines = [line for line in block.splitlines() if line.strip() and line != '---']
        if any(line[0].isalpha() for line in lines):
            assert lines[0].startswith('#'), 'undocumented defaults in {0}: {1}'.format(role, lines[0])


def inventory(name, *extra):
    out = subprocess.run([os.path.join(BIN, 'ansible-inventory'), '-i', os.path.join(ROOT, 'inventories', name),
                          '--list', *extra], capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(out.stdout)


def test_lab_inventory_has_a_pve_host_and_a_node_with_a_vmid():
    inv = inventory('lab')
    assert inv['pve_hosts']['hosts'] == ['pve-lab']
    assert inv['inference_nodes']['hosts'] == ['glm5-lab']
    assert inv['_meta']['hostvars']['glm5-lab']['pve_container_vmid'] == 120


def test_production_example_decrypts_with_the_documented_password(tmp_path):
    pw = tmp_path / 'pw'
    pw.write_text('example\n')
    inv = inventory('production', '--vault-password-file', str(pw))
    node = inv['_meta']['hostvars']['glm5']
    assert node['vault_pve_root_password'] == 'CHANGE-ME'
    assert node['pve_container_pve_host'] in inv['pve_hosts']['hosts']
    assert node['pve_container_api_user'] == 'root@pam'
