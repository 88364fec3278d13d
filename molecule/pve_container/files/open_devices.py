"""Open every NVIDIA node in the container and one that was not passed through; print `path errno-name`.

Through the device cgroup a passed-through stand-in node opens as far as the (missing) driver: ENXIO.
A node of the same major that PVE did not allow is stopped by the cgroup: EPERM.
"""
import errno
import glob
import os


def try_open(path):
    try:
        os.close(os.open(path, os.O_RDONLY))
        return 'OK'
    except OSError as exc:
        return errno.errorcode[exc.errno]


for path in sorted(glob.glob('/dev/nvidia*') + glob.glob('/dev/nvidia-caps/*')):
    if not os.path.isdir(path):
        print(path, try_open(path))
probe = '/tmp/not-passed-nvidia-node'
if os.path.exists(probe):
    os.unlink(probe)
os.mknod(probe, 0o600 | 0o020000, os.makedev(195, 200))
print('not-passed', try_open(probe))
os.unlink(probe)
