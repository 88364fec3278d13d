"""glm5-lab's settings from the environment (scripts/lab/paths.py) and its status: a bad value is one line naming the
variable, not a traceback (GLM5_LAB_PORT=abc broke even --help), a relative or wrong state folder is refused, and
status makes nothing (it created <state>/lxc wherever GLM5_LAB_STATE pointed). No lab needed: it never gets that far."""
import os
import subprocess
import sys

import pytest
from siterun import ROOT

GLM5_LAB = os.path.join(os.path.dirname(sys.executable), 'glm5-lab')


def lab(*args, **env):
    return subprocess.run([GLM5_LAB, *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **env))


@pytest.mark.parametrize('env, line', [
    ({'GLM5_LAB_PORT': 'abc'}, "GLM5_LAB_PORT must be a number from 1 to 65535, got 'abc'"),
    ({'GLM5_LAB_PORT': '70000'}, "GLM5_LAB_PORT must be a number from 1 to 65535, got '70000'"),
    ({'GLM5_LAB_POLL': 'x'}, "GLM5_LAB_POLL must be a number from 0.1 to 3600, got 'x'"),
    ({'GLM5_LAB_FILES_PORT': '8o'}, "GLM5_LAB_FILES_PORT must be a number from 0 to 65535, got '8o'"),
    ({'GLM5_LAB_STATE': 'relative/dir'}, "GLM5_LAB_STATE must be an absolute path, got 'relative/dir'"),
    ({'GLM5_LAB_STATE': '/etc/hostname'}, 'GLM5_LAB_STATE: /etc/hostname is not a folder')])
def test_a_bad_setting_is_one_line_naming_it(env, line, tmp_path):
    for args in (['--help'], ['status']):
        r = subprocess.run([GLM5_LAB, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                           env=dict(os.environ, **env))
        assert r.returncode == 1 and r.stderr.strip() == line and r.stdout == '', (args, r.stderr)
    assert os.listdir(tmp_path) == []           # nothing made where it ran


def test_status_of_a_state_that_is_not_there_says_so_and_makes_nothing(tmp_path):
    state = tmp_path / 'typo-state'
    r = lab('status', GLM5_LAB_STATE=str(state), GLM5_LAB_PORT='1')
    assert r.returncode == 1 and 'no lab state at {0}'.format(state) in r.stdout, r
    assert not state.exists()


@pytest.mark.parametrize('unbuffered', ['', '1'])
def test_status_into_a_reader_that_has_gone_is_no_traceback(unbuffered, tmp_path):
    """`glm5-lab status | head -1`: its lines went into a closed pipe and Python printed a BrokenPipeError traceback
    (at the print, or as it exited: PYTHONUNBUFFERED set or not)."""
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONUNBUFFERED'}
    env.update({'PYTHONUNBUFFERED': unbuffered} if unbuffered else {}, GLM5_LAB_STATE=str(tmp_path), GLM5_LAB_PORT='1')
    read, write = os.pipe()
    os.close(read)                              # the reader gone before the first line
    try:
        r = subprocess.run([GLM5_LAB, 'status'], stdout=write, stderr=subprocess.PIPE, text=True, timeout=60,
                           env=env)
    finally:
        os.close(write)
    assert r.returncode == 1 and r.stderr == '', r

BUILD_TEMPLATE = os.path.join(ROOT, 'scripts', 'lab', 'build-template.sh')


@pytest.mark.parametrize('args, words', [
    ([], 'usage: build-template.sh OUT.tar.gz MIRROR'),
    (['only-one'], 'usage: build-template.sh OUT.tar.gz MIRROR'),
    (['/nonexistent/t.tar.gz', 'http://127.0.0.1:9/debian'], '/nonexistent is not a folder'),
    (['{tmp}/t.tar.gz', 'http://127.0.0.1:9/debian', '{tmp}/missing.crt'], 'certificate {tmp}/missing.crt not found')])
def test_build_template_refuses_bad_arguments_before_debootstrap(args, words, tmp_path):
    """Run without arguments it stopped on 'parameter not set' (set -u) with no usage; a missing CA file was found
    only after debootstrap had run for minutes."""
    args = [a.format(tmp=tmp_path) for a in args]
    r = subprocess.run(['sh', BUILD_TEMPLATE, *args], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and words.format(tmp=tmp_path) in r.stderr, r
    assert list(tmp_path.iterdir()) == []
    help_ = subprocess.run(['sh', BUILD_TEMPLATE, '--help'], capture_output=True, text=True, timeout=30)
    assert help_.returncode == 0 and help_.stdout.startswith('usage: build-template.sh'), help_
