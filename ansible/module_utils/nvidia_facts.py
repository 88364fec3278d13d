# Parsers for what NVIDIA's own tools print, turned into GPU facts (used by the nvidia_gpu_facts module).
# Each parser takes the text a tool printed and nothing else, so pytest runs them on real recorded outputs.
from __future__ import annotations

import csv
import io
import re
import xml.etree.ElementTree as ET

# The query the facts module runs (the same columns as tests/fixtures/nvidia-smi/*/query-gpu.csv).
QUERY_FIELDS = ['index', 'name', 'uuid', 'pci.bus_id', 'driver_version', 'vbios_version', 'memory.total',
                'power.limit', 'power.draw', 'power.max_limit', 'compute_cap', 'persistence_mode', 'clocks.max.sm']
QUERY_ARGS = ['--query-gpu=' + ','.join(QUERY_FIELDS), '--format=csv']
# What the smoke test samples during its sweep, every few seconds (parse_sample_csv).
# nvidia-smi heads a column with a field's canonical name (clocks.sm -> clocks.current.sm): the columns are read by
# position, in this order.
SAMPLE_FIELDS = ['index', 'utilization.gpu', 'power.draw', 'power.limit', 'memory.used', 'memory.total',
                 'clocks.current.sm', 'temperature.gpu']
SAMPLE_ARGS = ['--query-gpu=' + ','.join(SAMPLE_FIELDS), '--format=csv']

_ANSI = re.compile(r'\x1b\[[0-9;]*m')
_NA = ('', 'n/a', '[n/a]', '[not supported]', 'not supported', 'none', '[unknown error]')


class NvidiaParseError(ValueError):
    """The text is not what the tool prints."""


def _number(text):
    """'700.00 W' -> 700.0, '143771 MiB' -> 143771, 'N/A' -> None."""
    text = (text or '').strip()
    if text.lower() in _NA:
        return None
    m = re.match(r'^(-?\d+(?:\.\d+)?)', text)
    if not m:
        return None
    value = float(m.group(1))
    return int(value) if value.is_integer() and '.' not in m.group(1) else value


def _enabled(text):
    text = (text or '').strip().lower()
    if text in ('enabled', 'on', 'yes'):
        return True
    if text in ('disabled', 'off', 'no'):
        return False
    return None


def _query_rows(text, fields=None):
    """`nvidia-smi --query-gpu=... --format=csv` -> one {column: text} per GPU. Columns are named by the header
    (units dropped), or by position from `fields` (the header may name a field otherwise: clocks.sm comes back as
    clocks.current.sm)."""
    rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))
    if not rows or not rows[0] or rows[0][0].strip() != 'index' or (fields and len(rows[0]) != len(fields)):
        raise NvidiaParseError('not nvidia-smi --query-gpu CSV {0}: {1!r}'.format(
            'of the sample fields' if fields else 'with a header', text[:200]))
    names = fields or [re.sub(r'\s*\[.*\]$', '', h.strip()) for h in rows[0]]
    for row in rows[1:]:
        if not row:
            continue
        if len(row) != len(names):
            raise NvidiaParseError('nvidia-smi --query-gpu row has {0} fields, the header {1}: {2!r}'.format(
                len(row), len(names), row))
        yield dict(zip(names, (c.strip() for c in row), strict=True))


def parse_query_csv(text):
    """`nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv` (header with units) -> one dict per GPU."""
    gpus = []
    for v in _query_rows(text):
        gpus.append({
            'index': int(v['index']),
            'name': v.get('name'),
            'uuid': v.get('uuid'),
            'pci_bus_id': v.get('pci.bus_id'),
            'driver_version': v.get('driver_version'),
            'vbios_version': v.get('vbios_version'),
            'memory_total_mib': _number(v.get('memory.total')),
            'power_limit_w': _number(v.get('power.limit')),
            'power_draw_w': _number(v.get('power.draw')),
            'power_max_limit_w': _number(v.get('power.max_limit')),
            'compute_cap': v.get('compute_cap') if (v.get('compute_cap') or '').lower() not in _NA else None,
            'persistence_mode': _enabled(v.get('persistence_mode')),
            'clocks_max_sm_mhz': _number(v.get('clocks.max.sm')),
        })
    return gpus


def parse_sample_csv(text):
    """`nvidia-smi --query-gpu=<SAMPLE_FIELDS> --format=csv` -> one dict per GPU (the load figures only)."""
    gpus = []
    for v in _query_rows(text, SAMPLE_FIELDS):
        gpus.append({
            'index': int(v['index']),
            'utilization_gpu_pct': _number(v['utilization.gpu']),
            'power_draw_w': _number(v['power.draw']),
            'power_limit_w': _number(v['power.limit']),
            'memory_used_mib': _number(v['memory.used']),
            'memory_total_mib': _number(v['memory.total']),
            'clocks_sm_mhz': _number(v['clocks.current.sm']),
            'temperature_c': _number(v['temperature.gpu']),
        })
    return gpus


def parse_smi_xml(text):
    """`nvidia-smi -q -x` -> {driver_version, cuda_version, gpus: [{pci_bus_id, minor, ...}]}."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise NvidiaParseError('nvidia-smi -q -x gave no XML ({0}): {1!r}'.format(exc, text[:200])) from None
    if root.tag != 'nvidia_smi_log':
        raise NvidiaParseError('nvidia-smi -q -x: unexpected root element {0!r}'.format(root.tag))
    gpus = []
    for gpu in root.iter('gpu'):
        def get(path, gpu=gpu):
            value = gpu.findtext(path)
            return value.strip() if value is not None else None
        minor = get('minor_number')
        gpus.append({
            'pci_bus_id': get('pci/pci_bus_id') or gpu.get('id'),
            'minor': int(minor) if minor and minor.isdigit() else None,
            'name': get('product_name'),
            'architecture': get('product_architecture'),
            'uuid': get('uuid'),
            'persistence_mode': _enabled(get('persistence_mode')),
            'virtualization_mode': get('gpu_virtualization_mode/virtualization_mode'),
            'memory_total_mib': _number(get('fb_memory_usage/total')),
            'memory_used_mib': _number(get('fb_memory_usage/used')),
            'utilization_gpu_pct': _number(get('utilization/gpu_util')),
            'temperature_c': _number(get('temperature/gpu_temp')),
            'power_draw_w': _number(get('gpu_power_readings/average_power_draw')),
            'power_limit_w': _number(get('gpu_power_readings/current_power_limit')),
            'power_default_limit_w': _number(get('gpu_power_readings/default_power_limit')),
            'power_max_limit_w': _number(get('gpu_power_readings/max_power_limit')),
            'clocks_sm_mhz': _number(get('clocks/sm_clock')),
            'clocks_mem_mhz': _number(get('clocks/mem_clock')),
            'clocks_max_sm_mhz': _number(get('max_clocks/sm_clock')),
        })
    return {'driver_version': (root.findtext('driver_version') or '').strip() or None,
            'cuda_version': (root.findtext('cuda_version') or '').strip() or None,
            'gpus': gpus}


def parse_topo(text):
    """`nvidia-smi topo -m` -> [{'a': 0, 'b': 1, 'link': 'NODE'}, ...] for every GPU pair (a < b)."""
    lines = [_ANSI.sub('', line) for line in text.splitlines()]
    header = next((line for line in lines if re.match(r'^\s*GPU\d+', line.strip('\t ')) and line.startswith('\t')),
                  None)
    if header is None:
        raise NvidiaParseError('not nvidia-smi topo -m output: {0!r}'.format(text[:200]))
    columns = [c.strip() for c in header.split('\t')[1:]]
    gpu_cols = {i: int(c[3:]) for i, c in enumerate(columns) if re.fullmatch(r'GPU\d+', c)}
    pairs = []
    seen_rows = 0
    for line in lines:
        cells = line.split('\t')
        if not re.fullmatch(r'GPU\d+', cells[0].strip()):
            continue
        seen_rows += 1
        a = int(cells[0].strip()[3:])
        for i, b in gpu_cols.items():
            if i + 1 >= len(cells):
                raise NvidiaParseError('nvidia-smi topo -m: row GPU{0} is short: {1!r}'.format(a, line))
            link = cells[i + 1].strip()
            if a < b:
                pairs.append({'a': a, 'b': b, 'link': link})
    if seen_rows != len(gpu_cols):
        raise NvidiaParseError('nvidia-smi topo -m: {0} GPU columns but {1} GPU rows'.format(len(gpu_cols), seen_rows))
    return pairs


def parse_proc_version(text):
    """/proc/driver/nvidia/version -> {version, open, text}."""
    first = text.strip().splitlines()[0] if text.strip() else ''
    m = re.search(r'Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)', first)
    if not first.startswith('NVRM version:') or not m:
        raise NvidiaParseError('not /proc/driver/nvidia/version: {0!r}'.format(text[:200]))
    return {'version': m.group(1), 'open': 'Open Kernel Module' in first, 'text': first.strip()}


def parse_proc_devices(text):
    """/proc/devices -> {'nvidia': 195, 'nvidia-uvm': 238, ...} for the NVIDIA character devices."""
    majors = {}
    for line in text.splitlines():
        m = re.match(r'^\s*(\d+)\s+(nvidia\S*)\s*$', line)
        if m:
            majors.setdefault(m.group(2), int(m.group(1)))
    return majors


def merge(query, xml):
    """One dict per GPU from the CSV query and the XML, matched by PCI bus id, ordered by index."""
    by_bus = {g['pci_bus_id'].upper(): g for g in xml['gpus'] if g.get('pci_bus_id')}
    out = []
    for q in sorted(query, key=lambda g: g['index']):
        x = by_bus.get((q['pci_bus_id'] or '').upper(), {})
        gpu = dict(x)
        gpu.update({k: v for k, v in q.items() if v is not None or k not in gpu})
        out.append(gpu)
    return out


# DMI values of hypervisors (sys_vendor / product_name), lower case.
VM_DMI = ('qemu', 'kvm', 'vmware', 'virtualbox', 'innotek', 'xen', 'microsoft corporation', 'bochs', 'parallels',
          'amazon ec2', 'google compute engine', 'openstack', 'cloud hypervisor', 'firecracker')


def virtualization(detect_virt, dmi_vendor, dmi_product, gpus):
    """Is this a VM? From systemd-detect-virt --vm (its output), DMI, and the GPUs' own virtualization mode."""
    evidence = []
    if detect_virt and detect_virt.strip() not in ('', 'none'):
        evidence.append('systemd-detect-virt --vm: {0}'.format(detect_virt.strip()))
    for label, value in (('DMI sys_vendor', dmi_vendor), ('DMI product_name', dmi_product)):
        if value and any(v in value.strip().lower() for v in VM_DMI):
            evidence.append('{0}: {1}'.format(label, value.strip()))
    modes = sorted({g.get('virtualization_mode') for g in gpus if g.get('virtualization_mode')} - {'None', 'N/A'})
    for mode in modes:
        evidence.append('nvidia-smi virtualization mode: {0}'.format(mode))
    return {'in_vm': bool(evidence), 'evidence': evidence, 'systemd_detect_virt': (detect_virt or '').strip() or None,
            'dmi_sys_vendor': (dmi_vendor or '').strip() or None, 'dmi_product_name': (dmi_product or '').strip() or None}


def iommu(cmdline, groups):
    """IOMMU mode from the kernel command line and how many IOMMU groups the kernel made."""
    flags = [w for w in (cmdline or '').split() if re.match(r'^(intel_iommu|amd_iommu|iommu)(=|\.)', w)]
    if any(f in ('iommu=pt', 'iommu.passthrough=1') for f in flags):
        mode = 'passthrough'
    elif any(f.endswith('=off') for f in flags):
        mode = 'off'
    elif groups:
        mode = 'translated (DMA remapping)'
    else:
        mode = 'off or not supported'
    return {'mode': mode, 'cmdline_flags': flags, 'groups': groups}
