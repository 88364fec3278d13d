"""The GPU facts parsers on real recorded outputs (one H200) and on the constructed 8x RTX PRO 6000 fixture."""
import os

import pytest

from ansible.module_utils import nvidia_facts as nf

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fixtures', 'nvidia-smi')
H200 = os.path.join(FIX, 'h200-1gpu-firecracker')
RTX = os.path.join(FIX, 'rtx-pro-6000-8gpu-constructed')


def text(folder, name):
    with open(os.path.join(folder, name)) as fh:
        return fh.read()


def gpus(folder):
    return nf.merge(nf.parse_query_csv(text(folder, 'query-gpu.csv')), nf.parse_smi_xml(text(folder, 'nvidia-smi-q.xml')))


def test_the_recorded_query_is_the_one_the_module_runs():
    header = text(H200, 'query-gpu.csv').splitlines()[0]
    assert [h.split(' [')[0] for h in header.split(', ')] == nf.QUERY_FIELDS


def test_h200_recorded():
    (g,) = gpus(H200)
    assert g['index'] == 0 and g['minor'] == 0
    assert g['name'] == 'NVIDIA H200' and g['architecture'] == 'Hopper'
    assert g['uuid'] == 'GPU-f7da5474-6b1c-c5dc-eec5-03cfcf8c0985'
    assert g['pci_bus_id'] == '00000000:00:06.0'
    assert g['compute_cap'] == '9.0'
    assert g['memory_total_mib'] == 143771
    assert g['persistence_mode'] is True
    assert (g['power_draw_w'], g['power_limit_w'], g['power_max_limit_w']) == (129.11, 700.0, 700.0)
    assert g['power_default_limit_w'] == 700.0
    assert (g['clocks_sm_mhz'], g['clocks_mem_mhz'], g['clocks_max_sm_mhz']) == (1980, 3201, 1980)
    assert g['virtualization_mode'] == 'Pass-Through'
    assert g['driver_version'] == '580.159.04'
    xml = nf.parse_smi_xml(text(H200, 'nvidia-smi-q.xml'))
    assert (xml['driver_version'], xml['cuda_version']) == ('580.159.04', '13.0')


def test_h200_topology_has_no_pairs_and_its_kernel_module_is_open():
    assert nf.parse_topo(text(H200, 'topo.txt')) == []
    assert nf.parse_proc_version(text(H200, 'proc-driver-version.txt')) == {
        'version': '580.159.04', 'open': True,
        'text': 'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)'}
    assert nf.parse_proc_devices(text(H200, 'proc-devices.txt')) == {
        'nvidia': 195, 'nvidiactl': 195, 'nvidia-uvm': 238, 'nvidia-nvswitch': 239, 'nvidia-nvlink': 240,
        'nvidia-caps': 241, 'nvidia-caps-imex-channels': 242}


def test_rtx_pro_6000_constructed():
    eight = gpus(RTX)
    assert [g['index'] for g in eight] == list(range(8)) and [g['minor'] for g in eight] == list(range(8))
    assert {g['name'] for g in eight} == {'NVIDIA RTX PRO 6000 Blackwell Workstation Edition'}
    assert {g['compute_cap'] for g in eight} == {'12.0'} and {g['architecture'] for g in eight} == {'Blackwell'}
    assert eight[4]['pci_bus_id'] == '00000000:81:00.0'
    assert len({g['uuid'] for g in eight}) == 8
    assert all(g['power_max_limit_w'] == 600.0 and 240 < g['power_draw_w'] < 260 for g in eight)
    pairs = nf.parse_topo(text(RTX, 'topo.txt'))
    assert len(pairs) == 28 and {(p['a'], p['b']) for p in pairs} == {(a, b) for a in range(8) for b in range(a + 1, 8)}
    assert {'a': 0, 'b': 3, 'link': 'NODE'} in pairs and {'a': 3, 'b': 4, 'link': 'SYS'} in pairs
    assert nf.parse_proc_version(text(RTX, 'proc-driver-version.txt'))['version'] == '580.95.05'


def test_proprietary_kernel_module_is_told_apart():
    line = 'NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n'
    assert nf.parse_proc_version(line) == {'version': '550.54.14', 'open': False, 'text': line.strip()}


@pytest.mark.parametrize('parser, bad', [
    (nf.parse_query_csv, 'NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver.'),
    (nf.parse_query_csv, 'index, name\n0, a, b\n'),
    (nf.parse_smi_xml, 'No devices were found'),
    (nf.parse_smi_xml, '<other/>'),
    (nf.parse_topo, 'No devices were found'),
    (nf.parse_proc_version, 'something else'),
])
def test_parsers_refuse_what_the_tool_did_not_print(parser, bad):
    with pytest.raises(nf.NvidiaParseError):
        parser(bad)


def test_topology_with_a_missing_row_is_refused():
    lines = text(RTX, 'topo.txt').splitlines()
    with pytest.raises(nf.NvidiaParseError, match='8 GPU columns but 7 GPU rows'):
        nf.parse_topo('\n'.join(lines[:3] + lines[4:]))


@pytest.mark.parametrize('detect, vendor, product, modes, in_vm', [
    ('none', 'Supermicro', 'AS -4125GS-TNRT', ['None'], False),
    ('kvm', 'QEMU', 'Standard PC (Q35 + ICH9, 2009)', ['Pass-Through'], True),
    (None, None, None, ['Pass-Through'], True),          # the recorded H200 microVM: no DMI, no systemd
    ('', 'Dell Inc.', 'PowerEdge XE7745', [], False),
    (None, 'QEMU', 'Standard PC (i440FX + PIIX, 1996)', [], True),
])
def test_virtualization_evidence(detect, vendor, product, modes, in_vm):
    v = nf.virtualization(detect, vendor, product, [{'virtualization_mode': m} for m in modes])
    assert v['in_vm'] is in_vm
    assert bool(v['evidence']) is in_vm


def test_iommu_mode():
    assert nf.iommu('BOOT_IMAGE=/vmlinuz root=ZFS=rpool quiet amd_iommu=on iommu=pt', 120)['mode'] == 'passthrough'
    assert nf.iommu('quiet intel_iommu=on', 80) == {'mode': 'translated (DMA remapping)',
                                                    'cmdline_flags': ['intel_iommu=on'], 'groups': 80}
    assert nf.iommu('quiet', 0)['mode'] == 'off or not supported'
    assert nf.iommu('intel_iommu=off', 0)['mode'] == 'off'


SAMPLED = os.path.join(FIX, 'h200-1gpu-sampled')


def test_the_sample_query_on_the_recorded_h200_idle_and_busy():
    """As recorded on the lent H200 (its header says clocks.current.sm, and temperature.gpu has no unit)."""
    idle = nf.parse_sample_csv(text(SAMPLED, 'sample-query-idle.csv'))
    busy = nf.parse_sample_csv(text(SAMPLED, 'sample-query-busy.csv'))
    assert idle == [{'index': 0, 'utilization_gpu_pct': 0, 'power_draw_w': 77.8, 'power_limit_w': 700.0,
                     'memory_used_mib': 0, 'memory_total_mib': 143771, 'clocks_sm_mhz': 345, 'temperature_c': 38}]
    assert (busy[0]['utilization_gpu_pct'], busy[0]['power_draw_w'], busy[0]['clocks_sm_mhz']) == (98, 689.66, 1485)


def test_the_constructed_sample_is_eight_gpus_at_the_seeds_250_w():
    gpus = nf.parse_sample_csv(text(RTX, 'sample-query.csv'))
    assert [g['index'] for g in gpus] == list(range(8))
    assert all(247 < g['power_draw_w'] < 254 and g['power_limit_w'] == 600.0 for g in gpus)


def test_a_sample_with_other_columns_is_refused():
    with pytest.raises(nf.NvidiaParseError, match='sample fields'):
        nf.parse_sample_csv(text(H200, 'query-gpu.csv'))
    with pytest.raises(nf.NvidiaParseError, match='fields'):
        nf.parse_sample_csv(text(SAMPLED, 'sample-query-idle.csv') + '1, 0 %\n')
