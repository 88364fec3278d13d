"""The container play on a real lab container, tried the ways the hardening issue observed it failing.

They run on make test's container-stage node (molecule/pve_container's inventory: built and verified by the
container_base, gpu_container and pve_container scenarios just before); each test runs site.yml again against it and
checks the truth through the PVE API and on the lab host. A test that stops or removes the node brings it back.
The one that moves a GPU device node on the lab host away is marked `host`: it runs alone, after the lanes.
"""
import json
import os
import shutil

import pytest
from glm5_lab.paths import paths
from siterun import ROOT, node_ssh, site, snapshot

GROUP_WARNING = 'Could not match supplied host pattern'


@pytest.fixture(scope='module')
def node(ct_node):
    inventory, name, hostvars = ct_node
    return inventory, hostvars['pve_container_vmid'], hostvars


@pytest.fixture(scope='module')
def ct(node, lab_api):
    return lab_api.nodes('pve1').lxc(node[1])


def run(node, extra=None, *args):
    return site(extra, *args, inventory=node[0])


def config(ct):
    return ct.config.get()


def gpus_of(cfg):
    return sorted(v.split(',')[0] for k, v in cfg.items() if k.startswith('dev') and '/dev/nvidia' in v
                  and v.split(',')[0][len('/dev/nvidia'):].isdigit())


@pytest.mark.ct
def test_a_normal_run_changes_nothing_and_warns_nothing(node, ct):
    """At -vvv, as an operator debugging a run would: the PVE password (every task that sends it to the API is
    no_log) is nowhere in the output."""
    r = run(node, None, '-vvv')
    assert r.rc == 0 and 'changed=0' in r.out, r
    assert '[WARNING]' not in r.raw and GROUP_WARNING not in r.out, r
    assert len(gpus_of(config(ct))) == 8
    with open(paths()['password']) as fh:
        password = fh.read().strip()
    assert len(password) >= 16 and 'ESTABLISH' in r.raw          # the lab's password; a -vvv run
    assert [n for n, line in enumerate(r.raw.splitlines(), 1) if password in line] == [], 'the password, at these lines'


@pytest.mark.ct
def test_a_shorter_gpu_list_is_refused_before_any_change(node, ct, lab_api):
    """Was: gpus [0] (or []) removed seven GPUs from the running container, restarted it, rc=0."""
    vmid = node[1]
    before = snapshot(lab_api, [vmid])
    one = dict(pve_container_gpus=[0], pve_container_gpu_count=1, gpu_preflight_gpu_count=8)  # host: 8
    r = run(node, one)
    assert r.rc != 0, r
    assert 'refusing to remove /dev/nvidia1, /dev/nvidia2, /dev/nvidia3, /dev/nvidia4, /dev/nvidia5, /dev/nvidia6, ' \
           '/dev/nvidia7 from CT {0}'.format(vmid) in r.out, r
    assert 'set pve_container_allow_gpu_removal: true' in r.out, r
    assert snapshot(lab_api, [vmid]) == before
    r = run(node, one, '--check', '--diff')
    assert r.rc != 0 and 'refusing to remove /dev/nvidia1' in r.out, r


@pytest.mark.host
def test_a_gpu_node_missing_on_the_host_stops_the_run(node, ct, lab_api):
    """Was: /dev/nvidia3 gone, gpus all: seven GPUs renumbered into dev3..dev12 and a restart, rc=0.
    Moves /dev/nvidia3 on the lab host itself, which every lab container's deploy reads: `host`, run alone."""
    before = snapshot(lab_api, [node[1]])
    os.rename('/dev/nvidia3', '/dev/nvidia3.moved-by-test')
    try:
        for args in ((), ('--check', '--diff')):
            r = run(node, None, *args)
            assert r.rc != 0, r
            assert 'GPUs on pve-lab: found 7 GPU device node(s) on the PVE host' in r.out, r
            assert 'pve_container_gpu_count is 8 (missing /dev/nvidia3)' in r.out, r
    finally:
        os.rename('/dev/nvidia3.moved-by-test', '/dev/nvidia3')
    assert snapshot(lab_api, [node[1]]) == before
    assert len(gpus_of(config(ct))) == 8


@pytest.mark.ct
def test_a_new_sglang_build_without_room_is_refused_before_anything_is_installed(node):
    """Found when two fleets shared the lab's disk: a new SGLang build (~9 GiB) on a full disk stopped half-way in
    uv with "No space left on device". The container's real filesystem, checked through the SGLang plays: asked for
    more than it has, sglang_env stops before apt, uv or the build, naming the node, the filesystem, need and have."""
    hostvars = node[2]
    r = site({'sglang_env_build_free_gb': 100000}, '--tags', 'sglang', inventory=node[0], sglang=True)
    assert r.rc != 0, r
    assert 'a new SGLang build (/opt/glm5/sglang.d/seed-validated-' in r.out, r
    assert 'needs 100000 GiB free on /, which has' in r.out and 'nothing was installed' in r.out, r
    there = node_ssh(hostvars, 'ls /opt/glm5 2>&1; dpkg-query -W -f "${Status}" patch 2>&1')
    assert 'No such file or directory' in there.stdout and 'install ok installed' not in there.stdout, there.stdout


@pytest.mark.ct
def test_a_download_the_wheel_cache_has_no_room_for_is_refused_before_it_starts(node):
    """The host-side wheel cache takes as much again as a build (~9 GiB) the first time a profile is built on a PVE
    host, and nothing checked its room: a full /srv stopped uv half-way. On this node's real cold cache (the test's
    own, emptied first) through the SGLang plays: uv's real dry run says every package is missing, the need is the
    profile's wheel sizes summed, plus the build's room (the lab's cache and rootfs share this machine's filesystem)
    and the reserve; asked for more than there is, nothing is downloaded and no build is started; --check says so
    too. (Without the check - its count misread once - the run downloaded 9.3 GiB and deployed whole.) (After the room
    test above, so that one still finds nothing installed; the container is made again by the tests below.)"""
    hostvars = node[2]
    cache = os.path.join(hostvars['pve_container_sglang_cache_dir'], 'uv')
    shutil.rmtree(cache, ignore_errors=True)
    with open(os.path.join(ROOT, 'roles', 'sglang_env', 'profiles', 'seed-validated', 'wheel-sizes.json')) as fh:
        sizes = json.load(fh)['sizes']
    r = site({'sglang_env_build_free_gb': 1, 'sglang_env_cache_reserve_gb': 100000}, '--tags', 'sglang',
             inventory=node[0], sglang=True)
    assert r.rc != 0, r
    need = (sum(sizes.values()) + 100001 * 2 ** 30) / 2 ** 30
    words = ('the wheel cache (/var/cache/sglang/uv, on /var/cache/sglang) lacks {0} of the {0} packages of profile '
             'seed-validated: up to {1:.1f} GiB to download, and the new build\'s 1 GiB on the same filesystem, with '
             'sglang_env_cache_reserve_gb (100000) left: {2:.1f} GiB needed,').format(len(sizes), sum(sizes.values())
                                                                                    / 2 ** 30, need)
    assert words in r.out and 'Nothing was downloaded or built' in r.out, r
    assert hostvars['pve_container_sglang_cache_dir'] in r.out, r     # where to free space: the PVE host's side
    assert not os.path.exists(os.path.join(cache, 'archive-v0')) or not os.listdir(os.path.join(cache, 'archive-v0'))
    there = node_ssh(hostvars, 'ls -A /opt/glm5/sglang.d /tmp | grep -E "^(seed-validated-|glm5-room-)" || echo none')
    assert there.stdout.strip() == 'none', there.stdout
    # --check says the same, now that uv is there to ask (its dry run in a folder of /tmp, removed after)
    r = site({'sglang_env_build_free_gb': 1, 'sglang_env_cache_reserve_gb': 100000}, '--tags', 'sglang', '--check',
             inventory=node[0], sglang=True)
    assert r.rc != 0 and words in r.out, r
    there = node_ssh(hostvars, 'ls -A /opt/glm5/sglang.d /tmp | grep -E "^(seed-validated-|glm5-room-)" || echo none')
    assert there.stdout.strip() == 'none', there.stdout


@pytest.mark.ct
def test_check_on_a_stopped_container_tells_the_truth(node, ct, lab_api):
    """Was: --check --diff on a stopped container ended UNREACHABLE (rc=4). Starts the node again at the end."""
    vmid = node[1]
    r = run(node, dict(pve_container_state='stopped'))
    assert r.rc == 0, r
    assert 'skipped: CT {0} is stopped (pve_container_state: stopped)'.format(vmid) in r.out, r
    assert ct.status.current.get()['status'] == 'stopped'
    before = snapshot(lab_api, [vmid])
    r = run(node, None, '--check', '--diff')
    assert r.rc == 0, r
    assert 'UNREACHABLE' not in r.out and 'unreachable=0' in r.out, r
    assert 'skipped: CT {0} is stopped; --check would start it'.format(vmid) in r.out, r
    assert snapshot(lab_api, [vmid]) == before
    r = run(node)
    assert r.rc == 0, r
    assert ct.status.current.get()['status'] == 'running'


@pytest.mark.ct
def test_state_absent_removes_the_container_and_keeps_host_data(node, ct, lab_api, tmp_path):
    """Was: the container was destroyed, then the next play failed UNREACHABLE (rc=4). Builds the node again
    (site.yml's container plays) at the end, for the tests after this one."""
    vmid = node[1]
    keep = os.path.join(node[2]['pve_container_model_cache_dir'], 'kept-by-test-{0}'.format(vmid))
    with open(keep, 'w') as out:
        out.write('weights')
    try:
        before = snapshot(lab_api, [vmid])
        r = run(node, dict(pve_container_state='absent'), '--check', '--diff')
        assert r.rc == 0, r
        assert 'skipped: CT {0} would be destroyed (pve_container_state: absent); --check leaves it'.format(vmid) \
            in r.out, r
        assert '-    dev0: /dev/nvidia0,gid=2000,mode=0660' in r.raw, r    # the diff shows what would go
        assert snapshot(lab_api, [vmid]) == before
        for _ in range(2):   # and again: nothing left to remove
            r = run(node, dict(pve_container_state='absent'))
            assert r.rc == 0 and 'unreachable=0' in r.out, r
            assert 'skipped: CT {0} is absent (pve_container_state: absent)'.format(vmid) in r.out, r
        assert vmid not in snapshot(lab_api, [vmid])
        with open(keep) as fh:
            assert fh.read() == 'weights'
        r = run(node, None, '--check')
        assert r.rc == 0, r
        assert 'skipped: CT {0} does not exist yet; --check would create it'.format(vmid) in r.out, r
        assert GROUP_WARNING not in r.out, r
        assert vmid not in snapshot(lab_api, [vmid])
    finally:
        os.unlink(keep)
    r = run(node)     # back, for the tests after this one
    assert r.rc == 0, r
