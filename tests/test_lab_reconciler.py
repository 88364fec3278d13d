"""The lab reconciler: how a PVE container config becomes an LXC config, and when PVE would refuse a start.

The last test drives the running lab (fakepve + reconciler + real LXC) through the PVE API; `make test`
brings the lab up first and sets GLM5_LAB=1, so there it runs and never skips.
"""
import os
import stat
import time

import labd
import pytest


def test_lxc_config_passes_devices_with_their_major_minor_and_mounts(tmp_path, monkeypatch):
    monkeypatch.setattr(labd, 'cgroup_prefix', lambda: 'lxc.cgroup')
    config = {'hostname': 'glm5', 'memory': '4096', 'cores': '2',
              'dev0': '/dev/null,mode=0600,uid=5,gid=6', 'dev1': 'path=/dev/zero,deny-write=1',
              'mp0': '/srv/models,backup=0,mp=/models', 'mp1': '/srv/ro,mp=/ro,ro=1',
              'mp2': 'local-lvm:vm-120-disk-1,mp=/data,size=8G'}
    text, nodes = labd.lxc_config(120, config, str(tmp_path))
    lines = text.splitlines()
    assert 'lxc.uts.name = glm5' in lines
    assert 'lxc.net.0.type = none' in lines
    assert 'lxc.cgroup.devices.allow = c 1:3 rwm' in lines       # /dev/null is 1:3
    assert 'lxc.cgroup.devices.allow = c 1:5 rm' in lines        # deny-write
    assert 'lxc.cgroup.memory.limit_in_bytes = 4294967296' in lines
    assert 'lxc.cgroup.cpu.cfs_quota_us = 200000' in lines
    assert 'lxc.mount.entry = /srv/models models none bind,create=dir 0 0' in lines
    assert 'lxc.mount.entry = /srv/ro ro none bind,create=dir,ro 0 0' in lines
    assert not any('/data' in line for line in lines)              # a volume, not a bind mount
    node = os.path.join(str(tmp_path), 'passthrough', 'dev', 'null')
    assert 'lxc.mount.entry = {0} dev/null none bind,create=file 0 0'.format(node) in lines
    assert nodes[0] == (node, 'c', 0o600, 5, 6, os.stat('/dev/null').st_rdev)


def test_lxc_config_on_a_cgroup2_host(tmp_path, monkeypatch):
    monkeypatch.setattr(labd, 'cgroup_prefix', lambda: 'lxc.cgroup2')
    text, _ = labd.lxc_config(120, {'memory': 1024, 'cores': 4, 'dev0': '/dev/null'}, str(tmp_path))
    assert 'lxc.cgroup2.devices.allow = c 1:3 rwm' in text
    assert 'lxc.cgroup2.memory.max = 1073741824' in text
    assert 'lxc.cgroup2.cpu.max = 400000 100000' in text


def test_start_error_names_what_pve_would(tmp_path):
    assert labd.start_error({'dev0': '/dev/null', 'mp0': '{0},mp=/x'.format(tmp_path)}) is None
    assert labd.start_error({'dev0': '/dev/null', 'dev1': '/dev/nvidia-lab-missing'}) == \
        'Device /dev/nvidia-lab-missing does not exist'
    regular = tmp_path / 'file'
    regular.write_text('x')
    assert labd.start_error({'dev0': str(regular)}) == 'Path {0} is not a device'.format(regular)
    assert 'does not exist on the host' in labd.start_error({'mp0': '/nonexistent/lab,mp=/x'})


def test_ssh_ports_stay_on_loopback_range():
    assert labd.ssh_port(120) == 20120
    with pytest.raises(ValueError):
        labd.ssh_port(45536)


def wait_for(pred, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.5)
    return False


def test_lab_missing_device_fails_start_and_destroy_keeps_host_data(lab_api, tmp_path):
    from proxmoxer.tools import Tasks
    vmid, node = 191, lab_api.nodes('pve1')
    tmpl = [v['volid'] for v in node.storage('local').content.get(content='vztmpl')][0]
    keep = tmp_path / 'host-data'
    keep.mkdir()
    (keep / 'weights.safetensors').write_text('precious')
    upid = node.lxc.post(vmid=vmid, hostname='lab-test', ostemplate=tmpl, rootfs='local-lvm:4', memory=512,
                         dev0='/dev/nvidia-lab-missing', mp0='{0},mp=/data'.format(keep), tags='glm5-managed')
    try:
        assert Tasks.blocking_status(lab_api, upid)['exitstatus'] == 'OK'
        lab = labd.LabLxc(labd.paths())
        assert wait_for(lambda: lab.exists(vmid)), 'the reconciler did not build the LXC container'
        status = Tasks.blocking_status(lab_api, node.lxc(vmid).status.start.post())
        assert status['exitstatus'] == 'Device /dev/nvidia-lab-missing does not exist'
        assert node.lxc(vmid).status.current.get()['status'] == 'stopped'
        time.sleep(1.5)
        assert lab.state(vmid) != 'running'
    finally:
        Tasks.blocking_status(lab_api, node.lxc(vmid).delete())
    assert wait_for(lambda: not os.path.exists(lab.ctdir(vmid))), 'the reconciler did not remove the container'
    assert (keep / 'weights.safetensors').read_text() == 'precious'
    assert stat.S_ISDIR(os.stat(str(keep)).st_mode)


def test_new_requests_survive_fakepve_dropping_old_ones():
    def req(method, path):  # built at run time: equal constant tuples may be one object
        return tuple([method, path, b''])
    a, b, c, d = req('GET', '/a'), req('GET', '/b'), req('POST', '/c'), req('GET', '/b')
    assert labd.new_requests([a, b], None) == [a, b]
    assert labd.new_requests([a, b, c], b) == [c]
    assert labd.new_requests([b, c, d], b) == [c, d]      # 'a' dropped: positions shifted
    assert labd.new_requests([c, d], b) == [c, d]         # the last one read was dropped too
    assert labd.new_requests([b, c, d], d) == []
    equal_but_new = req('GET', '/b')
    assert labd.new_requests([b, c, equal_but_new], b) == [c, equal_but_new]  # identity, not equality


def test_write_config_keeps_passthrough_nodes_until_they_change(tmp_path, monkeypatch):
    monkeypatch.setattr(labd, 'cgroup_prefix', lambda: 'lxc.cgroup')
    lab = labd.LabLxc(labd.paths(str(tmp_path)))
    os.makedirs(os.path.join(lab.ctdir(150), 'rootfs', 'etc'))
    lab.write_config(150, {'hostname': 'a', 'dev0': '/dev/null,mode=0666'})
    node = os.path.join(lab.ctdir(150), 'passthrough', 'dev', 'null')
    inode = os.stat(node).st_ino
    assert lab.write_config(150, {'hostname': 'a', 'dev0': '/dev/null,mode=0666'}) is False
    assert os.stat(node).st_ino == inode
    lab.write_config(150, {'hostname': 'a', 'dev0': '/dev/null,mode=0600'})
    assert stat.S_IMODE(os.stat(node).st_mode) == 0o600
    lab.write_config(150, {'hostname': 'a', 'dev0': '/dev/zero'})
    assert not os.path.exists(node)
    assert os.stat(os.path.join(lab.ctdir(150), 'passthrough', 'dev', 'zero')).st_rdev == os.stat('/dev/zero').st_rdev
