"""site.yml's rolling deploy on make test's full-stack fleet (molecule/default: two nodes and the gateway in front of
them, deployed and verified before this), while a load generator asks through the gateway at a steady concurrency
(scripts/bench_fleet.py's, the one the benchmark uses): a change the first node fails stops the rollout with the
other node serving; a flag change (with a key change's first step: the gateway restarts too) rolls across both, one
at a time. No request may fail in either.

The order matters and is the file's: the failing rollout first (from the inventory's configuration), then the flag
change (which brings the first node back). Both nodes end on the flag change, taking both keys, in the gateway; only
Prometheus' checks, the secrets audit and the key change's last step run after this one."""
import json
import os
import re
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from bench_fleet import FLAG_CHANGE, Load
from glm5.inventory import GATEWAY_CONTRACT
from glm5_lab.paths import paths
from siterun import (
    FLEET_NEXT_KEY,
    ROLLOUT_SMOKE,
    ROOT,
    node_ssh,
    prometheus_api,
    scenario_fleet_inventory,
    scenario_hosts,
    scenario_inventory,
    site,
    stack_monitor,
)
from test_glm5_ops import GLM5, hold_lock

pytestmark = pytest.mark.stack

HOSTS = scenario_hosts('default')
NODES = [h for h, (group, _) in HOSTS.items() if group == 'inference_nodes']
(GATEWAY,) = [h for h, (group, _) in HOSTS.items() if group == 'gateways']
MONITOR, MONITOR_VARS = stack_monitor()
MONITOR_ADDRESS = MONITOR_VARS['ansible_host']


def hv(host):
    return HOSTS[host][1]


def ssh(host, *cmd):
    r = node_ssh(hv(host), *cmd, timeout=60)
    assert r.returncode == 0, (host, cmd, r.stderr)
    return r.stdout


class Workers(threading.Thread):
    """The gateway's healthy workers (GET /workers), every half second while a rollout runs: [(t, {url, ...})]."""

    def __init__(self, url, admin, ca=None):
        super().__init__(daemon=True)
        self.url, self.admin, self.samples, self.stop = url, admin, [], threading.Event()
        self.context = ssl.create_default_context(cafile=ca) if ca else None

    def now(self):
        req = urllib.request.Request(self.url + '/workers', headers={'Authorization': 'Bearer ' + self.admin})
        with urllib.request.urlopen(req, timeout=10, context=self.context) as resp:
            return {w['url'] for w in json.load(resp)['workers'] if w.get('is_healthy')}

    def run(self):
        while not self.stop.is_set():
            try:
                self.samples.append((time.time(), self.now()))
            except OSError as err:
                self.samples.append((time.time(), err))
            self.stop.wait(0.5)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join(15)


@pytest.fixture(scope='module')
def fleet(stack_node, tmp_path_factory):
    """The whole fleet's inventory (all of molecule/default's inventory files and the lab's group_vars) and what the
    checks read: the gateway's URL and keys, each node's worker URL, unit and environment file."""
    path = scenario_fleet_inventory(tmp_path_factory.mktemp('fleet-inventory'))
    inv = scenario_inventory()
    gw = inv.contract(GATEWAY, which=GATEWAY_CONTRACT)
    nodes = {n: inv.contract(n) for n in NODES}
    f = {'inventory': path, 'url': gw['url'], 'ca': gw['ca_cert'] or None, 'admin': hv(GATEWAY)['sglang_gateway_admin_key'],
         'key': hv(GATEWAY)['sglang_gateway_api_key'], 'model': hv(NODES[0])['sglang_service_served_model_name'],
         'nodes': nodes, 'worker': {n: c['url'] for n, c in nodes.items()}}  # the lab's workers: the nodes' URLs
    workers = Workers(f['url'], f['admin'], f['ca'])
    for _ in range(60):                     # the verify put the first node back; healthy after two checks
        if workers.now() == set(f['worker'].values()):
            break
        time.sleep(1)
    assert workers.now() == set(f['worker'].values()), 'both nodes in the gateway before the rollouts'
    return f


def unit_state(fleet, node):
    """(main PID, start time in µs, the unit's and environment file's text) of a node's engine."""
    c = fleet['nodes'][node]
    pid, start = ssh(node, 'systemctl', 'show', '--value', '-p', 'MainPID', '-p', 'ExecMainStartTimestampMonotonic',
                     c['service']).split()
    return int(pid), int(start), ssh(node, 'cat', c['unit'], c['env_file'])


def rollout(fleet, extra, *args):
    """site.yml --tags sglang [args] under the load, the gateway's workers watched -> (Run, Load, Workers, seconds)."""
    with Load(fleet['url'], fleet['key'], fleet['model'], 4, fleet['ca']) as load, \
            Workers(fleet['url'], fleet['admin'], fleet['ca']) as w:
        time.sleep(2)
        t0 = time.time()
        run = site(extra, '--tags', 'sglang', *args, inventory=fleet['inventory'], sglang=True)
        took = time.time() - t0
        time.sleep(2)
    return run, load, w, took


def lock_holds(fleet, node, since):
    """Each start of the node's engine lock since a time (epoch seconds), as its container's journal tells it: one line
    ("Started <unit> - <holder>.") a hold."""
    out = ssh(node, 'journalctl', '-q', '-o', 'cat', '-u', fleet['nodes'][node]['lock_unit'],
              '--since', '@{0:.0f}'.format(since))
    return [line for line in out.splitlines() if line.startswith('Started ')]


def out_of_gateway(w, url):
    return [t for t, healthy in w.samples if isinstance(healthy, set) and url not in healthy]


def ask(fleet, key):
    """The status of one short chat completion through the gateway with this key."""
    body = {'model': fleet['model'], 'max_tokens': 4, 'messages': [{'role': 'user', 'content': 'What is 17 + 25?'}]}
    req = urllib.request.Request(fleet['url'] + '/v1/chat/completions', data=json.dumps(body).encode(),
                                 headers={'Authorization': 'Bearer ' + key, 'Content-Type': 'application/json'})
    context = ssl.create_default_context(cafile=fleet['ca']) if fleet['ca'] else None
    try:
        with urllib.request.urlopen(req, timeout=60, context=context) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def test_each_nodes_engine_port_is_open_to_the_gateway_only_in_its_pve_firewall(lab_api):
    """What site.yml asked PVE for (pve_container_firewall's default for a node behind a gateway): the engine port
    open to the gateway's and the monitoring host's addresses and closed to all others, the rules first, the firewall
    on with an input policy that filters nothing else. (The lab's PVE keeps the firewall, it enforces none: README, stand-ins.)"""
    gateway_address = hv(GATEWAY)['sglang_gateway_source_address'] or hv(GATEWAY)['ansible_host']
    for node in NODES:
        ct = lab_api.nodes(hv(node)['pve_container_node']).lxc(hv(node)['pve_container_vmid'])
        port = str(hv(node)['sglang_service_port'])
        rules = [(r['type'], r['action'], r.get('source'), r.get('proto'), str(r['dport']), int(r['enable']))
                 for r in sorted(ct.firewall.rules.get(), key=lambda r: r['pos'])]
        # the gateway, then the monitoring host that scrapes /metrics there (molecule/default's Prometheus), then DROP
        assert rules[:3] == [('in', 'ACCEPT', gateway_address, 'tcp', port, 1),
                             ('in', 'ACCEPT', MONITOR_ADDRESS, 'tcp', port, 1),
                             ('in', 'DROP', None, 'tcp', port, 1)], (node, rules)
        comments = [r.get('comment', '') for r in sorted(ct.firewall.rules.get(), key=lambda r: r['pos'])][:3]
        assert 'from the monitoring host ' + MONITOR in comments[1], comments
        options = ct.firewall.options.get()
        assert int(options['enable']) == 1 and options['policy_in'] == 'ACCEPT', (node, options)
    gateway = lab_api.nodes(hv(GATEWAY)['pve_container_node']).lxc(hv(GATEWAY)['pve_container_vmid'])
    assert gateway.firewall.rules.get() == []       # not a node: its firewall is left as it is
    monitor = lab_api.nodes(MONITOR_VARS['pve_container_node']).lxc(MONITOR_VARS['pve_container_vmid'])
    assert monitor.firewall.rules.get() == []       # nor Prometheus' (no pve_container_open_ports in the lab)


def test_check_mode_tells_what_would_roll_in_order_and_changes_nothing(fleet, tmp_path):
    """--check of a rollout that switches the SGLang profile (docs/real-host.md: --check --diff first): it ran into the
    launch-line check with the old build's sglang, which refused the new profile's flags, so check mode stopped at
    the first node; a changed helper file the unit runs broke it (its check-mode result has no dest); a new admin key
    for the gateway failed every node's membership check (the gateway takes it only when restarted). Now each
    node says it would leave the gateway and roll, in the play's order, and nothing changes: the gateway keeps both
    workers, the engines keep running on the files they had."""
    first, second = NODES
    before = {n: unit_state(fleet, n) for n in NODES}
    # the engine's program (the lab's emulator: a file the unit runs, from the controller) changed as well
    changed = tmp_path / 'sglang-emulator'
    with open(os.path.join(ROOT, 'scripts', 'lab', 'sglang_emulator.py')) as fh:
        changed.write_text(fh.read() + '# changed\n')
    # and the gateway's admin key: the gateway takes it when the real run restarts it, so in check mode it does not
    # answer the nodes' membership checks with it (which stopped every node)
    # (the wheel cache's room check off: the lane's caches hold seed-validated's wheels alone, and a machine with ~20 GB
    # free has no room for current's 9.3 GiB beside a second build on each node - the check says so, rightly, and is
    # tested on the container-stage node; this test is about the rollout's check mode)
    run = site({'sglang_env_profile': 'current', 'lab_sglang_emulator': str(changed),
                'sglang_gateway_admin_key': 'a-new-admin-key-for-check-mode-0123456789',
                'sglang_env_cache_room_check': False}, '--tags', 'sglang', '--check',
               '--diff', inventory=fleet['inventory'], sglang=True)
    assert run.rc == 0, run
    would = [run.out.index('Check mode: {0} would leave {1}'.format(n, GATEWAY)) for n in NODES]
    assert would == sorted(would), 'the rollout\'s order is the play\'s: {0} first'.format(first)
    assert run.out.count('would be built first (sglang_env)') == 2, run
    # each node says the gateway did not answer with the new key, rather than failing (the YAML output doubles ')
    said = re.findall(r"Check mode: {0}'+s control plane \(\S+/workers\) answered 401".format(re.escape(GATEWAY)), run.out)
    assert len(said) >= len(NODES), run
    assert {n: unit_state(fleet, n) for n in NODES} == before
    assert Workers(fleet['url'], fleet['admin'], fleet['ca']).now() == set(fleet['worker'].values())


def test_a_rollout_refused_the_first_nodes_lock_leaves_it_in_the_gateway_and_glm5_undrain_is_refused_too(fleet):
    """A deploy that must restart the first node while another run drives its engine (glm5 bench, a second operator)
    is refused before the node leaves the gateway: it used to leave first, wait for the lock, and stop with the node
    out of the gateway, saying "Nothing was changed". glm5 undrain is refused under that lock too (a deploy holds it
    while it has the node out for its restart). What must restart: the environment file, touched after the engine
    started (its text as it was: the tests after this one find the configuration they expect)."""
    first = NODES[0]
    c = fleet['nodes'][first]
    before = unit_state(fleet, first)
    ssh(first, 'touch', c['env_file'])
    hold_lock('a test holds the engine', hv(first), c['lock_unit'])
    try:
        run, load, w, took = rollout(fleet, dict(ROLLOUT_SMOKE, sglang_service_lock_wait=6),
                                     '--limit', '{0},gateways'.format(first))
        undrain = subprocess.run([GLM5, '-i', fleet['inventory'], 'undrain', first], capture_output=True, text=True,
                                 timeout=300, stdin=subprocess.DEVNULL)
    finally:
        ssh(first, 'systemctl', 'stop', c['lock_unit'])
    assert run.rc != 0, run
    assert '{0}: another run drives the engine: {1} is held by "a test holds the engine"'.format(
        first, c['lock_unit']) in run.out, run
    assert 'Member | out of each gateway' not in run.out, 'the node left its gateway before the lock was taken'
    assert unit_state(fleet, first)[:2] == before[:2], 'the engine was restarted under the lock'
    # both nodes healthy in the gateway throughout, and no request failed
    assert all(isinstance(h, set) and h == set(fleet['worker'].values()) for _, h in w.samples), w.samples
    assert load.failed == 0 and load.ok > 0, (load.ok, load.failed, load.errors)
    assert undrain.returncode == 1 and 'Traceback' not in undrain.stderr, (undrain.stdout, undrain.stderr)
    assert undrain.stderr.strip().splitlines()[-1] == (
        'glm5: {0}: another run drives the engine: {1} is held by "a test holds the engine"; try again when it is done '
        '(if that run is gone: systemctl stop {1} in the container)'.format(first, c['lock_unit'])), undrain.stderr
    print('lock-refused rollout: {0:.0f} s, {1} answered, {2} failed'.format(took, load.ok, load.failed))


def test_a_change_the_first_node_fails_stops_the_rollout_there_and_the_other_node_serves(fleet):
    first, second = NODES
    before = {n: unit_state(fleet, n) for n in NODES}
    bad = dict(ROLLOUT_SMOKE, sglang_service_flag_overrides=FLAG_CHANGE,
               sglang_service_env={'GLM5_EMULATOR_SPEED': str(hv(first)['lab_emulator_speed']),
                                   'GLM5_EMULATOR_FAULTS': 'nan'})
    run, load, w, took = rollout(fleet, bad)
    assert run.rc != 0, run
    assert 'The smoke test of {0} failed'.format(first) in run.out, run
    assert 'Rolled back to the unit and environment file that passed run' in run.out, run
    # the first node: back on the configuration that passed (its files as before, the failed ones kept), serving
    pid, _, files = unit_state(fleet, first)
    assert files == before[first][2] and pid != before[first][0]
    assert 'nan' in ssh(first, 'cat', fleet['nodes'][first]['env_file'] + fleet['nodes'][first]['failed_suffix'])
    # the rollout stopped there: the second node was not touched
    assert unit_state(fleet, second) == before[second], 'the rollout went on past a failed node'
    # the failed node stays out of the gateway; the other one served every request meanwhile
    healthy = Workers(fleet['url'], fleet['admin'], fleet['ca']).now()
    assert healthy == {fleet['worker'][second]}, healthy
    assert all(isinstance(h, set) and fleet['worker'][second] in h for _, h in w.samples), w.samples
    assert load.failed == 0 and load.ok > 0, (load.ok, load.failed, load.errors)
    print('failing rollout: {0:.0f} s, {1} answered, {2} failed'.format(took, load.ok, load.failed))


def prometheus(expr):
    """The one value of a PromQL expression on the lane's Prometheus (the monitoring container), now."""
    (series,) = prometheus_api('http://127.0.0.1:{0}'.format(MONITOR_VARS['prometheus_port']),
                               '/api/v1/query?' + urllib.parse.urlencode({'query': expr}))['result']
    return float(series['value'][1])


def fleet_runs():
    """The gateway's fleet smoke-test runs, as its bench history's index lists them."""
    path = os.path.join(hv(GATEWAY)['pve_container_bench_history_dir'], 'index.jsonl')
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def secrets_in(text, secrets):
    """[(which secret, line number)] of each secret found in text: never the secret itself."""
    return [(name, n) for n, line in enumerate(text.splitlines(), 1) for name, value in secrets.items() if value in line]


def test_a_flag_change_with_a_second_key_rolls_one_node_at_a_time_under_load_with_no_failed_request(
        fleet, record_testsuite_property):
    """A flag change, and in the same run a key change's first step (docs/security.md: the fleet's next key as the
    secondary, glm5_fleet_api_key_secondary): the gateway hands off to a restart taking both keys, then each node
    leaves it, restarts, is smoke-tested and rejoins, one at a time. The clients stay on the key throughout; after it
    the next key is served too (tests/test_secrets.py makes it the key, last in the lane). Run at -vvv, what an operator
    debugging a rollout turns on: no secret in its output (either key, the gateway's admin key, the PVE password): every
    task that handles one is no_log. Each node's engine lock is held once, from its restart to its smoke test's end:
    no moment between readiness and the test in which glm5 undrain could put the node back (it used to be let go at
    readiness and taken again by the test)."""
    first, second = NODES
    before, fleet_before, since = {n: unit_state(fleet, n) for n in NODES}, fleet_runs(), time.time() - 1
    change = dict(ROLLOUT_SMOKE, sglang_service_flag_overrides=FLAG_CHANGE, glm5_fleet_api_key_secondary=FLEET_NEXT_KEY)
    assert ask(fleet, FLEET_NEXT_KEY) == 401                  # not served before
    run, load, w, took = rollout(fleet, change, '--tags', 'gateway', '-vvv')
    assert run.rc == 0, run
    assert ask(fleet, FLEET_NEXT_KEY) == 200 and ask(fleet, fleet['key']) == 200     # both keys served: clients may move
    with open(paths()['password']) as fh:
        secrets = {'the API key': fleet['key'], 'the admin key': fleet['admin'], 'the PVE password': fh.read().strip(),
                   'the next key': FLEET_NEXT_KEY}
    assert min(len(v) for v in secrets.values()) >= 16
    assert 'ESTABLISH' in run.raw, 'not a -vvv run'
    assert secrets_in(run.raw, secrets) == [], 'a secret in the -vvv output (which, at which line)'
    after = {n: unit_state(fleet, n) for n in NODES}
    flag = '--{0} {1}'.format(*next(iter(FLAG_CHANGE.items())))
    for n in NODES:
        assert after[n][0] != before[n][0], '{0} was not restarted'.format(n)
        assert flag in after[n][2] and flag not in before[n][2], n
    # one at a time, in the inventory's order: the first node back in the gateway (it was out since the failed
    # rollout) before the second left it; at every moment a node served
    samples = [h for _, h in w.samples]
    assert samples and all(isinstance(h, set) and h for h in samples), samples
    first_out, second_out = out_of_gateway(w, fleet['worker'][first]), out_of_gateway(w, fleet['worker'][second])
    assert first_out and second_out, samples
    assert max(first_out) < min(second_out), samples
    assert after[first][1] < after[second][1]
    assert Workers(fleet['url'], fleet['admin'], fleet['ca']).now() == set(fleet['worker'].values())
    assert load.failed == 0 and load.ok > 0, (load.ok, load.failed, load.errors)
    # one hold of each node's engine lock: the restart's, kept through the smoke test (not taken again by it)
    for n in NODES:
        holds = lock_holds(fleet, n, since)
        assert len(holds) == 1 and 'deploy (sglang_service, then its smoke test) from ' in holds[0], (n, holds)
    # the gateway's second smg served during the hand-off, and Prometheus scraped it then (its own job); now it is down
    assert prometheus('max_over_time(up{{job="glm5-gateway-handoff"}}[{0}s])'.format(round(took) + 120)) == 1
    assert prometheus('up{job="glm5-gateway-handoff"}') == 0
    # then the fleet smoke test through the gateway: swept (its nodes changed) and passed, both nodes counted
    new = fleet_runs()[len(fleet_before):]
    assert len(new) == 1 and new[0]['passed'] and sorted(new[0]['nodes']) == sorted(NODES), new
    # its clients shared the engines with the steady ones (each engine's load report, read before each side): judged
    # against the nodes driven directly in the same run, not their idle baselines, which a fleet under load misses
    assert new[0]['levels'] and all(lv['others'] > 0 for lv in new[0]['levels'].values()), new[0]['levels']
    record_testsuite_property('fleet_rollout_seconds', round(took))
    print('flag change and second key rollout: {0:.0f} s, {1} answered, {2} failed'.format(took, load.ok, load.failed))
