#!/usr/bin/python
from __future__ import annotations

DOCUMENTATION = r'''
---
module: nvidia_gpu_facts
short_description: NVIDIA GPU facts from the real tools (nvidia-smi, /proc, /sys) on a host or in a container
description:
  - Runs C(nvidia-smi --query-gpu=... --format=csv), C(nvidia-smi -q -x) and C(nvidia-smi topo -m), reads
    C(/proc/driver/nvidia/version), C(/proc/devices), C(/proc/cmdline), C(/sys/kernel/iommu_groups) and DMI, runs
    C(systemd-detect-virt --vm) where it exists, and returns the facts as C(nvidia_gpu).
  - Changes nothing. Where there is no C(nvidia-smi), C(present) is false; where it fails, C(error) holds its
    words. Deciding what is acceptable is left to the caller (the gpu_preflight role).
options:
  nvidia_smi:
    description: The nvidia-smi to run (a name looked up in PATH, or a path; the lab points it at its stand-in).
    type: str
    default: nvidia-smi
  proc_root: {description: Where /proc is (tests and the lab point it elsewhere)., type: path, default: /proc}
  sys_root: {description: Where /sys is., type: path, default: /sys}
  detect_virt: {description: Run systemd-detect-virt --vm where it exists., type: bool, default: true}
author: GLM-5 node maintainers
'''

EXAMPLES = r'''
- name: GPU facts on the PVE host
  nvidia_gpu_facts:
  register: gpu
- ansible.builtin.debug:
    msg: "{{ ansible_facts.nvidia_gpu.count }} GPUs, driver {{ ansible_facts.nvidia_gpu.driver_version }}"
'''

RETURN = r'''
nvidia_gpu:
  description: >-
    present, error, nvidia_smi, count, driver_version (userspace), cuda_version, kernel_module (version, open,
    text; from /proc/driver/nvidia/version), gpus (index, minor, name, uuid, pci_bus_id, compute_cap,
    memory_total_mib, persistence_mode, power_draw_w, power_limit_w, power_default_limit_w, power_max_limit_w,
    clocks_sm_mhz, clocks_mem_mhz, clocks_max_sm_mhz, ...), topology (pairs a, b, link), majors,
    virtualization (in_vm, evidence, ...), iommu (mode, cmdline_flags, groups). Also set as a fact.
  returned: always
  type: dict
'''

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.nvidia_facts import (
    QUERY_ARGS, NvidiaParseError, iommu, merge, parse_proc_devices, parse_proc_version, parse_query_csv, parse_smi_xml,
    parse_topo, virtualization)


def read(path):
    try:
        with open(path, errors='replace') as fh:
            return fh.read()
    except OSError:
        return None


def smi_facts(module, smi):
    """What nvidia-smi says; raises RuntimeError with its words when it fails."""
    def run(args):
        rc, out, err = module.run_command([smi] + args)
        if rc != 0:
            words = ' '.join((out.strip() or err.strip() or 'no output').split())
            raise RuntimeError('{0} {1} failed (rc {2}): {3}'.format(smi, ' '.join(args), rc, words[:300]))
        return out
    query = parse_query_csv(run(QUERY_ARGS))
    xml = parse_smi_xml(run(['-q', '-x']))
    gpus = merge(query, xml)
    topology = parse_topo(run(['topo', '-m'])) if gpus else []
    return {'driver_version': xml['driver_version'] or (gpus[0]['driver_version'] if gpus else None),
            'cuda_version': xml['cuda_version'], 'gpus': gpus, 'topology': topology}


def main():
    module = AnsibleModule(argument_spec=dict(
        nvidia_smi=dict(type='str', default='nvidia-smi'),
        proc_root=dict(type='path', default='/proc'),
        sys_root=dict(type='path', default='/sys'),
        detect_virt=dict(type='bool', default=True),
    ), supports_check_mode=True)
    p = module.params
    facts = dict(present=False, error=None, nvidia_smi=None, count=0, driver_version=None, cuda_version=None,
                 gpus=[], topology=[], kernel_module=None, majors={})
    smi = p['nvidia_smi'] if os.path.isabs(p['nvidia_smi']) else module.get_bin_path(p['nvidia_smi'])
    if smi and os.access(smi, os.X_OK):
        facts.update(present=True, nvidia_smi=smi)
        try:
            facts.update(smi_facts(module, smi))
        except (RuntimeError, NvidiaParseError) as exc:
            facts['error'] = str(exc)
    facts['count'] = len(facts['gpus'])
    version = read(os.path.join(p['proc_root'], 'driver', 'nvidia', 'version'))
    if version:
        try:
            facts['kernel_module'] = parse_proc_version(version)
        except NvidiaParseError as exc:
            facts['error'] = facts['error'] or str(exc)
    facts['majors'] = parse_proc_devices(read(os.path.join(p['proc_root'], 'devices')) or '')
    detect = None
    tool = module.get_bin_path('systemd-detect-virt') if p['detect_virt'] else None
    if tool:
        detect = module.run_command([tool, '--vm'])[1]
    dmi = os.path.join(p['sys_root'], 'class', 'dmi', 'id')
    facts['virtualization'] = virtualization(detect, read(os.path.join(dmi, 'sys_vendor')),
                                             read(os.path.join(dmi, 'product_name')), facts['gpus'])
    groups_dir = os.path.join(p['sys_root'], 'kernel', 'iommu_groups')
    groups = len(os.listdir(groups_dir)) if os.path.isdir(groups_dir) else 0
    facts['iommu'] = iommu(read(os.path.join(p['proc_root'], 'cmdline')), groups)
    module.exit_json(changed=False, nvidia_gpu=facts, ansible_facts={'nvidia_gpu': facts})


if __name__ == '__main__':
    main()
