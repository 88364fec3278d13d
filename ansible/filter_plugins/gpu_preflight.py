"""The GPU preflight's decisions, from nvidia_gpu_facts: what must stop a deploy, what is only reported, and
the short table the role prints."""
from __future__ import annotations

import re

DOCUMENTATION = r'''
name: gpu_preflight_findings
short_description: Decide from nvidia_gpu_facts whether a PVE host can run the GLM-5 node
description:
  - Returns C(failures) (each one line saying what is wrong and what to do), C(reports) (worth knowing, not
    fatal: power limits below the GPU's maximum, the IOMMU mode, a VM allowed by the inventory) and C(table)
    (one line per GPU).
  - Fails on no nvidia-smi or a failing one, a GPU count or model other than expected, a userspace driver older
    than I(min_driver), a userspace/kernel-module version mismatch, the proprietary kernel module on Blackwell
    when I(require_open), GPUs inside a VM unless I(allow_vm) (the message names the missing P2P path), and a GPU
    pair without a path in C(nvidia-smi topo -m).
options:
  _input: {description: The nvidia_gpu facts., type: dict, required: true}
  count: {description: GPUs expected., type: int, required: true}
  model: {description: Text every GPU name must contain (empty accepts any)., type: str, default: ''}
  min_driver: {description: Lowest driver version accepted (the CUDA build in use needs it)., type: str, default: '580'}
  allow_vm: {description: Accept GPUs inside a virtual machine., type: bool, default: false}
  require_open: {description: Require the open kernel module on Blackwell (compute capability 10+)., type: bool, default: true}
  driver_follows:
    description: The host driver role installs the driver later in the run (no driver is then reported).
    type: bool
    default: false
'''

EXAMPLES = r'''
findings: "{{ ansible_facts.nvidia_gpu | gpu_preflight_findings(count=8, model='RTX PRO 6000', min_driver='580') }}"
'''

RETURN = r'''
_value: {description: "{failures: [str], reports: [str], table: [str]}", type: dict}
'''

# Link types nvidia-smi topo -m prints for a pair of GPUs that have a path.
LINKS = re.compile(r'^(X|SYS|NODE|PHB|PXB|PIX|NV\d+)$')


def _version(text):
    return tuple(int(p) for p in re.findall(r'\d+', str(text or '')))


def _watts(value):
    return '{0:.0f} W'.format(value) if isinstance(value, (int, float)) else '?'


def table(facts):
    lines = ['GPU minor  {0:<50} {1:<17} cc    memory     power draw / limit / max   persist  SM MHz (max)'.format(
        'name', 'PCI bus')]
    for g in facts.get('gpus', []):
        lines.append('{0:>3} {1:>5}  {2:<50} {3:<17} {4:<5} {5:>6} MiB  {6:>8} / {7:>6} / {8:>6}   {9:<7}  {10} ({11})'.format(
            g.get('index'), g.get('minor'), (g.get('name') or '?')[:50], g.get('pci_bus_id') or '?',
            g.get('compute_cap') or '?', g.get('memory_total_mib') or '?', _watts(g.get('power_draw_w')),
            _watts(g.get('power_limit_w')), _watts(g.get('power_max_limit_w')),
            {True: 'on', False: 'OFF'}.get(g.get('persistence_mode'), '?'), g.get('clocks_sm_mhz') or '?',
            g.get('clocks_max_sm_mhz') or '?'))
    km = facts.get('kernel_module') or {}
    lines.append('driver {0} (userspace), kernel module {1} ({2}), CUDA {3}'.format(
        facts.get('driver_version') or '?', km.get('version') or 'not loaded',
        'open' if km.get('open') else 'proprietary' if km else '-', facts.get('cuda_version') or '?'))
    return lines


def gpu_preflight_findings(facts, count, model='', min_driver='580', allow_vm=False, require_open=True,
                           driver_follows=False):
    failures, reports = [], []
    gpus = facts.get('gpus') or []
    if not facts.get('present') and driver_follows:
        reports.append('no NVIDIA driver on this host yet: nvidia_host_driver installs it next in this run, and the '
                       'GPU checks run again after it')
    elif not facts.get('present'):
        failures.append('no nvidia-smi on this host: install the NVIDIA driver (the nvidia_host_driver role) first')
    elif facts.get('error'):
        failures.append('nvidia-smi does not work here: {0}. Is the kernel module loaded (lsmod | grep nvidia; '
                        'dmesg)?'.format(facts['error']))
    if facts.get('present') and not facts.get('error'):
        if len(gpus) != int(count):
            failures.append('{0} GPU(s) found, the inventory expects {1}: a GPU that fell off the bus or is not '
                            'bound to the driver must be fixed first (nvidia-smi -L, dmesg | grep -i -e xid -e nvrm)'
                            .format(len(gpus), count))
        if model:
            other = sorted({g.get('name') or '?' for g in gpus if model.lower() not in (g.get('name') or '').lower()})
            if other:
                failures.append('GPU model {0} is not the expected {1!r} (gpu_preflight_gpu_model)'.format(
                    ', '.join(other), model))
        user = facts.get('driver_version')
        if user and _version(user) < _version(min_driver):
            failures.append('driver {0} is older than {1}, which the CUDA build in use needs (CUDA 13.0: >= 580): '
                            'upgrade the host driver (nvidia_host_driver_version)'.format(user, min_driver))
        km = facts.get('kernel_module')
        if not km:
            failures.append('no NVIDIA kernel module loaded (/proc/driver/nvidia/version is missing): load it '
                            '(modprobe nvidia) or reboot into the kernel the driver was built for')
        else:
            if user and km.get('version') and km['version'] != user:
                failures.append('driver/library version mismatch: userspace {0}, kernel module {1}: reboot (or '
                                'reload the modules) so both are the same version'.format(user, km['version']))
            blackwell = [g for g in gpus if (g.get('architecture') or '').lower() == 'blackwell'
                         or _version(g.get('compute_cap'))[:1] >= (10,)]
            if require_open and blackwell and not km.get('open'):
                failures.append('the proprietary NVIDIA kernel module is loaded, but Blackwell GPUs need the open '
                                'kernel modules: install the driver with -m=kernel-open (nvidia_host_driver does)')
        pairs = {(p['a'], p['b']): p['link'] for p in facts.get('topology') or []}
        indexes = sorted(g['index'] for g in gpus if g.get('index') is not None)
        nopath = ['GPU{0}-GPU{1} ({2})'.format(a, b, pairs.get((a, b), 'missing'))
                  for i, a in enumerate(indexes) for b in indexes[i + 1:] if not LINKS.match(pairs.get((a, b), ''))]
        if nopath:
            failures.append('no path between {0} in nvidia-smi topo -m: tensor parallelism needs every GPU pair '
                            'connected (check the BIOS PCIe settings and nvidia-smi topo -p2p r)'.format(', '.join(nopath)))
        for g in gpus:
            limit, top = g.get('power_limit_w'), g.get('power_max_limit_w')
            if isinstance(limit, (int, float)) and isinstance(top, (int, float)) and limit < top:
                reports.append('GPU{0} power limit {1} is below its maximum {2} (nvidia-smi -i {0} -pl {3:.0f}, or '
                               'nvidia_host_driver_power_limit)'.format(g.get('index'), _watts(limit), _watts(top), top))
            if g.get('persistence_mode') is False:
                reports.append('GPU{0} persistence mode is off (nvidia-persistenced keeps it on)'.format(g.get('index')))
    virt = facts.get('virtualization') or {}
    if virt.get('in_vm'):
        words = ('this host is a virtual machine ({0}): passed-through GPUs get no peer-to-peer path there, each on '
                 'its own root complex, so all-reduce across them crawls (~1 GB/s on the node this package rebuilds). '
                 'Run the containers on the Proxmox host itself'.format('; '.join(virt.get('evidence') or ['?'])))
        if allow_vm:
            reports.append(words + ' (allowed by gpu_preflight_allow_vm)')
        else:
            failures.append(words + ', or set gpu_preflight_allow_vm: true to accept it')
    mmu = facts.get('iommu') or {}
    if mmu:
        reports.append('IOMMU: {0} ({1}; {2} groups)'.format(mmu.get('mode'), ' '.join(mmu.get('cmdline_flags') or [])
                                                            or 'no iommu flags on the kernel command line',
                                                            mmu.get('groups', 0)))
    return {'failures': failures, 'reports': reports, 'table': table(facts)}


class FilterModule(object):
    def filters(self):
        return {'gpu_preflight_findings': gpu_preflight_findings}
