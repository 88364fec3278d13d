"""A PVE container config, as the API holds it, translated for LXC: the property strings of dev[n] and mp[n]
(parsed as the pve_container module parses them), whether PVE's start would refuse the container on this host,
and the LXC config (with the passthrough device nodes) that pve-container would write."""
from __future__ import annotations

import os
import stat

from glm5.project import use_module_utils

# The PVE property-string parser the pve_container module uses: one definition for both sides.
use_module_utils()
from ansible.module_utils.pve_api import PROPERTY_DEFAULT_KEY, key_family, parse_property_string  # noqa: E402

# PVE's id map for unprivileged containers: ids 0..65535 inside are 100000.. on the host (PVE's /etc/subuid and
# /etc/subgid: root:100000:65536; lab_up.yml writes the same).
ID_SHIFT, ID_COUNT = 100000, 65536
# An unprivileged container on the host's network namespace may not mount sysfs (the kernel wants a network namespace
# its user namespace owns; PVE's containers have their own): it gets this instance of the host's sysfs, mounted
# without the host's cgroup mounts on it (LabLxc.start mounts it), bound non-recursively.
LAB_SYSFS = '/run/glm5-lab/sysfs'


def is_unprivileged(config):
    return str(config.get('unprivileged', '0')) == '1'


def host_id(config, inside):
    """The host's uid/gid of an id inside the container (PVE maps dev[n]'s uid= and gid= so)."""
    return inside + ID_SHIFT if is_unprivileged(config) else inside


def _props_of(config, family):
    """Parsed property strings of one key family (dev, mp), as pve_container's own module_utils parses them."""
    return [parse_property_string(v, PROPERTY_DEFAULT_KEY[family]) for k, v in sorted(config.items())
            if key_family(k) == family]


def devices_of(config):
    return _props_of(config, 'dev')


def bind_mounts_of(config):
    return [m for m in _props_of(config, 'mp') if m.get('volume', '').startswith('/')]


def start_error(config):
    """What PVE's start says when the container cannot start on this host, or None."""
    for dev in devices_of(config):
        path = dev.get('path', '')
        try:
            st = os.stat(path)
        except OSError:
            return 'Device {0} does not exist'.format(path)
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
            return 'Path {0} is not a device'.format(path)
    for m in bind_mounts_of(config):
        if not os.path.isdir(m['volume']):
            return 'mount point {0} does not exist on the host'.format(m['volume'])
    return None


def cgroup_prefix():
    """lxc.cgroup2 on a pure cgroup v2 host (real PVE 8/9), lxc.cgroup on a v1/hybrid one (this lab)."""
    return 'lxc.cgroup2' if os.path.exists('/sys/fs/cgroup/cgroup.controllers') else 'lxc.cgroup'


def cpu_weight(config):
    """(cgroup file, value) for the config's cpuunits, as PVE sets it: cpu.shares on cgroup v1 (the value itself), cpu.weight
    on v2 (clamped to the kernel's 1..10000); None without cpuunits."""
    if config.get('cpuunits') in (None, ''):
        return None
    units = int(config['cpuunits'])
    if cgroup_prefix() == 'lxc.cgroup2':
        return 'cpu.weight', min(max(units, 1), 10000)
    return 'cpu.shares', max(units, 2)


def lxc_config(vmid, config, ctdir):
    """The LXC config for one container, and the passthrough device nodes it needs (path, mode, uid, gid, rdev)."""
    cg = cgroup_prefix()
    lines = [
        '# Written by the GLM-5 lab reconciler from the PVE API config of CT {0}; do not edit.'.format(vmid),
        'lxc.include = /usr/share/lxc/config/debian.common.conf',
        'lxc.arch = amd64',
        'lxc.uts.name = {0}'.format(config.get('hostname', 'CT{0}'.format(vmid))),
        'lxc.rootfs.path = dir:{0}'.format(os.path.join(ctdir, 'rootfs')),
        'lxc.net.0.type = none',
        'lxc.apparmor.profile = unconfined',
        'lxc.log.file = {0}'.format(os.path.join(ctdir, 'lxc.log')),
        'lxc.log.level = WARN',
    ]
    if is_unprivileged(config):
        lines[2:2] = ['lxc.include = /usr/share/lxc/config/debian.userns.conf']
        # userns.conf empties common.conf's capability drops; without sys_rawio systemd skips /sys/kernel/debug, which a
        # user namespace may not mount (those three act on the host's namespaces, which the container's root does not own)
        lines += ['lxc.cap.drop = sys_time sys_module sys_rawio',
                  'lxc.idmap = u 0 {0} {1}'.format(ID_SHIFT, ID_COUNT), 'lxc.idmap = g 0 {0} {1}'.format(ID_SHIFT, ID_COUNT),
                  'lxc.mount.auto =', 'lxc.mount.auto = proc:mixed cgroup:mixed',
                  'lxc.mount.entry = {0} sys none bind,create=dir 0 0'.format(LAB_SYSFS)]
    memory = int(config.get('memory', 512))
    cores = int(config.get('cores', 0) or 0)
    if cg == 'lxc.cgroup2':
        lines.append('lxc.cgroup2.memory.max = {0}'.format(memory * 1024 ** 2))
        if cores:
            lines.append('lxc.cgroup2.cpu.max = {0} 100000'.format(cores * 100000))
    else:
        lines.append('lxc.cgroup.memory.limit_in_bytes = {0}'.format(memory * 1024 ** 2))
        if cores:
            lines += ['lxc.cgroup.cpu.cfs_period_us = 100000', 'lxc.cgroup.cpu.cfs_quota_us = {0}'.format(cores * 100000)]
    weight = cpu_weight(config)
    if weight:
        lines.append('{0}.{1} = {2}'.format(cg, *weight))
    nodes = []
    for dev in devices_of(config):
        path = dev['path']
        try:
            st = os.stat(path)
        except OSError:
            continue  # start_error() refuses the start
        kind = 'c' if stat.S_ISCHR(st.st_mode) else 'b'
        access = 'rm' if dev.get('deny-write') == '1' else 'rwm'
        lines.append('{0}.devices.allow = {1} {2}:{3} {4}'.format(cg, kind, os.major(st.st_rdev), os.minor(st.st_rdev),
                                                                   access))
        mode = int(dev.get('mode', '0660'), 8)
        node = os.path.join(ctdir, 'passthrough', path.lstrip('/'))
        nodes.append((node, kind, mode, host_id(config, int(dev.get('uid', 0))), host_id(config, int(dev.get('gid', 0))),
                      st.st_rdev))
        lines.append('lxc.mount.entry = {0} {1} none bind,create=file 0 0'.format(node, path.lstrip('/')))
    for m in bind_mounts_of(config):
        opts = 'bind,create=dir' + (',ro' if m.get('ro') == '1' else '')
        lines.append('lxc.mount.entry = {0} {1} none {2} 0 0'.format(m['volume'], m['mp'].lstrip('/'), opts))
    return '\n'.join(lines) + '\n', nodes
