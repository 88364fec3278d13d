"""The fleet behind the gateway: each node's worker URL and key from the inventory, and every bad fleet setting
refused with one line naming what is wrong (sglang_fleet filters); the gateway's launch line checked by the real
gateway's own parser (the sglang_gateway_args module, smg from PyPI); the gateway's start leaving the drained nodes
out (files/gateway-launch.py)."""
import base64
import json
import os
import subprocess
import sys

import pytest
import sglang_gateway_args
import siterun
from sglang_fleet import (
    sglang_drained,
    sglang_fleet_problems,
    sglang_fleet_workers,
    sglang_in_flight,
    sglang_leave_problem,
    sglang_serving_workers,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULTS = {'sglang_service_port': 30000, 'sglang_service_host': '127.0.0.1'}
KEY = 'fleet-key'


def hostvars(**nodes):
    return {name: dict({'sglang_service_api_key': KEY, 'ansible_host': '127.0.0.1'}, **hv) for name, hv in nodes.items()}


def workers(names, **nodes):
    return sglang_fleet_workers(names, hostvars(**nodes), DEFAULTS)


def problems(names, batch=1, api_key=KEY, admin_key='admin', single=False, secondary='', **nodes):
    return sglang_fleet_problems(workers(names, **nodes), 'gw', api_key, admin_key, batch, single, secondary)


def test_each_node_is_a_worker_at_its_own_url():
    got = workers(['a', 'b'], a={'sglang_service_port': 30120},
                  b={'sglang_gateway_worker_url': 'http://10.0.0.2:30000/', 'sglang_service_host': '0.0.0.0'})
    assert got == [
        {'node': 'a', 'url': 'http://127.0.0.1:30120', 'key': KEY, 'secondary': '', 'listen': '127.0.0.1', 'known': True},
        {'node': 'b', 'url': 'http://10.0.0.2:30000', 'key': KEY, 'secondary': '', 'listen': '0.0.0.0', 'known': True}]
    assert problems(['a', 'b'], a={'sglang_service_port': 30120}, b={'sglang_service_port': 30121}) == []


@pytest.mark.parametrize('names, nodes, kwargs, words', [
    ([], {}, {}, 'the gateway gw has no nodes behind it (sglang_gateway_nodes is empty)'),
    (['a', 'a', 'b'], {'a': {'sglang_service_port': 1}, 'b': {'sglang_service_port': 2}}, {},
     'a is listed 2 times in sglang_gateway_nodes of gw: list each node once'),
    (['a', 'c'], {'a': {}}, {'batch': 1, 'single': True}, 'sglang_gateway_nodes of gw names c, which is not an inventory host'),
    (['a', 'b'], {'a': {}, 'b': {}}, {}, 'a and b are both at http://127.0.0.1:30000: each node needs its own worker URL'),
    (['a', 'b'], {'a': {'sglang_gateway_worker_url': 'http://LOCALHOST:80'}, 'b': {'sglang_gateway_worker_url': 'http://localhost'}},
     {}, 'a and b both listen at localhost:80: each node needs its own address or port'),
    (['a', 'b'], {'a': {'sglang_service_port': 1}, 'b': {'sglang_gateway_worker_url': 'grpc://x:1'}}, {},
     "b: worker URL 'grpc://x:1' is not http(s)://host:port"),
    (['a', 'b'], {'a': {'sglang_service_port': 1}, 'b': {'sglang_service_port': 2, 'sglang_service_api_key': ''}}, {},
     "b has no sglang_service_api_key: behind the gateway every node serves the gateway's key"),
    (['a', 'b'], {'a': {'sglang_service_port': 1}, 'b': {'sglang_service_port': 2, 'sglang_service_api_key': 'own'}}, {},
     'sglang_gateway_api_key of gw is neither sglang_service_api_key nor sglang_service_api_key_secondary of b'),
    (['a', 'b'], {'a': {'sglang_service_port': 1}, 'b': {'sglang_service_port': 2}}, {'secondary': 'new-' + KEY},
     'sglang_gateway_api_key_secondary of gw is neither sglang_service_api_key nor sglang_service_api_key_secondary '
     'of a'),
    (['a', 'b'], {'a': {'sglang_service_port': 1}, 'b': {'sglang_service_port': 2}}, {'secondary': KEY},
     'sglang_gateway_api_key_secondary of gw is its sglang_gateway_api_key'),
    (['a', 'b'], {'a': {'sglang_service_port': 1}, 'b': {'sglang_service_port': 2}}, {'api_key': ''},
     'sglang_gateway_api_key is empty on gw'),
    (['a', 'b'], {'a': {'sglang_service_port': 1}, 'b': {'sglang_service_port': 2}}, {'admin_key': ''},
     'sglang_gateway_admin_key is empty on gw'),
    (['a', 'b'], {'a': {'ansible_host': '10.0.0.1'}, 'b': {'sglang_service_port': 2}}, {},
     'a: sglang listens on 127.0.0.1 only (sglang_service_host) but the gateway reaches it at http://10.0.0.1:30000'),
    (['a', 'b'], {'a': {'sglang_service_port': 1}, 'b': {'sglang_service_port': 2}}, {'batch': 2},
     'glm5_rolling_batch 2 restarts every node behind gw at once (it has 2): at most 1 keeps one serving'),
    (['a', 'b'], {'a': {'sglang_service_port': 1}, 'b': {'sglang_service_port': 2}}, {'batch': '50%'},
     "glm5_rolling_batch must be a whole number >= 1 (nodes restarted at once), got '50%'"),
    (['a', 'b'], {'a': {'sglang_service_port': 1}, 'b': {'sglang_service_port': 2}}, {'batch': '0'},
     "glm5_rolling_batch must be a whole number >= 1 (nodes restarted at once), got 0"),
    (['a', 'b'], {'a': {'sglang_service_port': 1}, 'b': {'sglang_service_port': 2}}, {'batch': '2'},
     'glm5_rolling_batch 2 restarts every node behind gw at once (it has 2): at most 1 keeps one serving'),
    (['a'], {'a': {}}, {}, 'the gateway gw has one node (a): a deploy that restarts it takes the service down'),
])
def test_bad_fleet_settings_are_one_line_each(names, nodes, kwargs, words):
    found = problems(names, **dict(kwargs), **nodes)
    assert any(p.startswith(words) for p in found), found
    assert all(KEY not in p for p in found), found   # names, never a key's value


def test_a_rolling_batch_given_on_the_command_line_is_taken():
    """-e glm5_rolling_batch=2, as docs/variables.md says, arrives as the string '2': it was refused as not a whole
    number."""
    three = {n: {'sglang_service_port': i} for i, n in enumerate('abc', 1)}
    assert problems(['a', 'b', 'c'], batch='2', **three) == [] == problems(['a', 'b', 'c'], batch=2, **three)


def test_a_key_change_is_a_key_every_node_takes_beside_the_other():
    new = 'new-' + KEY
    # first the nodes and the gateway take the new key beside the key; then the new is the key, the old one beside it
    both = {'sglang_service_api_key_secondary': new}
    assert problems(['a', 'b'], secondary=new, a=dict(both, sglang_service_port=1), b=dict(both, sglang_service_port=2)) == []
    swapped = {'sglang_service_api_key': new, 'sglang_service_api_key_secondary': KEY}
    assert problems(['a', 'b'], api_key=new, secondary=KEY, a=dict(swapped, sglang_service_port=1),
                    b=dict(swapped, sglang_service_port=2)) == []
    # a node that takes the new key only as its secondary serves a gateway on it
    assert problems(['a', 'b'], api_key=new, a=dict(both, sglang_service_port=1), b=dict(both, sglang_service_port=2)) == []
    # one node left out of the change refuses the gateway's new key: named, the key never printed
    found = problems(['a', 'b'], secondary=new, a=dict(both, sglang_service_port=1), b={'sglang_service_port': 2})
    assert found == ['sglang_gateway_api_key_secondary of gw is neither sglang_service_api_key nor '
                     'sglang_service_api_key_secondary of b: smg forwards the client\'s key to the worker unchanged, so '
                     'the node would refuse those requests; use the same variables for both (docs/security.md, '
                     '"Changing the key")'], found
    assert all(new not in p for p in found)


def test_one_node_is_accepted_when_said():
    assert problems(['a'], single=True, a={}) == []


PY = sys.executable   # the test venv has smg (requirements-lab.txt)


def test_the_gateways_parser_accepts_the_roles_line():
    ok, result = sglang_gateway_args.check(PY, [
        '--host', '127.0.0.1', '--port', '30130', '--worker-urls', 'http://127.0.0.1:30120', 'http://127.0.0.1:30121',
        '--policy', 'power_of_two', '--power-of-two-load-metric', 'requests', '--disable-worker-overload-protection',
        '--health-check-endpoint', '/health',
        '--retry-max-retries', '3', '--cb-failure-threshold', '5', '--disable-tokenizer-autoload',
        '--api-key=placeholder', '--control-plane-api-keys=glm5:glm5-ops:admin:placeholder'])
    assert ok, result
    assert result['smg_version'] == '1.13.0'
    assert result['args']['policy'] == 'power_of_two' and result['args']['port'] == 30130
    assert result['args']['worker_overload_protection'] is False
    assert result['args']['worker_urls'] == ['http://127.0.0.1:30120', 'http://127.0.0.1:30121']
    assert 'placeholder' not in str(result)


@pytest.mark.parametrize('argv, words', [
    (['--policy', 'fastest'], "argument --policy: invalid choice: 'fastest'"),
    (['--no-such-flag'], 'unrecognized arguments: --no-such-flag'),
    (['--control-plane-api-keys', 'only-a-key'], "Invalid control-plane API key entry: expected 'id:name:role:key'"),
    (['--port', 'eighty'], "argument --port: invalid int value: 'eighty'"),
])
def test_the_gateways_parser_refuses_with_its_own_words(argv, words):
    ok, result = sglang_gateway_args.check(PY, argv)
    assert not ok
    assert words in result['parser_message'], result


def test_no_gateway_environment_is_said(tmp_path):
    ok, result = sglang_gateway_args.check('/nonexistent/bin/python', ['--port', '1'])
    assert not ok and 'is the gateway environment installed' in result['parser_message']
    # the environment's folder, or a python that cannot be run, instead of its bin/python: was a PermissionError
    import sglang_server_args
    (tmp_path / 'python').write_text('')
    for python in (str(tmp_path), str(tmp_path / 'python')):
        for module, what in ((sglang_gateway_args, 'gateway'), (sglang_server_args, 'SGLang')):
            ok, result = module.check(python, ['--port', '1'])
            assert not ok and result['parser_message'] == '{0} cannot be run (Permission denied): is the {1} ' \
                'environment installed?'.format(python, what), result


# ---------------------------------------------------------------- the gateway's start (files/gateway-launch.py)
def _launcher():
    import importlib.util
    path = os.path.join(ROOT, 'roles', 'sglang_gateway', 'files', 'gateway-launch.py')
    spec = importlib.util.spec_from_file_location('gateway_launch', path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_gateways_start_leaves_the_drained_workers_out_and_nothing_else(tmp_path, capsys):
    launch = _launcher()
    argv = ['/opt/glm5/gateway/bin/smg', 'launch', '--host', '0.0.0.0', '--worker-urls', 'http://a:1', 'http://b:1/',
            '--policy', 'power_of_two', '--api-key=k']
    drained = tmp_path / 'drained.json'
    assert launch.drained_workers(str(drained)) == set()                      # no file: none drained
    drained.write_text(json.dumps([{'node': 'b', 'worker': 'http://b:1', 'since': 's', 'by': 'op'}, 'junk']))
    assert launch.without(argv, launch.drained_workers(str(drained))) == [
        '/opt/glm5/gateway/bin/smg', 'launch', '--host', '0.0.0.0', '--worker-urls', 'http://a:1', '--policy',
        'power_of_two', '--api-key=k']
    assert 'http://b:1/ left out (drained)' in capsys.readouterr().err
    # every node drained: no --worker-urls at all (nargs='+' refuses an empty list); the rest untouched
    drained.write_text(json.dumps([{'node': n, 'worker': 'http://{0}:1'.format(n)} for n in 'ab']))
    assert launch.without(argv, launch.drained_workers(str(drained))) == [
        '/opt/glm5/gateway/bin/smg', 'launch', '--host', '0.0.0.0', '--policy', 'power_of_two', '--api-key=k']
    # a file that cannot be read keeps every node in, said
    drained.write_text('{not json')
    assert launch.drained_workers(str(drained)) == set() and 'no node left out' in capsys.readouterr().err
    drained.write_text('{"node": "b"}')
    assert launch.drained_workers(str(drained)) == set()


def test_the_gateways_start_with_fewer_than_two_workers_is_round_robin(capsys):
    """smg 1.13 refuses to start power_of_two with fewer than two workers ("Power-of-two policy requires at least 2
    workers"): a fleet of two with one drained, or a one-node gateway, must still start."""
    launch = _launcher()
    two = ['smg', 'launch', '--worker-urls', 'http://a:1', 'http://b:1', '--policy', 'power_of_two', '--port', '1']
    assert launch.policy_for(two) == two
    one = ['smg', 'launch', '--worker-urls', 'http://a:1', '--policy', 'power_of_two', '--port', '1']
    assert launch.policy_for(one) == ['smg', 'launch', '--worker-urls', 'http://a:1', '--policy', 'round_robin', '--port',
                                      '1']
    assert '1 worker(s) to start with: round_robin' in capsys.readouterr().err
    assert launch.policy_for(['smg', 'launch', '--policy', 'power_of_two'])[-1] == 'round_robin'
    other = ['smg', 'launch', '--worker-urls', 'http://a:1', '--policy', 'cache_aware']
    assert launch.policy_for(other) == other


# What smg would see, run by the launcher in its own process: printed as JSON.
STAND_IN_SMG = """
import json, os, sys
with open('/proc/self/cmdline', 'rb') as fh:
    cmdline = fh.read().decode()
print(json.dumps({'argv': sys.argv, 'cmdline': cmdline, 'pid': os.getpid(),
                  'env': sorted(k for k in os.environ if k.startswith('SMG_'))}))
"""


def test_the_gateways_keys_reach_smg_in_its_process_and_on_no_command_line(tmp_path):
    """The unit passes ${SMG_API_KEY} and ${SMG_ADMIN_KEY} as text ($${...}: systemd would put the values on the
    command line, where every local user's ps reads them); the launcher puts the environment's values in and runs
    smg's entry script in its own process."""
    smg = tmp_path / 'smg'
    smg.write_text(STAND_IN_SMG)
    path = os.path.join(ROOT, 'roles', 'sglang_gateway', 'files', 'gateway-launch.py')
    key, admin = '-gw-key-0123456789abcdef', 'admin-key-0123456789abcdef'
    env = dict(os.environ, SMG_API_KEY=key, SMG_ADMIN_KEY=admin, SMG_OTHER='kept')
    argv = [sys.executable, path, str(tmp_path / 'none.json'), '--', str(smg), 'launch', '--port', '1',
            '--api-key=${SMG_API_KEY}', '--control-plane-api-keys=glm5:glm5-ops:admin:${SMG_ADMIN_KEY}']
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out['argv'] == [str(smg), 'launch', '--port', '1', '--api-key=' + key,
                           '--control-plane-api-keys=glm5:glm5-ops:admin:' + admin]
    assert out['cmdline'].split('\0')[:-1] == argv and key not in out['cmdline'] and admin not in out['cmdline']
    assert out['env'] == ['SMG_OTHER']             # the keys' variables gone before smg started; the rest kept
    # a key the environment lacks stops the start, naming it
    p = subprocess.run(argv, env=dict(env, SMG_ADMIN_KEY=''), capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and p.stdout == ''
    assert 'gateway-launch: SMG_ADMIN_KEY not set or empty in the environment' in p.stderr, p.stderr


TLS_INVENTORY = {'all': {'children': {
    'inference_nodes': {'hosts': {n: {'ansible_host': '127.0.0.1', 'sglang_service_port': p,
                                      'sglang_service_api_key': KEY} for n, p in (('a', 30001), ('b', 30002))}},
    'gateways': {'hosts': {'gw': {'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable,
                                  'ansible_host': '127.0.0.1',
                                  'sglang_gateway_api_key': KEY, 'sglang_gateway_admin_key': 'admin'}}}}}}


def site_first_play():
    """site.yml's first play as site.yml has it: the gateway's contract, then the fleet's checks (read-only)."""
    import yaml
    with open(os.path.join(ROOT, 'site.yml')) as fh:
        play = yaml.safe_load(fh)[0]
    assert play['name'].startswith("The fleet's settings, before anything changes"), play['name']
    return play


TLS_PLAY = [site_first_play()]


@pytest.fixture(scope='module')
def tls_check(tmp_path_factory):
    """site.yml's first play for a gateway (its contract, then its checks: read-only), run on this machine with extra
    variables -> (rc, output)."""
    top = tmp_path_factory.mktemp('tls')
    for name in ('cert.pem', 'key.pem', 'ca.pem'):
        (top / name).write_text('not read by the checks\n')
    checks = siterun.local_checks(top, TLS_INVENTORY, TLS_PLAY)

    def run(**extra):
        return checks(**{k: v.replace('TOP', str(top)) if isinstance(v, str) else v for k, v in extra.items()})
    return run


def refused_saying(rc, out, words):
    """The checks' outcome: passed (words None), or refused on the gateway saying words."""
    siterun.refused_saying(rc, out, 'gw', words)


@pytest.mark.parametrize('extra, words', [
    ({'sglang_gateway_tls_cert': 'TOP/cert.pem'},
     "gw: sglang_gateway_tls_cert and sglang_gateway_tls_key go together (empty both: a certificate from the "
     "package's CA in ~/.glm5/gateway-ca); sglang_gateway_tls_ca_cert is empty"),
    ({'sglang_gateway_tls_cert': 'TOP/cert.pem', 'sglang_gateway_tls_key': 'TOP/key.pem'},
     'gw: sglang_gateway_tls_ca_cert is empty: name the CA file clients trust for sglang_gateway_tls_cert'),
    ({'sglang_gateway_tls_cert': 'TOP/cert.pem', 'sglang_gateway_tls_key': 'TOP/nokey.pem',
      'sglang_gateway_tls_ca_cert': 'TOP/ca.pem'}, 'gw: TOP/nokey.pem is not a file on the controller'),
    ({}, None),
    ({'sglang_gateway_tls_cert': 'TOP/cert.pem', 'sglang_gateway_tls_key': 'TOP/key.pem',
      'sglang_gateway_tls_ca_cert': 'TOP/ca.pem'}, None),
    ({'sglang_gateway_tls': False, 'sglang_gateway_tls_cert': 'TOP/cert.pem'}, None),
])
def test_the_gateways_tls_settings_are_checked_before_any_change(tls_check, extra, words):
    refused_saying(*tls_check(**extra), words and words.split('TOP')[0])


@pytest.mark.parametrize('extra, words', [
    ({'sglang_gateway_source_address': 'gw.example.com'},
     "a is behind gw, whose address 'gw.example.com' (sglang_gateway_source_address, else its ansible_host) is not "
     "an IP address"),
    ({'pve_container_engine_sources': ['10.1.0.0/24', 'monitor.example.com']},
     "pve_container_engine_sources of a: 'monitor.example.com' is not an IP address or CIDR"),
    # the nodes' firewall left to the user: the gateway's name is no problem
    ({'sglang_gateway_source_address': 'gw.example.com', 'pve_container_firewall': False}, None),
    ({'sglang_gateway_source_address': '10.0.0.5', 'pve_container_engine_sources': ['10.1.0.0/24']}, None),
])
def test_the_nodes_firewall_needs_addresses_and_says_so_before_any_change(tls_check, extra, words):
    refused_saying(*tls_check(**extra), words)


@pytest.mark.parametrize('extra, words', [
    ({'sglang_gateway_handoff_port': 8000},
     'gw: sglang_gateway_port and sglang_gateway_handoff_port are the same port (8000); the front door (HAProxy), the '
     'two smg behind it (the hand-off) and their metrics each need their own.'),
    ({'sglang_gateway_backend_port': 29001, 'sglang_gateway_metrics_port': '8002'},
     'gw: sglang_gateway_handoff_port and sglang_gateway_metrics_port are the same port (8002); '
     'sglang_gateway_backend_port and sglang_gateway_handoff_metrics_port are the same port (29001); the front door'),
    ({'sglang_gateway_port': 443, 'sglang_gateway_backend_port': 9443}, None),
])
def test_the_front_door_and_both_gateways_have_ports_of_their_own_before_any_change(tls_check, extra, words):
    refused_saying(*tls_check(**extra), words)


@pytest.mark.parametrize('extra, words', [
    ({'sglang_gateway_backend_connect_timeout_ms': 0},
     'sglang_gateway_backend_connect_timeout_ms is 0: give 10 to 5000 (ms; 0 would be no limit at all'),
    ({'sglang_gateway_backend_connect_timeout_ms': 60000},
     'sglang_gateway_backend_connect_timeout_ms is 60000: give 10 to 5000'),
    ({'sglang_gateway_backend_connect_timeout_ms': 5000}, None),
])
def test_the_front_doors_wait_for_smg_is_checked_before_any_change(tls_check, extra, words):
    """HAProxy's `timeout connect` to smg (and its retries, ceil(3000 / it)): 0 would be no limit and a division by
    zero in the template."""
    refused_saying(*tls_check(**extra), words)


@pytest.mark.parametrize('extra, words', [
    # found on make deploy's fleet (2026-12-05): `site.yml --tags smoke -e sglang_smoke_fleet_poll=0` ran both nodes'
    # production sweeps (22 minutes) before the fleet step refused the 0
    ({'sglang_smoke_fleet_poll': 0, 'sglang_smoke_fleet_levels': [64, 64], 'sglang_smoke_fleet_ttft_overhead_ms': -1},
     'The fleet smoke test settings are not usable: sglang_smoke_fleet_levels lists a level twice: [64, 64]; '
     'sglang_smoke_fleet_ttft_overhead_ms must be a number of ms > 0 (or null: not gated), got -1; '
     'sglang_smoke_fleet_poll must be a whole number of seconds >= 1, got 0. Nothing was changed.'),
    ({'sglang_smoke_fleet_poll': 'often'}, 'sglang_smoke_fleet_poll'),
    ({'sglang_smoke_fleet_ttft_overhead_ms': 'fast'},
     'The fleet smoke test settings are not usable: sglang_smoke_fleet_ttft_overhead_ms must be a number of ms > 0 (or '
     'null: not gated), got "fast". Nothing was changed.'),
    # null: not gated (documented; the entry points' float type refused it once they were applied, 2026-12-05)
    ({'sglang_smoke_fleet_ttft_overhead_ms': None}, None),
    # numbers as text (-e key=value) are numbers; no levels: the nodes' common top level, known after their tests
    ({'sglang_smoke_fleet_poll': '2', 'sglang_smoke_fleet_ttft_overhead_ms': '40', 'sglang_smoke_fleet_levels': []},
     None),
])
def test_the_fleet_smoke_tests_own_settings_are_checked_before_any_change(tls_check, extra, words):
    rc, out = tls_check(**extra)
    # (the check runs on the controller: delegated to localhost)
    siterun.refused_saying(rc, out, 'gw -> localhost' if words and words.startswith('The fleet') else 'gw', words)
    if words == 'sglang_smoke_fleet_poll':      # the entry point's type check (Ansible's words), before the module
        assert "arg spec 'fleet_settings'" in out and '"\'often\'" cannot be converted to an int' in out, out


def test_the_gateways_fact_holds_no_key_even_at_vvv(tmp_path):
    """sglang_gateway_fleet (contract.yml's fact, shown at -v and above) names each worker's node and URL, never its
    key nor its secondary key (found by the rollout's -vvv check in make test, 2026-12-05: each node's secondary key,
    in the middle of a key change, was printed with the fact)."""
    import yaml
    (tmp_path / 'hosts.yml').write_text(yaml.safe_dump(TLS_INVENTORY))
    (tmp_path / 'play.yml').write_text(yaml.safe_dump(TLS_PLAY))
    secondary = 'the-secondary-key-0123456789'
    r = siterun.site({'sglang_service_api_key_secondary': secondary}, '-vvv', inventory=str(tmp_path / 'hosts.yml'),
                     playbook=str(tmp_path / 'play.yml'))
    assert r.rc == 0, r.out
    assert 'sglang_gateway_fleet' in r.raw and 'http://127.0.0.1:30002' in r.raw, r.raw     # the fact is shown
    assert KEY not in r.raw and secondary not in r.raw


def test_the_serving_workers_are_healthy_and_under_a_model():
    """A gateway's worker list (smg's GET /workers): a worker healthy under the model 'unknown' refused the gateway's
    key, so it serves nothing; an unhealthy one serves nothing either."""
    workers = [{'url': 'http://a:1', 'is_healthy': True, 'model_id': 'glm-5'},
               {'url': 'http://b:1', 'is_healthy': True, 'model_id': 'unknown'},
               {'url': 'http://c:1', 'is_healthy': False, 'model_id': 'glm-5'},
               {'url': 'http://d:1', 'model_id': 'glm-5'}]
    assert sglang_serving_workers(workers) == ['http://a:1']
    assert sglang_serving_workers([]) == sglang_serving_workers(None) == []


LEAVERS = [{'node': 'a', 'url': 'http://a:1'}, {'node': 'b', 'url': 'http://b:1'}, {'node': 'c', 'url': 'http://c:1'}]


def _worker(url, healthy=True, model='glm-5', status='ready'):
    return {'url': url, 'is_healthy': healthy, 'model_id': model, 'status': status}


@pytest.mark.parametrize('workers,words', [
    ([_worker('http://a:1'), _worker('http://b:1', False, status='draining')],
     'a is the last node serving through gw (b: unhealthy there (status draining); c: out of it): without it every '
     'request through gw fails until it is back'),
    ([_worker('http://a:1/'), _worker('http://b:1', model='unknown')],
     'a is the last node serving through gw (b: there under the model unknown (it refuses the key the gateway was '
     'given); c: out of it)'),
])
def test_the_last_node_serving_may_not_leave_naming_the_others(workers, words):
    """A node leaving (a deploy's restart, glm5 drain) while no other node of the gateway serves there: refused, each
    other node's state said (out, unhealthy, refusing the key)."""
    assert words in sglang_leave_problem(workers, 'http://a:1', 'gw', 'a', LEAVERS)


@pytest.mark.parametrize('workers,worker,others', [
    ([_worker('http://a:1'), _worker('http://c:1')], 'http://a:1', LEAVERS),           # c serves
    ([_worker('http://b:1')], 'http://a:1', LEAVERS),                                 # a is out: leaving changes nothing
    ([_worker('http://a:1', False), _worker('http://b:1', False)], 'http://a:1', LEAVERS),  # a serves nothing either
    ([_worker('http://a:1')], 'http://a:1', LEAVERS[:1]),                             # a gateway of one node
])
def test_a_node_may_leave_when_another_serves_or_it_serves_nothing(workers, worker, others):
    assert sglang_leave_problem(workers, worker, 'gw', 'a', others) == ''


def test_after_leaving_nobody_else_serving_is_said_as_a_race():
    """The list after the node's removal (after=): nobody else serving there means another run took the others out at
    the same time (or they failed) - said so; someone serving is fine, and so is a node that served nothing before."""
    before = [_worker('http://a:1'), _worker('http://b:1'), _worker('http://c:1')]
    said = sglang_leave_problem(before, 'http://a:1', 'gw', 'a', LEAVERS,
                                after=[_worker('http://b:1', False, status='draining')])
    assert said.startswith('once a left gw, no node served there (b: unhealthy there (status draining); c: out of it), '
                           'though one did when it checked - another run took it out at the same time'), said
    assert sglang_leave_problem(before, 'http://a:1', 'gw', 'a', LEAVERS, after=[_worker('http://c:1')]) == ''
    assert sglang_leave_problem([_worker('http://a:1', False)] + before[1:], 'http://a:1', 'gw', 'a', LEAVERS,
                                after=[]) == ''


def test_in_flight_is_running_and_waiting_over_every_rank():
    """sglang's load report (GET /v1/loads): one entry a data-parallel rank."""
    loads = [{'dp_rank': 0, 'num_running_reqs': 3, 'num_waiting_reqs': 2},
             {'dp_rank': 1, 'num_running_reqs': 1, 'num_waiting_reqs': 0}, {'dp_rank': 2}]
    assert sglang_in_flight(loads) == 6
    assert sglang_in_flight([]) == sglang_in_flight(None) == 0


def test_a_node_at_an_ipv6_address_is_a_worker_url_with_brackets():
    """ansible_host: fd00::11 gave http://fd00::11:30000, refused as a bad sglang_gateway_worker_url (never set)."""
    six = {'a': {'ansible_host': 'fd00::11', 'sglang_service_host': '::'},
           'b': {'ansible_host': '[fd00::12]', 'sglang_service_host': '::'}}
    assert [w['url'] for w in workers(['a', 'b'], **six)] == ['http://[fd00::11]:30000', 'http://[fd00::12]:30000']
    assert problems(['a', 'b'], **six) == []


DRAINED = '/etc/glm5/glm5-gw.drained.json'


def slurped(text):
    return {'content': base64.b64encode(text.encode()).decode(), 'encoding': 'base64'}


@pytest.mark.parametrize('result, entries', [
    ({'failed': True, 'msg': 'file not found: ' + DRAINED}, []),    # no drain yet
    (slurped(''), []),
    (slurped('[]\n'), []),
    (slurped('[{"node": "n1", "worker": "http://10.0.0.1:30000", "since": "t", "by": "op"}]\n'),
     [{'node': 'n1', 'worker': 'http://10.0.0.1:30000', 'since': 't', 'by': 'op'}]),
])
def test_the_drained_file_is_read_as_glm5_drain_writes_it(result, entries):
    assert sglang_drained(result, DRAINED, 'glm5-gw') == {'entries': entries, 'problem': ''}


@pytest.mark.parametrize('result, words', [
    (slurped('[{"node": "n1"},]'), 'is not JSON (Expecting value: line 1'),
    (slurped('42'), 'is not a list of drained nodes ({"node": NAME, ...} each): a JSON number'),
    ({'content': base64.b64encode(b'[\xff]').decode()}, "is not JSON ('utf-8' codec can't decode byte 0xff"),
    (slurped('{"n1": "drained"}'), 'is not a list of drained nodes ({"node": NAME, ...} each): a JSON object'),
    (slurped('[{"node": "n1"}, "n2"]'), ': entry 2 ("n2")'),
    (slurped('[{"worker": "http://10.0.0.1:30000"}]'), ': entry 1 ({"worker": "http://10.0.0.1:30000"})'),
    (slurped('[{"node": ""}]'), ': entry 1 ({"node": ""})'),
    ({'failed': True, 'msg': 'Permission denied'}, 'cannot be read (Permission denied)'),
    ({}, 'cannot be read (no answer)'),
])
def test_a_drained_file_edited_into_something_else_is_a_problem_not_none_drained(result, words):
    out = sglang_drained(result, DRAINED, 'glm5-gw')
    assert out['entries'] == [] and out['problem'].startswith(DRAINED + ' on glm5-gw '), out
    assert words in out['problem'], out['problem']
