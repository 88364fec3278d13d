#!/usr/bin/env python3
"""Fleet benchmark on the lab (by hand, not in CI): the gateway in front of make deploy's two nodes. Prints a table.

    .venv/bin/python scripts/bench_fleet.py [--concurrency 1024] [--skip throughput,overhead,rolling,failing,kill]

1. throughput: sglang.bench_serving (random-ids 256/128, as the smoke test) at C against one node directly, then at 2C
   through the gateway: total tok/s of each and their ratio.
   overhead: the p99 TTFT the gateway adds at C: through the gateway at C (C/2 a node, two clients of C/2) less the
   nodes' own when both are driven directly at C/2 at once (the load the gateway gives each; the same engines' and
   clients' load on this machine's two CPUs); each p99 over all the requests of its two clients. At C per node (2C
   through the gateway) the nodes sit at the seeds' --max-running-requests 1024, where any imbalance queues a request
   behind a full batch for seconds: that figure is printed too, and is not the gateway's own cost.
2. rolling: a load generator through the gateway at a steady concurrency (--load threads, each asking again as soon
   as it is answered) while `ansible-playbook site.yml --tags sglang` rolls a flag change across both nodes (one at a
   time: out of the gateway, drained, restarted, smoke-tested at concurrency 64, back): failed requests, rollout time.
3. failing: a change the first node fails its smoke test with (the emulator's NaN fault) rolled out under the same
   load: it is rolled back and stays out of the gateway, the rollout stops, the second node keeps serving; then the
   inventory's configuration is rolled out again under load (the flag change undone, the first node back).
4. kill: the same load while one node's engine is killed (SIGKILL) and held down --down seconds (then started
   again): failed requests, and the gateway's own retry counters over the same time (smg_worker_retries_total,
   smg_worker_retries_exhausted_total: the requests it resent to the other node, and those it gave up on), seconds
   until the gateway marked the node unhealthy, and until it was healthy again.

Runs bench_serving with a Python that has the pinned sglang (default: the lab's cached seed-validated venv that make
test builds; --python to name another). The lab only: never point it at a real fleet (it restarts nodes).
"""
import argparse
import json
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from bench_gateway import bench, lab_sglang_python, overhead, positive
from glm5.inventory import DEFAULT_INVENTORY, GATEWAY_CONTRACT, Inventory
from glm5.project import ROOT

PLAYBOOK = os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')
# The rollouts' smoke test: one level (64, the production prompts per level and gates), not the full sweep
SMOKE = {'sglang_smoke_levels': [64]}
# A flag change every node restarts for (sglang's watchdog, harmless on the emulator)
FLAG_CHANGE = {'watchdog-timeout': 602}


def lab():
    inv = Inventory(DEFAULT_INVENTORY)
    (gateway,) = inv.gateways()
    gw = inv.contract(gateway, which=GATEWAY_CONTRACT)
    nodes = inv.nodes()
    first = inv.host_vars(nodes[0])
    return {'gateway': gateway, 'url': gw['url'], 'ca': gw.get('ca_cert') or None,
            'admin': inv.host_vars(gateway).get('sglang_gateway_admin_key'),
            'key': first.get('sglang_service_api_key'), 'nodes': nodes, 'metrics': gw['metrics_url'],
            'node_urls': [inv.contract(n)['url'] for n in nodes], 'model': first.get('sglang_service_served_model_name'),
            'tokenizer': first.get('lab_stand_in_model_dir'), 'ssh': {n: inv.host_vars(n) for n in nodes}}


class Load(object):
    """Threads asking the gateway again and again; counts answers and failures."""

    def __init__(self, url, key, model, threads, ca=None):
        self.url, self.key, self.model = url, key, model
        # the gateway's TLS: its CA (the contract's ca_cert)
        self.context = ssl.create_default_context(cafile=ca) if ca else None
        self.ok = self.failed = 0
        self.errors = {}
        self.failures = []          # (time.time(), outcome) of each failed request
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.loop, daemon=True) for _ in range(threads)]

    def loop(self):
        body = json.dumps({'model': self.model, 'messages': [{'role': 'user', 'content': 'Tell me a story.'}],
                           'max_tokens': 64, 'ignore_eos': True}).encode()
        while not self.stop.is_set():
            req = urllib.request.Request(self.url + '/v1/chat/completions', body, {
                'Authorization': 'Bearer ' + self.key, 'Content-Type': 'application/json'})
            try:
                with urllib.request.urlopen(req, timeout=300, context=self.context) as resp:
                    resp.read()
                    outcome = None
            except urllib.error.HTTPError as err:
                outcome = 'HTTP {0}'.format(err.code)
            except OSError as err:
                outcome = type(err).__name__
            with self.lock:
                if outcome is None:
                    self.ok += 1
                else:
                    self.failed += 1
                    self.errors[outcome] = self.errors.get(outcome, 0) + 1
                    self.failures.append((time.time(), outcome))
            if outcome is not None:
                # a client's pause before it asks again: a refused connection is not counted thousands of times
                self.stop.wait(0.1)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(330)


def workers(fleet):
    req = urllib.request.Request(fleet['url'] + '/workers', headers={'Authorization': 'Bearer ' + fleet['admin']})
    context = ssl.create_default_context(cafile=fleet['ca']) if fleet['ca'] else None
    with urllib.request.urlopen(req, timeout=10, context=context) as resp:
        return {w['url']: w['is_healthy'] for w in json.load(resp)['workers']}


def rollout(extra, must_pass=True):
    t0 = time.time()
    with tempfile.NamedTemporaryFile('w', suffix='.json') as fh:
        json.dump(extra, fh)
        fh.flush()
        r = subprocess.run([PLAYBOOK, os.path.join(ROOT, 'site.yml'), '--tags', 'sglang', '-e', '@' + fh.name],
                           capture_output=True, text=True, cwd=ROOT)
    if (r.returncode == 0) != must_pass:
        sys.exit('the rollout {0}:\n{1}'.format('failed' if must_pass else 'passed', r.stdout[-3000:]))
    return time.time() - t0


def retries(fleet):
    """The gateway's retry counters, summed: (resent, exhausted)."""
    with urllib.request.urlopen(fleet['metrics'], timeout=10) as resp:
        text = resp.read().decode()
    sums = {'smg_worker_retries_total': 0, 'smg_worker_retries_exhausted_total': 0}
    for line in text.splitlines():
        name = line.split('{')[0].split(' ')[0]
        if name in sums:
            sums[name] += int(float(line.rsplit(' ', 1)[1]))
    return sums['smg_worker_retries_total'], sums['smg_worker_retries_exhausted_total']


def ssh(fleet, node, *argv):
    hv = fleet['ssh'][node]
    cmd = ['ssh', '-i', hv.get('ansible_ssh_private_key_file'), '-p', str(hv.get('ansible_port'))] + \
        hv.get('ansible_ssh_common_args').split() + ['root@' + hv.get('ansible_host')] + list(argv)
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)


# the stages, in the order they run (--skip names some of them)
STAGES = ('throughput', 'overhead', 'rolling', 'failing', 'kill')


def stages(text):
    """argparse type: comma-separated stage names, each one of STAGES (a typo would run the stage it meant to skip,
    and those restart nodes)."""
    names = set(filter(None, (n.strip() for n in text.split(','))))
    unknown = sorted(names - set(STAGES))
    if unknown:
        raise argparse.ArgumentTypeError('unknown stage(s) {0}: the stages are {1}'.format(', '.join(unknown),
                                                                                          ', '.join(STAGES)))
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--concurrency', type=positive, default=1024,
                    help='per node (default 1024, the seeds\' top level)')
    ap.add_argument('--prompts-per-concurrency', type=positive, default=2)
    ap.add_argument('--load', type=positive, default=64,
                    help='load generator threads for rolling and kill (default 64)')
    ap.add_argument('--skip', type=stages, default=set(), help='comma-separated: ' + ', '.join(STAGES))
    ap.add_argument('--down', type=positive, default=20, help='seconds the killed node is kept down (default 20)')
    ap.add_argument('--python', default=lab_sglang_python(),
                    help='a Python with the pinned sglang (default: the newest seed-validated venv make test cached)')
    args = ap.parse_args()
    skip = args.skip
    fleet = lab()
    rows = []
    try:
        if 'throughput' not in skip:
            if not args.python:
                sys.exit('no Python with sglang: run make test once (it caches one) or give --python')
            c = args.concurrency
            one = bench(args.python, fleet['node_urls'][0], fleet['key'], fleet['model'], fleet['tokenizer'], c,
                        c * args.prompts_per_concurrency)
            two = bench(args.python, fleet['url'], fleet['key'], fleet['model'], fleet['tokenizer'], 2 * c,
                        2 * c * args.prompts_per_concurrency, ca=fleet['ca'])
            rows += [('one node direct, concurrency {0}'.format(c), '{0:,.0f} tok/s'.format(one['tok_s']),
                      'p99 TTFT {0:,.0f} ms, {1} failed'.format(one['p99_ttft_ms'], one['failed'])),
                     ('gateway, 2 nodes, concurrency {0}'.format(2 * c), '{0:,.0f} tok/s'.format(two['tok_s']),
                      'p99 TTFT {0:,.0f} ms, {1} failed'.format(two['p99_ttft_ms'], two['failed'])),
                     ('ratio (need >= 1.8)', '{0:.2f}x'.format(two['tok_s'] / one['tok_s']), ''),
                     ('p99 TTFT at {0} a node, through the gateway less directly'.format(c),
                      '{0:+,.0f} ms'.format(two['p99_ttft_ms'] - one['p99_ttft_ms']),
                      'the nodes at their --max-running-requests: imbalance queues (not the gateway\'s own cost)')]
        if 'overhead' not in skip:
            c = args.concurrency
            # both nodes at C/2 at once, each by its own client, then the gateway at C by as many clients (C/2 each):
            # the same engines' and clients' load on this machine's CPUs both times, so the difference is the gateway's
            r = overhead(args.python, fleet['node_urls'], fleet['url'], fleet['key'], fleet['model'], fleet['tokenizer'],
                         c, args.prompts_per_concurrency, clients=len(fleet['node_urls']), ca=fleet['ca'])
            through = r['through']
            rows += [('both nodes direct at once, concurrency {0} each'.format(c // 2),
                      '{0:,.0f} tok/s'.format(sum(d['tok_s'] for d in r['direct'])),
                      'p99 TTFT {0:,.0f} ms (all their requests), {1} failed'.format(
                          r['direct_p99_ttft_ms'], sum(d['failed'] for d in r['direct']))),
                     ('gateway, 2 nodes, concurrency {0} ({1} clients)'.format(c, r['clients']),
                      '{0:,.0f} tok/s'.format(through['tok_s']),
                      'p99 TTFT {0:,.0f} ms, {1} failed'.format(through['p99_ttft_ms'], through['failed'])),
                     ('gateway p99 TTFT overhead at {0} (need <= 50 ms)'.format(c),
                      '{0:+,.0f} ms'.format(r['overhead_ms']),
                      'connections refused by a full listen queue: {0} direct, {1} through the gateway'.format(
                          *r['overflows'])),
                     ('the same after each client\'s first wave (its connections opened at once)',
                      'n/a' if r['steady_overhead_ms'] is None else '{0:+,.0f} ms'.format(r['steady_overhead_ms']),
                      'p99 TTFT {0} ms directly, {1} ms through the gateway'.format(
                          *('n/a' if v is None else '{0:,.0f}'.format(v)
                            for v in (r['direct_steady_p99_ttft_ms'], through['steady_p99_ttft_ms']))))]
        if 'rolling' not in skip:
            with Load(fleet['url'], fleet['key'], fleet['model'], args.load, fleet['ca']) as load:
                there = rollout(dict(SMOKE, sglang_service_flag_overrides=FLAG_CHANGE))
            rows += [('rolling deploy under load: flag change, 2 nodes', '{0:.0f} s'.format(there),
                      '{0} answered, {1} failed {2}'.format(load.ok, load.failed, load.errors or ''))]
        if 'failing' not in skip:
            # a change the first node's smoke test fails (the engine's NaN fault): rolled back, left out, the rollout stops;
            # then the inventory's own configuration rolled out again (the first node back in)
            bad = dict(SMOKE, sglang_service_env={'GLM5_EMULATOR_SPEED': '1', 'GLM5_EMULATOR_FAULTS': 'nan'})
            with Load(fleet['url'], fleet['key'], fleet['model'], args.load, fleet['ca']) as load:
                took = rollout(bad, must_pass=False)
                after = workers(fleet)
            with Load(fleet['url'], fleet['key'], fleet['model'], args.load, fleet['ca']) as again:
                recover = rollout(dict(SMOKE))
            rows += [('rollout of a change the first node fails', '{0:.0f} s'.format(took),
                      'then in the gateway: {0}; {1} answered, {2} failed {3}'.format(
                          ', '.join(n for n, u in zip(fleet['nodes'], fleet['node_urls'], strict=True)
                                    if after.get(u)) or 'nobody',
                          load.ok, load.failed, load.errors or '')),
                     ('rolling deploy back to the inventory', '{0:.0f} s'.format(recover),
                      '{0} answered, {1} failed {2}'.format(again.ok, again.failed, again.errors or ''))]
        if 'kill' not in skip:
            node, url = fleet['nodes'][-1], fleet['node_urls'][-1]
            before = retries(fleet)
            with Load(fleet['url'], fleet['key'], fleet['model'], args.load, fleet['ca']) as load:
                time.sleep(5)
                t0 = time.time()
                # killed, and kept down (systemd would restart it within seconds, before any health check noticed)
                ssh(fleet, node, 'systemctl kill -s KILL glm5-sglang; systemctl stop glm5-sglang')
                unhealthy = healthy = None
                started = False
                while time.time() - t0 < 180 and healthy is None:
                    state = workers(fleet).get(url)
                    if unhealthy is None and state is False:
                        unhealthy = time.time() - t0
                    if not started and time.time() - t0 >= args.down:
                        ssh(fleet, node, 'systemctl reset-failed glm5-sglang; systemctl start glm5-sglang')
                        started = True
                    if started and unhealthy is not None and state:
                        healthy = time.time() - t0
                    time.sleep(0.5)
                time.sleep(5)
            after = retries(fleet)
            rows += [('{0} killed under load, down {1} s'.format(node, args.down), '{0} failed'.format(load.failed),
                      '{0} answered; the gateway resent {1}, gave up on {2}; unhealthy after {3}, healthy again after '
                      '{4} {5}'.format(load.ok, after[0] - before[0], after[1] - before[1],
                                       '{0:.1f} s'.format(unhealthy) if unhealthy is not None else 'never',
                                       '{0:.1f} s'.format(healthy) if healthy is not None else 'never', load.errors or ''))]
    finally:
        table(rows)


def table(rows):
    width = max(len(r[0]) for r in rows) if rows else 0
    print('| {0} | result | detail |\n|{1}|---|---|'.format('measure'.ljust(width), '-' * (width + 2)))
    for r in rows:
        print('| {0} | {1} | {2} |'.format(r[0].ljust(width), r[1], r[2]))


if __name__ == '__main__':
    main()
