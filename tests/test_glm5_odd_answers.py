"""glm5 against answers of an odd shape and inventory values of the wrong kind (no lab): a gateway, a node and a
Prometheus stood in by a small HTTP server on 127.0.0.1, asked the way glm5 asks them (python3 over the host's shell,
here this machine's). Each was a traceback, a key printed or a node left neither drained nor in its gateway."""
import http.server
import json
import os
import threading
import time
from types import SimpleNamespace

import pytest
import yaml
from glm5 import cli, fleet, monitoring
from glm5.errors import OpsError
from glm5.inventory import Inventory
from glm5.transport import Local
from test_glm5_fleet import inventories, one_error_line  # noqa: F401  (its autouse fixture: several inventories)

ADMIN = 'adm1n-' + os.urandom(8).hex()
NODE_KEY = 'n0de-' + os.urandom(8).hex()


@pytest.fixture
def server():
    """answers[(method, path)] = (status, body); a body 'ECHO' answers with the request's headers, as a misbehaving
    proxy might. seen: the requests, (method, path, body)."""
    answers, seen = {}, []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            length = int(self.headers.get('Content-Length') or 0)
            seen.append((self.command, self.path, self.rfile.read(length).decode() if length else ''))
            status, body = answers.get((self.command, self.path), (404, 'no'))
            if body == 'HANG':
                time.sleep(40)              # an engine that never answers (longer than any bound asked of it)
                return
            if body == 'ECHO':
                body = 'internal error; you sent ' + '; '.join('{0}={1}'.format(k, v) for k, v in self.headers.items())
            data = body.encode()
            self.send_response(status)
            self.send_header('Content-Length', str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield SimpleNamespace(url='http://127.0.0.1:{0}'.format(httpd.server_address[1]), port=httpd.server_address[1],
                          answers=answers, seen=seen)
    httpd.shutdown()
    httpd.server_close()


def gateway(server, tmp_path):
    env = tmp_path / 'gateway.env'
    env.write_text('SMG_ADMIN_KEY="{0}"\n'.format(ADMIN))
    contract = {'url': server.url, 'env_file': str(env), 'metrics_url': server.url + '/metrics',
                'drained_file': str(tmp_path / 'drained.json'), 'service': 'glm5-gateway'}
    return fleet.Gateway('gw', contract, Local(SimpleNamespace(name='gw')),
                         [{'node': 'n1', 'url': 'http://127.0.0.1:1'}])


def node(server, tmp_path, key=True):
    key_file = tmp_path / 'node.key'
    if key:
        key_file.write_text(NODE_KEY + '\n')
    return SimpleNamespace(name='n1', ssh=Local(SimpleNamespace(name='n1')),
                           contract={'url': server.url, 'key_file': str(key_file)})


def test_an_answer_that_echoes_the_admin_key_shows_it_as_stars(server, tmp_path):
    """The key is read in the gateway's container and sent there: an answer repeating it is masked there too (the
    control plane's 500 was printed with 'Authorization=Bearer <the admin key>')."""
    server.answers[('GET', '/workers')] = (500, 'ECHO')
    with pytest.raises(OpsError) as e:
        gateway(server, tmp_path).workers()
    assert ADMIN not in str(e.value) and 'Authorization=Bearer ***' in str(e.value), str(e.value)


@pytest.mark.parametrize('body', ['{"workers": ["a", 1]}', '{"workers": {"x": 1}}', '{"workers": null}', '[]'])
def test_a_worker_list_of_another_shape_is_one_error(server, tmp_path, body):
    server.answers[('GET', '/workers')] = (200, body)
    with pytest.raises(OpsError) as e:
        gateway(server, tmp_path).workers()
    assert str(e.value) == "gw: GET {0}/workers is not the gateway's worker list".format(server.url)


def test_a_metrics_line_without_its_value_gives_no_state_for_that_worker():
    text = 'smg_worker_cb_state{worker="http://a:1"}\nsmg_worker_cb_state{worker="http://b:2/"} 1\n'
    assert fleet.circuit_states(text) == {'http://b:2': 'open'}


@pytest.mark.parametrize('body', ['{"loads": "x"}', '{"loads": [1]}', '{"loads": null}', '[]'])
def test_a_load_report_of_another_shape_is_a_load_not_known(server, tmp_path, body):
    server.answers[('GET', '/v1/loads')] = (200, body)
    assert fleet.in_flight(node(server, tmp_path)) == {'status': 200, 'running': None, 'waiting': None, 'total': None}
    res = {'in_flight': None, 'loads_status': 200, 'gateways': [{'gateway': 'gw'}]}
    assert fleet.drain_error(res, node(server, tmp_path), 5) == (
        'n1: its in-flight requests cannot be seen ({0}/v1/loads answered 200, not a load report): it stays drained '
        '(out of gw); glm5 undrain n1 puts it back'.format(server.url))
    server.answers[('GET', '/v1/loads')] = (200, '{"loads": [{"num_running_reqs": 2, "num_waiting_reqs": 1}]}')
    assert fleet.in_flight(node(server, tmp_path))['total'] == 3


MARK = {'node': 'n1', 'worker': 'http://127.0.0.1:1', 'since': '2026-12-06T00:00:00Z', 'by': 'ops@ctl'}


def test_undrain_that_cannot_read_the_nodes_key_leaves_it_drained(server, tmp_path):
    """The key was read after the node's drained mark was taken off: a node whose key could not be read was then
    neither drained nor in its gateway, and nothing said so."""
    gw = gateway(server, tmp_path)
    (tmp_path / 'drained.json').write_text(json.dumps([MARK]))
    server.answers[('GET', '/workers')] = (200, '{"workers": []}')
    with pytest.raises(OpsError) as e:
        fleet.undrain([gw], node(server, tmp_path, key=False), 5, lambda text: None)
    assert str(e.value).startswith('n1: cannot read its key {0}: '.format(tmp_path / 'node.key')), str(e.value)
    assert json.loads((tmp_path / 'drained.json').read_text()) == [MARK]
    assert [s[0] for s in server.seen] == ['GET']                       # nothing asked of the gateway but its list


def test_undrain_that_the_gateway_refuses_puts_the_mark_back(server, tmp_path):
    gw = gateway(server, tmp_path)
    (tmp_path / 'drained.json').write_text(json.dumps([MARK]))
    server.answers[('GET', '/workers')] = (200, '{"workers": []}')
    server.answers[('POST', '/workers')] = (500, 'ECHO')
    with pytest.raises(OpsError) as e:
        fleet.undrain([gw], node(server, tmp_path), 5, lambda text: None)
    text = str(e.value)
    assert text.startswith('gw: its control plane (POST {0}/workers) answered 500: '.format(server.url)), text
    assert text.endswith('; it stays drained') and ADMIN not in text and NODE_KEY not in text, text
    assert json.loads((tmp_path / 'drained.json').read_text()) == [MARK]
    assert NODE_KEY in [s for s in server.seen if s[0] == 'POST'][0][2]  # it was sent (on the helper's stdin), not shown


def test_a_gateway_node_that_is_no_host_is_named_as_such():
    v = fleet.fleet_view('gw', [{'node': 'n1', 'url': 'http://a:1', 'known': True},
                                {'node': 'nosuch', 'url': '', 'known': False}], [], [], {})
    assert v['problems'] == [
        'n1 is not in gw and not drained: a deploy adds it once its smoke test passes; glm5 undrain n1 adds it now',
        'sglang_gateway_nodes of gw names nosuch, which is not an inventory host']


def write_inventory(path, nodes=None, monitoring_vars=None, gateway_vars=None):
    doc = {'all': {'children': {'inference_nodes': {'hosts': nodes or {'n1': {'ansible_host': '127.0.0.1'}}}}}}
    if monitoring_vars is not None:
        doc['all']['children']['monitoring'] = {'hosts': {'prom': dict(ansible_connection='local', **monitoring_vars)}}
    if gateway_vars is not None:
        doc['all']['children']['gateways'] = {'hosts': {'gw': dict(ansible_connection='local', **gateway_vars)}}
    path.mkdir(exist_ok=True)
    (path / 'hosts.yml').write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.mark.parametrize('body', ['[1]', '{"data": null}', '{"data": {"alerts": [1]}}', '{"data": {"alerts": "x"}}'])
def test_prometheus_answering_another_shape_is_a_problem_of_its_section(server, tmp_path, body):
    server.answers[('GET', '/api/v1/alerts')] = (200, body)
    inv = Inventory(write_inventory(tmp_path / 'inv', monitoring_vars={'prometheus_port': server.port}))
    st = monitoring.monitoring_status(inv, 'prom')
    assert len(st['problems']) == 1 and st['problems'][0].startswith('Prometheus on prom: '), st['problems']


@pytest.mark.parametrize('port', ['abc', 99999, 0])
def test_a_port_that_is_not_a_port_is_one_line_naming_it(tmp_path, capsys, port):
    """ansible_port: abc was a ValueError traceback; 99999 reached port 99999 - 65536."""
    inv = write_inventory(tmp_path / 'inv', nodes={'n1': {'ansible_host': '127.0.0.1', 'ansible_port': port}})
    assert one_error_line(capsys, ['gpus', '-n', 'n1', '-i', inv]) == (
        'glm5: n1: ansible_port must be a whole number from 1 to 65535, got {0!r}'.format(port))
    inv = write_inventory(tmp_path / 'inv2', monitoring_vars={'prometheus_port': port})
    assert one_error_line(capsys, ['status', '-n', 'n1', '-i', inv]) == (
        'glm5: prom: prometheus_port must be a whole number from 1 to 65535, got {0!r}'.format(port))


def test_a_gateway_timeout_that_is_not_a_number_is_one_line_naming_it(tmp_path, capsys):
    inv = write_inventory(tmp_path / 'inv', gateway_vars={'sglang_gateway_nodes': ['n1'],
                                                          'sglang_gateway_drain_timeout': 'soon'})
    assert one_error_line(capsys, ['drain', 'n1', '-i', inv]) == (
        "glm5: gw: sglang_gateway_drain_timeout must be a whole number of at least 1, got 'soon'")


@pytest.mark.parametrize('value', ['0', '-5'])
def test_restart_takes_no_timeout_below_a_second(capsys, value):
    """restart --timeout -5 stopped and started the engine, then left it out of its gateway as not ready after 0 s."""
    with pytest.raises(SystemExit) as e:
        cli.parser().parse_args(['restart', '--timeout', value])
    assert e.value.code == 2 and '--timeout' in capsys.readouterr().err


def test_a_history_line_that_is_not_an_object_is_named():
    from ansible.module_utils.glm5_results import parse_jsonl
    assert parse_jsonl('{"a": 1}\n\n{"b": 2}\n') == [{'a': 1}, {'b': 2}]
    with pytest.raises(ValueError) as e:
        parse_jsonl('{"a": 1}\n[1, 2]\n')
    assert str(e.value) == 'line 2 is not a JSON object: [1, 2]'


def test_hosts_at_ipv6_addresses_are_urls_with_brackets(tmp_path):
    """The gateway's client URL (its contract, rendered by Ansible as the roles render it) and Prometheus' links, for
    hosts whose ansible_host is an IPv6 address (they were http://fd00::9:30000)."""
    inv = Inventory(write_inventory(tmp_path / 'inv', nodes={'n1': {'ansible_host': 'fd00::11'}},
                                    gateway_vars={'sglang_gateway_nodes': ['n1'], 'ansible_host': 'fd00::9'},
                                    monitoring_vars={'ansible_host': 'fd00::40', 'prometheus_port': 9090}))
    gw, = fleet.gateways(inv)
    assert gw.contract['client_url'].split('//')[1].startswith('[fd00::9]:'), gw.contract['client_url']
    assert gw.nodes == [{'node': 'n1', 'url': 'http://[fd00::11]:30000', 'known': True}]
    # Prometheus' own page as an operator opens it (its alerts are asked at 127.0.0.1 in its container: here, a closed
    # port of this machine)
    st = monitoring.monitoring_status(inv, 'prom')
    assert (st['page'], st['alerts_url']) == ('http://[fd00::40]:9090/consoles/glm5.html', 'http://[fd00::40]:9090/alerts')


def test_an_empty_node_name_and_two_node_names_are_refused(tmp_path, capsys):
    """gpus -n '' (a shell variable left empty) acted on every node; drain A -n B drained A without a word."""
    inv = write_inventory(tmp_path / 'inv', nodes={'n1': {'ansible_host': '127.0.0.1'}, 'n2': {'ansible_host': '127.0.0.1'}},
                          gateway_vars={'sglang_gateway_nodes': ['n1', 'n2']})
    assert one_error_line(capsys, ['gpus', '-n', '', '-i', inv]) == "glm5: unknown node '': {0} has n1, n2".format(inv)
    assert one_error_line(capsys, ['drain', 'n1', '-n', 'n2', '-i', inv]) == (
        'glm5: drain takes one node: n1 and -n n2 name two')


def test_a_drain_of_a_node_that_never_answers_ends_near_its_bound(server, tmp_path):
    """drain --timeout 2 against an engine that took the connection and never answered ran 31 s: each ask of its load
    waited 30 s. The ask now waits no longer than the drain's bound (at least a second)."""
    gw = gateway(server, tmp_path)
    server.answers[('GET', '/workers')] = (200, '{"workers": []}')
    server.answers[('GET', '/v1/loads')] = (200, 'HANG')
    t0 = time.monotonic()
    res = fleet.drain([gw], node(server, tmp_path), 2, lambda text: None, force=True)
    assert time.monotonic() - t0 < 8, time.monotonic() - t0
    assert not res['drained'] and res['in_flight'] is None and res['loads_status'] not in (200, 'refused'), res
    assert json.loads((tmp_path / 'drained.json').read_text())[0]['node'] == 'n1'        # it stays drained


def test_compare_says_where_its_plot_cannot_go_before_asking_the_node(tmp_path, capsys):
    """compare --out into a folder that is not there asked the node for its history and its runs, then said only
    '[Errno 2] ...' (exit 1). It is refused first now, in one line naming the folder (exit 2): the node here is a
    closed port, never reached."""
    inv = write_inventory(tmp_path / 'inv', nodes={'n1': {'ansible_host': '127.0.0.1', 'ansible_port': 1}})
    missing = tmp_path / 'no-such-folder'
    assert one_error_line(capsys, ['compare', '-n', 'n1', '--out', str(missing / 'cmp.png'), '-i', inv]) == (
        'glm5: --out: {0} is not a folder that exists (the plot goes into it)'.format(missing))
    assert one_error_line(capsys, ['compare', '-n', 'n1', '--out', str(tmp_path), '-i', inv]) == (
        "glm5: --out: {0} is a folder; give the plot's file name".format(tmp_path))
