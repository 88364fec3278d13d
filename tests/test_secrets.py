"""No secret outside its own file: after make test's full-stack fleet was deployed, smoke-tested, faulted, rolled back,
rolled out and benchmarked (molecule/default, the `stack2` tests, the rollout), neither the engine's API key, the
gateway's admin key nor the PVE password is in any file the package wrote - each node's host-side bench history and
caches, the gateway's fleet reports, each container's configuration, logs, homes and temporary files - except in a
file that only its owner (and group) can read (0600, 0640 or stricter: the key file, the unit's environment file and
its .previous/.failed copies, the journal) - nor in what `glm5 --json` prints. Runs last in the lane (file order,
after the rollout), so every run of the lane is in the histories; then, last of all, a change of the fleet's key."""
import json
import os
import shlex
import ssl
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from glm5_lab.paths import STATE, paths
from sglang_fleet import sglang_serving_workers
from siterun import FLEET_NEXT_KEY, ROLLOUT_SMOKE, node_ssh, scenario_fleet_inventory, scenario_hosts, scenario_inventory, site
from test_glm5_ops import GLM5

HOSTS = scenario_hosts('default')
NODES = {h: hv for h, (group, hv) in HOSTS.items() if group == 'inference_nodes'}
GATEWAYS = {h: hv for h, (group, hv) in HOSTS.items() if group == 'gateways'}


# The regular files under the folders given (less the folders to skip: patterns) that hold one of the secrets given on stdin,
# each with its mode.
SCAN = r'''
import fnmatch, json, os, stat, sys
secrets = [s.encode() for s in json.load(sys.stdin)]
tops, skip = sys.argv[1].split(':'), sys.argv[2].split(':')
found, seen = [], 0
for top in tops:
    for root, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if not any(fnmatch.fnmatch(os.path.join(root, d), s) for s in skip)]
        for name in files:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode):
                    continue
                with open(path, 'rb') as fh:
                    data = fh.read()
            except OSError:
                continue
            seen += 1
            if any(s in data for s in secrets):
                found.append([path, st.st_mode & 0o777])
print(json.dumps({'files': seen, 'found': found}))
'''


def scan(tops, skip, secrets, container=None):
    cmd = ['python3' if container else sys.executable, '-c', SCAN, ':'.join(tops), ':'.join(skip)]
    if container:
        p = node_ssh(container, ' '.join(shlex.quote(c) for c in cmd), stdin=json.dumps(secrets), timeout=300)
    else:
        p = subprocess.run(cmd, input=json.dumps(secrets), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def leaks(found):
    """The files holding a secret that others may read, or the group write: a secret's own file is 0600/0640."""
    return [(path, oct(mode)) for path, mode in found if mode & 0o037]


@pytest.fixture(scope='module')
def secrets(stack_node):
    hv = next(iter(NODES.values()))
    key = node_ssh(hv, 'cat /var/cache/sglang/glm5/api-key')
    assert key.returncode == 0 and len(key.stdout.strip()) >= 32, key.stderr
    with open(paths()['password']) as fh:
        password = fh.read().strip()
    with open(os.path.join(STATE, 'fleet', 'admin-key')) as fh:
        admin = fh.read().strip()
    assert len(password) >= 16 and len(admin) >= 32
    # the fleet's next key too: the flag-change rollout brought it in as the secondary (tests/test_fleet_rollout.py)
    return [key.stdout.strip(), password, admin, FLEET_NEXT_KEY]


@pytest.mark.stack
@pytest.mark.parametrize('node', sorted(NODES))
def test_no_secret_in_the_bench_history_or_the_host_side_caches(secrets, node):
    """The history is 0644 files in 0755 folders on the PVE host (bench_serving's result lines, with sglang's
    /server_info in them, were the leak). uv's wheel cache (PyPI's wheels) is left out."""
    hv = NODES[node]
    cache = hv['pve_container_sglang_cache_dir']
    out = scan([hv['pve_container_bench_history_dir'], cache, hv['pve_container_model_cache_dir']],
               [os.path.join(cache, 'uv')], secrets)
    assert out['files'] >= 20, out                  # the runs of converge, idempotence, the faults, glm5 bench, rollouts
    assert leaks(out['found']) == [], out['found']
    # the key's own file (0600, on the host side: a rebuilt container keeps its key) is seen, and is the only one
    assert [path for path, _ in out['found']] == [os.path.join(cache, 'glm5', 'api-key')], out['found']


@pytest.mark.stack
def test_no_secret_in_the_gateways_fleet_reports(secrets):
    """The gateway's bench history: the fleet smoke tests' reports (bench_serving through the gateway, its probe)."""
    tops = [hv['pve_container_bench_history_dir'] for hv in GATEWAYS.values()]
    out = scan(tops, [], secrets)
    assert tops and out['files'] >= 10, (tops, out)     # the fleet runs of converge and the rollout
    assert out['found'] == [], out['found']


@pytest.mark.stack
@pytest.mark.parametrize('node', sorted(NODES))
def test_no_secret_in_the_containers_files_but_their_own(secrets, node):
    """Configuration, logs, homes, temporary files, the environment's own files (not its site-packages)."""
    out = scan(['/etc', '/opt/glm5', '/var/lib', '/var/log', '/var/tmp', '/tmp', '/root', '/home'],
               ['/opt/glm5/sglang.d/*/lib', '/var/lib/apt', '/var/lib/dpkg'], secrets, container=NODES[node])
    assert out['files'] >= 200, out
    assert leaks(out['found']) == [], out['found']
    env_file = scenario_inventory().contract(node)['env_file']
    assert env_file in [path for path, _ in out['found']], out['found']   # the scan sees it


@pytest.mark.stack
def test_no_secret_in_what_glm5_prints(secrets, stack_node, stack_node2):
    for inventory in (stack_node[0], stack_node2[0]):
        for args in (['status', '--json'], ['history', '--json'], ['gpus', '--json']):
            p = subprocess.run([GLM5, '-i', inventory] + args, capture_output=True, text=True, timeout=300)
            assert p.returncode == 0, (args, p.stderr)
            assert not [s for s in secrets if s in p.stdout + p.stderr], args


@pytest.mark.stack
def test_a_key_change_under_load_fails_no_request(tmp_path_factory, stack_node):
    """The key change docs/security.md gives an operator, under load through the gateway: first the new key as the
    secondary (glm5_fleet_api_key_secondary) - the gateway restarts taking both, each node leaves it, restarts taking
    both, is smoke-tested and rejoins; the flag-change rollout before (tests/test_fleet_rollout.py) did it, with clients
    on the old key, or it is done here when that test did not run -, then the clients move to the new key, then the new
    key as the key and the old one as the secondary. Clients on the old key throughout, on the new one from the second
    run: no request is refused for its key (401) or for a node the gateway cannot ask (404: found in the lab on
    2026-12-04, when a change of the one key left the fleet serving neither for 11 minutes), and none fails at all: the
    gateway takes its keys only at its start, and its restarts hand off to a second one behind the front door. The very
    last check of the lane."""
    from bench_fleet import FLAG_CHANGE, Load
    from glm5.inventory import GATEWAY_CONTRACT
    path = scenario_fleet_inventory(tmp_path_factory.mktemp('key-change-inventory'))
    (gateway, hv), = GATEWAYS.items()
    gw = scenario_inventory().contract(gateway, which=GATEWAY_CONTRACT)
    old, new = hv['sglang_gateway_api_key'], FLEET_NEXT_KEY
    model = next(iter(NODES.values()))['sglang_service_served_model_name']
    context = ssl.create_default_context(cafile=gw['ca_cert']) if gw['ca_cert'] else None

    def ask(path, key, body=None):
        req = urllib.request.Request(gw['url'] + path, headers={'Authorization': 'Bearer ' + key,
                                                                 'Content-Type': 'application/json'},
                                     data=json.dumps(body).encode() if body else None)
        try:
            with urllib.request.urlopen(req, timeout=60, context=context) as resp:
                return resp.status, json.load(resp)
        except urllib.error.HTTPError as err:
            return err.code, None

    def change(**keys):
        # the rollouts' short smoke test; the flags the flag-change rollout left (only the keys change here)
        run = site(dict(ROLLOUT_SMOKE, sglang_service_flag_overrides=FLAG_CHANGE, **keys), '--tags', 'sglang,gateway',
                   inventory=path, sglang=True)
        assert run.rc == 0, run

    chat = {'model': model, 'max_tokens': 4, 'messages': [{'role': 'user', 'content': 'What is 17 + 25?'}]}
    assert ask('/v1/chat/completions', old, chat)[0] == 200          # the fleet serves the inventory's key before
    loads = []
    if ask('/v1/chat/completions', new, chat)[0] == 401:             # the flag-change rollout did not run: its step here
        with Load(gw['url'], old, model, 2, gw['ca_cert']) as on_first:
            change(glm5_fleet_api_key_secondary=new)
        loads.append(on_first)
    assert ask('/v1/chat/completions', new, chat)[0] == 200          # both keys served: the clients may move
    with Load(gw['url'], old, model, 2, gw['ca_cert']) as on_old, Load(gw['url'], new, model, 2, gw['ca_cert']) as on_new:
        change(glm5_fleet_api_key=new, glm5_fleet_api_key_secondary=old)
    loads += [on_old, on_new]
    for load in loads:
        # none refused for its key (401), for a node the gateway cannot ask (404), nor by a gateway's restart: the front
        # door hands off to a second smg while the first restarts (sglang_gateway's tasks/handoff.yml; before it, each
        # run had one window of refused connections, 0.3-5.2 s, then 404s)
        assert load.ok > 0 and load.failed == 0, (load.key == new, load.ok, load.errors,
                                                 [round(t - load.failures[0][0], 1) for t, _ in load.failures])
    print('key change under load: old key {0} ok, {1} failed {2}; new key {3} ok, {4} failed {5}'.format(
        on_old.ok, on_old.failed, on_old.errors, on_new.ok, on_new.failed, on_new.errors))
    status, workers = ask('/workers', hv['sglang_gateway_admin_key'])
    assert status == 200
    nodes = {scenario_inventory().contract(n)['url'] for n in NODES}
    assert set(sglang_serving_workers(workers['workers'])) == nodes, workers
    assert ask('/v1/chat/completions', new, chat)[0] == 200
    assert ask('/v1/chat/completions', old, chat)[0] == 200          # until a run without the secondary retires it
    assert ask('/v1/chat/completions', 'other-' + new, chat)[0] == 401
