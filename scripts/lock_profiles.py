#!/usr/bin/env python3
"""Write (or check) the hashed lock of each SGLang profile: roles/sglang_env/profiles/<name>/requirements.lock.

    scripts/lock_profiles.py [--check] [NAME ...]
    scripts/lock_profiles.py --sizes-from UV_CACHE [NAME ...]

For each profile (all by default) it runs `uv pip compile --generate-hashes` on the profile's `requirements`,
resolved as of the profile's `resolved_as_of` date (`--exclude-newer`), for its Python on Debian 12 x86_64
(glibc 2.36). The lock pins the whole environment; the role installs it with `--require-hashes`.
--check resolves again into a temporary file and exits 1 when it differs from the committed lock (a lock
resolved as of a fixed date must come out the same every time). Needs uv (requirements-lab.txt) and PyPI.

--sizes-from writes each profile's wheel-sizes.json instead: the disk every pin of its lock takes unpacked in the
given uv cache (the folder UV_CACHE_DIR names), which must hold them all: install the lock from it first (the lab's
is /srv/glm5-lab/sglang-cache/uv once `make test` ran). Every named profile is measured before any file is written:
a cache that lacks one profile's pins writes nothing. sglang_env checks the wheel cache's room against them.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import yaml
from packaging.utils import canonicalize_name, canonicalize_version

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'ansible', 'filter_plugins'))
from sglang_profiles import WHEEL_SIZES, first_few, lock_pins  # noqa: E402  (the roles' own reading of a lock)

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


def _key(name, version):
    return canonicalize_name(name), canonicalize_version(version)


def cache_sizes(cache):
    """{(name, version): bytes on disk} of every wheel unpacked in the uv cache (archive-v0/<id>/ holds one, named
    by its .dist-info folder); each file counted once per wheel, the largest copy where a wheel is there twice."""
    archive = os.path.join(cache, 'archive-v0')
    if not os.path.isdir(archive):
        raise SystemExit('lock_profiles: {0} is not a uv cache (no archive-v0 in it)'.format(cache))
    out = {}
    for entry in os.listdir(archive):
        top = os.path.join(archive, entry)
        infos = [d[:-len('.dist-info')] for d in os.listdir(top) if d.endswith('.dist-info')] \
            if os.path.isdir(top) else []
        if len(infos) != 1 or '-' not in infos[0]:
            continue
        size, seen = 0, set()
        for folder, _, files in os.walk(top):
            for name in files:
                st = os.lstat(os.path.join(folder, name))
                if st.st_ino not in seen:
                    seen.add(st.st_ino)
                    size += st.st_blocks * 512
        key = _key(*infos[0].rsplit('-', 1))
        out[key] = max(size, out.get(key, 0))
    return out


def measure_sizes(profile, lock, measured):
    """The wheel-sizes.json document of profile from the cache's measured sizes; refused unless every pin is there."""
    with open(lock) as fh:
        pins = lock_pins(fh.read())
    sizes = {pin: measured.get(_key(*pin.split('==', 1))) for pin in pins}
    missing = [pin for pin, size in sizes.items() if size is None]
    if missing:
        raise SystemExit('lock_profiles: {0}: {1} of its {2} pins are not in the cache ({3}): install its lock from '
                         'that cache first; no sizes written'.format(profile['name'], len(missing), len(pins),
                                                                     first_few(missing)))
    return {'about': 'Disk (bytes) each pin of {0} takes unpacked in uv\'s wheel cache: written by '
                     'scripts/lock_profiles.py --sizes-from; roles/sglang_env checks the cache\'s room against them.'
                     .format(profile['lock']),
            'total_gib': round(sum(sizes.values()) / 2 ** 30, 2), 'sizes': sizes}


def write_json(path, doc):
    new = path + '.new'
    with open(new, 'w') as fh:
        json.dump(doc, fh, indent=1, sort_keys=False)
        fh.write('\n')
    os.replace(new, path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--check', action='store_true', help='compare with the committed lock, write nothing')
    parser.add_argument('--sizes-from', metavar='UV_CACHE',
                        help="write each profile's wheel-sizes.json from this uv cache (no lock is resolved)")
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
    if args.sizes_from:
        if args.check:
            raise SystemExit('lock_profiles: --sizes-from writes; it has no --check')
        measured = cache_sizes(args.sizes_from)
        # every profile measured before any is written: a cache that lacks one profile's pins changes no file
        docs = {name: measure_sizes(profile, os.path.join(PROFILES, name, profile['lock']), measured)
                for name, profile in profiles.items()}
        for name, doc in docs.items():
            path = os.path.join(PROFILES, name, WHEEL_SIZES)
            write_json(path, doc)
            print('{0}: wrote {1} ({2} pins, {3} GiB)'.format(name, os.path.relpath(path, ROOT), len(doc['sizes']),
                                                             doc['total_gib']))
        return 0
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
