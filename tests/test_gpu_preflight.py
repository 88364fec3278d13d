"""Every GPU preflight decision, on facts parsed from the fixtures (the constructed 8x RTX PRO 6000 host and
the real H200 recording), changed one way at a time."""
import copy
import os

import pytest
from gpu_preflight import gpu_preflight_findings

from ansible.module_utils import nvidia_facts as nf

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fixtures', 'nvidia-smi')


def facts_of(name, in_vm_evidence=()):
    folder = os.path.join(FIX, name)

    def text(f):
        with open(os.path.join(folder, f)) as fh:
            return fh.read()
    xml = nf.parse_smi_xml(text('nvidia-smi-q.xml'))
    gpus = nf.merge(nf.parse_query_csv(text('query-gpu.csv')), xml)
    return {'present': True, 'error': None, 'count': len(gpus), 'gpus': gpus, 'driver_version': xml['driver_version'],
            'cuda_version': xml['cuda_version'], 'topology': nf.parse_topo(text('topo.txt')),
            'kernel_module': nf.parse_proc_version(text('proc-driver-version.txt')),
            'majors': nf.parse_proc_devices(text('proc-devices.txt')),
            'virtualization': nf.virtualization('none', 'Supermicro', 'AS -4125GS-TNRT', gpus),
            'iommu': nf.iommu('quiet amd_iommu=on iommu=pt', 120)}


NODE = dict(count=8, model='RTX PRO 6000 Blackwell', min_driver='580')


@pytest.fixture
def rtx():
    return copy.deepcopy(facts_of('rtx-pro-6000-8gpu-constructed'))


def one_failure(findings, *words):
    assert len(findings['failures']) == 1, findings['failures']
    for w in words:
        assert w in findings['failures'][0], findings['failures'][0]
    assert '\n' not in findings['failures'][0]
    return findings['failures'][0]


def test_the_node_as_it_should_be_passes_and_reports_iommu(rtx):
    f = gpu_preflight_findings(rtx, **NODE)
    assert f['failures'] == []
    assert f['reports'] == ['IOMMU: passthrough (amd_iommu=on iommu=pt; 120 groups)']
    assert len(f['table']) == 10 and 'RTX PRO 6000 Blackwell Workstation Edition' in f['table'][1]
    assert f['table'][-1] == 'driver 580.95.05 (userspace), kernel module 580.95.05 (open), CUDA 13.0'


def test_gpus_inside_a_vm_fail_naming_the_p2p_problem(rtx):
    rtx['virtualization'] = nf.virtualization('kvm', 'QEMU', 'Standard PC (Q35 + ICH9, 2009)', rtx['gpus'])
    msg = one_failure(gpu_preflight_findings(rtx, **NODE), 'virtual machine', 'systemd-detect-virt --vm: kvm',
                      'no peer-to-peer path', 'gpu_preflight_allow_vm: true')
    assert msg.startswith('this host is a virtual machine')
    allowed = gpu_preflight_findings(rtx, allow_vm=True, **NODE)
    assert allowed['failures'] == [] and any('allowed by gpu_preflight_allow_vm' in r for r in allowed['reports'])


def test_the_recorded_h200_microvm_is_caught_by_the_gpus_own_virtualization_mode():
    h200 = facts_of('h200-1gpu-firecracker')
    h200['virtualization'] = nf.virtualization(None, None, None, h200['gpus'])   # no DMI, no systemd there
    one_failure(gpu_preflight_findings(h200, count=1, model='H200', min_driver='580'),
                'nvidia-smi virtualization mode: Pass-Through')


def test_a_gpu_missing(rtx):
    del rtx['gpus'][3]
    rtx['topology'] = [p for p in rtx['topology'] if 3 not in (p['a'], p['b'])]
    one_failure(gpu_preflight_findings(rtx, **NODE), '7 GPU(s) found, the inventory expects 8', 'dmesg')


def test_another_model(rtx):
    one_failure(gpu_preflight_findings(rtx, count=8, model='H200'),
                "GPU model NVIDIA RTX PRO 6000 Blackwell Workstation Edition is not the expected 'H200'")


def test_an_old_driver(rtx):
    for g in rtx['gpus']:
        g['driver_version'] = '570.172.08'
    rtx['driver_version'] = rtx['kernel_module']['version'] = '570.172.08'
    one_failure(gpu_preflight_findings(rtx, **NODE), 'driver 570.172.08 is older than 580', 'CUDA 13.0')


def test_proprietary_modules_on_blackwell(rtx):
    rtx['kernel_module'] = nf.parse_proc_version('NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Release '
                                                 'Build  (dvs-builder@U22)\n')
    one_failure(gpu_preflight_findings(rtx, **NODE), 'proprietary', 'Blackwell GPUs need the open kernel modules')
    assert gpu_preflight_findings(rtx, require_open=False, **NODE)['failures'] == []


def test_proprietary_modules_are_fine_on_hopper():
    h200 = facts_of('h200-1gpu-firecracker')
    h200['kernel_module']['open'] = False
    assert gpu_preflight_findings(h200, count=1, allow_vm=True)['failures'] == []


def test_no_p2p_path(rtx):
    rtx['topology'] = [dict(p, link='N/A') if (p['a'], p['b']) == (2, 5) else p for p in rtx['topology']]
    rtx['topology'] = [p for p in rtx['topology'] if (p['a'], p['b']) != (6, 7)]
    one_failure(gpu_preflight_findings(rtx, **NODE), 'no path between GPU2-GPU5 (N/A), GPU6-GPU7 (missing)')


def test_a_low_power_limit_is_reported_not_failed(rtx):
    rtx['gpus'][5]['power_limit_w'] = 450.0
    f = gpu_preflight_findings(rtx, **NODE)
    assert f['failures'] == []
    assert 'GPU5 power limit 450 W is below its maximum 600 W (nvidia-smi -i 5 -pl 600' in f['reports'][0]
    assert ' 450 W /  600 W' in f['table'][6]


def test_userspace_and_kernel_module_mismatch(rtx):
    rtx['kernel_module']['version'] = '580.82.07'
    one_failure(gpu_preflight_findings(rtx, **NODE), 'driver/library version mismatch: userspace 580.95.05, kernel '
                                                      'module 580.82.07')


def test_no_kernel_module(rtx):
    rtx['kernel_module'] = None
    one_failure(gpu_preflight_findings(rtx, **NODE), 'no NVIDIA kernel module loaded')


def test_no_driver_yet_is_reported_when_the_host_role_installs_it(rtx):
    bare = dict(rtx, present=False, gpus=[], topology=[], kernel_module=None, driver_version=None)
    f = gpu_preflight_findings(bare, driver_follows=True, **NODE)
    assert f['failures'] == []
    assert f['reports'][0].startswith('no NVIDIA driver on this host yet: nvidia_host_driver installs it next')
    one_failure(gpu_preflight_findings(bare, **NODE), 'no nvidia-smi on this host')


def test_no_or_failing_nvidia_smi(rtx):
    one_failure(gpu_preflight_findings(dict(rtx, present=False, gpus=[], topology=[]), **NODE), 'no nvidia-smi')
    one_failure(gpu_preflight_findings(dict(rtx, error='nvidia-smi -q -x failed (rc 9): NVIDIA-SMI has failed',
                                            gpus=[], topology=[]), **NODE),
                'nvidia-smi does not work here: nvidia-smi -q -x failed (rc 9)')
