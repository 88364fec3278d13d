#!/usr/bin/env python3
"""Lab stand-in for NVIDIA's nvidia-smi (no GPU and no driver here). Prints the constructed 8x RTX PRO 6000
fixture (tests/fixtures/nvidia-smi/rtx-pro-6000-8gpu-constructed) with the installed driver version.

    GLM5_NVIDIA_FIXTURE  the fixture directory (default: <this file's dir>/fixture, where the lab puts it
                         next to the stand-in; in the repository: tests/fixtures/nvidia-smi/rtx-pro-6000-8gpu-constructed)
    GLM5_NVIDIA_VERSION  the driver version to report (default: the file 'version' next to this file,
                         else the fixture's own)

Like the real one in a container, it shows only the GPUs whose device node /dev/nvidiaN is there (numbered 0.. in
that order, minor numbers kept): a lab node given four of the lab's eight GPUs sees four. On the host (no
/run/systemd/container), or with no /dev/nvidiaN at all, all eight. GLM5_NVIDIA_DEV_DIR names the /dev to look in
(tests; set, it applies outside a container too).

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
    given = os.environ.get('GLM5_NVIDIA_FIXTURE')
    if given:       # named: that one, or said - never quietly another
        if not os.path.isfile(os.path.join(given, 'nvidia-smi-q.xml')):
            sys.exit('nvidia-smi (lab stand-in): GLM5_NVIDIA_FIXTURE={0} is not a fixture directory (no '
                     'nvidia-smi-q.xml)'.format(given))
        return given
    for path in (os.path.join(HERE, 'fixture'), REPO_FIXTURE):
        if os.path.isdir(path):
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


def visible():
    """In a container (systemd says so in /run/systemd/container), the GPU minors whose /dev/nvidiaN exists; None
    (every GPU) on the host, whose driver knows every GPU whatever /dev holds, or with no such node at all."""
    dev = os.environ.get('GLM5_NVIDIA_DEV_DIR')
    if dev is None:
        if not os.path.exists('/run/systemd/container'):
            return None
        dev = '/dev'
    try:
        minors = {int(m.group(1)) for m in (re.match(r'^nvidia(\d+)$', n) for n in os.listdir(dev)) if m}
    except OSError:
        return None
    return minors or None


def only_visible(name, text):
    """The fixture's text less the GPUs this container does not have (CSV rows by index = minor, XML <gpu> blocks by
    minor_number), the rest numbered 0.. as nvidia-smi numbers what it sees."""
    seen = visible()
    if seen is None:
        return text
    if name.endswith('.csv'):
        lines = text.splitlines(True)
        rows = [ln for ln in lines[1:] if ln.strip() and int(ln.split(',')[0]) in seen]
        return lines[0] + ''.join(re.sub(r'^\d+', str(i), r) for i, r in enumerate(rows))
    if name.endswith('.xml'):
        blocks = re.split(r'(?=\t<gpu id=)|(?<=</gpu>\n)', text)
        kept = [b for b in blocks if not b.startswith('\t<gpu id=')
                or int(re.search(r'<minor_number>(\d+)<', b).group(1)) in seen]
        out = ''.join(kept)
        return re.sub(r'<attached_gpus>\d+<', '<attached_gpus>{0}<'.format(
            sum(1 for b in kept if b.startswith('\t<gpu id='))), out)
    return text


def show(name):
    with open(os.path.join(fixture_dir(), name)) as fh:
        text = only_visible(name, fh.read())
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
            rows = [r.split(', ') for r in only_visible('query-gpu.csv', fh.read()).splitlines()[1:] if r]
        for r in rows:
            print('GPU {0}: {1} (UUID: {2})'.format(r[0], r[1], r[2]))
        return None
    print('nvidia-smi (lab stand-in): unknown call: nvidia-smi {0}'.format(' '.join(argv)), file=sys.stderr)
    return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
