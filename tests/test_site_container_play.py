"""The container play on a real lab container, tried the ways the hardening issue observed it failing.

One lab container (vmid 196, 8 stand-in GPUs) is built with site.yml for this module; each test then runs
site.yml again against it and checks the truth through the PVE API and on the lab host.
"""
import os

import pytest
from siterun import site, snapshot

VMID = 196
NODE = {'pve_container_vmid': VMID, 'ansible_port': 20000 + VMID}
GROUP_WARNING = 'Could not match supplied host pattern'


@pytest.fixture(scope='module')
def ct(lab_api):
    run = site(NODE)
    assert run.rc == 0, run
    assert GROUP_WARNING not in run.out, run
    yield lab_api.nodes('pve1').lxc(VMID)
    site(dict(NODE, pve_container_state='absent'))


def config(ct):
    return ct.config.get()


def gpus_of(cfg):
    return sorted(v.split(',')[0] for k, v in cfg.items() if k.startswith('dev') and '/dev/nvidia' in v
                  and v.split(',')[0][len('/dev/nvidia'):].isdigit())


def test_a_normal_run_changes_nothing_and_warns_nothing(ct):
    run = site(NODE)
    assert run.rc == 0 and 'changed=0' in run.out, run
    assert '[WARNING]' not in run.raw, run
    assert len(gpus_of(config(ct))) == 8


def test_a_shorter_gpu_list_is_refused_before_any_change(ct, lab_api):
    """Was: gpus [0] (or []) removed seven GPUs from the running container, restarted it, rc=0."""
    before = snapshot(lab_api)
    one = dict(NODE, pve_container_gpus=[0], pve_container_gpu_count=1, gpu_preflight_gpu_count=8)  # host: 8
    run = site(one)
    assert run.rc != 0, run
    assert 'refusing to remove /dev/nvidia1, /dev/nvidia2, /dev/nvidia3, /dev/nvidia4, /dev/nvidia5, /dev/nvidia6, ' \
           '/dev/nvidia7 from CT 196' in run.out, run
    assert 'set pve_container_allow_gpu_removal: true' in run.out, run
    assert snapshot(lab_api) == before
    run = site(one, '--check', '--diff')
    assert run.rc != 0 and 'refusing to remove /dev/nvidia1' in run.out, run


def test_a_gpu_node_missing_on_the_host_stops_the_run(ct, lab_api):
    """Was: /dev/nvidia3 gone, gpus all: seven GPUs renumbered into dev3..dev12 and a restart, rc=0."""
    before = snapshot(lab_api)
    os.rename('/dev/nvidia3', '/dev/nvidia3.moved-by-test')
    try:
        for args in ((), ('--check', '--diff')):
            run = site(NODE, *args)
            assert run.rc != 0, run
            assert 'GPUs on pve-lab: found 7 GPU device node(s) on the PVE host' in run.out, run
            assert 'pve_container_gpu_count is 8 (missing /dev/nvidia3)' in run.out, run
    finally:
        os.rename('/dev/nvidia3.moved-by-test', '/dev/nvidia3')
    assert snapshot(lab_api) == before
    assert len(gpus_of(config(ct))) == 8


def test_check_on_a_stopped_container_tells_the_truth(ct, lab_api):
    """Was: --check --diff on a stopped container ended UNREACHABLE (rc=4)."""
    run = site(dict(NODE, pve_container_state='stopped'))
    assert run.rc == 0, run
    assert 'skipped: CT 196 is stopped (pve_container_state: stopped)' in run.out, run
    assert ct.status.current.get()['status'] == 'stopped'
    before = snapshot(lab_api)
    run = site(NODE, '--check', '--diff')
    assert run.rc == 0, run
    assert 'UNREACHABLE' not in run.out and 'unreachable=0' in run.out, run
    assert 'skipped: CT 196 is stopped; --check would start it' in run.out, run
    assert snapshot(lab_api) == before
    run = site(NODE)
    assert run.rc == 0, run
    assert ct.status.current.get()['status'] == 'running'


def test_state_absent_removes_the_container_and_keeps_host_data(ct, lab_api, tmp_path):
    """Was: the container was destroyed, then the next play failed UNREACHABLE (rc=4)."""
    keep = '/srv/glm5-lab/models/kept-by-test-{0}'.format(VMID)
    with open(keep, 'w') as out:
        out.write('weights')
    try:
        before = snapshot(lab_api)
        run = site(dict(NODE, pve_container_state='absent'), '--check', '--diff')
        assert run.rc == 0, run
        assert 'skipped: CT 196 would be destroyed (pve_container_state: absent); --check leaves it' in run.out, run
        assert '-    dev0: /dev/nvidia0,gid=2000,mode=0660' in run.raw, run    # the diff shows what would go
        assert snapshot(lab_api) == before
        for _ in range(2):   # and again: nothing left to remove
            run = site(dict(NODE, pve_container_state='absent'))
            assert run.rc == 0 and 'unreachable=0' in run.out, run
            assert 'skipped: CT 196 is absent (pve_container_state: absent)' in run.out, run
        assert VMID not in snapshot(lab_api)
        with open(keep) as fh:
            assert fh.read() == 'weights'
        run = site(NODE, '--check')
        assert run.rc == 0, run
        assert 'skipped: CT 196 does not exist yet; --check would create it' in run.out, run
        assert GROUP_WARNING not in run.out, run
        assert VMID not in snapshot(lab_api)
    finally:
        os.unlink(keep)
    run = site(NODE)     # back, for the tests after this one
    assert run.rc == 0, run
