"""site.yml's GPU plays on the lab: the host preflight from the stand-in driver, the container's userspace
following the host's kernel module through a host driver upgrade, and a forced mismatch refused naming both.

On make test's container-stage node (molecule/pve_container's inventory). The upgrade is played on a stand-in driver
directory of this test's own (lab_gpu_standin_dir, for this node's runs only), so the full-stack lane, which reads
the lab's, is never disturbed; at the end that directory is back at the inventory's version and so is the node."""
import glob
import os

import pytest
from glm5_lab.paths import STATE
from siterun import site

UPGRADE = '580.105.08'
INSTALLED = '580.95.05'       # lab_nvidia_driver_version
# this test's own stand-in host driver (the lab's stays as it is)
STANDIN = {'lab_gpu_standin_dir': os.path.join(STATE, 'gpu-standin-upgrade-test')}

pytestmark = pytest.mark.ct


@pytest.fixture(scope='module')
def node(ct_deploy):
    """The container-stage node and a site.yml run on it (its preflight's output): the one that deployed it, if this
    session did."""
    inventory, name, hostvars, run = ct_deploy
    if run is None:
        run = site(None, inventory=inventory)
        assert run.rc == 0, run
    return inventory, hostvars['pve_container_vmid'], run


def versions(vmid):
    libs = os.path.join(STATE, 'lxc', 'pve-{0}'.format(vmid), 'rootfs/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.*.*')
    return sorted(os.path.basename(p)[len('libnvidia-ml.so.'):] for p in glob.glob(libs))


def standin_driver(version=None):
    """This test's stand-in host driver at a version: lab_up.yml's own tasks for it, as make lab-up builds the lab's
    (only them: the rest of the lab is up)."""
    extra = dict(STANDIN, **({'lab_nvidia_driver_version': version} if version else {}))
    run = site(extra, '--tags', 'lab_gpu_driver', playbook='ansible/playbooks/lab_up.yml')
    assert run.rc == 0 and 'Lab | stand-in .run installer for driver {0}'.format(
        version or INSTALLED) in run.out and 'start labd' not in run.out, run


def test_preflight_prints_the_gpus_and_reports_the_lab_vm(node):
    inventory, _, out = node
    assert 'NVIDIA RTX PRO 6000 Blackwell Workstation Edition 00000000:E1:00.0 12.0' in out.out, out
    assert 'driver 580.95.05 (userspace), kernel module 580.95.05 (open), CUDA 13.0' in out.out, out
    assert 'this host is a virtual machine (systemd-detect-virt --vm: kvm)' in out.out, out
    assert '(allowed by gpu_preflight_allow_vm)' in out.out, out
    run = site(None, '--tags', 'preflight', inventory=inventory)
    assert run.rc == 0 and 'gpu_preflight : Preflight | nothing stops the deploy' in run.out, run
    assert 'gpu_container : Installed' not in run.out and 'Connect | wait for SSH' not in run.out, run


def test_userspace_follows_the_host_driver_and_a_mismatch_is_refused(node):
    inventory, vmid, _ = node
    assert versions(vmid) == [INSTALLED]
    run = site(None, inventory=inventory)
    assert run.rc == 0 and 'changed=0' in run.out, run
    try:
        standin_driver()                             # this test's stand-in: the lab's version (its .run too) ...
        standin_driver(UPGRADE)                      # ... then the host's driver is upgraded
        run = site(STANDIN, inventory=inventory)
        assert run.rc == 0, run
        assert 'gpu_container : Install | run it, userspace only (replaces another version)] *** changed' \
            in run.out, run
        assert versions(vmid) == [UPGRADE]
        # a forced version other than the host's is refused before it is installed (it was installed, then refused,
        # leaving the node in the very mismatch the check exists to prevent)
        run = site(dict(STANDIN, gpu_container_driver_version=INSTALLED), inventory=inventory)
        assert run.rc != 0, run
        assert 'gpu_container_driver_version is {0}, the host kernel module on pve-lab is {1}: that userspace would ' \
               'make NVML fail with "Driver/library version mismatch". Nothing was installed.'.format(
                   INSTALLED, UPGRADE) in run.out, run
        assert versions(vmid) == [UPGRADE]
        assert 'gpu_container : Install | run it' not in run.out, run
    finally:
        standin_driver()                             # back at the inventory's version ...
    run = site(STANDIN, inventory=inventory)         # ... and the node follows it down again
    assert run.rc == 0, run
    assert versions(vmid) == [INSTALLED]
    run = site(None, inventory=inventory)            # the lab's own stand-in: the same version, nothing to do
    assert run.rc == 0 and 'changed=0' in run.out, run
