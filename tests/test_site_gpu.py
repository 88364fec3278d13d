"""site.yml's GPU plays on the lab: the host preflight from the stand-in driver, the container's userspace
following the host's kernel module through a host driver upgrade, and a forced mismatch refused naming both.
Its own lab container (vmid 198); the lab host's stand-in driver is put back to the inventory's version."""
import glob
import os

import labd
import pytest
from siterun import site

VMID = 198
NODE = {'pve_container_vmid': VMID, 'ansible_port': 20000 + VMID}
LIBS = os.path.join(labd.STATE, 'lxc', 'pve-{0}'.format(VMID), 'rootfs/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.*.*')
UPGRADE = '580.105.08'


def versions():
    return sorted(os.path.basename(p)[len('libnvidia-ml.so.'):] for p in glob.glob(LIBS))


def lab_driver(version=None):
    run = site({'lab_nvidia_driver_version': version} if version else None, playbook='ansible/playbooks/lab_up.yml')
    assert run.rc == 0, run


@pytest.fixture(scope='module')
def node(lab_api):
    run = site(NODE)
    assert run.rc == 0, run
    yield run
    lab_driver()
    site(dict(NODE, pve_container_state='absent'))


def test_preflight_prints_the_gpus_and_reports_the_lab_vm(node):
    assert 'NVIDIA RTX PRO 6000 Blackwell Workstation Edition 00000000:E1:00.0 12.0' in node.out, node
    assert 'driver 580.95.05 (userspace), kernel module 580.95.05 (open), CUDA 13.0' in node.out, node
    assert 'this host is a virtual machine (systemd-detect-virt --vm: kvm)' in node.out, node
    assert '(allowed by gpu_preflight_allow_vm)' in node.out, node
    run = site(NODE, '--tags', 'preflight')
    assert run.rc == 0 and 'gpu_preflight : Preflight | nothing stops the deploy' in run.out, run
    assert 'gpu_container : Installed' not in run.out and 'Connect | wait for SSH' not in run.out, run


def test_userspace_follows_the_host_driver_and_a_mismatch_is_refused(node):
    assert versions() == ['580.95.05']
    run = site(NODE)
    assert run.rc == 0 and 'changed=0' in run.out, run
    try:
        lab_driver(UPGRADE)                          # the host's driver is upgraded
        run = site(NODE)
        assert run.rc == 0, run
        assert 'gpu_container : Install | run it, userspace only (replaces another version)] *** changed' \
            in run.out, run
        assert versions() == [UPGRADE]
        run = site(dict(NODE, gpu_container_driver_version='580.95.05'))
        assert run.rc != 0, run
        assert "The container's NVIDIA userspace is 580.95.05, the host kernel module on pve-lab is {0}: NVML " \
               'would fail with "Driver/library version mismatch"'.format(UPGRADE) in run.out, run
    finally:
        lab_driver()
    run = site(NODE)
    assert run.rc == 0, run
    assert versions() == ['580.95.05']
