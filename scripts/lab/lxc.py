"""The LXC driver: lab containers as real LXC containers under the lab's own lxcpath (pve-<vmid>), made, configured,
started, stopped and destroyed as pve-container does it on a PVE node."""
from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import subprocess

from glm5_lab.paths import ssh_port, write_if_changed, write_private
from glm5_lab.pveconf import ID_SHIFT, LAB_SYSFS, cpu_weight, is_unprivileged, lxc_config

LOG = logging.getLogger('labd')


def _node_is(path, kind, mode, uid, gid, rdev):
    try:
        st = os.stat(path)
    except OSError:
        return False
    is_kind = stat.S_ISCHR(st.st_mode) if kind == 'c' else stat.S_ISBLK(st.st_mode)
    return is_kind and st.st_rdev == rdev and stat.S_IMODE(st.st_mode) == mode and (st.st_uid, st.st_gid) == (uid, gid)


def _count_nodes(top):
    return sum(len(files) for _, _, files in os.walk(top))


def shift_ids(top):
    """Every file under top owned by the container's ids as an unprivileged container sees them (+ID_SHIFT), as
    pve-container's create of an unprivileged container leaves its rootfs; set-id bits kept (chown clears them).
    Idempotent: ids already shifted are left."""
    count = 0
    walk = os.walk(top) if os.path.isdir(top) and not os.path.islink(top) else [(top, [], [])]
    for root, dirs, files in walk:
        for path in [root] + [os.path.join(root, n) for n in dirs + files]:
            st = os.lstat(path)
            if st.st_uid >= ID_SHIFT and st.st_gid >= ID_SHIFT:
                continue
            os.lchown(path, st.st_uid % ID_SHIFT + ID_SHIFT, st.st_gid % ID_SHIFT + ID_SHIFT)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                os.chmod(path, stat.S_IMODE(st.st_mode))
            count += 1
    return count


def mount_lab_sysfs():
    """The sysfs instance unprivileged lab containers get (pveconf.LAB_SYSFS), mounted once per boot."""
    os.makedirs(LAB_SYSFS, exist_ok=True)
    if not os.path.ismount(LAB_SYSFS):
        lxc('mount', '-t', 'sysfs', 'sysfs', LAB_SYSFS)


def lxc(*args, check=True, timeout=120):
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=timeout)


class LabLxc(object):
    """Lab containers live under their own lxcpath as pve-<vmid>; nothing else is ever touched."""

    def __init__(self, p):
        self.p = p
        self.lxcpath = p['lxcpath']
        os.makedirs(self.lxcpath, exist_ok=True)

    def name(self, vmid):
        return 'pve-{0}'.format(vmid)

    def ctdir(self, vmid):
        return os.path.join(self.lxcpath, self.name(vmid))

    def exists(self, vmid):
        return os.path.exists(os.path.join(self.ctdir(vmid), 'rootfs', 'etc'))

    def vmids(self):
        out = []
        for entry in os.listdir(self.lxcpath):
            m = re.fullmatch(r'pve-(\d+)', entry)
            if m and os.path.exists(os.path.join(self.lxcpath, entry, 'lab-created')):
                out.append(int(m.group(1)))
        return out

    def state(self, vmid):
        if not os.path.exists(os.path.join(self.ctdir(vmid), 'config')):
            return 'absent'
        r = lxc('lxc-info', '-P', self.lxcpath, '-n', self.name(vmid), '-sH', check=False)
        return r.stdout.strip().lower() or 'stopped'

    def create(self, vmid, template, keys, unprivileged=False):
        """The rootfs is made under rootfs.partial and renamed when whole, as PVE's create holds its lock until the
        volume is complete: labd killed mid-extraction leaves no half rootfs that exists() would take for a container
        (the next pass makes it again)."""
        ctdir = self.ctdir(vmid)
        rootfs = os.path.join(ctdir, 'rootfs.partial')
        shutil.rmtree(rootfs, ignore_errors=True)
        os.makedirs(rootfs)
        with open(os.path.join(ctdir, 'lab-created'), 'w') as out:
            out.write('{0}\n'.format(vmid))
        LOG.info('CT %s: extracting %s', vmid, template)
        lxc('tar', '-xpzf', template, '-C', rootfs, '--numeric-owner', timeout=900)
        for old in os.listdir(os.path.join(rootfs, 'etc/ssh')):
            if old.startswith('ssh_host_'):
                os.unlink(os.path.join(rootfs, 'etc/ssh', old))
        lxc('ssh-keygen', '-A', '-f', rootfs)
        # Like pve-container on create: a new container gets its own machine-id at first boot.
        with open(os.path.join(rootfs, 'etc/machine-id'), 'w'):
            pass
        try:
            os.unlink(os.path.join(rootfs, 'var/lib/dbus/machine-id'))
        except FileNotFoundError:
            pass
        if keys:
            sshdir = os.path.join(rootfs, 'root/.ssh')
            os.makedirs(sshdir, mode=0o700, exist_ok=True)
            write_private(os.path.join(sshdir, 'authorized_keys'), (keys.strip() + '\n').encode())
        if unprivileged:
            LOG.info('CT %s: unprivileged: %s files owned by the shifted ids', vmid, shift_ids(rootfs))
        old = os.path.join(ctdir, 'rootfs')  # an empty one, or one without etc/ (never mounted: it cannot have run)
        if os.path.lexists(old):
            self.refuse_if_mounted(vmid, old)
            shutil.rmtree(old)
        os.rename(rootfs, old)

    def write_config(self, vmid, config):
        ctdir = self.ctdir(vmid)
        text, nodes = lxc_config(vmid, config, ctdir)
        rootfs = os.path.join(ctdir, 'rootfs')
        hostname = config.get('hostname', 'CT{0}'.format(vmid))
        files = {
            os.path.join(ctdir, 'config'): text,
            os.path.join(rootfs, 'etc/hostname'): hostname + '\n',
            os.path.join(rootfs, 'etc/hosts'): '127.0.0.1 localhost\n127.0.1.1 {0}\n'.format(hostname),
            os.path.join(rootfs, 'etc/ssh/sshd_config.d/00-glm5-lab.conf'):
                '# lab: the container shares the host network; listen on loopback only\n'
                'ListenAddress 127.0.0.1\nPort {0}\n'.format(ssh_port(vmid)),
        }
        changed = False
        for path, content in files.items():
            changed = write_if_changed(path, content) or changed
            if is_unprivileged(config):
                shift_ids(path)
        if all(_node_is(*n) for n in nodes) and len(nodes) == _count_nodes(os.path.join(ctdir, 'passthrough')):
            return changed
        shutil.rmtree(os.path.join(ctdir, 'passthrough'), ignore_errors=True)
        for node, kind, mode, uid, gid, rdev in nodes:
            os.makedirs(os.path.dirname(node), exist_ok=True)
            os.mknod(node, mode | (stat.S_IFCHR if kind == 'c' else stat.S_IFBLK), rdev)
            os.chmod(node, mode)
            os.chown(node, uid, gid)
        return changed

    def set_cpu_weight(self, vmid, config):
        """The config's CPU weight on the running container now, as PVE applies cpuunits (hot); an error's text."""
        weight = cpu_weight(config)
        if not weight:
            return None
        r = lxc('lxc-cgroup', '-P', self.lxcpath, '-n', self.name(vmid), weight[0], str(weight[1]), check=False)
        return (r.stderr.strip() or 'lxc-cgroup failed') if r.returncode else None

    def start(self, vmid):
        with open(os.path.join(self.ctdir(vmid), 'config')) as fh:
            if 'lxc.mount.entry = {0} '.format(LAB_SYSFS) in fh.read():
                mount_lab_sysfs()
        r = lxc('lxc-start', '-P', self.lxcpath, '-n', self.name(vmid), check=False)
        if r.returncode != 0:
            tail = ''
            try:
                with open(os.path.join(self.ctdir(vmid), 'lxc.log')) as fh:
                    tail = ' | '.join(fh.read().strip().splitlines()[-3:])
            except OSError:
                pass
            return (r.stderr.strip() or 'lxc-start failed') + (' ' + tail if tail else '')
        return None

    def stop(self, vmid, timeout=30):
        if self.state(vmid) == 'running':
            lxc('lxc-stop', '-P', self.lxcpath, '-n', self.name(vmid), '-t', str(timeout), check=False,
                timeout=timeout + 30)

    def refuse_if_mounted(self, vmid, top):
        top = os.path.realpath(top)
        with open('/proc/self/mountinfo') as fh:
            mounted = [line.split()[4] for line in fh if (line.split()[4] + '/').startswith(top + '/')]
        if mounted:
            raise RuntimeError('CT {0}: refusing to remove {1}: still mounted: {2}'.format(vmid, top, mounted))

    def destroy(self, vmid):
        """Remove the container and its rootfs; never a bind-mounted host path."""
        self.stop(vmid, timeout=10)
        ctdir = os.path.realpath(self.ctdir(vmid))
        self.refuse_if_mounted(vmid, ctdir)
        shutil.rmtree(ctdir)
