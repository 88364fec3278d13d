"""glm5 fleet, drain and undrain, and the gateway's section of glm5 status (scripts/glm5/fleet.py).

Without a lab: the view and its table from the lab gateway's recorded /workers and metrics (tests/fixtures/gateway),
each node's worker URL from the lab inventory through the role's own filter, the arguments, and the one-line errors of
an inventory without a gateway or with several. With a real gateway of its own (marked sglang: the engine emulator
needs the seed-validated profile's sglang): smg from this venv, started here in front of two engine emulators, and
glm5's functions and commands run against it with this machine as both containers (a local shell, not SSH): drain
waits for a request in flight, is idempotent, says when its bound passed, and undrain puts the node back healthy; no
key is in the output, in --json, or on a command line.
"""
import contextlib
import json
import os
import stat
import subprocess
import sys
import threading
import time
import types

import pytest
import requests
from glm5 import cli, commands, fleet
from glm5.errors import Interrupted, OpsError
from glm5.inventory import Inventory, filter_plugin
from glm5.render import status_text
from glm5.transport import Local
from siterun import ROOT

FIXTURES = os.path.join(ROOT, 'tests', 'fixtures', 'gateway')
LAB = os.path.join(ROOT, 'inventories', 'lab')
LAB_NODES = [{'node': 'glm5-lab', 'url': 'http://127.0.0.1:30120'}, {'node': 'glm5-lab2', 'url': 'http://127.0.0.1:30121'}]


@pytest.fixture(autouse=True)
def inventories(monkeypatch):
    """Several inventories in this process (glm5 runs in-process here): Ansible sets up its vault secrets once a
    process (glm5 reads one inventory a run), so each inventory's replace the last's, and the process's are put back."""
    from ansible.parsing.vault import VaultSecretsContext
    monkeypatch.setattr(VaultSecretsContext, '_current', VaultSecretsContext._current)
    monkeypatch.setattr(VaultSecretsContext, 'initialize', classmethod(lambda cls, value: setattr(cls, '_current', value)))


def recorded():
    with open(os.path.join(FIXTURES, 'workers.json')) as fh:
        workers = json.load(fh)['workers']
    with open(os.path.join(FIXTURES, 'metrics.txt')) as fh:
        return workers, fleet.circuit_states(fh.read())


def test_the_recorded_gateway_as_glm5_fleet_shows_it():
    workers, circuits = recorded()
    assert circuits == {'http://127.0.0.1:30120': 'closed'}
    v = fleet.fleet_view('glm5-gw', LAB_NODES, workers, [], circuits)
    assert [(r['node'], r['in_gateway'], r['healthy'], r['status'], r['load'], r['circuit'], r['drained'])
            for r in v['workers']] == [('glm5-lab', True, True, 'ready', 0, 'closed', False),
                                       ('glm5-lab2', False, None, 'out', None, None, False)]
    assert v['problems'] == ['glm5-lab2 is not in glm5-gw and not drained: a deploy adds it once its smoke test passes; '
                             'glm5 undrain glm5-lab2 adds it now']
    assert fleet.fleet_text(v).splitlines()[:4] == [
        'glm5-gw: 1 of 2 nodes in, 1 healthy, 0 drained',
        'node       worker                  healthy  status  in flight  circuit  drained',
        'glm5-lab   http://127.0.0.1:30120  yes      ready           0  closed   no',
        'glm5-lab2  http://127.0.0.1:30121  -        out             -  -        no']
    # drained by an operator: out is what it should be
    mark = {'node': 'glm5-lab2', 'worker': 'http://127.0.0.1:30121', 'since': '2026-12-01T17:00:00Z', 'by': 'ops@ctl'}
    v = fleet.fleet_view('glm5-gw', LAB_NODES, workers, [mark], circuits)
    assert v['problems'] == [] and v['notes'] == [] and v['drained'] == 1
    assert fleet.fleet_text(v).splitlines()[3].endswith('out             -  -        yes, by ops@ctl since 2026-12-01T17:00:00Z')


def test_unhealthy_open_circuit_stray_worker_and_a_drained_node_still_in():
    workers, _ = recorded()
    w = workers[0]
    two = [dict(w, is_healthy=False, status='not_ready'), dict(w, url='http://127.0.0.1:30121', id='b'),
           dict(w, url='http://10.9.9.9:1', id='c')]
    circuits = {'http://127.0.0.1:30120': 'open', 'http://127.0.0.1:30121': 'half-open'}
    v = fleet.fleet_view('gw', LAB_NODES, two, [], circuits)
    assert v['problems'] == ['glm5-lab is unhealthy in gw (status not_ready, circuit open)']
    assert v['notes'] == ['glm5-lab2: its circuit in gw is half-open (failed requests; the gateway tries it again)',
                          'gw routes to http://10.9.9.9:1, which is no node of the inventory']
    v = fleet.fleet_view('gw', LAB_NODES, two[1:2], [{'node': 'glm5-lab2', 'by': 'a@b', 'since': 'T'}], {})
    assert v['notes'] == ['glm5-lab2 is drained (by a@b since T) but gw still routes to it: glm5 drain glm5-lab2 takes '
                          'it out again']
    assert v['problems'] == ['glm5-lab is not in gw and not drained: a deploy adds it once its smoke test passes; glm5 '
                             'undrain glm5-lab adds it now']


def test_a_node_the_gateway_could_not_ask_what_it_serves_is_a_problem():
    """Seen in the lab (a key change stopped half way): smg adds a worker that refuses its key under the model
    'unknown', healthy (its /health takes no key), and refuses every request for the model: glm5 must not call it in."""
    workers, circuits = recorded()
    v = fleet.fleet_view('glm5-gw', LAB_NODES[:1], [dict(workers[0], model_id='unknown')], [], circuits)
    assert v['problems'] == [
        'glm5-lab is in glm5-gw under the model unknown: the gateway could not ask it what it serves (the node refuses '
        'the key it was added with); every request for it is refused (glm5 drain then undrain glm5-lab adds it again '
        'with the node\'s key)']
    assert fleet.fleet_view('glm5-gw', LAB_NODES[:1], workers, [], circuits)['problems'] == []


def test_the_lab_gateway_its_contract_and_worker_urls_from_the_roles_filter():
    """Read from the inventory only (nothing is contacted): the worker URLs as sglang_fleet_workers computes them,
    with no key rendered on the way."""
    inv = Inventory(LAB)
    gw, = fleet.gateways(inv)
    assert gw.name == 'glm5-gw' and gw.nodes == [dict(n, known=True) for n in LAB_NODES]
    assert gw.contract['ca_cert'] == '/var/lib/glm5-lab/fleet/gateway-ca/ca.crt'
    assert gw.contract['ca_file'] == '/usr/local/share/ca-certificates/glm5-gateway-ca.crt'
    assert gw.contract['client_url'] == 'https://127.0.0.1:30130'
    assert {k: gw.contract[k] for k in ('service', 'url', 'metrics_url', 'drained_file', 'env_file')} == {
        'service': 'glm5-gateway', 'url': 'https://127.0.0.1:30130', 'metrics_url': 'http://127.0.0.1:29130/metrics',
        'drained_file': '/etc/glm5/glm5-gateway.drained.json', 'env_file': '/etc/glm5/glm5-gateway.env'}
    workers = filter_plugin('sglang_fleet_workers')(['glm5-lab'], fleet._Hostvars(inv), inv.defaults)
    assert workers[0]['url'] == 'http://127.0.0.1:30120' and workers[0]['key'] == ''
    assert [g.name for g in fleet.in_front(inv, 'glm5-lab2')] == ['glm5-gw']


def test_arguments():
    p = cli.parser()
    a = p.parse_args(['drain', 'glm5-lab2', '--timeout', '30'])
    assert (a.command, a.target, a.timeout) == ('drain', 'glm5-lab2', 30)
    assert not a.force and p.parse_args(['drain', 'glm5-lab2', '--force']).force
    assert p.parse_args(['restart', '--force']).force and not p.parse_args(['restart']).force
    a = p.parse_args(['-n', 'glm5-lab', 'undrain', '--json'])
    assert (a.command, a.target, a.node, a.timeout, a.json) == ('undrain', None, 'glm5-lab', None, True)
    assert p.parse_args(['fleet', '-g', 'gw2']).gateway == 'gw2'
    assert p.parse_args(['status']).gateway is None
    with pytest.raises(SystemExit) as e:
        p.parse_args(['drain', 'x', '--timeout', '0'])
    assert e.value.code == 2


def write_inventory(path, gateways=(), **hosts):
    doc = {'all': {'children': {'inference_nodes': {'hosts': hosts or {'n1': {}}}}}}
    if gateways:
        doc['all']['children']['gateways'] = {'hosts': {g: {} for g in gateways}}
    path.mkdir(exist_ok=True)
    (path / 'hosts.yml').write_text(json.dumps(doc))
    return str(path)


def one_error_line(capsys, argv, code=2):
    assert cli.main(argv) == code
    out = capsys.readouterr()
    assert out.out == '' and len(out.err.splitlines()) == 1, out
    return out.err.strip()


def test_ctrl_c_is_one_line_and_exit_130_not_a_traceback(tmp_path, capsys, monkeypatch):
    """Any command interrupted where it changes nothing of its own says so in one line (glm5 restart and drain say
    where they left the node: the tests with a real gateway below)."""
    def interrupted(args, inv):
        raise KeyboardInterrupt
    monkeypatch.setitem(cli.COMMANDS, 'history', interrupted)
    with ctrl_c_kept():
        said = one_error_line(capsys, ['history', '-i', write_inventory(tmp_path / 'inv')], code=130)
    assert said == 'glm5: interrupted'


def test_no_gateway_several_gateways_and_no_node_are_one_line_each(tmp_path, capsys):
    none = write_inventory(tmp_path / 'none')
    for argv in (['fleet'], ['drain', 'n1'], ['undrain', 'n1'], ['status', '-g', 'gw']):
        assert one_error_line(capsys, argv + ['-i', none]) == 'glm5: {0} has no gateway (no hosts in gateways)'.format(none)
    two = write_inventory(tmp_path / 'two', gateways=('gw1', 'gw2'))
    assert one_error_line(capsys, ['fleet', '-i', two]) == (
        'glm5: {0} has 2 gateways (gw1, gw2): pick one with -g GATEWAY'.format(two))
    assert one_error_line(capsys, ['fleet', '-i', two, '-g', 'gw3']) == (
        "glm5: unknown gateway 'gw3': {0} has gw1, gw2".format(two))
    assert one_error_line(capsys, ['drain', '-i', two]) == 'glm5: drain needs the node: glm5 drain NODE (one of n1)'
    assert one_error_line(capsys, ['drain', 'n9', '-i', two]) == "glm5: unknown node 'n9': {0} has n1".format(two)


def test_status_without_a_gateway_is_as_it_was(tmp_path, capsys, monkeypatch):
    inv = write_inventory(tmp_path / 'none')
    canned = {'node': 'n1', 'problems': [], 'container': {'vmid': 1, 'node': 'pve1', 'status': 'running', 'uptime_s': 5},
              'drivers': {}, 'last_smoke': None}
    monkeypatch.setattr(commands, 'node_status', lambda node: dict(canned))
    assert cli.main(['status', '-i', inv]) == 0
    assert capsys.readouterr().out == status_text(canned) + '\n'
    assert cli.main(['status', '-i', inv, '--json']) == 0
    assert json.loads(capsys.readouterr().out) == {'healthy': True, 'nodes': [canned]}


def test_status_says_the_gateways_front_door_is_down_and_names_a_running_hand_off(monkeypatch):
    """The client port is HAProxy's (sglang_gateway's front door): smg running behind a stopped one serves nobody."""
    from types import SimpleNamespace
    contract = {'service': 'glm5-gateway', 'front_service': 'haproxy', 'handoff_service': 'glm5-gateway-handoff',
                'ready_path': '/health'}
    units = {'glm5-gateway': 'active', 'haproxy': 'failed', 'glm5-gateway-handoff': 'active'}
    monkeypatch.setattr(fleet, 'unit_state', lambda shell, name: {
        'name': name, 'load': 'loaded', 'active': units[name], 'sub': 'running' if units[name] == 'active' else 'failed',
        'since': None, 'uptime_s': None, 'restarts': 0})
    monkeypatch.setattr(fleet, 'ask', lambda shell, method, url, **kw: {'status': 200, 'seconds': 0.01})
    monkeypatch.setattr(fleet, 'fleet_text', lambda v, indent, head: head + 'two nodes in')
    gw = SimpleNamespace(name='gw', url='https://127.0.0.1:8000', shell=None, contract=contract,
                         view=lambda: {'problems': []})
    st = fleet.gateway_status(gw)
    assert st['problems'] == ['the front door haproxy is failed (failed): clients cannot reach the gateway']
    text = fleet.gateway_text(st)
    assert 'gw (gateway): UNHEALTHY' in text
    assert "  front door  haproxy failed (failed), the hand-off's glm5-gateway-handoff active" in text, text
    units.update(haproxy='active', **{'glm5-gateway-handoff': 'inactive'})
    st = fleet.gateway_status(gw)
    assert st['problems'] == [] and '  front door  haproxy active (running)\n' in fleet.gateway_text(st) + '\n'



@pytest.mark.parametrize('text, words', [
    ('[{"node": "n1"},]', 'is not JSON (Expecting value'),
    ('{"n1": "drained"}', 'is not a list of drained nodes ({"node": NAME, ...} each): a JSON object; mend it'),
    ('["n1"]', 'is not a list of drained nodes ({"node": NAME, ...} each): entry 1 ("n1")'),
])
def test_a_drained_file_edited_by_hand_is_read_and_refused_as_a_deploy_refuses_it(tmp_path, text, words):
    """glm5 reads the gateway's drained file as site.yml does (the sglang_drained_text filter): what a deploy stops
    on, status and fleet report, and drain/undrain change nothing in it, each one line."""
    path = tmp_path / 'gw.drained.json'
    path.write_text(text)
    gw = fleet.Gateway('gw', {'url': 'http://127.0.0.1:9', 'drained_file': str(path)},
                       Local(types.SimpleNamespace(name='gw')), [])
    with pytest.raises(OpsError) as e:
        gw.drained()
    assert str(e.value).startswith('{0} on gw '.format(path)) and words in str(e.value), str(e.value)
    for op in ('add', 'remove'):
        with pytest.raises(OpsError) as e:
            gw.mark(op, 'n1', {'node': 'n1'})
        assert str(e.value).startswith('gw: cannot {0} n1 in {1}: {1} is not'.format(op, path)), str(e.value)
        assert 'mend it, or remove it' in str(e.value) and 'Error' not in str(e.value), str(e.value)
    assert path.read_text() == text
    path.write_text('[{"node": "n1", "worker": "http://127.0.0.1:30000"}]')
    assert gw.drained() == [{'node': 'n1', 'worker': 'http://127.0.0.1:30000'}]


# ---- against a real gateway of its own (smg in front of two engine emulators on this machine)

ADMIN = 'adm1nK3y-' + os.urandom(12).hex()
FLEET = 'fl33tK3y-' + os.urandom(12).hex()
SMG = os.path.join(os.path.dirname(sys.executable), 'smg')


class Recorder(Local):
    """This machine as a container's shell, keeping every command line it ran (what the far side's ps would show)."""
    lines = []

    def __init__(self, name):
        super().__init__(types.SimpleNamespace(name=name))

    def run(self, cmd, timeout=60, stdin=None):
        Recorder.lines.append(cmd)
        return super().run(cmd, timeout=timeout, stdin=stdin)


@pytest.fixture(scope='module')
def lab(tmp_path_factory):
    """Two emulators (n1, n2) and a gateway in front of both; the gateway's files (environment file with the keys,
    drained list) in a folder of the test's."""
    from sglang_envs import environment
    from test_sglang_emulator import Engine, free_port
    top = tmp_path_factory.mktemp('gw')
    model = str(top / 'GLM-5-NVFP4')
    subprocess.run([sys.executable, os.path.join(ROOT, 'scripts', 'lab', 'stand_in_model.py'), model], check=True,
                   capture_output=True)
    python = os.path.join(environment('seed-validated')[1], 'bin', 'python')
    engines = [Engine(python, model, extra=['--api-key=' + FLEET]) for _ in range(2)]
    # The gateway starts once both engines answer, and registers them when its start-up bound has passed: smg 1.13 asks
    # a start-up worker what it is without the worker key (401 from an engine with a key), and after the bound takes it
    # for sglang (the role's sglang_gateway_worker_startup_timeout says more). The gateway's log is kept for the message.
    try:
        for e in engines:
            e.wait()
    except BaseException:
        for e in engines:
            e.stop()
        raise
    port, metrics = free_port(), free_port()
    log = open(str(top / 'gateway.log'), 'w')
    gateway = subprocess.Popen([SMG, 'launch', '--host', '127.0.0.1', '--port', str(port), '--prometheus-host',
                                '127.0.0.1', '--prometheus-port', str(metrics), '--api-key', FLEET,
                                '--control-plane-api-keys', 'glm5:glm5-ops:admin:' + ADMIN, '--disable-tokenizer-autoload',
                                '--health-check-interval-secs', '1', '--policy', 'round_robin',
                                '--worker-startup-timeout-secs', '3', '--worker-startup-check-interval', '1',
                                '--shutdown-grace-period-secs', '1', '--worker-urls']
                               + [e.url for e in engines], stdout=log, stderr=subprocess.STDOUT)
    try:
        (top / 'etc').mkdir()
        (top / 'etc' / 'gw.env').write_text('SMG_API_KEY={0}\nSMG_ADMIN_KEY={1}\nNO_COLOR=1\n'.format(FLEET, ADMIN))
        (top / 'key').write_text(FLEET + '\n')
        # (smg alone here, its port the client port: the front door's and the hand-off's units are none of this machine's)
        contract = {'service': 'glm5-test-gateway', 'front_service': 'glm5-test-front',
                    'handoff_service': 'glm5-test-gateway-handoff', 'url': 'http://127.0.0.1:{0}'.format(port),
                    'metrics_url': 'http://127.0.0.1:{0}/metrics'.format(metrics), 'ready_path': '/health',
                    'env_file': str(top / 'etc' / 'gw.env'), 'drained_file': str(top / 'etc' / 'gw.drained.json')}
        nodes = [{'node': 'n{0}'.format(i + 1), 'url': e.url} for i, e in enumerate(engines)]
        gw = fleet.Gateway('gw', dict(contract, nodes=['n1', 'n2']), Recorder('gw'), nodes)
        node = {n['node']: types.SimpleNamespace(name=n['node'], ssh=Recorder(n['node']),
                                                 contract={'url': n['url'], 'key_file': str(top / 'key')})
                for n in nodes}

        def both_healthy():
            try:
                return len([w for w in gw.workers() if w['is_healthy']]) == 2
            except OpsError:            # not listening yet: it was started a moment ago
                return False
        assert fleet._wait(both_healthy, 60, 0.5), (top / 'gateway.log').read_text()[-3000:]
        yield types.SimpleNamespace(gw=gw, node=node, engines=engines, top=top, contract=contract, port=port,
                                    metrics=metrics)
    finally:
        gateway.terminate()
        gateway.wait(30)
        log.close()
        for e in engines:
            e.stop()


def ask(engine, tokens):
    """A request straight to the node (the drain waits for the node's own count)."""
    body = {'model': 'glm-5', 'prompt': 'the city of water', 'max_tokens': tokens, 'ignore_eos': True}
    return requests.post(engine.url + '/v1/completions', json=body, headers={'Authorization': 'Bearer ' + FLEET},
                         timeout=120)


def in_flight_beside(engine, tokens):
    """A request in flight on the node, in a thread, until the node counts it: -> (thread, its answer in a list)."""
    got = []
    t = threading.Thread(target=lambda: got.append(ask(engine, tokens)))
    t.start()
    assert fleet._wait(lambda: requests.get(engine.url + '/v1/loads', headers={'Authorization': 'Bearer ' + FLEET},
                                            timeout=5).json()['loads'][0]['num_running_reqs'] > 0, 30, 0.1)
    return t, got


def state(lab):
    v = lab.gw.view()
    return {r['node']: (r['in_gateway'], r['healthy'], r['drained']) for r in v['workers']}, v


@pytest.mark.sglang
def test_the_view_of_a_real_gateway(lab):
    rows, v = state(lab)
    assert rows == {'n1': (True, True, False), 'n2': (True, True, False)} and v['problems'] == []
    assert {r['circuit'] for r in v['workers']} == {'closed'}
    st = fleet.gateway_status(lab.gw)
    assert st['health']['ok'] and st['fleet']['in'] == 2
    assert 'gw (gateway): UNHEALTHY' in fleet.gateway_text(st)   # its unit is none of this machine's


@pytest.mark.sglang
def test_drain_waits_for_the_request_in_flight_and_undrain_puts_it_back(lab):
    said = []
    # ~11 s at the seeds' pace; smg 1.13 drains a removed worker for 5 s (no new requests) before it leaves the list
    t, got = in_flight_beside(lab.engines[1], 90)
    res = fleet.drain([lab.gw], lab.node['n2'], 60, said.append, interval=0.3)
    t.join(60)
    assert res['drained'] and res['in_flight'] == 0 and res['waited_s'] >= 1, (res, said)
    assert got[0].status_code == 200 and got[0].json()['usage']['completion_tokens'] == 90   # not cut short
    assert said[0] == 'n2: out of gw ({0}), marked drained'.format(lab.engines[1].url)
    assert any(' in flight after ' in s for s in said) and said[-1].startswith('n2: drained, nothing in flight after ')
    rows, v = state(lab)
    assert rows == {'n1': (True, True, False), 'n2': (False, None, True)} and v['problems'] == []
    path = lab.contract['drained_file']
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o644 and (os.geteuid() != 0 or st.st_uid == 0)
    with open(path) as fh:
        mark, = json.load(fh)
    assert mark['node'] == 'n2' and mark['worker'] == lab.engines[1].url and mark['by'].count('@') == 1
    assert [x for x in os.listdir(os.path.dirname(path)) if x.startswith('.')] == []    # no temporary file left
    # again: says so, keeps the first mark
    said.clear()
    res = fleet.drain([lab.gw], lab.node['n2'], 60, said.append)
    assert res['drained'] and said[0] == 'n2: not in gw ({0}), drained already by {1} since {2}'.format(
        lab.engines[1].url, mark['by'], mark['since'])
    with open(path) as fh:
        assert json.load(fh) == [mark]
    # back
    said.clear()
    res = fleet.undrain([lab.gw], lab.node['n2'], 60, said.append)
    assert res['healthy'] and said[0] == 'n2: added to gw ({0}), no longer drained'.format(lab.engines[1].url), said
    rows, v = state(lab)
    assert rows == {'n1': (True, True, False), 'n2': (True, True, False)} and v['problems'] == []
    with open(path) as fh:
        assert json.load(fh) == []
    said.clear()
    assert fleet.undrain([lab.gw], lab.node['n2'], 60, said.append)['healthy']
    assert said[0] == 'n2: in gw ({0})'.format(lab.engines[1].url)


@pytest.mark.sglang
def test_a_restart_leaves_and_rejoins_unrecorded_and_an_operators_drain_stays(lab):
    """glm5 restart behind a gateway (record=False): out without a mark in the drained file, back in after; a node an
    operator drained stays out through it."""
    path, said = lab.contract['drained_file'], []
    res = fleet.drain([lab.gw], lab.node['n2'], 60, said.append, interval=0.3, record=False)
    assert res['drained'] and said[0] == 'n2: out of gw ({0})'.format(lab.engines[1].url), said
    rows, _ = state(lab)
    assert rows['n2'] == (False, None, False)           # out, and not drained by anyone
    assert not os.path.exists(path) or json.load(open(path)) == []
    said.clear()
    assert fleet.undrain([lab.gw], lab.node['n2'], 60, said.append, record=False)['healthy']
    assert said[0] == 'n2: added to gw ({0})'.format(lab.engines[1].url), said
    assert state(lab)[0]['n2'] == (True, True, False)
    # an operator's drain: the restart's leave finds it out already, its rejoin keeps it out
    assert fleet.drain([lab.gw], lab.node['n2'], 60, lambda text: None)['drained']
    with open(path) as fh:
        mark, = json.load(fh)
    try:
        said.clear()
        assert fleet.drain([lab.gw], lab.node['n2'], 60, said.append, record=False)['drained']
        assert 'drained already by ' in said[0], said
        said.clear()
        res = fleet.undrain([lab.gw], lab.node['n2'], 60, said.append, record=False)
        assert res['healthy'] and res['gateways'][0]['kept_out'] and said == [
            'n2: stays out of gw: drained by {0} since {1} (glm5 undrain n2 puts it back)'.format(mark['by'],
                                                                                                  mark['since'])]
        assert state(lab)[0]['n2'] == (False, None, True)
        with open(path) as fh:
            assert json.load(fh) == [mark]
    finally:
        assert fleet.undrain([lab.gw], lab.node['n2'], 60, lambda text: None)['healthy']


@pytest.mark.sglang
def test_an_operators_drain_while_a_restart_puts_the_node_back_is_kept(lab):
    """glm5 drain in the moment between glm5 restart's reading of the drained file and its adding the node back: the
    mark is written, the node is not in the gateway yet, so the drain takes nothing out. The put-back reads the file
    again once the node is in, and takes it out again (as the deploy's join does: drained_meanwhile.yml)."""
    said = []
    assert fleet.drain([lab.gw], lab.node['n2'], 60, said.append, interval=0.3, record=False)['drained']
    entry = {'node': 'n2', 'worker': lab.engines[1].url, 'since': '2026-12-07T10:00:00Z', 'by': 'ops@test'}

    def say(text):              # the operator's drain marks the node as soon as the restart has added it
        said.append(text)
        if text.startswith('n2: added to gw'):
            assert lab.gw.mark('add', 'n2', entry) is None
    try:
        said.clear()
        res = fleet.undrain([lab.gw], lab.node['n2'], 60, say, record=False)
        assert said[-1] == ('n2: drained by ops@test since 2026-12-07T10:00:00Z while it was put back into gw: out of '
                            'it again (glm5 undrain n2 puts it back)'), said
        assert res['gateways'][0]['kept_out'] and res['gateways'][0]['drained_before'] == entry
        assert state(lab)[0]['n2'] == (False, None, True)          # out, and marked drained
    finally:
        assert fleet.undrain([lab.gw], lab.node['n2'], 60, lambda text: None)['healthy']
    assert state(lab)[0]['n2'] == (True, True, False)


@contextlib.contextmanager
def ctrl_c_kept():
    """A KeyboardInterrupt that escapes glm5 (the operator's traceback) would end pytest's whole session: it fails the
    test instead."""
    try:
        yield
    except KeyboardInterrupt:
        pytest.fail('Ctrl-C escaped glm5: the operator gets a traceback')


def ctrl_c_at(words):
    """A say() that is Ctrl-C (SIGINT reaches Python as KeyboardInterrupt) the first time the command says words."""
    def say(text):
        if words in text:
            raise KeyboardInterrupt
    return say


def ctrl_c_after_removal(lab, monkeypatch):
    """Ctrl-C at the first look at lab's gateway after a removal, while smg still lists the worker (it drains a
    removed worker ~5 s before it lets go)."""
    remove, workers, removed = lab.gw.remove, lab.gw.workers, []

    def ctrl_c_once_removed():
        if removed and removed.pop():
            raise KeyboardInterrupt
        return workers()
    monkeypatch.setattr(lab.gw, 'remove', lambda i: (remove(i), removed.append(True)))
    monkeypatch.setattr(lab.gw, 'workers', ctrl_c_once_removed)


@pytest.mark.sglang
def test_an_undrain_right_after_an_interrupted_drain_puts_the_node_back_to_stay(lab, monkeypatch):
    """glm5 drain interrupted a moment after the removal, then glm5 undrain at once (tried on make deploy's lab): smg
    still listed the worker, draining it, so undrain took it for in, and it left: 'not listed yet' 120 s later, the
    node neither drained nor in. undrain waits until it has gone, then adds it."""
    ctrl_c_after_removal(lab, monkeypatch)
    with ctrl_c_kept(), pytest.raises(Interrupted):
        fleet.drain([lab.gw], lab.node['n2'], 60, lambda text: None, interval=0.3)
    monkeypatch.undo()
    said = []
    assert fleet.undrain([lab.gw], lab.node['n2'], 30, said.append)['healthy'], said
    assert said[0] == 'n2: added to gw ({0}), no longer drained'.format(lab.engines[1].url), said
    time.sleep(6)                           # longer than smg 1.13 drains a removed worker: it stays
    assert state(lab)[0]['n2'] == (True, True, False)


@pytest.mark.sglang
def test_a_restarts_leave_interrupted_puts_the_node_back(lab, monkeypatch):
    """Ctrl-C in glm5 restart while it waited for the gateway to let the node go (found by trying it on make deploy's
    lab): a traceback, and the node left out of its gateway, unmarked, its engine never restarted. Nothing was
    restarted yet: the node goes back in, and the one line says so. (The first mend put it back while smg still listed
    it, draining it: taken for in, and then it left.)"""
    ctrl_c_after_removal(lab, monkeypatch)
    with ctrl_c_kept(), pytest.raises(Interrupted) as err:
        fleet.drain([lab.gw], lab.node['n2'], 60, lambda text: None, interval=0.3, record=False)
    assert err.value.code == 130
    assert str(err.value) == 'n2: interrupted before the restart: nothing restarted, put back into gw'
    assert state(lab)[0]['n2'] == (True, True, False)
    time.sleep(6)                           # longer than smg 1.13 drains a removed worker (5 s): it stays
    assert state(lab)[0]['n2'] == (True, True, False)


@pytest.mark.sglang
def test_an_operators_drain_interrupted_stays_drained_saying_where(lab):
    """Ctrl-C while glm5 drain waits for the requests in flight: the drain the operator asked for stays (marked, out
    of the gateway); only the wait was cut short, and the line says so and how to put it back."""
    t, got = in_flight_beside(lab.engines[1], 90)
    try:
        with ctrl_c_kept(), pytest.raises(Interrupted) as err:
            fleet.drain([lab.gw], lab.node['n2'], 60, ctrl_c_at(' in flight after '), interval=0.3)
        assert err.value.code == 130 and str(err.value) == (
            'n2: interrupted: marked drained in gw, out of gw; its in-flight requests were not waited for (glm5 drain '
            'n2 again, glm5 undrain n2 puts it back)')
        assert state(lab)[0]['n2'] == (False, None, True)
    finally:
        t.join(60)
        assert fleet.undrain([lab.gw], lab.node['n2'], 60, lambda text: None)['healthy']
    assert got[0].status_code == 200          # the request in flight was not cut short


class StartInterrupted:
    """glm5 restart's node with the lab's n2 behind the real gateway, whose engine's unit is stood in: its stop
    answers, and Ctrl-C lands while it starts. What changes on the gateway is the real gateway's."""
    service = 'glm5-sglang.service'

    def __init__(self, lab):
        self.name, self.contract = 'n2', dict(lab.node['n2'].contract, ready_path='/health_generate')
        self.hv = types.SimpleNamespace(number=lambda var: 30)
        self.shell = lab.node['n2'].ssh          # what glm5 asks the engine (its load) runs for real
        self.ssh = types.SimpleNamespace(name='n2', run=self.run)
        self.ran, self.unlocked = [], False

    def run(self, cmd, timeout=60, **kw):
        if not cmd.startswith('systemctl '):
            return self.shell.run(cmd, timeout=timeout, **kw)
        self.ran.append(cmd)
        if 'systemctl start' in cmd:
            raise KeyboardInterrupt
        return types.SimpleNamespace(ok=True, stdout='', stderr='', exited=0)

    def launch(self):
        return {'base_url': self.contract['url']}

    def lock(self, what):
        pass

    def unlock(self):
        self.unlocked = True

    def close(self):
        pass


@pytest.mark.sglang
def test_a_restart_interrupted_while_its_engine_starts_keeps_it_out_and_says_so(lab, tmp_path, monkeypatch, capsys):
    """From the stop on, the engine is not known ready: the node stays out of its gateway (a request sent there now
    would fail), unmarked, the lock let go; one line says where it stands and what brings it back, exit 130."""
    node = StartInterrupted(lab)
    monkeypatch.setattr(commands, 'Node', lambda inv, name: node)
    monkeypatch.setattr(fleet, 'in_front', lambda inv, name, required=True: [lab.gw])
    inv = write_inventory(tmp_path / 'inv', n2={})
    try:
        with ctrl_c_kept():
            assert cli.main(['restart', '-n', 'n2', '-i', inv, '--timeout', '30']) == 130
        out = capsys.readouterr()
        assert out.err == ('glm5: n2: interrupted while glm5-sglang.service started: it stays out of gw; glm5 restart '
                           '-n n2 again, or glm5 undrain n2 once glm5 status -n n2 says it is ready\n'), out
        assert 'Traceback' not in out.out + out.err and 'n2: out of gw' in out.out
        assert node.unlocked and [c.split(' ')[0:2] for c in node.ran] == [['systemctl', 'stop'], ['systemctl',
                                                                                                  'reset-failed']]
        assert state(lab)[0]['n2'] == (False, None, False)
    finally:
        assert fleet.undrain([lab.gw], lab.node['n2'], 60, lambda text: None)['healthy']


@pytest.mark.sglang
def test_the_last_node_serving_is_not_taken_out_unless_forced(lab):
    """glm5 drain (and glm5 restart's leave) of the last node serving through the gateway, the other drained: refused
    before anything changes, saying why (the role's own check, sglang_leave_problem); --force takes it out."""
    path = lab.contract['drained_file']
    assert fleet.drain([lab.gw], lab.node['n2'], 60, lambda text: None)['drained']
    try:
        with open(path) as fh:
            before = fh.read()
        for record in (True, False):
            with pytest.raises(OpsError) as err:
                fleet.drain([lab.gw], lab.node['n1'], 60, lambda text: None, record=record)
            assert str(err.value) == (
                'n1 is the last node serving through gw (n2: out of it): without it every request through gw fails '
                'until it is back: nothing was changed; undrain another node first, or --force')
        assert state(lab)[0] == {'n1': (True, True, False), 'n2': (False, None, True)}
        with open(path) as fh:
            assert fh.read() == before
        said = []
        assert fleet.drain([lab.gw], lab.node['n1'], 60, said.append, force=True)['drained']
        assert said[0] == 'n1: out of gw ({0}), marked drained'.format(lab.engines[0].url), said
        assert state(lab)[0] == {'n1': (False, None, True), 'n2': (False, None, True)}
    finally:
        for n in ('n1', 'n2'):
            assert fleet.undrain([lab.gw], lab.node[n], 60, lambda text: None)['healthy']


@pytest.mark.sglang
def test_a_drain_past_its_bound_says_so_and_leaves_the_node_drained(lab):
    t, got = in_flight_beside(lab.engines[0], 120)                    # ~15 s
    try:
        res = fleet.drain([lab.gw], lab.node['n1'], 1, lambda text: None, interval=0.3)
        assert not res['drained'] and res['in_flight'] >= 1
        assert fleet.drain_error(res, lab.node['n1'], 1) == (
            'n1: {0} requests still in flight after 1 s (--timeout): it stays drained (out of gw); glm5 drain n1 waits '
            'again, glm5 undrain n1 puts it back'.format(res['in_flight']))
        rows, v = state(lab)
        assert rows['n1'] == (False, None, True) and v['problems'] == []
    finally:
        t.join(60)
        assert fleet.undrain([lab.gw], lab.node['n1'], 60, lambda text: None)['healthy']


@pytest.mark.sglang
def test_the_commands_show_no_key_and_put_none_on_a_command_line(lab, tmp_path, monkeypatch, capsys):
    """glm5 fleet / status / drain / undrain --json through the CLI, with an inventory whose gateway is this machine
    (ansible_connection: local) and whose nodes hold the keys as the lab's do; only the gateway's two file paths are
    the test's (the contract puts them under /etc/glm5), and the nodes' shells are this machine's."""
    inv = tmp_path / 'inv'
    inv.mkdir()
    node = {'ansible_host': '127.0.0.1', 'sglang_service_host': '127.0.0.1', 'sglang_service_api_key': FLEET,
            'sglang_service_api_key_file': str(lab.top / 'key')}
    (inv / 'hosts.yml').write_text(json.dumps({'all': {'children': {
        'inference_nodes': {'hosts': {'n{0}'.format(i + 1): dict(node, sglang_service_port=e.port)
                                      for i, e in enumerate(lab.engines)}},
        'gateways': {'hosts': {'gw': {'ansible_connection': 'local', 'sglang_gateway_port': lab.port,
                                      'sglang_gateway_metrics_port': lab.metrics, 'sglang_gateway_api_key': FLEET,
                                      'sglang_gateway_admin_key': ADMIN,
                                      # the fixture's smg serves plain HTTP (the role's default is HTTPS)
                                      'sglang_gateway_tls': False}}}}}}))
    contract = fleet.gateway_contract
    monkeypatch.setattr(fleet, 'gateway_contract', lambda *a: dict(contract(*a), env_file=lab.contract['env_file'],
                                                                   drained_file=lab.contract['drained_file']))
    monkeypatch.setattr(fleet, 'connect', lambda hv: Recorder(hv.name))
    monkeypatch.setattr(commands.Node, 'ssh', property(lambda self: Recorder(self.name)))
    monkeypatch.setattr(commands, 'node_status', lambda n: {'node': n.name, 'problems': []})
    # the engine's lock (a transient systemd unit; none on this machine): taken by undrain alone, and let go
    locks = []
    monkeypatch.setattr(commands.Node, 'lock', lambda self, what: locks.append((self.name, what)) or setattr(
        self, '_locked', 'glm5-sglang-lock'))
    monkeypatch.setattr(commands.Node, 'unlock', lambda self: locks.append((self.name, 'let go', self._locked))
                        if getattr(self, '_locked', None) else None)
    Recorder.lines.clear()
    outputs = []
    for argv, code in ((['fleet'], 0), (['status'], 1), (['drain', 'n2'], 0), (['fleet'], 0), (['undrain', 'n2'], 0),
                       (['status'], 1)):
        assert cli.main(argv + ['-i', str(inv), '--json']) == code, capsys.readouterr()
        out = capsys.readouterr()
        outputs.append(out.out + out.err)
    views = [json.loads(outputs[i]) for i in (0, 3)]
    assert [[(r['node'], r['in_gateway'], r['drained']) for r in v['workers']] for v in views] == [
        [('n1', True, False), ('n2', True, False)], [('n1', True, False), ('n2', False, True)]]
    status = json.loads(outputs[1])
    assert status['gateway']['gateway'] == 'gw' and status['gateway']['fleet']['in'] == 2
    assert status['nodes'] == [{'node': 'n1', 'problems': []}, {'node': 'n2', 'problems': []}]
    for text in outputs + Recorder.lines:
        assert ADMIN not in text and FLEET not in text
    assert Recorder.lines and any('/workers' in x for x in Recorder.lines)
    assert locks == [('n2', 'glm5 undrain'), ('n2', 'let go', 'glm5-sglang-lock')]


@pytest.mark.sglang
def test_undrain_of_a_node_the_gateway_cannot_reach_says_so(lab):
    """Last: the gateway keeps trying to add it (its job pending, not listed)."""
    from test_sglang_emulator import free_port
    url = 'http://127.0.0.1:{0}'.format(free_port())
    gw = fleet.Gateway('gw', lab.gw.contract, lab.gw.shell, lab.gw.nodes + [{'node': 'n3', 'url': url}])
    n3 = types.SimpleNamespace(name='n3', ssh=Recorder('n3'), contract={'url': url, 'key_file': str(lab.top / 'key')})
    res = fleet.drain([gw], n3, 5, lambda text: None)
    assert res['drained'] and res['loads_status'] == 'refused'       # nothing listens: nothing in flight
    res = fleet.undrain([gw], n3, 3, lambda text: None)
    assert not res['healthy'] and res['state'] == {'gw': 'not listed yet'}
    assert fleet.undrain_error(res, n3, 3).startswith("n3: not healthy in the gateway 3 s after it was put back "
                                                      "(--timeout): gw not listed yet; it is no longer drained")
