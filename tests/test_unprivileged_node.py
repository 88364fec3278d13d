"""The full-stack fleet's second node is an unprivileged container (hosts_fleet.yml: pve_container_unprivileged), built
by site.yml as make deploy builds one: checked here after its deploys, smoke tests and rollouts (make test's full-stack
lane, pytest -m stack2).

What it proves, issue 19's first point on a deployed node: root inside is the host's 100000; the engine's user opens
every GPU node it was given (the stand-in's ENXIO, not EACCES or EPERM); root inside is refused what host root may do;
the caches on the host are the container's (its root's and its service user's shifted ids); and its smoke test passed
at the same gates as the privileged first node's (the report in its host-side history, written from inside).
"""
import json
import os

import pytest
from sglang_envs import lab_wheel_cache
from siterun import node_ssh, second_node

NAME, NODE = second_node('default')
BASE = 100000
USER = 'sglang'
pytestmark = pytest.mark.stack2


@pytest.fixture(scope='module')
def node(stack_node2):
    return NODE


def inside(*cmd, stdin=None):
    return node_ssh(NODE, *cmd, stdin=stdin, timeout=120)


def test_its_root_is_an_unprivileged_id_of_the_host(node):
    assert node['pve_container_unprivileged'] is True
    r = inside('cat', '/proc/self/uid_map', '/proc/self/gid_map')
    assert r.returncode == 0, r
    assert [line.split() for line in r.stdout.splitlines()] == [['0', str(BASE), '65536']] * 2, r.stdout


OPEN_EACH = r"""
import errno, glob, os
for path in sorted(glob.glob('/dev/nvidia[0-9]*')) + ['/dev/nvidiactl']:
    try:
        os.close(os.open(path, os.O_RDWR))
        print(path, 'OPENED')
    except OSError as e:
        print(path, errno.errorcode[e.errno])
"""


def test_the_engines_user_opens_every_gpu_node_it_was_given(node):
    r = inside('runuser', '-u', USER, '--', 'python3', '-', stdin=OPEN_EACH)
    assert r.returncode == 0, r
    seen = dict(line.split() for line in r.stdout.splitlines())
    gpus = ['/dev/nvidia{0}'.format(n) for n in node['pve_container_gpus']]
    assert sorted(k for k in seen if k != '/dev/nvidiactl') == sorted(gpus), seen
    # The stand-in nodes are the host's null device's major with a minor no driver has: the kernel answers the open of
    # a node the user may open with ENXIO; a permission problem is EACCES (mode, group) or EPERM (the cgroup).
    assert set(seen.values()) == {'ENXIO'}, seen
    groups = inside('id', '-Gn', USER)
    assert groups.returncode == 0 and len(groups.stdout.split()) >= 2, groups
    nobody = inside('runuser', '-u', 'nobody', '--', 'python3', '-', stdin=OPEN_EACH)
    assert set(dict(line.split() for line in nobody.stdout.splitlines()).values()) == {'EACCES'}, nobody


def test_root_inside_is_refused_what_host_root_may_do(node):
    mknod = inside('mknod', '/tmp/glm5-null', 'c', '1', '3')
    assert mknod.returncode != 0 and 'Operation not permitted' in mknod.stderr, mknod
    sysfs = inside('sh', '-c', 'cat /sys/class/net/lo/mtu > /sys/class/net/lo/mtu')
    assert sysfs.returncode != 0 and 'Permission denied' in sysfs.stderr, sysfs
    # the weights the PVE host staged (host root's files): read, never written, from inside
    model = '/models/' + node['sglang_model_name']
    assert inside('test', '-r', model + '/config.json').returncode == 0
    write = inside('touch', model + '/written-from-inside')
    assert write.returncode != 0 and 'Permission denied' in write.stderr, write


def test_its_caches_on_the_host_are_the_containers_and_its_smoke_test_passed(node):
    history = node['pve_container_bench_history_dir']
    for key in ('pve_container_sglang_cache_dir', 'pve_container_bench_history_dir'):
        st = os.stat(node[key])
        assert (st.st_uid, st.st_gid) == (BASE, BASE), (key, st)
    # the service user's SGLang cache inside: its own id, shifted on the host
    uid = int(inside('id', '-u', USER).stdout)
    assert 0 < uid < 65536
    cache = os.path.join(node['pve_container_sglang_cache_dir'], 'sglang')
    assert os.stat(cache).st_uid == BASE + uid, cache
    # reports written from inside: the container root's files on the host, and a passing smoke test among them
    index = os.path.join(history, 'index.jsonl')
    assert os.stat(index).st_uid == BASE
    with open(index) as fh:
        entries = [json.loads(line) for line in fh if line.strip()]
    passed = [e for e in entries if e['node'] == NAME and e['passed'] and not e['rolled_back']]
    assert passed, entries
    report = os.path.join(history, passed[0]['run'], 'report.md')
    assert os.stat(report).st_uid == BASE
    with open(report) as fh:
        assert fh.readline().startswith('# Smoke test {0}: PASSED'.format(passed[0]['run']))


def test_its_wheel_cache_starts_as_hard_links_to_the_labs_not_a_second_download(node):
    """Its caches are its own, never make deploy's (tests/test_suite_map.py); its wheel cache starts as hard links to
    the lab's (make deploy's first node's), made by the scenario's create (ansible/playbooks/lab_caches.yml). Found in
    make test: the create skipped that under make test, and both lane nodes downloaded the 17 GB of wheels, filling
    the disk. Whether the lab had a wheel cache is what the create found (its record beside the cache): on a fresh
    machine the other lane's sglang tests fill the lab's while this node runs (found so: this test then failed)."""
    lab = lab_wheel_cache()
    own = os.path.join(node['pve_container_sglang_cache_dir'], 'uv')
    record = own + '.seeded-from'
    assert os.path.exists(record), 'no {0}: the create did not seed this node\'s wheel cache'.format(record)
    with open(record) as fh:
        seeded_from = fh.read().strip()
    if seeded_from.startswith('none'):
        assert os.path.isdir(own), own      # it filled its own
        pytest.skip('the lab had no wheel cache when this node was made (a fresh machine): it filled its own')
    if seeded_from.startswith('unknown'):
        pytest.skip('{0} was made before the create kept its record: remove it to check this'.format(own))
    assert seeded_from == lab, (record, seeded_from)
    # its big files that the lab has too (uv's archive entries have random names: the same path is the same entry)
    # are the lab's own inodes, not a second download; the lab's entries made since (the other lane) are not its
    shared = []
    for root, _dirs, files in os.walk(own):
        for f in files:
            mine = os.path.join(root, f)
            theirs = os.path.join(lab, os.path.relpath(mine, own))
            if os.path.getsize(mine) > 50 * 1024 ** 2 and os.path.exists(theirs):
                assert os.stat(mine).st_ino == os.stat(theirs).st_ino, (mine, theirs)
                shared.append(mine)
        if len(shared) >= 3:
            break
    assert shared, 'no wheel over 50 MB in {0} is the lab\'s ({1})'.format(own, lab)
