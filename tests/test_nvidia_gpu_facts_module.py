"""The nvidia_gpu_facts module run in-process: against the lab's stand-in nvidia-smi (the constructed
8-GPU fixture) with /proc and /sys of a temporary root, and against an nvidia-smi that fails."""
import os
import shutil

import modrun
import nvidia_gpu_facts
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STANDIN = os.path.join(ROOT, 'scripts', 'lab', 'nvidia_smi.py')
RTX = os.path.join(ROOT, 'tests', 'fixtures', 'nvidia-smi', 'rtx-pro-6000-8gpu-constructed')


def run_module(capsys, **args):
    return modrun.run_module(nvidia_gpu_facts, capsys, **args)


@pytest.fixture
def roots(tmp_path):
    proc, sys_ = tmp_path / 'proc', tmp_path / 'sys'
    (proc / 'driver' / 'nvidia').mkdir(parents=True)
    shutil.copy(os.path.join(RTX, 'proc-driver-version.txt'), str(proc / 'driver' / 'nvidia' / 'version'))
    shutil.copy(os.path.join(RTX, 'proc-devices.txt'), str(proc / 'devices'))
    (proc / 'cmdline').write_text('BOOT_IMAGE=/boot/vmlinuz-6.8.12-4-pve root=ZFS=rpool/ROOT/pve-1 quiet '
                                  'amd_iommu=on iommu=pt\n')
    (sys_ / 'class' / 'dmi' / 'id').mkdir(parents=True)
    (sys_ / 'class' / 'dmi' / 'id' / 'sys_vendor').write_text('Supermicro\n')
    (sys_ / 'class' / 'dmi' / 'id' / 'product_name').write_text('AS -4125GS-TNRT\n')
    for g in range(3):
        (sys_ / 'kernel' / 'iommu_groups' / str(g)).mkdir(parents=True)
    return {'proc_root': str(proc), 'sys_root': str(sys_), 'detect_virt': False}


def test_facts_from_the_standin_8_gpu_host(capsys, roots):
    res = run_module(capsys, nvidia_smi=STANDIN, **roots)
    f = res['nvidia_gpu']
    assert res['ansible_facts']['nvidia_gpu'] == f and res['changed'] is False
    assert f['present'] and f['error'] is None and f['count'] == 8
    assert f['driver_version'] == '580.95.05' and f['cuda_version'] == '13.0'
    assert f['kernel_module'] == {'version': '580.95.05', 'open': True, 'text': f['kernel_module']['text']}
    assert [g['minor'] for g in f['gpus']] == list(range(8))
    assert {g['compute_cap'] for g in f['gpus']} == {'12.0'}
    assert len(f['topology']) == 28
    assert f['majors']['nvidia-uvm'] == 238 and f['majors']['nvidia-caps'] == 241
    assert f['virtualization']['in_vm'] is False
    assert f['iommu'] == {'mode': 'passthrough', 'cmdline_flags': ['amd_iommu=on', 'iommu=pt'], 'groups': 3}


def test_no_nvidia_smi_is_reported_not_failed(capsys, roots, tmp_path):
    f = run_module(capsys, nvidia_smi=str(tmp_path / 'no-such-nvidia-smi'), **roots)['nvidia_gpu']
    assert f['present'] is False and f['count'] == 0 and f['gpus'] == []
    assert f['kernel_module']['version'] == '580.95.05'     # /proc still tells what is loaded


def test_a_failing_nvidia_smi_gives_its_words(capsys, roots, tmp_path):
    broken = tmp_path / 'nvidia-smi'
    broken.write_text('#!/bin/sh\necho "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA '
                      'driver. Make sure that the latest NVIDIA driver is installed and running."\nexit 9\n')
    broken.chmod(0o755)
    f = run_module(capsys, nvidia_smi=str(broken), **roots)['nvidia_gpu']
    assert f['present'] is True and f['count'] == 0
    assert f['error'].startswith('{0} --query-gpu='.format(broken))
    assert "failed (rc 9): NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." in f['error']


def test_the_standin_reports_the_installed_version(capsys, roots, monkeypatch):
    monkeypatch.setenv('GLM5_NVIDIA_VERSION', '590.44.01')
    f = run_module(capsys, nvidia_smi=STANDIN, **roots)['nvidia_gpu']
    assert f['driver_version'] == '590.44.01' and {g['driver_version'] for g in f['gpus']} == {'590.44.01'}


def test_the_standin_in_a_container_sees_only_its_gpus(capsys, roots, monkeypatch, tmp_path):
    """A lab node given GPUs 4-7 of the eight sees four, numbered 0-3, their minors kept (as nvidia-smi in a
    container shows what it may open): glm5 status and the smoke test count what the node has."""
    dev = tmp_path / 'dev'
    dev.mkdir()
    for name in ('nvidia4', 'nvidia5', 'nvidia6', 'nvidia7', 'nvidiactl', 'nvidia-uvm'):
        (dev / name).touch()
    monkeypatch.setenv('GLM5_NVIDIA_DEV_DIR', str(dev))
    f = run_module(capsys, nvidia_smi=STANDIN, **roots)['nvidia_gpu']
    assert f['error'] is None and f['count'] == 4
    assert [g['minor'] for g in f['gpus']] == [4, 5, 6, 7]
    assert [g['index'] for g in f['gpus']] == [0, 1, 2, 3]


def test_the_standin_says_a_fixture_folder_it_was_given_is_not_one(tmp_path):
    """GLM5_NVIDIA_FIXTURE naming a wrong folder was ignored: the stand-in answered from another fixture, and a folder
    without the files was a traceback (found by a review)."""
    import subprocess
    import sys
    for folder in (tmp_path / 'none', tmp_path):
        r = subprocess.run([sys.executable, STANDIN, '-L'], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, GLM5_NVIDIA_FIXTURE=str(folder)))
        assert r.returncode == 1 and r.stdout == '', r
        assert r.stderr.strip() == ('nvidia-smi (lab stand-in): GLM5_NVIDIA_FIXTURE={0} is not a fixture directory '
                                    '(no nvidia-smi-q.xml)'.format(folder)), r.stderr
