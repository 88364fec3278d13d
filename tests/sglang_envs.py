"""Throwaway SGLang environments for tests: each profile's lock installed (uv, --require-hashes) into a venv
under /var/cache/glm5-lab/sglang-venvs, hard-linked from the lab's wheel cache (the host side of the containers'
SGLang cache mount), keyed by the lock's hash. Needs PyPI or the warm cache; ~1 min per profile the first time."""
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILES = os.path.join(ROOT, 'roles', 'sglang_env', 'profiles')
NAMES = sorted(os.listdir(PROFILES))
VENVS = '/var/cache/glm5-lab/sglang-venvs'
UV = os.path.join(os.path.dirname(sys.executable), 'uv')


def load(name):
    with open(os.path.join(PROFILES, name, 'profile.yml')) as fh:
        return yaml.safe_load(fh)


def lab_wheel_cache():
    """The lab's wheel cache (the inventory's lab_wheel_cache_dir, not a second copy of it)."""
    with open(os.path.join(ROOT, 'inventories', 'lab', 'group_vars', 'all.yml')) as fh:
        return yaml.safe_load(fh)['lab_wheel_cache_dir']


def sha256(path):
    with open(path, 'rb') as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def site_packages(venv, profile):
    return os.path.join(venv, 'lib', 'python' + profile['python'], 'site-packages')


_envs = {}


def environment(name):
    """A venv holding exactly the profile's lock, keyed by the lock's hash (a changed lock gets a new one)."""
    if name in _envs:
        return _envs[name]
    profile = load(name)
    lock_file = os.path.join(PROFILES, name, profile['lock'])
    venv = os.path.join(VENVS, '{0}-{1}'.format(name, sha256(lock_file)[:12]))
    env = dict(os.environ, UV_CACHE_DIR=lab_wheel_cache(), UV_LINK_MODE='hardlink', UV_NO_PROGRESS='1')
    os.makedirs(VENVS, exist_ok=True)
    with open(os.path.join(VENVS, '.{0}.lock'.format(name)), 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)          # pytest-xdist workers: one builds, the others wait for it
        _build(name, profile, lock_file, venv, env)
    _envs[name] = (profile, venv)
    return _envs[name]


def _build(name, profile, lock, venv, env):
    if not os.path.exists(os.path.join(venv, '.glm5-complete')):
        shutil.rmtree(venv, ignore_errors=True)
        for old in os.listdir(VENVS):                 # environment() made VENVS
            if old.startswith(name + '-'):
                shutil.rmtree(os.path.join(VENVS, old), ignore_errors=True)
        subprocess.run([UV, 'venv', '--quiet', '--python', profile['python'], venv], check=True, env=env)
        r = subprocess.run([UV, 'pip', 'sync', '--require-hashes', '--python', os.path.join(venv, 'bin', 'python'),
                            lock], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        open(os.path.join(venv, '.glm5-complete'), 'w').close()
