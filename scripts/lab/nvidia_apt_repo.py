#!/usr/bin/env python3
"""Lab stand-in for NVIDIA's apt repository (developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/).

    nvidia_apt_repo.py REPO_DIR GNUPG_HOME VERSION PAYLOAD_DIR

Adds stand-in driver packages of VERSION (Debian version VERSION-1) to the flat repository REPO_DIR (labd
serves <lab state>/www over HTTP) and signs it, as NVIDIA's is signed, with a key kept in GNUPG_HOME (made on
first use; its public half is REPO_DIR/lab-nvidia-repo.pub, the counterpart of NVIDIA's 3bf863cc.pub). Packages
of other versions already in the repository stay, so a host can be moved between versions. Real apt installs
them: dependencies with exact versions, maintainer scripts, holds. What they install is what the stand-in
.run installer installs (scripts/lab/nvidia_installer.py: its texts are reused, not copied):

- nvidia-kernel-open-dkms: /usr/src/nvidia-VERSION/dkms.conf, registered with the real `dkms add` by its
  postinst and removed by its prerm (no module is built: there is no GPU and no kernel source here);
- nvidia-driver-cuda: libnvidia-ml.so.VERSION and nvidia-smi printing the constructed 8-GPU fixture (from
  PAYLOAD_DIR) with this version; it depends on the three others at exactly its version;
- nvidia-persistenced, nvidia-modprobe: record each run in /run/glm5-lab-nvidia/<tool>.log.

Prints "added VERSION" or "unchanged"; exits non-zero with one line on bad input or a failing tool.
"""
import datetime
import fcntl
import gzip
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

KEY_NAME = 'glm5 lab stand-in for the NVIDIA CUDA repository'
PUBLIC_KEY = 'lab-nvidia-repo.pub'
MAINTAINER = 'glm5 lab <root@localhost>'


def installer():
    """scripts/lab/nvidia_installer.py, whose texts (and paths) the packages reuse."""
    from glm5_lab import nvidia_installer
    return nvidia_installer


def run(argv, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    if r.returncode != 0:       # one line: the tool's last word is the one that says why
        said = [line for line in (r.stderr or r.stdout).splitlines() if line.strip()]
        raise SystemExit('nvidia-apt-repo: {0} failed: {1}'.format(argv[0], said[-1].strip() if said else
                                                                   'exit {0}'.format(r.returncode)))
    return r.stdout


def write(path, text, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as out:
        out.write(text)
    os.chmod(path, mode)


def control(name, debver, depends, description):
    lines = ['Package: ' + name, 'Version: ' + debver, 'Architecture: amd64', 'Maintainer: ' + MAINTAINER,
             'Section: non-free/libs', 'Priority: optional']
    if depends:
        lines.append('Depends: ' + ', '.join(depends))
    lines += ['Description: ' + description, ' Lab stand-in (scripts/lab/nvidia_apt_repo.py): no GPU code.']
    return '\n'.join(lines) + '\n'


def build_deb(root, pool, name, debver):
    out = os.path.join(pool, '{0}_{1}_amd64.deb'.format(name, debver))
    env = dict(os.environ, SOURCE_DATE_EPOCH='0')
    run(['dpkg-deb', '--root-owner-group', '-Zgzip', '--build', root, out], env=env)
    return out


def packages(version, payload, pool, nv):
    debver = version + '-1'
    exact = '(= {0})'.format(debver)
    with tempfile.TemporaryDirectory() as work:
        # nvidia-kernel-open-dkms
        root = os.path.join(work, 'dkms')
        write(os.path.join(root, 'usr/src/nvidia-' + version, 'dkms.conf'), nv.DKMS_CONF.format(version=version))
        write(os.path.join(root, 'DEBIAN/control'), control(
            'nvidia-kernel-open-dkms', debver, ['dkms'], 'NVIDIA open kernel module DKMS source'))
        write(os.path.join(root, 'DEBIAN/postinst'), (
            '#!/bin/sh\nset -e\n'
            'if [ "$1" = configure ] && ! dkms status -m nvidia -v {v} | grep -q .; then\n'
            '  dkms add -m nvidia -v {v}\nfi\n').format(v=version), 0o755)
        write(os.path.join(root, 'DEBIAN/prerm'), (
            '#!/bin/sh\nset -e\n'
            'if dkms status -m nvidia -v {v} | grep -q .; then\n'
            '  dkms remove -m nvidia -v {v} --all\nfi\n').format(v=version), 0o755)
        build_deb(root, pool, 'nvidia-kernel-open-dkms', debver)

        # nvidia-persistenced, nvidia-modprobe
        for tool in ('nvidia-persistenced', 'nvidia-modprobe'):
            root = os.path.join(work, tool)
            write(os.path.join(root, 'usr/bin', tool), nv.RECORDER.format(tool=tool, version=version), 0o755)
            write(os.path.join(root, 'DEBIAN/control'), control(tool, debver, [], 'NVIDIA ' + tool))
            build_deb(root, pool, tool, debver)

        # nvidia-driver-cuda: the userspace the container's installer also puts in place
        root = os.path.join(work, 'userspace')
        lib = os.path.join(root, nv.LIBDIR.lstrip('/'))
        write(os.path.join(lib, 'libnvidia-ml.so.' + version), 'lab stand-in for NVIDIA NVML {0} (no code)\n'.format(
            version))
        os.symlink('libnvidia-ml.so.' + version, os.path.join(lib, 'libnvidia-ml.so.1'))
        share = os.path.join(root, nv.SHARE.lstrip('/'))
        shutil.copytree(payload, share)
        os.chmod(os.path.join(share, 'nvidia-smi'), 0o755)
        write(os.path.join(share, 'version'), version + '\n')
        os.makedirs(os.path.join(root, 'usr/bin'))
        os.symlink(os.path.join(nv.SHARE, 'nvidia-smi'), os.path.join(root, 'usr/bin/nvidia-smi'))
        write(os.path.join(root, 'DEBIAN/control'), control(
            'nvidia-driver-cuda', debver,
            ['nvidia-kernel-open-dkms {0}'.format(exact), 'nvidia-persistenced ' + exact, 'nvidia-modprobe ' + exact],
            'NVIDIA driver CUDA integration components'))
        build_deb(root, pool, 'nvidia-driver-cuda', debver)


def ensure_key(gnupg):
    os.makedirs(gnupg, mode=0o700, exist_ok=True)
    gpg = ['gpg', '--homedir', gnupg, '--batch', '--quiet']
    if not run(gpg + ['--list-secret-keys', '--with-colons']).strip():
        run(gpg + ['--pinentry-mode', 'loopback', '--passphrase', '', '--quick-gen-key', KEY_NAME,
                   'ed25519', 'sign', 'never'])
    return gpg


def index(repo, gpg, force):
    """Packages(.gz), Release, InRelease and Release.gpg for the flat repository; rewritten when Packages or the
    key changes."""
    listing = run(['dpkg-scanpackages', '--multiversion', 'pool', '/dev/null'], cwd=repo)
    path = os.path.join(repo, 'Packages')
    if (not force and os.path.exists(path) and open(path).read() == listing
            and os.path.exists(os.path.join(repo, 'InRelease'))):
        return False
    # the whole index written beside the old one (NAME.new), signed, then put in place: a signing that fails leaves
    # the repository as it was, signed
    new = '{0}.new'.format
    for name in ('Packages', 'Packages.gz', 'Release', 'InRelease', 'Release.gpg'):
        if os.path.lexists(os.path.join(repo, new(name))):
            os.unlink(os.path.join(repo, new(name)))
    write(os.path.join(repo, new('Packages')), listing)
    with gzip.GzipFile(os.path.join(repo, new('Packages.gz')), 'wb', mtime=0) as dst:
        dst.write(listing.encode())
    release = ['Origin: glm5-lab', 'Label: NVIDIA CUDA repository (lab stand-in)', 'Architectures: amd64',
               'Date: ' + datetime.datetime.now(datetime.UTC).strftime('%a, %d %b %Y %H:%M:%S UTC')]
    for field, algo in (('MD5Sum', 'md5'), ('SHA256', 'sha256')):
        release.append(field + ':')
        for name in ('Packages', 'Packages.gz'):
            data = open(os.path.join(repo, new(name)), 'rb').read()
            release.append(' {0} {1} {2}'.format(hashlib.new(algo, data).hexdigest(), len(data), name))
    write(os.path.join(repo, new('Release')), '\n'.join(release) + '\n')
    run(gpg + ['--clearsign', '-o', new('InRelease'), new('Release')], cwd=repo)
    run(gpg + ['--armor', '--detach-sign', '-o', new('Release.gpg'), new('Release')], cwd=repo)
    for name in ('Packages', 'Packages.gz', 'Release', 'Release.gpg', 'InRelease'):
        os.replace(os.path.join(repo, new(name)), os.path.join(repo, name))
    return True


def main(argv):
    if len(argv) != 4:
        raise SystemExit(__doc__.strip().splitlines()[2].strip())
    repo, gnupg, version, payload = (os.path.abspath(a) if i in (0, 1, 3) else a for i, a in enumerate(argv))
    for name, path in (('REPO_DIR', repo), ('GNUPG_HOME', gnupg)):
        if os.path.exists(path) and not os.path.isdir(path):
            raise SystemExit('nvidia-apt-repo: {0} {1} is not a folder'.format(name, path))
    if not re.fullmatch(r'\d+\.\d+(\.\d+)?', version):
        raise SystemExit('nvidia-apt-repo: not a driver version: {0!r}'.format(version))
    if not os.path.isfile(os.path.join(payload, 'nvidia-smi')):
        raise SystemExit('nvidia-apt-repo: {0} has no nvidia-smi stand-in'.format(payload))
    pool = os.path.join(repo, 'pool')
    os.makedirs(pool, exist_ok=True)
    # one run at a time on a repository (two at once each made a signing key, and one could fail)
    lock = open(os.path.join(repo, '.lock'), 'w')
    fcntl.flock(lock, fcntl.LOCK_EX)
    added = not os.path.exists(os.path.join(pool, 'nvidia-driver-cuda_{0}-1_amd64.deb'.format(version)))
    if added:
        packages(version, payload, pool, installer())
    gpg = ensure_key(gnupg)
    public = run(gpg + ['--armor', '--export', KEY_NAME])
    key_path = os.path.join(repo, PUBLIC_KEY)
    key_changed = not os.path.exists(key_path) or open(key_path).read() != public
    if key_changed:
        write(key_path, public)
    indexed = index(repo, gpg, key_changed)
    print('added ' + version if added else ('re-signed' if indexed or key_changed else 'unchanged'))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
