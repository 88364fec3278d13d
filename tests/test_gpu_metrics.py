"""glm5-gpu-metrics (roles/gpu_metrics/files): the PVE host's GPUs in node exporter's textfile format, from nvidia-smi's
two queries this package parses already. On the recorded outputs (the 8-GPU constructed host, the real H200's samples),
through the lab's stand-in nvidia-smi (the program's own run, its file written atomically), when nvidia-smi fails, and
checked by promtool; on a real GPU (marked gpu: skipped without one, as in CI) against what nvidia-smi -L lists, idle
and under a matmul."""
import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, 'roles', 'gpu_metrics', 'files', 'glm5-gpu-metrics')
FIXTURES = os.path.join(ROOT, 'tests', 'fixtures', 'nvidia-smi')
STANDIN = os.path.join(ROOT, 'scripts', 'lab', 'nvidia_smi.py')
sys.path.insert(0, os.path.join(ROOT, 'ansible', 'module_utils'))     # nvidia_facts, installed beside it on a host


def _load():
    loader = importlib.machinery.SourceFileLoader('glm5_gpu_metrics', SCRIPT)
    spec = importlib.util.spec_from_loader('glm5_gpu_metrics', loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


gm = _load()


def fixture(*path):
    with open(os.path.join(FIXTURES, *path)) as fh:
        return fh.read()


def samples(text):
    """{(metric, uuid): value} of a textfile (the info series keyed by uuid with its labels)."""
    out = {}
    for line in text.splitlines():
        if line.startswith('#') or not line:
            continue
        m = re.match(r'^([a-z_0-9]+)(?:\{(.*)\})? (\S+)$', line)
        assert m, line
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ''))
        out[(m.group(1), labels.get('uuid'))] = (float(m.group(3)), labels)
    return out


def promtool_check(text):
    promtool = shutil.which('promtool') or os.path.join(ROOT, '.venv', 'bin', 'promtool')
    if not os.access(promtool, os.X_OK):
        return None
    r = subprocess.run([promtool, 'check', 'metrics'], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return True


def test_the_eight_gpu_host_in_textfile_format():
    folder = 'rtx-pro-6000-8gpu-constructed'
    text, up = gm.exposition(fixture(folder, 'query-gpu.csv'), fixture(folder, 'sample-query.csv'), 1796300000)
    s = samples(text)
    assert up and s[('glm5_gpu_metrics_up', None)][0] == 1
    infos = [labels for (name, _), (_, labels) in s.items() if name == 'nvidia_smi_gpu_info']
    assert [i['index'] for i in infos] == [str(i) for i in range(8)]
    assert infos[0]['name'] == 'NVIDIA RTX PRO 6000 Blackwell Workstation Edition'
    assert infos[0]['pci_bus_id'] == '00000000:01:00.0' and infos[0]['driver_version'] == '580.95.05'
    uuid = infos[0]['uuid']
    # the constructed host is the seeds' state: 97 % busy at 251.37 W of 600 W
    assert s[('nvidia_smi_utilization_gpu_ratio', uuid)][0] == 0.97
    assert s[('nvidia_smi_power_draw_watts', uuid)][0] == 251.37
    assert s[('nvidia_smi_power_limit_watts', uuid)][0] == 600
    assert s[('nvidia_smi_power_max_limit_watts', uuid)][0] == 600
    assert s[('nvidia_smi_memory_total_bytes', uuid)][0] == 97887 * 1024 * 1024
    assert s[('nvidia_smi_memory_used_bytes', uuid)][0] == 90112 * 1024 * 1024
    assert s[('nvidia_smi_clocks_sm_hertz', uuid)][0] == 2407e6
    assert s[('nvidia_smi_clocks_max_sm_hertz', uuid)][0] == 3090e6
    assert s[('nvidia_smi_temperature_gpu_celsius', uuid)][0] == 58
    assert s[('glm5_gpu_metrics_timestamp_seconds', None)][0] == 1796300000
    assert promtool_check(text) is not False


def test_the_real_h200s_recorded_outputs():
    text, up = gm.exposition(fixture('h200-1gpu-firecracker', 'query-gpu.csv'),
                             fixture('h200-1gpu-sampled', 'sample-query-busy.csv'), 0)
    s = samples(text)
    uuid = 'GPU-f7da5474-6b1c-c5dc-eec5-03cfcf8c0985'
    assert up and s[('nvidia_smi_gpu_info', uuid)][1]['name'] == 'NVIDIA H200'
    assert s[('nvidia_smi_utilization_gpu_ratio', uuid)][0] == 0.98
    assert (s[('nvidia_smi_power_draw_watts', uuid)][0], s[('nvidia_smi_power_limit_watts', uuid)][0]) == (689.66, 700)


def test_a_figure_nvidia_smi_does_not_report_is_left_out_not_zero():
    sample = fixture('h200-1gpu-sampled', 'sample-query-busy.csv').replace('689.66 W', '[N/A]')
    text, up = gm.exposition(fixture('h200-1gpu-firecracker', 'query-gpu.csv'), sample, 0)
    assert up and 'nvidia_smi_power_draw_watts' not in text and 'nvidia_smi_power_limit_watts{' in text


@pytest.mark.parametrize('query, sample', [(None, 'x'), ('x', None), ('not csv', 'not csv')])
def test_nvidia_smi_failing_or_answering_nonsense_is_up_0_and_no_gpu(query, sample):
    text, up = gm.exposition(query, sample, 0)
    s = samples(text)
    assert not up and s[('glm5_gpu_metrics_up', None)][0] == 0
    assert [k for k in s if k[0].startswith('nvidia_smi_')] == []


def test_the_program_through_the_lab_stand_in_writes_its_file_whole(tmp_path):
    out = tmp_path / 'glm5-gpu.prom'
    r = subprocess.run([sys.executable, SCRIPT, '--nvidia-smi', STANDIN, '--output', str(out)], capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, 'ansible', 'module_utils')))
    assert r.returncode == 0, r.stderr
    assert len([k for k in samples(out.read_text()) if k[0] == 'nvidia_smi_gpu_info']) == 8
    assert oct(out.stat().st_mode & 0o777) == '0o644' and os.listdir(tmp_path) == ['glm5-gpu.prom']
    # nvidia-smi gone (a driver that lost its GPUs): exit 1, the file says so, no GPU left in it
    r = subprocess.run([sys.executable, SCRIPT, '--nvidia-smi', '/nonexistent/nvidia-smi', '--output', str(out)],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, 'ansible', 'module_utils')))
    assert r.returncode == 1 and '/nonexistent/nvidia-smi' in r.stderr
    assert 'glm5_gpu_metrics_up 0' in out.read_text() and 'nvidia_smi_gpu_info' not in out.read_text()


@pytest.fixture(scope='module')
def real_gpu():
    if not shutil.which('nvidia-smi') or not os.path.exists('/dev/nvidiactl'):
        pytest.skip('no NVIDIA GPU on this machine')
    return subprocess.run(['nvidia-smi', '-L'], capture_output=True, text=True, check=True).stdout


def _run_real(tmp_path):
    out = tmp_path / 'glm5-gpu.prom'
    r = subprocess.run([sys.executable, SCRIPT, '--output', str(out)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, 'ansible', 'module_utils')))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    if os.environ.get('GLM5_RECORD_DIR'):
        with open(os.path.join(os.environ['GLM5_RECORD_DIR'], 'glm5-gpu-{0}.prom'.format(
                'busy' if 'busy' in tmp_path.name else 'idle')), 'w') as fh:
            fh.write(text)
    return text, samples(text)


@pytest.mark.gpu
def test_on_a_real_gpu_every_gpu_nvidia_smi_lists(real_gpu, tmp_path):
    text, s = _run_real(tmp_path)
    listed = re.findall(r'\(UUID: (GPU-[0-9a-f-]+)\)', real_gpu)
    assert listed and sorted(u for (n, u) in s if n == 'nvidia_smi_gpu_info') == sorted(listed)
    for uuid in listed:
        assert 0 <= s[('nvidia_smi_utilization_gpu_ratio', uuid)][0] <= 1
        assert 0 < s[('nvidia_smi_power_draw_watts', uuid)][0] <= s[('nvidia_smi_power_max_limit_watts', uuid)][0]
        assert s[('nvidia_smi_memory_total_bytes', uuid)][0] > 1024 ** 3
        assert s[('nvidia_smi_clocks_max_sm_hertz', uuid)][0] >= s[('nvidia_smi_clocks_sm_hertz', uuid)][0] > 0
    promtool_check(text)


@pytest.mark.gpu
def test_on_a_real_gpu_under_load_busy_near_its_power_limit(real_gpu, tmp_path_factory):
    """The power alert's premise on real hardware: a GPU that computes (a bf16 matmul loop) is busy AND draws most of
    its limit, so GLM5GPUPowerCapped (busy >= 0.8 at < 0.6 of the limit) stays quiet on a healthy GPU."""
    torch = pytest.importorskip('torch')
    import threading
    import time
    stop = threading.Event()

    def burn():
        a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
        while not stop.is_set():
            a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
    t = threading.Thread(target=burn, daemon=True)
    t.start()
    try:
        time.sleep(8)
        text, s = _run_real(tmp_path_factory.mktemp('busy'))
    finally:
        stop.set()
        t.join(30)
    (uuid,) = [u for (n, u) in s if n == 'nvidia_smi_gpu_info'][:1]
    busy = s[('nvidia_smi_utilization_gpu_ratio', uuid)][0]
    ratio = s[('nvidia_smi_power_draw_watts', uuid)][0] / s[('nvidia_smi_power_limit_watts', uuid)][0]
    assert busy >= 0.8 and ratio >= 0.6, (busy, ratio)
