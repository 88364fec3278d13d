"""glm5_mount_of: the mount fact of the filesystem a path is on (or would be on once made), from the setup module's
real mount facts - sglang_env's room check reads size_available from it."""
import json
import os
import subprocess
import sys

import pytest
from ansible.errors import AnsibleFilterError
from glm5_space import glm5_mount_of

MOUNTS = [
    {'mount': '/', 'device': '/dev/vda', 'size_available': 100},
    {'mount': '/opt', 'device': '/dev/vdb', 'size_available': 200},
    {'mount': '/opt/glm5/sglang.d', 'device': '/dev/vdc', 'size_available': 300},
    {'mount': '/var/cache/sglang', 'device': '/dev/vda', 'size_available': 100},
]


@pytest.mark.parametrize('path, mount', [
    ('/opt/glm5/sglang.d', '/opt/glm5/sglang.d'),                # the mount point itself
    ('/opt/glm5/sglang.d/seed-validated-1234', '/opt/glm5/sglang.d'),
    ('/opt/glm5/sglang', '/opt'),                                # a sibling with a common prefix is not under it
    ('/opt/glm5/sglang.dx', '/opt'),
    ('/optional', '/'),
    ('/var/cache/sglang/uv/', '/var/cache/sglang'),
    ('/opt/./glm5/../glm5/sglang.d', '/opt/glm5/sglang.d'),
])
def test_the_longest_mount_point_above_the_path(path, mount):
    assert glm5_mount_of(MOUNTS, path)['mount'] == mount


@pytest.mark.parametrize('mounts, path, words', [
    (MOUNTS, 'opt/glm5', 'an absolute path is needed'),
    (MOUNTS, None, 'an absolute path is needed'),
    ([], '/opt', 'no mounted filesystem holds /opt in the facts given (gather_subset mounts: 0 mounts)'),
    ([{'mount': '/srv'}], '/opt', 'no mounted filesystem holds /opt'),
])
def test_no_answer_is_an_error_naming_why(mounts, path, words):
    with pytest.raises(AnsibleFilterError, match=words.replace('(', r'\(').replace(')', r'\)')):
        glm5_mount_of(mounts, path)


def test_on_this_machines_own_mount_facts(tmp_path):
    """The setup module's real facts here, as the role gathers them: the answer for a path is the mount df names."""
    playbook = os.path.join(os.path.dirname(sys.executable), 'ansible')
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(os.path.dirname(os.path.dirname(__file__)), 'ansible.cfg'))
    out = subprocess.run([playbook, 'localhost', '-m', 'setup', '-a', 'gather_subset=!all,!min,mounts filter=ansible_mounts',
                          '-o'], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout.split('=>', 1)[1])['ansible_facts']['ansible_mounts']
    df = subprocess.run(['df', '--output=target', str(tmp_path)], capture_output=True, text=True, check=True)
    assert glm5_mount_of(facts, str(tmp_path / 'not-made-yet'))['mount'] == df.stdout.split()[-1]
