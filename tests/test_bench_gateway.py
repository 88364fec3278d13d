"""scripts/bench_gateway.py's arithmetic (the benchmark itself runs by hand: docs/operations.md): its p99 is
bench_serving's (numpy's percentile), and the overhead compares all the requests of each side's clients together."""
import multiprocessing
import os
import random
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time

import bench_gateway
import numpy
import pytest


def test_the_percentile_is_numpys_as_bench_serving_computes_it():
    many = [random.Random(7).expovariate(1 / 800.0) for _ in range(2048)]
    for values in ([5.0], [1.0, 2.0], [float(x) for x in range(100)], many):
        for q in (0, 50, 99, 100):
            assert bench_gateway.percentile(values, q) == pytest.approx(float(numpy.percentile(values, q))), (values, q)


def run(ttfts, tok_s=100.0, failed=0, wave=0):
    """A client's run whose first `wave` requests were its first wave."""
    return {'tok_s': tok_s, 'p99_ttft_ms': bench_gateway.percentile(ttfts, 99), 'failed': failed, 'ttfts_ms': ttfts,
            'steady_ttfts_ms': ttfts[wave:]}


def test_the_overhead_is_the_gateways_p99_over_all_its_clients_less_the_nodes_p99_over_both(monkeypatch):
    # node 1's requests are fast, node 2's slow: the direct p99 is over both nodes' requests together, not one node's
    node1, node2 = [100.0] * 100, [300.0] * 100
    client1, client2 = [110.0] * 100, [330.0] * 100
    calls = []

    def fake_bench(python, url, key, model, tokenizer, concurrency, prompts, seed=1, ca=None, start=None):
        calls.append((url, concurrency, prompts, seed))
        return {'n1': run(node1), 'n2': run(node2)}[url] if url != 'gw' else run(client1 if seed == 1 else client2)
    monkeypatch.setattr(bench_gateway, 'bench', fake_bench)
    monkeypatch.setattr(bench_gateway, 'listen_overflows', lambda: None)
    r = bench_gateway.overhead('py', ['n1', 'n2'], 'gw', 'k', 'm', 't', 8, 2, clients=2)
    assert sorted(calls) == [('gw', 4, 8, 1), ('gw', 4, 8, 2), ('n1', 4, 8, 1), ('n2', 4, 8, 2)]
    assert r['direct_p99_ttft_ms'] == pytest.approx(300.0)
    assert r['through']['p99_ttft_ms'] == pytest.approx(330.0)
    assert r['overhead_ms'] == pytest.approx(30.0)
    assert r['through']['tok_s'] == pytest.approx(200.0)
    # the direct side measured once serves another count of clients at the same concurrency
    calls.clear()
    again = bench_gateway.overhead('py', ['n1', 'n2'], 'gw', 'k', 'm', 't', 8, 2, clients=1, direct_run=r)
    assert calls == [('gw', 8, 16, 1)]
    assert again['direct_p99_ttft_ms'] == r['direct_p99_ttft_ms']
    assert again['overhead_ms'] == pytest.approx(110.0 - 300.0)


def test_the_direct_side_has_as_many_clients_as_the_gateway_side_half_on_each_node(monkeypatch):
    """Two clients through an HTTPS gateway at 1,024 made 512 TLS handshakes each at once: +700 ms at p99 that eight
    clients did not show (docs/operations.md). So with k clients through the gateway the nodes get k/2 each
    directly, each client at the same concurrency as the gateway side's; the direct side is measured again only for
    another count of clients."""
    calls = []

    def fake_bench(python, url, key, model, tokenizer, concurrency, prompts, seed=1, ca=None, start=None):
        calls.append((url, concurrency, prompts))
        return run({'n1': [100.0], 'n2': [200.0]}.get(url, [150.0]) * 10)
    monkeypatch.setattr(bench_gateway, 'bench', fake_bench)
    monkeypatch.setattr(bench_gateway, 'listen_overflows', lambda: None)
    r = bench_gateway.overhead('py', ['n1', 'n2'], 'gw', 'k', 'm', 't', 16, 2, clients=8)
    assert sorted(calls) == sorted([('gw', 2, 4)] * 8 + [('n1', 2, 4)] * 4 + [('n2', 2, 4)] * 4)
    assert r['direct_clients'] == 8 and len(r['direct']) == 8
    assert r['direct_nodes_p99_ttft_ms'] == [pytest.approx(100.0), pytest.approx(200.0)]
    assert r['direct_p99_ttft_ms'] == pytest.approx(200.0)
    # the same direct side serves another 8 through the gateway; 2 through it get one client a node, measured anew
    calls.clear()
    bench_gateway.overhead('py', ['n1', 'n2'], 'gw', 'k', 'm', 't', 16, 2, clients=8, direct_run=r)
    assert sorted(calls) == [('gw', 2, 4)] * 8
    calls.clear()
    two = bench_gateway.overhead('py', ['n1', 'n2'], 'gw', 'k', 'm', 't', 16, 2, clients=2, direct_run=r)
    assert sorted(calls) == [('gw', 8, 16), ('gw', 8, 16), ('n1', 8, 16), ('n2', 8, 16)]
    assert two['direct_clients'] == 2
    # one client through the gateway: still one a node directly
    calls.clear()
    one = bench_gateway.overhead('py', ['n1', 'n2'], 'gw', 'k', 'm', 't', 16, 2, clients=1)
    assert sorted(calls) == [('gw', 16, 32), ('n1', 8, 16), ('n2', 8, 16)] and one['direct_clients'] == 2


def test_the_overhead_after_the_first_wave_leaves_each_clients_first_requests_out(monkeypatch):
    """Through the gateway each client's first wave opens its TLS connections at once: there the whole tail."""
    direct = [700.0] * 4 + [500.0] * 96
    through = [1100.0] * 4 + [430.0] * 96

    def fake_bench(python, url, key, model, tokenizer, concurrency, prompts, seed=1, ca=None, start=None):
        return run(through if url == 'gw' else direct, wave=4)
    monkeypatch.setattr(bench_gateway, 'bench', fake_bench)
    monkeypatch.setattr(bench_gateway, 'listen_overflows', lambda: None)
    r = bench_gateway.overhead('py', ['n1', 'n2'], 'gw', 'k', 'm', 't', 8, 2, clients=2)
    assert r['overhead_ms'] == pytest.approx(1100.0 - 700.0)
    assert r['direct_steady_p99_ttft_ms'] == pytest.approx(500.0)
    assert r['through']['steady_p99_ttft_ms'] == pytest.approx(430.0)
    assert r['steady_overhead_ms'] == pytest.approx(-70.0)


def test_an_https_gateways_clients_get_its_ca_and_a_failed_clients_reason_is_kept(monkeypatch):
    """bench_fleet.py's overhead through make deploy's HTTPS gateway: each client through the gateway trusts its CA
    (without it every request failed its TLS check), and a client that fails says why (a thread's SystemExit was
    dropped: the run ended with 'a client failed' and nothing else)."""
    seen = []

    def fake_bench(python, url, key, model, tokenizer, concurrency, prompts, seed=1, ca=None, start=None):
        seen.append((url, ca))
        return run([100.0] * 8)
    monkeypatch.setattr(bench_gateway, 'bench', fake_bench)
    monkeypatch.setattr(bench_gateway, 'listen_overflows', lambda: None)
    bench_gateway.overhead('py', ['n1', 'n2'], 'gw', 'k', 'm', 't', 8, 2, clients=2, ca='/ca.crt')
    assert [ca for url, ca in seen if url == 'gw'] == ['/ca.crt', '/ca.crt']

    def failing_bench(python, url, key, model, tokenizer, concurrency, prompts, seed=1, ca=None, start=None):
        if url == 'n2':
            sys.exit('bench_serving failed against n2 (rc 1):\ncertificate verify failed')
        return run([100.0] * 8)
    monkeypatch.setattr(bench_gateway, 'bench', failing_bench)
    with pytest.raises(SystemExit) as failed:
        bench_gateway.side_by_side('py', ['n1', 'n2'], 'k', 'm', 't', 4, 2)
    assert 'failed at concurrency 4 against n1, n2' in str(failed.value)
    assert 'certificate verify failed' in str(failed.value)


# A stand-in for `python -m sglang.bench_serving` (the test's, not the lab's): it takes as long as --seed says to get
# ready (its imports), then records when its benchmark began - its one asyncio.run - in $BEGAN and writes
# bench_serving's last JSONL line. A seed of 0 fails before it is ready.
FAKE_BENCH_SERVING = """
import argparse, asyncio, json, os, sys, time
p = argparse.ArgumentParser()
for flag in ('--backend', '--base-url', '--model', '--tokenizer', '--dataset-name', '--random-input-len',
             '--random-output-len', '--random-range-ratio', '--request-rate', '--output-file'):
    p.add_argument(flag)
for flag in ('--num-prompts', '--max-concurrency', '--seed'):
    p.add_argument(flag, type=int)
p.add_argument('--output-details', action='store_true')
a = p.parse_args()
if a.seed == 0:
    sys.exit('no engine at ' + a.base_url)
time.sleep(0.4 * a.seed)
async def benchmark():
    with open(os.path.join(os.environ['BEGAN'], str(a.seed)), 'w') as f:
        f.write(repr(time.time()))
    return {'total_throughput': 10.0, 'p99_ttft_ms': 5.0, 'completed': a.num_prompts, 'ttfts': [0.005] * a.num_prompts,
            'errors': [''] * a.num_prompts}
with open(a.output_file, 'w') as f:
    f.write(json.dumps(asyncio.run(benchmark())) + chr(10))
"""


def stand_in_bench_serving(tmp_path, monkeypatch):
    pkg = tmp_path / 'site' / 'sglang'
    pkg.mkdir(parents=True)
    (pkg / '__init__.py').write_text('')
    (pkg / 'bench_serving.py').write_text(FAKE_BENCH_SERVING)
    monkeypatch.setenv('PYTHONPATH', str(tmp_path / 'site'))
    (tmp_path / 'began').mkdir()
    monkeypatch.setenv('BEGAN', str(tmp_path / 'began'))


def test_clients_side_by_side_send_nothing_until_every_one_is_ready(tmp_path, monkeypatch):
    """Each client used to start when its own imports were done: 16 clients importing sglang kept 16 CPUs busy for
    ~18 s, so the first waves met starved engines (two runs of one configuration: +306 and +111 ms at p99). Now
    every client waits, imports done, until the last is ready (the stand-in's clients are ready 0.4 s apart)."""
    stand_in_bench_serving(tmp_path, monkeypatch)
    runs, p99, _ = bench_gateway.side_by_side(sys.executable, ['n1', 'n2', 'n1'], 'k', 'm', 't', 2, 2)
    assert [r['tok_s'] for r in runs] == [10.0, 10.0, 10.0] and p99 == pytest.approx(5.0)
    began = sorted(float(f.read_text()) for f in (tmp_path / 'began').iterdir())
    assert len(began) == 3
    # the last was ready 0.8 s after the first: without the wait they would have begun that far apart
    assert began[-1] - began[0] < 0.3, began


def test_a_client_that_fails_before_it_is_ready_keeps_no_one_waiting(tmp_path, monkeypatch):
    stand_in_bench_serving(tmp_path, monkeypatch)
    urls = ['n1', 'gone']

    def seeded(python, url, key, model, tokenizer, concurrency, prompts, seed=1, ca=None, start=None):
        return real(python, url, key, model, tokenizer, concurrency, prompts, seed=0 if url == 'gone' else 2, ca=ca,
                    start=start)
    real = bench_gateway.bench
    monkeypatch.setattr(bench_gateway, 'bench', seeded)
    ended = []

    def run_them():
        try:
            bench_gateway.side_by_side(sys.executable, urls, 'k', 'm', 't', 2, 2)
        except SystemExit as exc:
            ended.append(str(exc))
    t = threading.Thread(target=run_them, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), 'the ready client still waits for the one that failed'
    assert len(ended) == 1 and 'no engine at gone' in ended[0]


def test_a_waiting_client_gives_up_when_the_run_that_started_it_is_gone(tmp_path, monkeypatch):
    """A bench killed while its clients wait (SIGKILL: its temporary folder is then removed by hand or at boot) must
    not leave them polling for ever."""
    stand_in_bench_serving(tmp_path, monkeypatch)
    folder = tmp_path / 'start'
    folder.mkdir()
    ended = []

    def client():
        try:
            bench_gateway.bench(sys.executable, 'n1', 'k', 'm', 't', 2, 2, start=(str(folder), '0'))
        except SystemExit as exc:
            ended.append(str(exc))
    t = threading.Thread(target=client, daemon=True)
    t.start()
    for _ in range(300):
        if (folder / '0').exists():
            break
        t.join(0.1)
    assert (folder / '0').exists(), 'the client never got ready'
    assert t.is_alive()                         # ready, waiting for go
    shutil.rmtree(folder)
    t.join(30)
    assert not t.is_alive(), 'the client still waits'
    assert len(ended) == 1 and 'the benchmark that started this client has ended' in ended[0]
    assert not list((tmp_path / 'began').iterdir())          # it sent nothing


@pytest.mark.parametrize('args, option', [(['--gateway-clients', 'x'], '--gateway-clients'),
                                          (['--gateway-clients', '3'], '--gateway-clients'),
                                          (['--concurrency', '3'], '--concurrency'),
                                          (['--concurrency', 'a,b'], '--concurrency'),
                                          (['--concurrency', ','], '--concurrency'),
                                          (['--gateway-flag', 'policy'], '--gateway-flag'),
                                          (['--gateway-flag=--policy=round_robin'], '--gateway-flag'),
                                          (['--gateway-flag', 'worker-urls=http://x'], '--gateway-flag'),
                                          (['--gateway-flag', 'tls-cert-path=/x'], '--gateway-flag'),
                                          (['--python', '/nonexistent/python'], '--python'),
                                          (['--logs', '/etc/hostname'], '--logs'),
                                          (['--smg', '/nonexistent/smg'], '--smg')])
def test_bad_input_is_one_line_naming_the_option_before_anything_starts(args, option):
    p = subprocess.run([sys.executable, bench_gateway.__file__, *args], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and p.stderr.startswith(option + ': '), p.stderr
    assert p.stdout == ''                   # nothing started (the gateway's line comes first when it does)


def test_a_gateway_flag_goes_over_the_roles_and_true_is_a_switch():
    assert bench_gateway.gateway_overrides([]) == {}
    assert bench_gateway.gateway_overrides(['power-of-two-load-metric=least_requests', 'disable-load-monitoring=true',
                                            'x=a=b']) == {'power-of-two-load-metric': 'least_requests',
                                                          'disable-load-monitoring': True, 'x': 'a=b'}
    # false leaves a flag out, as sglang_argv leaves out a false one: a switch the role sets can be turned off
    flags = bench_gateway.gateway_flags()[0]
    assert flags['disable-tokenizer-autoload'] is True
    off = bench_gateway.argv_of(dict(flags, **bench_gateway.gateway_overrides(['disable-tokenizer-autoload=false'])))
    assert '--disable-tokenizer-autoload' not in off and 'false' not in off
    assert flags['policy'] == 'power_of_two'        # the role's, which --gateway-flag policy=... replaces
    assert bench_gateway.argv_of(dict(flags, **bench_gateway.gateway_overrides(['policy=round_robin']))).count(
        '--policy') == 1


def test_the_front_door_is_the_roles_haproxy_file_less_what_needs_its_package(tmp_path):
    """The bench's HAProxy runs the role's own templates/haproxy.cfg.j2 (its defaults, the bench's ports): TCP
    through to smg, the role's connection limit, TLS health checks when smg serves HTTPS - less chroot, user and
    group, which need Debian's package."""
    text = bench_gateway.front_config(8443, 9001, 9002, str(tmp_path / 'admin.sock'), True)
    lines = [line.strip() for line in text.splitlines()]
    assert 'mode tcp' in lines and 'bind 127.0.0.1:8443' in lines and 'maxconn 20000' in lines, text
    assert 'server primary 127.0.0.1:9001 check inter 1s fall 4 rise 1 check-ssl verify none' in lines, text
    assert 'server handoff 127.0.0.1:9002 check inter 1s fall 4 rise 1 check-ssl verify none disabled' in lines, text
    assert 'stats socket {0} mode 600 level admin expose-fd listeners'.format(tmp_path / 'admin.sock') in lines
    assert not [x for x in lines if x.split(' ')[0] in ('chroot', 'user', 'group')], text
    assert text.endswith('\n')                  # HAProxy refuses a last line without one
    plain = bench_gateway.front_config(8443, 9001, 9002, 'sock', False, max_connections=900)
    assert 'check-ssl' not in plain and 'maxconn 900' in plain and 'maxconn 20000' not in plain


@pytest.mark.parametrize('connect_ms, retries, fall', [(100, 30, 4), (1000, 3, 4), (5000, 3, 16)])
def test_the_front_door_marks_smg_down_no_sooner_than_its_retries_give_up(monkeypatch, connect_ms, retries, fall):
    """A health check connects within `timeout connect` too: an smg that stalls with its queue full fails its checks
    as its connections time out. Marked down, HAProxy ends each connection it is retrying at once (a reset to the
    client): 71 of a burst of 200 reset with fall 2 in a run by hand. Failed checks (every 1 s) before it is marked down
    span the retries (retries x timeout connect)."""
    defaults = bench_gateway.role_defaults()
    monkeypatch.setattr(bench_gateway, 'role_defaults',
                        lambda: dict(defaults, sglang_gateway_backend_connect_timeout_ms=connect_ms))
    lines = [line.strip() for line in bench_gateway.front_config(8443, 9001, 9002, 'sock', False).splitlines()]
    assert 'retries {0}'.format(retries) in lines and 'timeout connect {0}ms'.format(connect_ms) in lines, lines
    assert 'server primary 127.0.0.1:9001 check inter 1s fall {0} rise 1'.format(fall) in lines, lines
    assert (fall - 1) * 1000 >= retries * connect_ms


@pytest.mark.skipif(not shutil.which('openssl'), reason='no openssl on this machine')
def test_the_gateways_certificate_is_trusted_through_the_ca_for_127_0_0_1(tmp_path):
    """make_certificate's CA and certificate, as the bench's clients meet them: a TLS handshake for 127.0.0.1
    that checks the certificate against the CA succeeds; against another CA it fails."""
    cert, key, ca = bench_gateway.make_certificate(str(tmp_path))

    def handshake(cafile):
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(cert, key)
        client = ssl.create_default_context(cafile=cafile)
        a, b = socket.socketpair()
        errors = []

        def serve():
            try:
                with server.wrap_socket(a, server_side=True) as s:
                    s.recv(1)
            except (ssl.SSLError, OSError) as exc:
                errors.append(exc)
        t = threading.Thread(target=serve)
        t.start()
        try:
            with client.wrap_socket(b, server_hostname='127.0.0.1') as c:
                c.sendall(b'x')
                return c.getpeercert()['subjectAltName']
        finally:
            t.join(10)
    assert ('IP Address', '127.0.0.1') in handshake(ca)
    other = tmp_path / 'other'
    other.mkdir()
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(bench_gateway.make_certificate(str(other))[2])


# A TLS (or plain) server in its own process for handshakes(): it counts the connections it accepted (completed
# handshakes, for TLS) into a file.
COUNTING_SERVER = r'''
import asyncio, os, ssl, sys
count_file, cert, key = sys.argv[1], sys.argv[2], sys.argv[3]
n = 0
context = None
if cert:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
async def accepted(reader, writer):
    global n
    n += 1
    with open(count_file + '.new', 'w') as fh:
        fh.write(str(n))
    os.replace(count_file + '.new', count_file)
    await reader.read()
    writer.close()
async def main():
    server = await asyncio.start_server(accepted, '127.0.0.1', 0, ssl=context, backlog=512)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
'''


@pytest.fixture
def counting_server(tmp_path):
    started = []

    def start(tls):
        cert, key, ca = bench_gateway.make_certificate(str(tmp_path)) if tls else ('', '', None)
        count = tmp_path / 'count'
        p = subprocess.Popen([sys.executable, '-c', COUNTING_SERVER, str(count), cert, key], stdout=subprocess.PIPE,
                             text=True)
        started.append(p)
        return int(p.stdout.readline()), ca, count, p.pid
    yield start
    for p in started:
        p.kill()
        p.wait()


@pytest.mark.skipif(not shutil.which('openssl'), reason='no openssl on this machine')
@pytest.mark.parametrize('tls', [True, False], ids=['TLS', 'TCP'])
def test_the_first_waves_connections_alone_are_opened_by_every_client_and_timed(counting_server, tls):
    """handshakes(): each of the clients opens its connections (TLS trusting the CA, or plain TCP) - the server
    counts them all - and the result times each one and the wave, and charges CPU to the clients and the server."""
    port, ca, count, pid = counting_server(tls)
    r = bench_gateway.handshakes('127.0.0.1', port, ca, 3, 8, watch={'server': pid})
    deadline = time.time() + 10      # the server counts a connection a moment after the client has it
    while int(count.read_text()) < 24 and time.time() < deadline:
        time.sleep(0.05)
    assert int(count.read_text()) == 24
    assert (r['clients'], r['each'], r['tls']) == (3, 8, tls)
    assert 0 < r['p50_ms'] <= r['p99_ms'] <= r['wave_ms'] + 1
    assert r['client_cpu_ms'] > 0 and set(r['server_cpu_ms']) == {'server'} and r['server_cpu_ms']['server'] >= 0


@pytest.mark.skipif(not shutil.which('openssl'), reason='no openssl on this machine')
def test_a_client_that_cannot_open_its_connections_is_said(counting_server, tmp_path):
    """A certificate the clients do not trust: handshakes() says why instead of timing failures."""
    port, _, _, _ = counting_server(True)
    other = tmp_path / 'other'
    other.mkdir()
    with pytest.raises(RuntimeError, match='could not open its connections: SSLCertVerificationError'):
        bench_gateway.handshakes('127.0.0.1', port, bench_gateway.make_certificate(str(other))[2], 2, 4, timeout=30)


def test_a_wave_that_does_not_open_in_time_is_said_and_its_clients_ended(counting_server, tmp_path):
    """A server that takes the connections but never answers a TLS hello (a plain one): handshakes() gives up at its
    timeout with one line, and no client is left behind."""
    port, _, _, _ = counting_server(False)
    (tmp_path / 'ca').mkdir()
    ca = bench_gateway.make_certificate(str(tmp_path / 'ca'))[2]
    t0 = time.time()
    with pytest.raises(RuntimeError, match='4 connections at once from 2 clients: not all open after 2 s'):
        bench_gateway.handshakes('127.0.0.1', port, ca, 2, 4, timeout=2)
    assert time.time() - t0 < 8
    time.sleep(0.2)
    assert not multiprocessing.active_children()


def test_a_processes_cpu_counts_the_processes_under_it():
    """tree_cpu: a parent that only waits, whose child spins ~0.5 s of CPU, has used that CPU itself."""
    p = subprocess.Popen([sys.executable, '-c', 'import subprocess, sys; subprocess.run([sys.executable, "-c", '
                          '"import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.5: pass\\n'
                          'time.sleep(30)"])'])
    try:
        deadline = time.time() + 20
        while bench_gateway.tree_cpu(p.pid) < 0.4 and time.time() < deadline:
            time.sleep(0.1)
        assert bench_gateway.tree_cpu(p.pid) >= 0.4
        assert bench_gateway.tree_cpu(p.pid + 10 ** 7) == 0.0
    finally:
        for child in subprocess.run(['pgrep', '-P', str(p.pid)], capture_output=True, text=True).stdout.split():
            os.kill(int(child), 9)
        p.kill()
        p.wait()


def test_the_nodes_loads_are_sampled_with_the_key_and_their_gap_taken_at_full_load():
    """NodeLoads: each node's /v1/loads (sglang's JSON, the emulator's too) polled with the key while a side runs; the
    gap between the busiest and the idlest node counted only while the side is at (90 % of) its concurrency, so
    neither its ramp-up nor its last requests, when one client has ended before another, look like an imbalance."""
    import http.server
    import json
    # what each node answers, one value a poll, the last one repeated: a ramp-up, full load 60/40 then 52/48, a tail
    answers = {'/a': [5, 60, 52, 52, 3], '/b': [5, 40, 48, 48, 0]}
    asked, keys = {'/a': 0, '/b': 0}, set()

    class Node(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            node = self.path.rpartition('/v1/loads')[0]
            keys.add(self.headers.get('Authorization'))
            values = answers[node]
            n = values[min(asked[node], len(values) - 1)]
            asked[node] += 1
            body = json.dumps({'aggregate': {'total_reqs': n, 'total_waiting_reqs': n // 10}}).encode()
            self.send_response(200)
            self.send_header('Content-Length', str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Node)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = 'http://127.0.0.1:{0}'.format(server.server_address[1])
    try:
        with bench_gateway.NodeLoads([base + '/a', base + '/b'], 'secret', 100, every=0.02) as loads:
            deadline = time.time() + 10
            while min(asked.values()) < 6 and time.time() < deadline:
                time.sleep(0.02)
    finally:
        server.shutdown()
    assert keys == {'Bearer secret'}
    assert [60, 40] in loads.samples and [52, 48] in loads.samples
    assert all(sum(s) >= 90 for s in loads.samples), loads.samples       # no ramp-up (10), no tail (3)
    mean, most = loads.spread()
    assert most == 20 and 4 < mean < 20
    assert 0 <= loads.cpu_busy() <= 100
    assert loads.waiting == 6       # node a's 60 (a tenth of it waiting), at full load: not its 52s
    assert bench_gateway.NodeLoads(['x'], 'k', 1).spread() is None


def test_the_table_says_how_far_apart_the_nodes_were_on_each_side(monkeypatch, capsys):
    monkeypatch.setattr(bench_gateway, 'bench', lambda *a, **kw: run([100.0] * 10))
    monkeypatch.setattr(bench_gateway, 'listen_overflows', lambda: None)
    spreads = iter([(0.5, 2), (37.25, 90)])
    busy = iter([61.4, None])
    monkeypatch.setattr(bench_gateway.NodeLoads, '__init__', lambda self, *a, **kw: setattr(self, 'waiting', 3)
                        or setattr(self, '_thread', threading.Thread(target=lambda: None))
                        or setattr(self, '_stop', threading.Event()))
    monkeypatch.setattr(bench_gateway.NodeLoads, 'spread', lambda self: next(spreads))
    monkeypatch.setattr(bench_gateway.NodeLoads, 'cpu_busy', lambda self: next(busy))
    r = bench_gateway.overhead('py', ['n1', 'n2'], 'gw', 'k', 'm', 't', 8, 2, clients=2)
    assert r['spread'] == ((0.5, 2), (37.25, 90)) and r['cpu_busy'] == (61.4, None)
    bench_gateway.table([r])
    cells = [c.strip() for c in capsys.readouterr().out.splitlines()[-1].split('|')[-4:-1]]
    assert cells == ['0.5 / 2; 37.2 / 90', '3 / 3', '61 % / n/a']
    # another count of clients at the same concurrency reuses the direct side's, its spread and CPU too
    spreads, busy = iter([(1.0, 3)]), iter([70.0])
    again = bench_gateway.overhead('py', ['n1', 'n2'], 'gw', 'k', 'm', 't', 8, 2, clients=2, direct_run=r)
    assert again['spread'] == ((0.5, 2), (1.0, 3)) and again['cpu_busy'] == (61.4, 70.0)


def test_a_process_that_ends_while_waited_for_is_said_with_the_end_of_its_log(tmp_path):
    """'see its log' named a log in the temporary folder the benchmark removed as it ended: the message carries the
    end of the log itself."""
    log_path = tmp_path / 'engine.log'
    with open(log_path, 'w') as log:
        p = subprocess.Popen([sys.executable, '-c', 'print("line one"); print("no module named sglang"); exit(3)'],
                             stdout=log, stderr=subprocess.STDOUT)
    p.log_path = str(log_path)
    p.wait()
    with pytest.raises(SystemExit) as e:
        bench_gateway.wait_for('http://127.0.0.1:1', lambda: False, {'emulator 1': p}, 30)
    assert str(e.value).startswith('emulator 1 exited (3) while waiting for http://127.0.0.1:1; the end of its log:')
    assert 'no module named sglang' in str(e.value)
