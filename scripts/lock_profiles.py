#!/usr/bin/env python3
"""Write (or check) the hashed lock of each SGLang profile: roles/sglang_env/profiles/<name>/requirements.lock.

    scripts/lock_profiles.py [--check] [NAME ...]

For each profile (all by default) it runs `uv pip compile --generate-hashes` on the profile's `requirements`,
resolved as of the profile's `resolved_as_of` date (`--exclude-newer`), for its Python on Debian 12 x86_64
(glibc 2.36). The lock pins the whole environment; the role installs it with `--require-hashes`.
--check resolves again into a temporary file and exits 1 when it differs from the committed lock (a lock
resolved as of a fixed date must come out the same every time). Needs uv (requirements-lab.txt) and PyPI.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILES = os.path.join(ROOT, 'roles', 'sglang_env', 'profiles')
PLATFORM = 'x86_64-manylinux_2_36'   # Debian 12 (PVE 8 and the container template): glibc 2.36


def uv():
    here = os.path.join(os.path.dirname(sys.executable), 'uv')
    return here if os.path.exists(here) else 'uv'


def compile_lock(profile, lock):
    """Resolve profile into the file lock: written whole or not at all (uv writes into a temporary file, the header
    is added there, then it replaces lock at once)."""
    lock = os.path.abspath(lock)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, 'requirements.lock')
        # a fixed relative name, so the lock's "# via -r requirements.in" comes out the same every time
        with open(os.path.join(tmp, 'requirements.in'), 'w') as req:
            req.write('\n'.join(profile['requirements']) + '\n')
        cmd = [uv(), 'pip', 'compile', 'requirements.in', '--generate-hashes', '--quiet', '--no-header',
               '--exclude-newer', str(profile['resolved_as_of']), '--python-version', str(profile['python']),
               '--python-platform', PLATFORM, '-o', out]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        if r.returncode != 0:
            raise SystemExit('lock_profiles: uv pip compile failed for {0}:\n{1}'.format(profile['name'], r.stderr))
        header = ('# Lock of SGLang profile "{name}": written by scripts/lock_profiles.py, do not edit.\n'
                  '# uv pip compile --generate-hashes --exclude-newer {asof} --python-version {py} '
                  '--python-platform {plat}\n# from: {reqs}\n').format(
            name=profile['name'], asof=profile['resolved_as_of'], py=profile['python'], plat=PLATFORM,
            reqs=' '.join(profile['requirements']))
        with open(out) as fh:
            body = fh.read()
        new = lock + '.new'
        with open(new, 'w') as fh:
            fh.write(header + body)
        os.replace(new, lock)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--check', action='store_true', help='compare with the committed lock, write nothing')
    parser.add_argument('names', nargs='*')
    args = parser.parse_args(argv)
    names = args.names or sorted(os.listdir(PROFILES))
    profiles = {}
    for name in names:      # every name read and checked before any lock is written
        path = os.path.join(PROFILES, name, 'profile.yml')
        if not os.path.exists(path):
            raise SystemExit('lock_profiles: no profile {0!r} ({1})'.format(name, path))
        try:
            with open(path) as fh:
                profile = yaml.safe_load(fh)
        except (OSError, yaml.YAMLError) as exc:
            raise SystemExit('lock_profiles: {0} cannot be read: {1}'.format(path, str(exc).splitlines()[0])) from None
        missing = [k for k in ('name', 'lock', 'requirements', 'resolved_as_of', 'python')
                   if not isinstance(profile, dict) or k not in profile]
        if missing:
            raise SystemExit('lock_profiles: {0} has no {1}'.format(path, ', '.join(missing)))
        profiles[name] = profile
    if not shutil.which(uv()):
        raise SystemExit('lock_profiles: uv not found (beside this Python or on PATH): make venv installs it')
    status = 0
    for name, profile in profiles.items():
        lock = os.path.join(PROFILES, name, profile['lock'])
        if args.check and not os.path.exists(lock):
            print('{0}: no lock yet ({1}): run without --check to write it'.format(name, os.path.relpath(lock, ROOT)))
            status = 1
        elif args.check:
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, 'lock')
                compile_lock(profile, out)
                same = open(out).read() == open(lock).read()
            print('{0}: {1}'.format(name, 'same' if same else 'DIFFERS from ' + os.path.relpath(lock, ROOT)))
            status |= 0 if same else 1
        else:
            compile_lock(profile, lock)
            print('{0}: wrote {1}'.format(name, os.path.relpath(lock, ROOT)))
    return status


if __name__ == '__main__':
    sys.exit(main())
