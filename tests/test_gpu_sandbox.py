"""The engine unit's sandbox on a real GPU (marked gpu; skipped where there is none, as in CI).

The GPU machines this project is lent have no systemd to run glm5-sglang.service under, so its sandbox is rebuilt from
the kernel's own tools, as far as they go: a mount namespace with / read-only (ProtectSystem=strict) but a writable
home (ReadWritePaths), a private /tmp (PrivateTmp), /proc with hidepid=invisible (ProtectProc=invisible); an unprivileged
user with no new privileges and an empty capability bounding set (setpriv: NoNewPrivileges, CapabilityBoundingSet=);
and systemd 252's @system-service less @privileged as a seccomp allow list, everything else EPERM (libseccomp through
ctypes; the list recorded from the lab containers' systemd, tests/fixtures/systemd/). Under all of it: a CUDA matmul
checked against the CPU, a Triton kernel JIT-compiled into the home's cache and run, and a CUDA tensor of an expandable
segment shared with another process (PyTorch duplicates its file descriptor with pidfd_getfd: the unit allows it).
Not rebuilt here: ProtectKernelTunables/Modules/Logs, ProtectControlGroups, RestrictNamespaces/AddressFamilies and the
other seccomp-based options (systemd's own filters), which CUDA's use of /sys, /proc and sockets is read-only against.
Run there with: python3 -m pytest -m gpu -s tests/test_gpu_sandbox.py
"""
import ctypes.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest
from glm5.project import ROOT

pytestmark = pytest.mark.gpu

GROUPS = os.path.join(ROOT, 'tests', 'fixtures', 'systemd', 'system-service-less-privileged.txt')
UNIT = os.path.join(ROOT, 'roles', 'sglang_service', 'templates', 'sglang.service.j2')


def unit_allow_list():
    """The engine unit's allow list: the recorded groups, and the calls its template names beside @system-service."""
    with open(UNIT) as fh:
        lines = [x.split('=', 1)[1].split() for x in fh if x.startswith('SystemCallFilter=@system-service')]
    assert len(lines) == 1, 'the unit has no SystemCallFilter=@system-service line'
    with open(GROUPS) as fh:
        return sorted(set(fh.read().split()) | set(lines[0][1:]))

# Runs in the sandbox: the filter first, then the checks; prints one JSON object.
CHILD = r'''
import ctypes, ctypes.util, errno, json, os, sys

lib = ctypes.CDLL(ctypes.util.find_library('seccomp') or 'libseccomp.so.2', use_errno=True)
lib.seccomp_init.restype = ctypes.c_void_p
lib.seccomp_init.argtypes = [ctypes.c_uint32]
lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
lib.seccomp_load.argtypes = [ctypes.c_void_p]
ctx = lib.seccomp_init(0x00050000 | errno.EPERM)            # SCMP_ACT_ERRNO(EPERM): SystemCallErrorNumber=EPERM
allowed = 0
for name in open(sys.argv[1]).read().split():
    nr = lib.seccomp_syscall_resolve_name(name.encode())
    if nr >= 0 and lib.seccomp_rule_add(ctx, 0x7fff0000, nr, 0) == 0:    # SCMP_ACT_ALLOW
        allowed += 1
assert lib.seccomp_load(ctx) == 0, 'seccomp_load failed'

out = {'allowed_syscalls': allowed}
status = dict(line.split(':', 1) for line in open('/proc/self/status') if ':' in line)
out.update({k: status[k].strip() for k in ('NoNewPrivs', 'Seccomp', 'CapBnd', 'CapEff', 'Uid')})
try:
    open('/etc/glm5-sandbox-probe', 'w')
    out['etc'] = 'writable'
except OSError as exc:
    out['etc'] = errno.errorcode.get(exc.errno, str(exc.errno))
out['pid1_visible'] = os.path.exists('/proc/1')
libc = ctypes.CDLL(None, use_errno=True)
traceme = libc.syscall(101, 0, 0, 0, 0)                    # ptrace(PTRACE_TRACEME): not in @system-service
out['ptrace'] = 'allowed' if traceme == 0 else errno.errorcode.get(ctypes.get_errno(), '?')

import torch
a = torch.randn(512, 512, dtype=torch.float32)
b = torch.randn(512, 512, dtype=torch.float32)
c = (a.cuda() @ b.cuda()).cpu()
out['matmul_max_error'] = float((c - a @ b).abs().max())
out['device'] = torch.cuda.get_device_name(0)

import triton
import triton.language as tl

@triton.jit
def add(x_ptr, y_ptr, o_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(o_ptr + i, tl.load(x_ptr + i, mask=m) + tl.load(y_ptr + i, mask=m), mask=m)

x = torch.arange(1000, device='cuda', dtype=torch.float32)
o = torch.empty_like(x)
add[(4,)](x, x, o, 1000, BLOCK=256)
out['triton_ok'] = bool(torch.equal(o.cpu(), (x * 2).cpu()))
cache = os.environ['TRITON_CACHE_DIR']
out['triton_cache_files'] = sum(len(f) for _, _, f in os.walk(cache))

# a CUDA tensor of an expandable segment shared with another process (PyTorch: pidfd_getfd)
import torch.multiprocessing as mp


def receive(q, r):
    r.put(float(q.get().sum().item()))


if __name__ == '__main__':
    ctx = mp.get_context('spawn')
    q, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=receive, args=(q, r))
    p.start()
    shared = torch.ones(1 << 20, device='cuda')
    q.put(shared)
    try:
        out['ipc_sum'] = r.get(timeout=120)
    except Exception as exc:
        out['ipc_sum'] = repr(exc)
    p.join(30)
    print(json.dumps(out))
'''

# Root, in a new mount namespace: the home bind-mounted on itself (it stays writable), a private /tmp, / read-only,
# /proc with hidepid; then the child as nobody, no new privileges, no capabilities.
SHELL = r'''
set -e
home=$1; child=$2; allow=$3; py=$4
mount --make-rprivate /
mount --bind "$home" "$home"
mount -t tmpfs tmpfs /tmp
mount -o remount,bind,ro /
mount -t proc -o hidepid=invisible proc /proc
exec setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs --bounding-set=-all --inh-caps=-all -- \
    env HOME="$home" TRITON_CACHE_DIR="$home/.triton" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    "$py" "$child" "$allow"
'''


@pytest.fixture(scope='module')
def gpu():
    if not shutil.which('nvidia-smi') or not os.path.exists('/dev/nvidiactl'):
        pytest.skip('no NVIDIA GPU on this machine')
    if os.geteuid() != 0 or not (shutil.which('unshare') and shutil.which('setpriv')):
        pytest.skip('needs root, unshare and setpriv to build the sandbox')
    if not ctypes.util.find_library('seccomp'):
        pytest.skip('needs libseccomp')
    for mod in ('torch', 'triton'):
        if subprocess.run([sys.executable, '-c', 'import ' + mod], capture_output=True).returncode:
            pytest.skip('needs {0} with CUDA'.format(mod))


@pytest.fixture()
def base():
    # not under /tmp: the sandbox mounts its own /tmp over it
    path = tempfile.mkdtemp(prefix='glm5-sandbox-', dir='/var/tmp')
    os.chmod(path, 0o755)
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


def test_cuda_and_a_triton_jit_compile_run_inside_the_engine_units_sandbox(gpu, base):
    home = base / 'home'
    home.mkdir()
    os.chown(home, 65534, 65534)
    child = base / 'child.py'
    child.write_text(CHILD)
    child.chmod(0o644)
    allow = base / 'allow.txt'
    allow.write_text('\n'.join(unit_allow_list()) + '\n')
    allow.chmod(0o644)
    p = subprocess.run(['unshare', '--mount', '--', 'sh', '-c', SHELL, 'sandbox', str(home), str(child), str(allow),
                        sys.executable], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    print(json.dumps(got, indent=1))
    # the sandbox was there
    assert got['NoNewPrivs'] == '1' and got['Seccomp'] == '2', got
    assert got['CapBnd'] == '0000000000000000' and got['CapEff'] == '0000000000000000', got
    assert got['Uid'].split()[0] == '65534', got
    assert got['etc'] == 'EROFS', got
    assert got['pid1_visible'] is False, got
    assert got['ptrace'] == 'EPERM', got                    # outside the allow list: refused by the filter
    # the list's 359 names less those of other architectures (_llseek and the like): 289 on x86_64 (the H200 host)
    assert got['allowed_syscalls'] > 250, got
    # and CUDA and Triton's JIT worked inside it
    assert got['matmul_max_error'] < 0.05, got
    assert got['triton_ok'] is True, got
    assert got['triton_cache_files'] > 0, got
    assert got['ipc_sum'] == float(1 << 20), got            # refused pidfd_getfd: 'pidfd_getfd: Operation not permitted'
