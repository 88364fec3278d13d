#!/usr/bin/env python3
"""Lab stand-in for NVIDIA's nvidia-smi (no GPU and no driver here). Prints the constructed 8x RTX PRO 6000
fixture (tests/fixtures/nvidia-smi/rtx-pro-6000-8gpu-constructed) with the installed driver version.

    GLM5_NVIDIA_FIXTURE  the fixture directory (default: <this file's dir>/fixture, where the lab puts it
                         next to the stand-in; in the repository: tests/fixtures/nvidia-smi/rtx-pro-6000-8gpu-constructed)
    GLM5_NVIDIA_VERSION  the driver version to report (default: the file 'version' next to this file,
                         else the fixture's own)

Knows the calls this package makes: --query-gpu with the recorded field list (the facts) or the smoke test's
sample fields (sample-query.csv: the same figures every time) and --format=csv, -q -x, topo -m, -L, --version.
Anything else exits 2 with a message, so a new call is noticed, not faked.
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
REPO_FIXTURE = os.path.join(HERE, '..', '..', 'tests', 'fixtures', 'nvidia-smi', 'rtx-pro-6000-8gpu-constructed')
FIXTURE_VERSION = '580.95.05'


def fixture_dir():
    for path in (os.environ.get('GLM5_NVIDIA_FIXTURE'), os.path.join(HERE, 'fixture'), REPO_FIXTURE):
        if path and os.path.isdir(path):
            return path
    sys.exit('nvidia-smi (lab stand-in): no fixture directory (GLM5_NVIDIA_FIXTURE)')


def version():
    if os.environ.get('GLM5_NVIDIA_VERSION'):
        return os.environ['GLM5_NVIDIA_VERSION']
    try:
        with open(os.path.join(HERE, 'version')) as fh:
            return fh.read().strip() or FIXTURE_VERSION
    except OSError:
        return FIXTURE_VERSION


def show(name):
    with open(os.path.join(fixture_dir(), name)) as fh:
        text = fh.read()
    ver = version()
    short = '.'.join(ver.split('.')[:2])
    text = text.replace(FIXTURE_VERSION, ver)
    text = re.sub(r'^(NVML version\s*: )\S+', r'\g<1>' + short, text, flags=re.M)
    sys.stdout.write(text)


def main(argv):
    if argv in (['-q', '-x'], ['-x', '-q']):
        return show('nvidia-smi-q.xml')
    if argv == ['topo', '-m']:
        return show('topo.txt')
    if argv == ['--version']:
        return show('smi-version.txt')
    if len(argv) == 2 and argv[0].startswith('--query-gpu=') and argv[1] == '--format=csv':
        asked = argv[0][len('--query-gpu='):].split(',')
        known = {}
        for name in ('query-gpu.csv', 'sample-query.csv'):
            with open(os.path.join(fixture_dir(), name)) as fh:
                header = fh.readline()
            known[name] = [h.split(' [')[0].strip() for h in header.split(',')]
        for name, fields in known.items():
            if asked == fields:
                return show(name)
        sys.exit('nvidia-smi (lab stand-in): only the recorded queries are known: {0}'.format(
            ' or '.join('--query-gpu=' + ','.join(f) for f in known.values())))
    if argv == ['-L']:
        with open(os.path.join(fixture_dir(), 'query-gpu.csv')) as fh:
            rows = [r.split(', ') for r in fh.read().splitlines()[1:] if r]
        for r in rows:
            print('GPU {0}: {1} (UUID: {2})'.format(r[0], r[1], r[2]))
        return None
    print('nvidia-smi (lab stand-in): unknown call: nvidia-smi {0}'.format(' '.join(argv)), file=sys.stderr)
    return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
