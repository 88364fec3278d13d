#!/usr/bin/env python3
"""The p99 TTFT the gateway adds, on any machine (by hand, not in CI): two engine emulators and the real gateway, here.

    python scripts/bench_gateway.py [--concurrency 128,512,1024] [--gateway-clients 8] [--python PY] [--smg SMG]
                                    [--no-tls] [--front haproxy|none] [--haproxy HAPROXY] [--gateway-flag FLAG=VALUE]

What it starts, all on 127.0.0.1 and torn down at the end: two engine emulators (scripts/lab/sglang_emulator.py at
the seeds' pace: GLM5_EMULATOR_SPEED unset, --max-running-requests 1024, an API key, the lab's stand-in tokenizer
made by scripts/lab/stand_in_model.py in a temporary folder unless --tokenizer names one) and SGLang's model
gateway (`smg launch`) in front of both, with the flags roles/sglang_gateway deploys: its vars/main.yml flag set
rendered with its defaults/main.yml (policy, health checks, retries, circuit breaker, timeouts), only the
addresses, the worker URLs and the keys put in here (and any --gateway-flag over them: a setting measured before the
role deploys it). As the role deploys it by default, clients reach it through its
front door: HTTPS (smg's own TLS, sglang_gateway_tls; a CA and a P-256 certificate for 127.0.0.1 made here with
`openssl`, the clients trusting that CA) and HAProxy in front, passing TCP through (the role's templates/haproxy.cfg.j2
rendered with its defaults, less its chroot, user and group lines and with its admin socket in the temporary folder;
checked with haproxy -c first). --no-tls serves plain HTTP; --front none lets the clients reach smg itself.

What it measures, at each C of --concurrency, as scripts/bench_fleet.py's 'overhead' part does on the lab's fleet:
sglang.bench_serving (backend sglang, random-ids 256 in / 128 out, --random-range-ratio 0.0, --request-rate inf, C x
--prompts-per-concurrency prompts in all) first against both nodes directly at C/2 each, at the same time (the load
the gateway gives each node), then through the gateway at C, from each count k of clients in --gateway-clients side by
side (C/k each). Both sides have as many clients: k/2 on each node directly (at least one), so each client carries the
same concurrency both times (those through an HTTPS gateway also make its TLS handshakes); the clients of a side
send nothing until all of them have imported sglang and read their prompts, then start together. Default k = 8: a
bench_serving client opens a connection for every request, and at 1,024 two clients through an HTTPS gateway each made
512 TLS handshakes at once in one Python event loop - +700 ms at p99 that were the clients' own (docs/operations.md);
one client reading every stream of both nodes is likewise a bottleneck of its own. The overhead is the gateway's p99
TTFT less the nodes' direct p99 TTFT, each over all the requests of its clients (the issue's bar: <= 50 ms at 1,024),
and the same after each client's first wave (its first C/k requests, sent at once, each opening its connection: the
fleet smoke test gates that one). Also printed: both sides' total tok/s, failed requests, and the connections the kernel
refused over each run because a listen queue was full (TcpExt ListenOverflows, machine-wide: a refused SYN is sent again
only after a second), and how far apart the two nodes' requests (running and waiting, each node's /v1/loads polled every
0.1 s) were while each side ran at (at least 90 % of) its concurrency: the direct side's C/2 a node by construction, the
gateway's as its policy spread them, the most requests waiting (queued, not yet running) on a node, and the machine's
CPUs' busy share meanwhile. Before the runs (--no-handshakes leaves it out), a second table: each side's first wave in
connections alone - k clients (k/2 on one node directly) each opening C/k connections at once, TLS trusting the
gateway's CA or plain TCP as each side serves, the clients starting together - with the slowest client's wave, a
connection's p50/p99, and the CPU a connection cost the clients and each server (smg, HAProxy; an engine): where the
first wave's time over HTTPS goes.

The emulators and bench_serving run with --python (default: this Python), which must import sglang (the emulator
parses its argv with sglang's own ServerArgs) and its bench_serving; --smg is the gateway's command (default: `smg`
beside --python, else on PATH, else `--python -m smg`), --haproxy HAProxy's (default: haproxy on PATH, else
/usr/sbin/haproxy). Everything shares this machine's CPUs: on a small machine
the engines, the clients and the gateway saturate them together, and the overhead measured is theirs too; the table
says how many CPUs it ran on.
"""
import argparse
import glob
import json
import os
import resource
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from glm5.project import use_module_utils

use_module_utils()
from ansible.module_utils.glm5_fleet import percentile  # noqa: E402  (bench_serving's p99, as the fleet test takes it)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EMULATOR = os.path.join(ROOT, 'scripts', 'lab', 'sglang_emulator.py')
STAND_IN_MODEL = os.path.join(ROOT, 'scripts', 'lab', 'stand_in_model.py')
GATEWAY_ROLE = os.path.join(ROOT, 'roles', 'sglang_gateway')
# sglang's native /generate for the nodes and the gateway alike: bench_serving's OpenAI backend sends best_of with
# stream, which smg 1.13 refuses (400 "best_of is not supported when stream is enabled")
BACKEND = 'sglang'
MODEL = 'glm-5'
# the gateway flags set here, not from the role: where it listens, its workers, its keys
PLACED = ('host', 'port', 'worker-urls', 'prometheus-host', 'prometheus-port', 'api-key', 'control-plane-api-keys')
# its certificate and key: the ones made here (TLS, the role's default), or none (--no-tls)
TLS_FLAGS = ('tls-cert-path', 'tls-key-path')
BAR_MS = 50


def positive(text):
    """argparse type: a whole number >= 1 (the benchmarks' concurrencies, counts and seconds)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError('a whole number >= 1, got {0!r}'.format(text))
    return value


def lab_sglang_python():
    """The newest (last built) seed-validated SGLang environment make test caches, or None: the Python the lab's
    benchmarks run bench_serving and the emulator with unless told another."""
    found = glob.glob('/var/cache/glm5-lab/sglang-venvs/seed-validated-*/bin/python')
    return max(found, key=os.path.getmtime) if found else None


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def role_defaults():
    import yaml
    with open(os.path.join(GATEWAY_ROLE, 'defaults', 'main.yml')) as fh:
        return yaml.safe_load(fh)


def gateway_flags():
    """roles/sglang_gateway's __sglang_gateway_flags rendered with its defaults by Ansible's own templating (its
    filters, its native types: a switch is true or false, as the role's sglang_argv gets it), less the PLACED flags
    and its TLS paths (TLS_FLAGS: the certificate made here, or none)."""
    import yaml
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template
    defaults = role_defaults()
    with open(os.path.join(GATEWAY_ROLE, 'vars', 'main.yml')) as fh:
        flags = yaml.safe_load(fh)['__sglang_gateway_flags']
    templar = Templar(loader=DataLoader(), variables=defaults)
    out = {}
    for key, value in flags.items():
        if key in PLACED or key in TLS_FLAGS:
            continue
        out[key] = templar.template(trust_as_template(value)) if isinstance(value, str) else value
    return out, defaults['sglang_gateway_version']


def gateway_overrides(given):
    """--gateway-flag's FLAG=VALUE list -> {flag: value} (true: a switch on, false: the flag left out), or None where one
    is not FLAG=VALUE or names a flag this script sets itself (PLACED, TLS_FLAGS)."""
    out = {}
    for item in given:
        flag, eq, value = item.partition('=')
        if not eq or not flag or flag.startswith('-') or flag in PLACED or flag in TLS_FLAGS:
            return None
        out[flag] = {'true': True, 'false': False}.get(value, value)
    return out


def make_certificate(folder, openssl='openssl'):
    """A CA and a certificate it signed for 127.0.0.1 and localhost (P-256, serverAuth, as roles/sglang_gateway's
    tasks/tls.yml makes a gateway's), made with openssl in folder: (certificate, key, CA file)."""
    ca_key, ca, key, csr, cert = (os.path.join(folder, n) for n in ('ca.key', 'ca.crt', 'gw.key', 'gw.csr', 'gw.crt'))
    ext = os.path.join(folder, 'gw.ext')
    with open(ext, 'w') as fh:
        fh.write('subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n'
                 'basicConstraints=critical,CA:FALSE\n')
    steps = [
        ['ecparam', '-name', 'prime256v1', '-genkey', '-noout', '-out', ca_key],
        ['req', '-x509', '-new', '-key', ca_key, '-subj', '/CN=glm5 bench_gateway CA', '-days', '2', '-out', ca],
        ['ecparam', '-name', 'prime256v1', '-genkey', '-noout', '-out', key + '.ec'],
        ['pkcs8', '-topk8', '-nocrypt', '-in', key + '.ec', '-out', key],
        ['req', '-new', '-key', key, '-subj', '/CN=127.0.0.1', '-out', csr],
        ['x509', '-req', '-in', csr, '-CA', ca, '-CAkey', ca_key, '-CAcreateserial', '-days', '2', '-extfile', ext,
         '-out', cert]]
    for step in steps:
        try:
            r = subprocess.run([openssl] + step, capture_output=True, text=True)
        except OSError as exc:
            sys.exit('openssl is needed for the gateway\'s certificate ({0}); or --no-tls for plain HTTP'.format(exc))
        if r.returncode != 0:
            sys.exit('openssl {0} failed: {1}'.format(step[0], r.stderr.strip()[-1000:]))
    return cert, key, ca


def front_config(front_port, backend_port, handoff_port, socket_path, tls, max_connections=None):
    """roles/sglang_gateway's templates/haproxy.cfg.j2 rendered with its defaults and these ports, less the lines
    that need the Debian package's user and folder (chroot, user, group): the same TCP pass-through, limits, timeouts
    and health checks as a deployed gateway's front door (max_connections: fewer than the role's where this process
    may not open the two descriptors a connection that HAProxy needs)."""
    import re

    import jinja2
    values = dict(role_defaults(), ansible_managed='scripts/bench_gateway.py', sglang_gateway_host='127.0.0.1',
                  sglang_gateway_port=front_port, sglang_gateway_backend_port=backend_port,
                  sglang_gateway_handoff_port=handoff_port, sglang_gateway_tls=tls)
    if max_connections is not None:
        values['sglang_gateway_max_connections'] = max_connections
    values['sglang_gateway_contract'] = {
        'service': 'bench-gateway', 'handoff_service': 'bench-gateway-handoff', 'front_socket': socket_path,
        'ready_path': '/health'}
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)     # as Ansible's
    env.filters['bool'] = lambda v: v if isinstance(v, bool) else str(v).lower() in ('1', 'true', 'yes', 'on')
    with open(os.path.join(GATEWAY_ROLE, 'templates', 'haproxy.cfg.j2')) as fh:
        text = env.from_string(fh.read()).render(values)
    return re.sub(r'(?m)^\s+(chroot|user|group)\s.*\n', '', text)


def default_haproxy():
    return shutil.which('haproxy') or '/usr/sbin/haproxy'


def argv_of(flags):
    """As the role's sglang_argv filter: --flag value, --flag for true, --flag v1 v2 for a list."""
    argv = []
    for key, value in flags.items():
        if value is None or value is False:
            continue
        if value is True:
            argv.append('--' + key)
        elif isinstance(value, list):
            argv += ['--' + key] + [str(v) for v in value]
        else:
            argv += ['--' + key, str(value)]
    return argv


def get(url, key=None, timeout=5, ca=None):
    import ssl
    req = urllib.request.Request(url, headers={'Authorization': 'Bearer ' + key} if key else {})
    context = ssl.create_default_context(cafile=ca) if ca else None
    with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
        return resp.status, resp.read()


def log_tail(path, lines=15):
    """The last lines of a log, or '' (a temporary folder's logs are gone once the benchmark ends: said here)."""
    try:
        with open(path, errors='replace') as fh:
            return ''.join(fh.readlines()[-lines:])
    except (OSError, TypeError):
        return ''


def wait_for(what, check, procs, timeout):
    t0 = time.time()
    while time.time() - t0 < timeout:
        for name, p in procs.items():
            if p.poll() is not None:
                sys.exit('{0} exited ({1}) while waiting for {2}; the end of its log:\n{3}'.format(
                    name, p.returncode, what, log_tail(getattr(p, 'log_path', None)) or '(empty)'))
        try:
            if check():
                return time.time() - t0
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    sys.exit('{0}: not ready after {1} s'.format(what, timeout))


def listen_overflows():
    """The kernel's count of connections a full listen queue refused (TcpExt ListenOverflows), or None."""
    try:
        with open('/proc/net/netstat') as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith('TcpExt:') and 'ListenOverflows' in names.split():
            return int(values.split()[names.split().index('ListenOverflows')])
    return None


def cpu_times():
    """The machine's (busy, all) CPU clock ticks since boot (/proc/stat's cpu line; idle and iowait are not busy)."""
    try:
        with open('/proc/stat') as fh:
            ticks = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def overflows_since(before):
    after = listen_overflows()
    return None if before is None or after is None else after - before


# bench_serving as `python -m sglang.bench_serving` runs it, less its start: with its imports done (7-20 CPU-s: torch
# and transformers) and its prompts and tokenizer read, it marks itself ready (the file `name` in `folder`) and waits
# for the file `go` there before it sends anything (its one asyncio.run is the benchmark, warmup included); it gives
# up if the folder goes (the run that started it has ended)
AT_THE_START = """
import asyncio, os, runpy, sys, time
folder, name = sys.argv.pop(1), sys.argv.pop(1)
run = asyncio.run
def ready_then_run(main, **kw):
    open(os.path.join(folder, name), 'w').close()
    while not os.path.exists(os.path.join(folder, 'go')):
        if not os.path.isdir(folder):
            main.close()
            sys.exit('the benchmark that started this client has ended')
        time.sleep(0.005)
    return run(main, **kw)
asyncio.run = ready_then_run
runpy.run_module('sglang.bench_serving', run_name='__main__', alter_sys=True)
"""


def bench(python, url, key, model, tokenizer, concurrency, prompts, seed=1, ca=None, start=None):
    """One sglang.bench_serving run (the benchmarks' one: scripts/bench_fleet.py calls it too): total tok/s, p99 TTFT,
    failed requests, and each answered request's TTFT in ms (to merge the runs of clients side by side), all of them
    and those after the client's first wave (its first `concurrency` requests, sent at once: bench_serving opens a
    connection for each request, so the first wave opens them all at the same moment). start=(folder, name): it sends
    nothing until `go` is in that folder (AT_THE_START), clients side by side starting together."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, 'r.jsonl')
        main = ['-c', AT_THE_START, *start] if start else ['-m', 'sglang.bench_serving']
        cmd = [python, *main, '--backend', BACKEND, '--base-url', url, '--model', model,
               '--tokenizer', tokenizer, '--dataset-name', 'random-ids', '--random-input-len', '256',
               '--random-output-len', '128', '--random-range-ratio', '0.0', '--num-prompts', str(prompts),
               '--max-concurrency', str(concurrency), '--request-rate', 'inf', '--seed', str(seed),
               '--output-file', out, '--output-details']
        env = dict(os.environ, OPENAI_API_KEY=key, HF_HUB_OFFLINE='1')
        if ca:      # an HTTPS gateway: the CA of its certificate
            env.update(SSL_CERT_FILE=ca, REQUESTS_CA_BUNDLE=ca)
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0 or not os.path.exists(out):
            sys.exit('bench_serving failed against {0} (rc {1}):\n{2}'.format(
                url, r.returncode, (r.stderr.strip() or r.stdout)[-3000:]))
        with open(out) as fh:
            line = json.loads(fh.read().splitlines()[-1])
    answered = [(i, t * 1000.0) for i, (t, e) in enumerate(zip(line['ttfts'], line['errors'], strict=True)) if not e]
    return {'tok_s': line['total_throughput'], 'p99_ttft_ms': line['p99_ttft_ms'], 'failed': prompts - line['completed'],
            'ttfts_ms': [t for _, t in answered], 'steady_ttfts_ms': [t for i, t in answered if i >= concurrency]}


def side_by_side(python, urls, key, model, tokenizer, share, per, ca=None):
    """One bench_serving client per URL (a URL may come twice), all at once, each at concurrency `share`; their runs,
    and the p99 TTFT of all their requests together, and of those after each client's first wave (None: none)."""
    runs = [None] * len(urls)
    errors = []
    with tempfile.TemporaryDirectory(prefix='glm5-bench-start-') as folder:

        def one(i, url):
            try:
                runs[i] = bench(python, url, key, model, tokenizer, share, share * per, seed=1 + i, ca=ca,
                                start=(folder, str(i)))
            except SystemExit as exc:  # a thread drops its SystemExit silently: keep bench's message for the report
                errors.append(str(exc))
        threads = [threading.Thread(target=one, args=(i, u)) for i, u in enumerate(urls)]
        for t in threads:
            t.start()
        start_together(folder, threads)
        for t in threads:
            t.join()
    if any(r is None for r in runs):
        sys.exit('a bench_serving client failed at concurrency {0} against {1}:\n{2}'.format(
            share, ', '.join(urls), '\n'.join(errors)))
    every = [t for r in runs for t in r['ttfts_ms']]
    steady = [t for r in runs for t in r.get('steady_ttfts_ms') or []]
    return runs, (percentile(every, 99) if every else float('nan')), (percentile(steady, 99) if steady else None)


def start_together(folder, threads, poll=0.01):
    """Let the clients of side_by_side send when every one of them is ready (its file in `folder`), or as soon as one
    of them has ended (failed before it was ready: the others are not kept waiting). Without this each client started
    when its own imports were done, over the ~18 s that 16 clients importing sglang kept 16 CPUs busy: the first
    clients' waves met engines short of CPU and the later ones' a part-loaded machine, and the clients did not all
    overlap (two runs of one configuration, 16 clients over HTTPS: +306 and +111 ms at p99)."""
    while not all(os.path.exists(os.path.join(folder, str(i))) for i in range(len(threads))):
        if not all(t.is_alive() for t in threads):
            break
        time.sleep(poll)
    open(os.path.join(folder, 'go'), 'w').close()


def tree_cpu(pid):
    """CPU seconds a process and every process under it have used, every thread of each (the kernel's schedstat, in
    nanoseconds: the clock ticks of /proc/PID/stat are too coarse for a connection's share); 0.0 if it is gone."""
    parents = {}
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                with open('/proc/{0}/stat'.format(entry)) as fh:
                    parents[int(entry)] = int(fh.read().rsplit(')', 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    total, todo = 0.0, [pid] if pid in parents else []
    while todo:
        p = todo.pop()
        try:
            for tid in os.listdir('/proc/{0}/task'.format(p)):
                with open('/proc/{0}/task/{1}/schedstat'.format(p, tid)) as fh:
                    total += int(fh.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            pass        # gone meanwhile
        todo += [c for c, parent in parents.items() if parent == p]
    return total


def _open_at_once(host, port, ca, n, go, out):
    """One client of handshakes(): once go is set, n connections at once (TLS when ca) in one event loop, as a
    bench_serving client's first wave opens them; out gets (its wall, its own CPU, each connection's time)."""
    import asyncio
    import ssl
    context = ssl.create_default_context(cafile=ca) if ca else None

    async def one():
        t = time.perf_counter()
        _, writer = await asyncio.open_connection(host, port, ssl=context)
        return time.perf_counter() - t, writer

    async def wave():
        go.wait()
        cpu, t0 = time.process_time(), time.perf_counter()
        opened = await asyncio.gather(*[one() for _ in range(n)])
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu
        for _, writer in opened:
            writer.close()
        return wall, cpu, [t for t, _ in opened]
    try:
        out.put(asyncio.run(wave()))
    except Exception as exc:    # noqa: BLE001 - said by the parent, which waits for every client
        out.put('{0}: {1}'.format(type(exc).__name__, exc))


def handshakes(host, port, ca, clients, each, watch=None, timeout=120):
    """What a side's first wave costs in connections alone: `clients` processes, each opening `each` connections at
    once (TLS trusting ca, else plain TCP), all starting together. Returns the slowest client's wall, the p50 and p99
    of a connection's time, the clients' CPU for each connection, and the CPU each process of watch ({name: pid},
    with the processes under it) used for each connection meanwhile - where a wave's time goes: the clients' own TLS
    or the server's."""
    import multiprocessing
    ctx = multiprocessing.get_context('fork')
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_open_at_once, args=(host, port, ca, each, go, out)) for _ in range(clients)]
    for p in procs:
        p.start()
    time.sleep(0.5)     # the clients up, their contexts made
    before = {name: tree_cpu(pid) for name, pid in (watch or {}).items()}
    go.set()
    import queue
    try:
        results = [out.get(timeout=timeout) for _ in procs]
    except queue.Empty:
        for p in procs:
            p.kill()
        raise RuntimeError('{0} connections at once from {1} clients: not all open after {2} s'.format(
            each, clients, timeout)) from None
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    failed = [r for r in results if isinstance(r, str)]
    if failed:
        raise RuntimeError('a client could not open its connections: ' + failed[0])
    n = clients * each
    times = [t for _, _, ts in results for t in ts]
    return {'clients': clients, 'each': each, 'tls': bool(ca), 'wave_ms': 1000 * max(w for w, _, _ in results),
            'p50_ms': 1000 * percentile(times, 50), 'p99_ms': 1000 * percentile(times, 99),
            'client_cpu_ms': 1000 * sum(c for _, c, _ in results) / n,
            'server_cpu_ms': {name: 1000 * (tree_cpu(pid) - before[name]) / n for name, pid in (watch or {}).items()}}


class NodeLoads:
    """Each node's requests (running + waiting, from its /v1/loads with the key) every `every` seconds while a side
    runs, in a thread: how evenly the load lay on the nodes. The direct side's is even by construction (C/2 a node);
    through the gateway it is its policy's, and a node carrying more than its half queues more: a longer TTFT."""

    def __init__(self, nodes, key, full, every=0.1):
        self.nodes, self.key, self.full, self.every = nodes, key, full, every
        self.samples = []
        self.waiting = None     # the most requests waiting (queued, not running) on one node in those samples
        self.busy = [0, 0]      # the machine's busy and all CPU time over the samples at full load (clock ticks)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        last = cpu_times()
        while not self._stop.wait(self.every):
            try:
                loads = [json.loads(get(n + '/v1/loads', self.key, timeout=2)[1])['aggregate'] for n in self.nodes]
                now = [a['total_reqs'] for a in loads]
                waiting = max(a['total_waiting_reqs'] for a in loads)
            except (OSError, ValueError, KeyError, TypeError):
                continue
            cpu, last = last, cpu_times()
            if sum(now) >= 0.9 * self.full:     # the side at its concurrency: not its ramp-up nor its last requests
                self.samples.append(now)
                self.waiting = waiting if self.waiting is None else max(self.waiting, waiting)
                if cpu and last:
                    self.busy = [a + b - c for a, b, c in zip(self.busy, last, cpu, strict=True)]

    def cpu_busy(self):
        """The machine's CPUs' busy share (%) over the samples at full load (/proc/stat), or None."""
        busy, total = self.busy
        return 100.0 * busy / total if total else None

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)

    def spread(self):
        """(mean, max) over the samples at full load of the busiest node's requests less the idlest's; None: none."""
        gaps = [max(s) - min(s) for s in self.samples]
        return (sum(gaps) / len(gaps), max(gaps)) if gaps else None


def direct_clients(clients, n):
    """How many clients drive n nodes directly against `clients` through the gateway: as many, at least one a node."""
    return max(1, clients // n) * n


def overhead(python, nodes, gateway, key, model, tokenizer, c, per, clients=1, direct_run=None, ca=None):
    """The nodes directly at C/n each, all at once, then the gateway at C from `clients` clients side by side (C/clients
    each); the overhead is the gateway's p99 TTFT less the nodes' direct p99 TTFT, each over all of its requests
    together. Each side has as many clients as the other where it can: clients/n on each node (at least one), each at
    the same concurrency both times (one Python client reading every node's streams, or 512 requests each opening a
    TLS connection at once, is itself a bottleneck at 1,024: measured on 16 CPUs, docs/operations.md). Also the same
    after each client's first wave (steady_*): its connections all opened at once, whose TLS handshakes on a busy
    machine were the whole tail of the fleet smoke test through the gateway."""
    each = direct_clients(clients, len(nodes)) // len(nodes)     # clients on each node directly
    if direct_run is None or direct_run['direct_clients'] != each * len(nodes):
        before = listen_overflows()
        urls = [n for n in nodes for _ in range(each)]
        with NodeLoads(nodes, key, c) as loads:
            direct, direct_p99, direct_steady = side_by_side(python, urls, key, model, tokenizer, c // len(urls), per)
        direct_loads = loads.spread(), loads.cpu_busy(), loads.waiting
        direct_overflows = overflows_since(before)
        by_node = [percentile([t for r in direct[i * each:(i + 1) * each] for t in r['ttfts_ms']], 99)
                   for i in range(len(nodes))]
    else:       # the direct side of an earlier call at the same C and clients (another count through the gateway)
        direct, direct_p99, direct_steady, direct_overflows, by_node, direct_loads = (
            direct_run['direct'], direct_run['direct_p99_ttft_ms'], direct_run['direct_steady_p99_ttft_ms'],
            direct_run['overflows'][0], direct_run['direct_nodes_p99_ttft_ms'],
            (direct_run['spread'][0], direct_run['cpu_busy'][0], direct_run['waiting'][0]))
    before = listen_overflows()
    with NodeLoads(nodes, key, c) as loads:
        runs, through_p99, through_steady = side_by_side(python, [gateway] * clients, key, model, tokenizer,
                                                         c // clients, per, ca=ca)
    through_overflows = overflows_since(before)
    through = {'tok_s': sum(r['tok_s'] for r in runs), 'p99_ttft_ms': through_p99, 'steady_p99_ttft_ms': through_steady,
               'failed': sum(r['failed'] for r in runs)}
    return {'c': c, 'clients': clients, 'direct_clients': len(direct), 'direct': direct,
            'direct_nodes_p99_ttft_ms': by_node, 'direct_p99_ttft_ms': direct_p99,
            'direct_steady_p99_ttft_ms': direct_steady, 'through': through, 'overhead_ms': through_p99 - direct_p99,
            'steady_overhead_ms': None if direct_steady is None or through_steady is None
            else through_steady - direct_steady, 'overflows': (direct_overflows, through_overflows),
            'spread': (direct_loads[0], loads.spread()), 'cpu_busy': (direct_loads[1], loads.cpu_busy()),
            'waiting': (direct_loads[2], loads.waiting)}


def markdown_table(head, lines):
    """Print head and lines (lists of strings) as a Markdown table, each column as wide as its widest cell."""
    widths = [max(len(x) for x in col) for col in zip(head, *lines, strict=True)]
    for i, line in enumerate([head] + lines):
        print('| ' + ' | '.join(x.ljust(w) for x, w in zip(line, widths, strict=True)) + ' |')
        if i == 0:
            print('|' + '|'.join('-' * (w + 2) for w in widths) + '|')


def table(rows):
    head = ['C', 'clients direct / through the gateway', 'direct p99 TTFT (node 1 / node 2 / both)',
            'gateway p99 TTFT', 'overhead (need <= {0} ms)'.format(BAR_MS),
            'after the first wave: direct / gateway / overhead', 'direct tok/s (sum)', 'gateway tok/s', 'failed direct',
            'failed gateway', 'listen overflows direct / gateway', "nodes' requests apart, mean / max: direct; gateway",
            'most waiting on a node direct / gateway', 'CPUs busy at full load direct / gateway']
    lines = []
    for r in rows:
        lines.append(['{0} ({1} a node)'.format(r['c'], r['c'] // 2), '{0} / {1}'.format(r['direct_clients'],
                                                                                    r['clients']),
                      ' / '.join('{0:,.0f}'.format(p) for p in r['direct_nodes_p99_ttft_ms'] + [r['direct_p99_ttft_ms']])
                      + ' ms',
                      '{0:,.0f} ms'.format(r['through']['p99_ttft_ms']),
                      '{0:+,.0f} ms {1}'.format(r['overhead_ms'], 'met' if r['overhead_ms'] <= BAR_MS else 'NOT met'),
                      'n/a' if r['steady_overhead_ms'] is None else '{0:,.0f} / {1:,.0f} / {2:+,.0f} ms {3}'.format(
                          r['direct_steady_p99_ttft_ms'], r['through']['steady_p99_ttft_ms'], r['steady_overhead_ms'],
                          'met' if r['steady_overhead_ms'] <= BAR_MS else 'NOT met'),
                      '{0:,.0f}'.format(sum(d['tok_s'] for d in r['direct'])), '{0:,.0f}'.format(r['through']['tok_s']),
                      str(sum(d['failed'] for d in r['direct'])), str(r['through']['failed']),
                      ' / '.join('n/a' if n is None else str(n) for n in r['overflows']),
                      '; '.join('n/a' if g is None else '{0:.1f} / {1}'.format(*g) for g in r['spread']),
                      ' / '.join('n/a' if w is None else str(w) for w in r['waiting']),
                      ' / '.join('n/a' if b is None else '{0:.0f} %'.format(b) for b in r['cpu_busy'])])
    markdown_table(head, lines)


def wave_table(waves):
    head = ['C', 'to', 'clients x connections', 'kind', 'slowest client\'s wave', 'a connection p50 / p99',
            'client CPU a connection', 'server CPU a connection']
    lines = [['{0} ({1} a node)'.format(w['c'], w['c'] // 2), w['side'], '{0} x {1}'.format(w['clients'], w['each']),
              'TLS' if w['tls'] else 'TCP', '{0:,.0f} ms'.format(w['wave_ms']),
              '{0:,.0f} / {1:,.0f} ms'.format(w['p50_ms'], w['p99_ms']), '{0:.2f} ms'.format(w['client_cpu_ms']),
              ', '.join('{0} {1:.2f} ms'.format(k, v) for k, v in w['server_cpu_ms'].items())] for w in waves]
    markdown_table(head, lines)


def numbers(text):
    """'1024,512' -> [1024, 512]; None for anything that is not a comma-separated list of integers."""
    try:
        return [int(x) for x in text.split(',') if x.strip()]
    except ValueError:
        return None


def haproxy_version(haproxy):
    r = subprocess.run(haproxy + ['-v'], capture_output=True, text=True)
    return (r.stdout.splitlines() or ['?'])[0]


def default_smg(python):
    beside = os.path.join(os.path.dirname(python), 'smg')
    if os.path.exists(beside):
        return [beside]
    found = shutil.which('smg')
    return [found] if found else [python, '-m', 'smg']


def main():
    defaults = role_defaults()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--concurrency', default='1024',
                    help='through the gateway, comma-separated (C/2 a node directly; default 1024)')
    ap.add_argument('--gateway-clients', default='8',
                    help='bench_serving clients side by side through the gateway, comma-separated: a row for each, '
                         'with half as many on each node directly, at least one (default 8)')
    ap.add_argument('--prompts-per-concurrency', type=positive, default=2, help='prompts per run: C times this (default 2)')
    ap.add_argument('--python', default=sys.executable, help='a Python that imports sglang (default: this one)')
    ap.add_argument('--smg', default=None, help='the gateway command (default: smg beside --python, on PATH, or -m smg)')
    ap.add_argument('--tokenizer', default=None, help='a stand-in model folder (default: made in a temporary folder)')
    ap.add_argument('--emulator', default=EMULATOR, help='the engine emulator (default: scripts/lab/sglang_emulator.py)')
    ap.add_argument('--max-running-requests', type=positive, default=1024, help="each engine's (default 1024, the seeds')")
    ap.add_argument('--logs', default=None, help='keep the emulators\' and the gateway\'s logs in this folder')
    ap.add_argument('--tls', action=argparse.BooleanOptionalAction, default=bool(defaults['sglang_gateway_tls']),
                    help='HTTPS at the gateway, as the role deploys it (default: the role\'s sglang_gateway_tls)')
    ap.add_argument('--front', choices=('haproxy', 'none'), default='haproxy',
                    help='what clients reach: HAProxy in front of smg, as the role deploys it (default), or smg itself')
    ap.add_argument('--haproxy', default=None, help='HAProxy\'s command (default: haproxy on PATH, /usr/sbin/haproxy)')
    ap.add_argument('--handshakes', action=argparse.BooleanOptionalAction, default=True,
                    help='first, each side\'s first wave in connections alone: each client\'s connections opened at '
                         'once, the CPU they cost the clients and the servers (default: on)')
    ap.add_argument('--gateway-flag', action='append', default=[], metavar='FLAG=VALUE',
                    help='a gateway flag over the role\'s, as sglang_gateway_extra_flags sets one (without its dashes; '
                         'FLAG=true for a switch, FLAG=false leaves a flag out): to measure a setting before the role '
                         'deploys it; repeatable')
    args = ap.parse_args()
    levels, client_counts = numbers(args.concurrency), numbers(args.gateway_clients)
    overrides = gateway_overrides(args.gateway_flag)
    if overrides is None:
        sys.exit('--gateway-flag: FLAG=VALUE with FLAG a gateway flag other than {0}, without its dashes; got {1!r}'
                 .format(', '.join(PLACED + TLS_FLAGS), args.gateway_flag))
    if not levels or any(c < 2 or c % 2 for c in levels):
        sys.exit('--concurrency: even numbers >= 2 (half a node), comma-separated; got {0!r}'.format(args.concurrency))
    if not client_counts or any(k < 1 or c % k or c % direct_clients(k, 2) for k in client_counts for c in levels):
        sys.exit('--gateway-clients: numbers >= 1 that divide every --concurrency (and twice their half, the clients '
                 'directly), comma-separated; got {0!r}'.format(args.gateway_clients))
    # thousands of connections: the client, the gateway and the engines each hold one per request; HAProxy wants two
    # for each of its sglang_gateway_max_connections. The role's units set LimitNOFILE=1048576: so here where allowed
    # (root may raise the hard limit), else as far as the hard limit goes.
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1048576, 1048576))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (1048576 if hard == resource.RLIM_INFINITY else hard, hard))
    if not (os.path.isfile(args.python) and os.access(args.python, os.X_OK)):
        sys.exit('--python: {0} is not a Python that can run here (give an SGLang environment\'s bin/python)'.format(
            args.python))
    if args.logs and os.path.exists(args.logs) and not os.path.isdir(args.logs):
        sys.exit('--logs: {0} is not a folder'.format(args.logs))
    smg = args.smg.split() if args.smg else default_smg(args.python)
    if not (shutil.which(smg[0]) or os.access(smg[0], os.X_OK)):
        sys.exit('--smg: {0} not found (give the gateway\'s command: smg, or PY -m smg)'.format(smg[0]))
    haproxy = (args.haproxy or default_haproxy()).split()
    if args.front == 'haproxy' and not (shutil.which(haproxy[0]) or os.access(haproxy[0], os.X_OK)):
        sys.exit('HAProxy not found ({0}): install Debian\'s haproxy, give --haproxy, or --front none to measure smg '
                 'alone'.format(haproxy[0]))
    flags, version = gateway_flags()
    flags.update(overrides)
    key, admin = secrets.token_hex(16), secrets.token_hex(16)
    procs = {}
    with tempfile.TemporaryDirectory(prefix='glm5-bench-gateway-') as tmp:
        logs = args.logs or tmp
        os.makedirs(logs, exist_ok=True)
        tokenizer = args.tokenizer
        if not tokenizer:
            tokenizer = os.path.join(tmp, 'model')
            subprocess.run([args.python, STAND_IN_MODEL, tokenizer], check=True, capture_output=True)
        env = dict((k, v) for k, v in os.environ.items() if not k.startswith('GLM5_EMULATOR_'))
        # the seeds' pace (no GLM5_EMULATOR_SPEED), no faults, no file of faults, a parse cache of its own
        env.update(GLM5_EMULATOR_FAULTS_FILE=os.path.join(tmp, 'no-faults'),
                   GLM5_EMULATOR_CACHE=os.path.join(tmp, 'parse-cache'), PYTHONUNBUFFERED='1')
        ports = [free_port(), free_port()]
        nodes = ['http://127.0.0.1:{0}'.format(p) for p in ports]
        gw_port, metrics_port = free_port(), free_port()
        scheme = 'https' if args.tls else 'http'
        ca = None
        if args.tls:
            cert, cert_key, ca = make_certificate(tmp)
            flags.update({'tls-cert-path': cert, 'tls-key-path': cert_key})
        front_port = free_port() if args.front == 'haproxy' else gw_port
        gateway = '{0}://127.0.0.1:{1}'.format(scheme, front_port)
        files = []
        if args.front == 'haproxy':       # checked before anything starts
            cfg = os.path.join(tmp, 'haproxy.cfg')
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            conns = defaults['sglang_gateway_max_connections']
            if limit != resource.RLIM_INFINITY and 2 * conns + 100 > limit:
                conns = (limit - 100) // 2
                print('HAProxy maxconn {0} (the role\'s is {1}): this process may open {2} files'.format(
                    conns, defaults['sglang_gateway_max_connections'], limit), flush=True)
                if conns < 2 * max(levels):
                    sys.exit('too few open files allowed ({0}) for HAProxy at concurrency {1}'.format(limit, max(levels)))
            with open(cfg, 'w') as fh:
                fh.write(front_config(front_port, gw_port, free_port(), os.path.join(tmp, 'haproxy.sock'), args.tls,
                                      conns))
            check = subprocess.run(haproxy + ['-c', '-f', cfg], capture_output=True, text=True)
            if check.returncode != 0:
                sys.exit('haproxy -c refused the front door\'s configuration:\n' + (check.stdout + check.stderr)[-2000:])
        try:
            for i, port in enumerate(ports):
                log = open(os.path.join(logs, 'emulator{0}.log'.format(i + 1)), 'w')
                files.append(log)
                procs['emulator {0}'.format(i + 1)] = subprocess.Popen(
                    [args.python, args.emulator, '--model-path', tokenizer, '--served-model-name', MODEL, '--host',
                     '127.0.0.1', '--port', str(port), '--api-key', key, '--max-running-requests',
                     str(args.max_running_requests)], stdout=log, stderr=subprocess.STDOUT, env=env)
                procs['emulator {0}'.format(i + 1)].log_path = log.name
            for url in nodes:
                wait_for(url, lambda u=url: get(u + '/health')[0] == 200, procs, 180)
            gw_argv = smg + ['launch'] + argv_of(dict(flags, **{
                'host': '127.0.0.1', 'port': gw_port, 'worker-urls': nodes, 'prometheus-host': '127.0.0.1',
                'prometheus-port': metrics_port})) + ['--api-key', key, '--control-plane-api-keys',
                                                      'glm5:glm5-ops:admin:' + admin]
            log = open(os.path.join(logs, 'gateway.log'), 'w')
            files.append(log)
            procs['gateway'] = subprocess.Popen(gw_argv, stdout=log, stderr=subprocess.STDOUT,
                                                env=dict(os.environ, NO_COLOR='1'))
            procs['gateway'].log_path = log.name

            if args.front == 'haproxy':
                log = open(os.path.join(logs, 'haproxy.log'), 'w')
                files.append(log)
                procs['haproxy'] = subprocess.Popen(haproxy + ['-W', '-db', '-f', cfg], stdout=log,
                                                    stderr=subprocess.STDOUT)
                procs['haproxy'].log_path = log.name

            def both_healthy():
                workers = json.loads(get(gateway + '/workers', admin, ca=ca)[1])['workers']
                return len(workers) == 2 and all(w['is_healthy'] for w in workers)
            ready = wait_for('the gateway', both_healthy, procs, 120)
            shown = ' '.join(a if a not in (key, 'glm5:glm5-ops:admin:' + admin) else '***' for a in gw_argv)
            print('gateway smg {0} ready in {1:.1f} s: {2}'.format(version, ready, shown), flush=True)
            if args.front == 'haproxy':
                print('front door: HAProxy ({0}) at {1}, TCP through to smg at 127.0.0.1:{2}'.format(
                    haproxy_version(haproxy), gateway, gw_port), flush=True)
            waves = []
            if args.handshakes:
                # the first waves' connections alone, before any request: the direct side's clients on one node
                # (plain TCP, as the nodes serve), the gateway side's through the front door (TLS when served)
                host = '127.0.0.1'
                gw_watch = {'smg': procs['gateway'].pid}
                if 'haproxy' in procs:
                    gw_watch['HAProxy'] = procs['haproxy'].pid
                for c in levels:
                    for k in client_counts:
                        d = direct_clients(k, len(nodes))
                        try:
                            waves.append(dict(handshakes(host, ports[0], None, d // len(nodes), c // k,
                                                         {'engine': procs['emulator 1'].pid}), c=c,
                                              side='a node directly'))
                            waves.append(dict(handshakes(host, front_port, ca, k, c // k, gw_watch), c=c,
                                              side='the gateway'))
                        except RuntimeError as exc:
                            sys.exit('the first waves\' connections alone (--no-handshakes leaves them out): '
                                     '{0}'.format(exc))
            rows = []
            for c in levels:
                direct = {}     # the direct side measured once for each count of clients on it
                for k in client_counts:
                    t0 = time.time()
                    rows.append(overhead(args.python, nodes, gateway, key, MODEL, tokenizer, c,
                                         args.prompts_per_concurrency, clients=k,
                                         direct_run=direct.get(direct_clients(k, len(nodes))), ca=ca))
                    direct.setdefault(rows[-1]['direct_clients'], rows[-1])
                    r = rows[-1]
                    print('concurrency {0}: direct ({1} clients) p99 TTFT {2:,.0f} ms, through the gateway ({3} '
                          'client(s)) {4:,.0f} ms: {5:+,.0f} ms ({6:.0f} s)'.format(
                              c, r['direct_clients'], r['direct_p99_ttft_ms'], k, r['through']['p99_ttft_ms'],
                              r['overhead_ms'], time.time() - t0), flush=True)
        finally:
            # the gateway first (its health checks would see the engines go), then the engines
            for p in reversed(list(procs.values())):
                if p.poll() is None:
                    p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            for fh in files:
                fh.close()
    print('\n{0} CPUs; two engine emulators at the seeds\' pace (--max-running-requests {1}) and smg {2} ({3}), '
          'random-ids 256/128, {4} prompts per concurrency; the clients reach {5} over {6}\n'.format(
              os.cpu_count(), args.max_running_requests, version,
              ', '.join([flags.get('policy')] + ['{0} {1}'.format(k, v) for k, v in overrides.items() if k != 'policy']),
              args.prompts_per_concurrency,
              'HAProxy in front of smg' if args.front == 'haproxy' else 'smg itself',
              'HTTPS' if args.tls else 'plain HTTP'))
    table(rows)
    if waves:
        print('\nEach first wave in connections alone (before the runs above; each client opening its connections '
              'at once, the clients starting together):\n')
        wave_table(waves)


if __name__ == '__main__':
    main()
