#!/usr/bin/env python3
"""Harness benchmark (by hand, not a test): how fast can the lab's measuring chain go on this machine?

    .venv/bin/python scripts/bench_harness.py [--python ENV/bin/python] [--prompts 2048] [--concurrency 1024]

Starts the engine emulator (scripts/lab/sglang_emulator.py) with its pacing switched off (GLM5_EMULATOR_FAULTS=slow=0:
every step is immediate) on the lab's stand-in model, and runs the real sglang.bench_serving against it (random-ids,
256 in / 128 out, the seeds' length distribution) at each concurrency given. Prints a table: what bench_serving
measured (total and output tok/s), and where the time went (CPU seconds of the emulator and of the client, wall
seconds), so it shows which side saturates first. The smoke test must never be what caps the node: the figure to
beat is 10x the seeds' best, 37,400 total tok/s.

--python: an SGLang environment's Python (default: the newest seed-validated venv the tests made under
/var/cache/glm5-lab/sglang-venvs).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

from bench_gateway import lab_sglang_python, positive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf('SC_CLK_TCK')


def cpu_seconds(pid):
    """user + system CPU seconds of a process and its reaped children (/proc/<pid>/stat)."""
    with open('/proc/{0}/stat'.format(pid)) as fh:
        fields = fh.read().rsplit(')', 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / TICK


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--python', default=lab_sglang_python())
    parser.add_argument('--prompts', type=positive, default=2048)
    parser.add_argument('--concurrency', type=positive, nargs='+', default=[256, 1024])
    parser.add_argument('--model', default='/var/lib/glm5-lab/staged-models/GLM-5-NVFP4-lab-stand-in')
    args = parser.parse_args()
    if not args.python or not os.path.exists(args.python):
        sys.exit('no SGLang environment: pass --python (make test builds one under /var/cache/glm5-lab/sglang-venvs)')
    port = free_port()
    engine = subprocess.Popen(
        [args.python, os.path.join(ROOT, 'scripts', 'lab', 'sglang_emulator.py'), '--model-path', args.model,
         '--served-model-name', 'glm-5', '--host', '127.0.0.1', '--port', str(port), '--max-running-requests',
         str(max(args.concurrency))],
        env=dict(os.environ, GLM5_EMULATOR_FAULTS='slow=0'), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    rows = []
    try:
        deadline = time.time() + 120
        while True:
            try:
                socket.create_connection(('127.0.0.1', port), 1).close()
                break
            except OSError:
                if time.time() > deadline or engine.poll() is not None:
                    sys.exit('the emulator did not start: ' + engine.stderr.read().decode()[-2000:])
                time.sleep(0.5)
        for conc in args.concurrency:
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, 'bench.jsonl')
                e0, t0 = cpu_seconds(engine.pid), time.monotonic()
                client = subprocess.Popen(
                    [args.python, '-m', 'sglang.bench_serving', '--backend', 'sglang-oai', '--base-url',
                     'http://127.0.0.1:{0}'.format(port), '--model', 'glm-5', '--tokenizer', args.model,
                     '--dataset-name', 'random-ids', '--random-input-len', '256', '--random-output-len', '128',
                     '--num-prompts', str(args.prompts), '--max-concurrency', str(conc), '--request-rate', 'inf',
                     '--output-file', out], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                # the client's CPU, read just before it is reaped
                c_cpu = 0.0
                while client.poll() is None:
                    try:
                        c_cpu = cpu_seconds(client.pid)
                    except OSError:
                        pass
                    time.sleep(0.2)
                wall = time.monotonic() - t0
                e_cpu = cpu_seconds(engine.pid) - e0
                if client.returncode != 0:
                    sys.exit('bench_serving failed:\n' + client.stdout.read().decode()[-3000:])
                with open(out) as fh:
                    r = json.loads(fh.read().splitlines()[-1])
            rows.append((conc, r['completed'], r['total_throughput'], r['output_throughput'], r['duration'], wall,
                         e_cpu, c_cpu))
    finally:
        engine.terminate()
        engine.wait(30)
    print('{0:>11} {1:>9} {2:>14} {3:>15} {4:>12} {5:>9} {6:>16} {7:>16}'.format(
        'concurrency', 'completed', 'total tok/s', 'output tok/s', 'bench [s]', 'wall [s]', 'emulator CPU [s]',
        'client CPU [s]'))
    print('-' * 112)
    for row in rows:
        print('{0:>11} {1:>9} {2:>14,.0f} {3:>15,.0f} {4:>12.1f} {5:>9.1f} {6:>16.1f} {7:>16.1f}'.format(*row))
    best = max(r[2] for r in rows)
    print('\nbest total tok/s {0:,.0f} = {1:.1f}x the seeds\' best (3,740); the goal is >= 37,400'.format(
        best, best / 3740))


if __name__ == '__main__':
    main()
