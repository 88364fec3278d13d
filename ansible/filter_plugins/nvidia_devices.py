"""Filters that turn NVIDIA device nodes found on a PVE host into pve_container `devices` entries, and check
them against what the inventory expects and what the driver reports."""
from __future__ import annotations

import re

DOCUMENTATION = r'''
name: nvidia_passthrough
short_description: NVIDIA device nodes found on a PVE host -> pve_container devices
description:
  - Takes the C(files) list of M(ansible.builtin.find) over C(/dev) and C(/dev/nvidia-caps) and keeps the nodes
    an NVIDIA container needs, each GPU (C(/dev/nvidiaN)) selected by its minor N, then C(nvidiactl),
    C(nvidia-uvm), C(nvidia-uvm-tools) and C(nvidia-caps/*).
  - Fails with the problems C(nvidia_passthrough_problems) finds (without the count check).
  - C(nvidia_passthrough_problems) returns those problems as a list of one-line messages, empty when all is well,
    so a role can assert on it with a clear message. With I(count) and I(gpus=all), the GPUs found must be
    exactly I(count). With I(driver_minors) (the minors of the GPUs in the host's nvidia_gpu_facts), the GPU
    nodes must match what the driver reports.
  - C(gpu_selection_problems) checks a selection alone (C(all) or a non-empty list of distinct minors; with
    I(count), a list must have that many entries) and returns its problems, for a preflight assert.
options:
  _input: {description: The find module's files list (each with path and mode)., type: list, required: true}
  gpus: {description: C(all) or a list of GPU minors (N of /dev/nvidiaN)., type: raw, default: all}
  mode: {description: C(host) to keep each node's host mode, or an octal mode for all., type: str, default: host}
  count: {description: GPUs the node must have (nvidia_passthrough_problems only)., type: int}
  driver_minors: {description: GPU minors the driver reports (nvidia_passthrough_problems only)., type: list}
'''

EXAMPLES = r'''
devices: "{{ found.files | nvidia_passthrough(gpus=[0, 1]) }}"
problems: "{{ found.files | nvidia_passthrough_problems(gpus='all', count=8, driver_minors=[0, 1, 2, 3, 4, 5, 6, 7]) }}"
'''

RETURN = r'''
_value: {description: "List of {path, mode} in passthrough order; or a list of problems.", type: list}
'''

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover
    AnsibleFilterError = ValueError

GPU = re.compile(r'^/dev/nvidia(\d+)$')
ALWAYS = ['/dev/nvidiactl', '/dev/nvidia-uvm', '/dev/nvidia-uvm-tools']
REQUIRED = ['/dev/nvidiactl', '/dev/nvidia-uvm']


def _nodes(files):
    nodes = {f['path']: f for f in files if not f.get('isdir')}
    found = {int(GPU.match(p).group(1)): p for p in nodes if GPU.match(p)}
    return nodes, found


def _names(minors):
    return ', '.join('/dev/nvidia{0}'.format(m) for m in sorted(minors)) or 'none'


def gpu_selection_problems(gpus, count=None):
    """What is wrong with a GPU selection ('all', 'none' or a non-empty list of distinct minors) and an expected
    count (not used with 'none')."""
    if gpus == 'none':
        return []
    if gpus == 'all':
        problems = []
    elif isinstance(gpus, (str, bytes, dict)) or not hasattr(gpus, '__iter__'):
        return ['pve_container_gpus must be "all" or a list of GPU minors like [0, 1], got {0!r} ("none": a '
                'container without GPUs)'.format(gpus)]
    elif not list(gpus):
        return ['pve_container_gpus is an empty list: the node needs its GPUs (to remove the container use '
                'pve_container_state: absent); a container without GPUs says pve_container_gpus: none']
    elif any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpus):
        return ['pve_container_gpus entries must be GPU minors (whole numbers >= 0), got {0!r}'.format(list(gpus))]
    else:
        gpus = list(gpus)
        twice = sorted({g for g in gpus if gpus.count(g) > 1})
        problems = ['pve_container_gpus lists GPU {0} more than once: {1!r}'.format(
            ', '.join(str(g) for g in twice), gpus)] if twice else []
    if count is not None:
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            problems.append('pve_container_gpu_count must be a whole number >= 1, got {0!r}'.format(count))
        elif gpus != 'all' and not problems and len(gpus) != count:
            problems.append('pve_container_gpus lists {0} GPU(s) but pve_container_gpu_count is {1}: set both to the '
                            'same number of GPUs'.format(len(gpus), count))
    return problems


def _selected(gpus, found):
    """The minors a valid selection names: every GPU found for 'all', else the list, sorted."""
    return sorted(found) if gpus == 'all' else sorted(gpus)


def nvidia_passthrough_problems(files, gpus='all', count=None, mode='host', driver_minors=None, gid=''):
    nodes, found = _nodes(files)
    problems = []
    if not found:
        return ['no /dev/nvidiaN device nodes on the PVE host: is the NVIDIA driver loaded there (nvidia-smi)?']
    selection = gpu_selection_problems(gpus)
    if selection:
        return selection
    wanted = _selected(gpus, found)
    missing = [g for g in wanted if g not in found]
    if missing:
        problems.append('pve_container_gpus selects {0}, not on the PVE host (it has {1})'.format(
            _names(missing), _names(found)))
    if count is not None and gpus == 'all' and len(found) != int(count):
        gaps = [m for m in range(max(found) + 1) if m not in found]
        problems.append('found {0} GPU device node(s) on the PVE host ({1}) but pve_container_gpu_count is {2}{3}: '
                        'a GPU that fell off the bus or did not come up must be fixed on the host first '
                        '(nvidia-smi, dmesg | grep -i xid); for a node with fewer GPUs set pve_container_gpu_count'
                        .format(len(found), _names(found), count,
                                ' (missing {0})'.format(_names(gaps)) if gaps and len(found) < int(count) else ''))
    if driver_minors is not None and any(m is None for m in driver_minors):
        problems.append('the driver reports a GPU without a minor number (nvidia-smi -q): cannot match it to /dev')
    elif driver_minors is not None:
        driver = sorted(int(m) for m in driver_minors)
        no_node = [m for m in driver if m not in found]
        no_gpu = [m for m in found if m not in driver]
        if no_node or no_gpu:
            problems.append('the driver reports GPUs with minors {0} (nvidia-smi -q) but /dev has {1}{2}{3}'.format(
                driver, _names(found),
                ': no device node for {0} (nvidia-modprobe -c N, or udev)'.format(_names(no_node)) if no_node else '',
                ': {0} belong to no GPU the driver knows (stale nodes?)'.format(_names(no_gpu)) if no_gpu else ''))
        if count is not None and gpus == 'all' and len(driver) != int(count):
            problems.append('the driver reports {0} GPU(s) but pve_container_gpu_count is {1}'.format(
                len(driver), count))
    absent = [p for p in REQUIRED if p not in nodes]
    if absent:
        problems.append('{0} missing on the PVE host: run nvidia-modprobe -u -c0 at boot before containers start'
                        .format(', '.join(absent)))
    if isinstance(mode, int) and not isinstance(mode, bool):
        # YAML reads an unquoted 0660 as the number 432 (and 660 as six hundred and sixty): which mode was meant is lost
        problems.append('pve_container_gpu_mode must be quoted, e.g. "0660" (unquoted, YAML reads 0660 as the number '
                        '432), got the number {0}'.format(mode))
    elif mode != 'host' and not re.fullmatch(r'0?[0-7]{3}', str(mode)):
        problems.append('pve_container_gpu_mode must be "host" or octal like 0666, got {0!r}'.format(mode))
    if gid not in ('', None) and not re.fullmatch(r'\d+', str(gid)):
        problems.append('pve_container_gpu_gid must be a numeric gid or empty, got {0!r}'.format(gid))
    return problems


def nvidia_passthrough(files, gpus='all', mode='host', gid=''):
    problems = nvidia_passthrough_problems(files, gpus=gpus, mode=mode, gid=gid)
    if problems:
        raise AnsibleFilterError('; '.join(problems))
    nodes, found = _nodes(files)
    caps = sorted(p for p in nodes if p.startswith('/dev/nvidia-caps/'))
    paths = [found[g] for g in _selected(gpus, found)] + [p for p in ALWAYS if p in nodes] + caps
    out = []
    for path in paths:
        node_mode = nodes[path].get('mode', '0666') if mode == 'host' else mode
        node_mode = '0' + str(node_mode).lstrip('0').rjust(3, '0')[-3:]
        entry = {'path': path, 'mode': node_mode}
        if gid not in ('', None):
            entry['gid'] = int(gid)
        out.append(entry)
    return out


class FilterModule(object):
    def filters(self):
        return {'nvidia_passthrough': nvidia_passthrough, 'nvidia_passthrough_problems': nvidia_passthrough_problems,
                'gpu_selection_problems': gpu_selection_problems}
