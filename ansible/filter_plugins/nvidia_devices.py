"""Filters that turn NVIDIA device nodes found on a PVE host into pve_container `devices` entries."""
from __future__ import annotations

import re

DOCUMENTATION = r'''
name: nvidia_passthrough
short_description: NVIDIA device nodes found on a PVE host -> pve_container devices
description:
  - Takes the C(files) list of M(ansible.builtin.find) over C(/dev) and C(/dev/nvidia-caps) and keeps the nodes
    an NVIDIA container needs, each GPU (C(/dev/nvidiaN)) selected by index, then C(nvidiactl),
    C(nvidia-uvm), C(nvidia-uvm-tools) and C(nvidia-caps/*).
  - Fails when no GPU is found, when a selected GPU is missing, or when C(nvidiactl) or C(nvidia-uvm) is missing
    (C(nvidia-modprobe -u -c0) creates the uvm and caps nodes on a real host).
options:
  _input: {description: The find module's files list (each with path and mode)., type: list, required: true}
  gpus: {description: C(all) or a list of GPU indexes., type: raw, default: all}
  mode: {description: C(host) to keep each node's host mode, or an octal mode for all., type: str, default: host}
'''

EXAMPLES = r'''
devices: "{{ found.files | nvidia_passthrough(gpus=[0, 1]) }}"
'''

RETURN = r'''
_value: {description: "List of {path, mode} in passthrough order.", type: list}
'''

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover
    AnsibleFilterError = ValueError

GPU = re.compile(r'^/dev/nvidia(\d+)$')
ALWAYS = ['/dev/nvidiactl', '/dev/nvidia-uvm', '/dev/nvidia-uvm-tools']
REQUIRED = ['/dev/nvidiactl', '/dev/nvidia-uvm']


def nvidia_passthrough(files, gpus='all', mode='host'):
    nodes = {f['path']: f for f in files if not f.get('isdir')}
    found = {int(GPU.match(p).group(1)): p for p in nodes if GPU.match(p)}
    if not found:
        raise AnsibleFilterError('no /dev/nvidiaN device nodes on the PVE host: is the NVIDIA driver loaded there?')
    if gpus in ('all', None, ''):
        wanted = sorted(found)
    else:
        if isinstance(gpus, (str, int)):
            gpus = [g for g in str(gpus).split(',') if g.strip()]
        try:
            wanted = sorted({int(g) for g in gpus})
        except (TypeError, ValueError) as exc:
            raise AnsibleFilterError('gpus must be "all" or a list of GPU indexes, got {0!r}'.format(gpus)) from exc
        missing = [g for g in wanted if g not in found]
        if missing:
            raise AnsibleFilterError('GPU index(es) {0} not found on the PVE host (it has /dev/nvidia{1})'.format(
                missing, ', /dev/nvidia'.join(str(i) for i in sorted(found))))
    absent = [p for p in REQUIRED if p not in nodes]
    if absent:
        raise AnsibleFilterError('{0} missing on the PVE host: run nvidia-modprobe -u -c0 at boot before containers '
                                 'start'.format(', '.join(absent)))
    if mode != 'host' and not re.fullmatch(r'0?[0-7]{3}', str(mode)):
        raise AnsibleFilterError('mode must be "host" or octal like 0666, got {0!r}'.format(mode))
    caps = sorted(p for p in nodes if p.startswith('/dev/nvidia-caps/'))
    paths = [found[g] for g in wanted] + [p for p in ALWAYS if p in nodes] + caps
    out = []
    for path in paths:
        node_mode = nodes[path].get('mode', '0666') if mode == 'host' else mode
        node_mode = '0' + str(node_mode).lstrip('0').rjust(3, '0')[-3:]
        out.append({'path': path, 'mode': node_mode})
    return out


class FilterModule(object):
    def filters(self):
        return {'nvidia_passthrough': nvidia_passthrough}
