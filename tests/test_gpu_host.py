"""Device discovery against a real NVIDIA host (marked gpu; skipped where there is no GPU, as in CI).

The role finds /dev/nvidia* and /dev/nvidia-caps/* with ansible.builtin.find and hands the list to the
nvidia_passthrough filter. Here the same list is built from the real /dev of a GPU machine, and the
result is checked against what the driver itself reports (nvidia-smi -q -x, /proc/devices).
Run there with: python3 -m pytest -m gpu tests/test_gpu_host.py
"""
import importlib.util
import os
import re
import shutil
import stat
import subprocess
import xml.etree.ElementTree as ET

import pytest
from glm5.project import ROOT
from nvidia_devices import nvidia_passthrough, nvidia_passthrough_problems


def _nvidia_facts():
    """ansible.module_utils.nvidia_facts; on a GPU machine without Ansible, the same file loaded by its path."""
    try:
        from ansible.module_utils import nvidia_facts
    except ImportError:
        spec = importlib.util.spec_from_file_location(
            'nvidia_facts', os.path.join(ROOT, 'ansible', 'module_utils', 'nvidia_facts.py'))
        nvidia_facts = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(nvidia_facts)
    return nvidia_facts


parse_smi_xml = _nvidia_facts().parse_smi_xml

pytestmark = pytest.mark.gpu


@pytest.fixture(scope='module')
def host():
    if not shutil.which('nvidia-smi') or not os.path.exists('/dev/nvidiactl'):
        pytest.skip('no NVIDIA GPU on this machine')
    xml = subprocess.run(['nvidia-smi', '-q', '-x'], capture_output=True, text=True, check=True).stdout
    minors = sorted(int(g.findtext('minor_number')) for g in ET.fromstring(xml).iter('gpu'))
    files = []
    for folder in ('/dev', '/dev/nvidia-caps'):
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            if name.startswith('nvidia'):
                path = os.path.join(folder, name)
                st = os.stat(path)
                files.append({'path': path, 'mode': '%04o' % stat.S_IMODE(st.st_mode), 'isdir': stat.S_ISDIR(st.st_mode)})
    majors = {}
    if os.path.exists('/proc/devices'):
        with open('/proc/devices') as fh:
            for line in fh:
                m = re.match(r'\s*(\d+)\s+(nvidia\S*)$', line)
                if m:
                    majors.setdefault(m.group(2), int(m.group(1)))
    return {'minors': minors, 'files': files, 'majors': majors, 'xml': xml}


def test_every_gpu_the_driver_reports_is_passed_through(host):
    devices = nvidia_passthrough(host['files'])
    gpus = [d['path'] for d in devices if re.fullmatch(r'/dev/nvidia\d+', d['path'])]
    assert gpus == ['/dev/nvidia%d' % m for m in host['minors']]
    paths = [d['path'] for d in devices]
    assert '/dev/nvidiactl' in paths and '/dev/nvidia-uvm' in paths


def test_device_majors_are_the_hosts_own(host):
    """GPUs and ctl are 195; uvm and caps majors are dynamic: whatever the host's driver registered."""
    for dev in nvidia_passthrough(host['files']):
        rdev = os.stat(dev['path']).st_rdev
        name = dev['path']
        if re.fullmatch(r'/dev/nvidia(\d+|ctl)', name):
            assert os.major(rdev) == 195, name
        elif host['majors']:
            driver = 'nvidia-caps' if name.startswith('/dev/nvidia-caps/') else 'nvidia-uvm'
            assert os.major(rdev) == host['majors'][driver], (name, host['majors'])
        else:
            assert os.major(rdev) != 195, name


def test_host_modes_are_kept(host):
    for dev in nvidia_passthrough(host['files']):
        assert int(dev['mode'], 8) == stat.S_IMODE(os.stat(dev['path']).st_mode), dev


def test_the_role_gpu_checks_pass_on_a_real_host(host):
    """What the role asserts before passing GPUs through: the nodes in /dev match the driver's own list
    (nvidia-smi -q -x, parsed as nvidia_gpu_facts does), as many as expected; one fewer expected is a problem."""
    minors = sorted(g['minor'] for g in parse_smi_xml(host['xml'])['gpus'])
    assert minors == host['minors']
    assert nvidia_passthrough_problems(host['files'], gpus='all', count=len(minors), driver_minors=minors) == []
    problems = nvidia_passthrough_problems(host['files'], gpus='all', count=len(minors) + 1, driver_minors=minors)
    assert any('pve_container_gpu_count is {0}'.format(len(minors) + 1) in p for p in problems), problems


def test_facts_module_on_a_real_host(host, capsys):
    """nvidia_gpu_facts on the real driver: the facts agree with nvidia-smi's own XML and /proc. Needs the
    ansible package importable (the device run carries it); prints the facts for the record."""
    pytest.importorskip('ansible.module_utils.basic')
    import json

    import nvidia_gpu_facts
    from ansible.module_utils.testing import patch_module_args
    with patch_module_args({}), pytest.raises(SystemExit):
        nvidia_gpu_facts.main()
    facts = json.loads(capsys.readouterr().out)['nvidia_gpu']
    with capsys.disabled():
        print('\nnvidia_gpu_facts on this host:\n' + json.dumps(facts, indent=1, sort_keys=True))
    assert facts['present'] and facts['error'] is None
    assert sorted(g['minor'] for g in facts['gpus']) == host['minors']
    assert facts['count'] == len(host['minors'])
    assert all(g['uuid'].startswith('GPU-') and g['compute_cap'] and g['memory_total_mib'] > 0 for g in facts['gpus'])
    assert facts['kernel_module']['version'] == facts['driver_version']
    assert facts['majors']['nvidia'] == 195
    assert len(facts['topology']) == len(host['minors']) * (len(host['minors']) - 1) // 2


def test_the_smoke_tests_gpu_sample_query_on_a_real_gpu(host, tmp_path):
    """The query sglang_bench samples with during the sweep: every GPU, every figure a number. With torch on the
    machine, a sample taken under a matmul load shows the GPU busy. GLM5_RECORD_DIR keeps the raw outputs."""
    SAMPLE_ARGS, parse_sample_csv = _nvidia_facts().SAMPLE_ARGS, _nvidia_facts().parse_sample_csv
    idle = subprocess.run(['nvidia-smi'] + SAMPLE_ARGS, capture_output=True, text=True, check=True).stdout
    gpus = parse_sample_csv(idle)
    assert [g['index'] for g in gpus] == list(range(len(host['minors'])))
    for g in gpus:
        for key in ('utilization_gpu_pct', 'power_draw_w', 'power_limit_w', 'memory_used_mib', 'memory_total_mib',
                    'clocks_sm_mhz', 'temperature_c'):
            assert isinstance(g[key], (int, float)), (key, g)
        assert 0 < g['power_draw_w'] <= g['power_limit_w'] * 1.2
    record = os.environ.get('GLM5_RECORD_DIR')
    if record:
        with open(os.path.join(record, 'sample-query-idle.csv'), 'w') as fh:
            fh.write(idle)
    load = ('import torch, time\nx = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)\n'
            't = time.time()\nwhile time.time() - t < 12:\n    y = x @ x\n    torch.cuda.synchronize()\n')
    try:
        proc = subprocess.Popen(['python3', '-c', load], stderr=subprocess.PIPE, text=True)
    except OSError:
        return
    import time
    time.sleep(8)
    busy = subprocess.run(['nvidia-smi'] + SAMPLE_ARGS, capture_output=True, text=True, check=True).stdout
    _, err = proc.communicate(timeout=60)
    if proc.returncode != 0:
        pytest.skip('no torch with CUDA here for the load half: ' + err[-200:])
    if record:
        with open(os.path.join(record, 'sample-query-busy.csv'), 'w') as fh:
            fh.write(busy)
    loaded = parse_sample_csv(busy)[0]
    print('idle:', gpus[0], '\nbusy:', loaded)
    assert loaded['utilization_gpu_pct'] > 50
    assert loaded['power_draw_w'] > gpus[0]['power_draw_w']
    assert loaded['memory_used_mib'] > gpus[0]['memory_used_mib']
