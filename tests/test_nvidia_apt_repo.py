"""The lab's stand-in NVIDIA apt repository (scripts/lab/nvidia_apt_repo.py): a relative GNUPG_HOME signs with the key
it names, and a signing that fails leaves the repository as it was, signed - it deleted InRelease and Release.gpg
first, so a repository apt had accepted was left unsigned, and said gpg's five lines (found by a review). Needs
dpkg-dev and gnupg, which make lab-up installs: the lab lane."""
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.lab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, 'scripts', 'lab', 'nvidia_apt_repo.py')


def make(tmp_path, version, cwd, gnupg, env=None):
    return subprocess.run([sys.executable, SCRIPT, str(tmp_path / 'repo'), gnupg, version, str(tmp_path / 'payload')],
                          cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


def test_a_relative_key_folder_signs_and_a_failed_signing_leaves_the_repository_signed(tmp_path):
    (tmp_path / 'payload').mkdir()
    shutil.copy(os.path.join(ROOT, 'scripts', 'lab', 'nvidia_smi.py'), tmp_path / 'payload' / 'nvidia-smi')
    first = make(tmp_path, '580.95.05', str(tmp_path), 'gnupg')        # GNUPG_HOME relative to where it runs
    assert first.returncode == 0 and first.stdout.strip() == 'added 580.95.05', first.stderr
    repo = tmp_path / 'repo'
    before = {n: (repo / n).read_bytes() for n in ('Packages', 'Packages.gz', 'Release', 'InRelease', 'Release.gpg')}
    # gpg verifies the signature with the key the repository publishes
    keyring = tmp_path / 'keyring.gpg'
    subprocess.run(['gpg', '--batch', '--quiet', '--dearmor', '-o', str(keyring), str(repo / 'lab-nvidia-repo.pub')],
                   check=True)
    verify = subprocess.run(['gpgv', '--keyring', str(keyring), str(repo / 'InRelease')], capture_output=True)
    assert verify.returncode == 0, verify.stderr
    # another version, its signing failing (a gpg that refuses to sign)
    fake = tmp_path / 'bin'
    fake.mkdir()
    (fake / 'gpg').write_text('#!/bin/sh\ncase " $* " in *" --clearsign "*) echo "gpg: one" >&2; '
                              'echo "gpg: signing failed: No secret key" >&2; exit 2;; esac\nexec {0} "$@"\n'.format(
                                  shutil.which('gpg')))
    (fake / 'gpg').chmod(0o755)
    failed = make(tmp_path, '580.105.08', str(tmp_path), 'gnupg',
                  env=dict(os.environ, PATH='{0}:{1}'.format(fake, os.environ['PATH'])))
    assert failed.returncode == 1, failed
    assert failed.stderr.strip() == 'nvidia-apt-repo: gpg failed: gpg: signing failed: No secret key', failed.stderr
    assert {n: (repo / n).read_bytes() for n in before} == before      # the index as it was, still signed
    verify = subprocess.run(['gpgv', '--keyring', str(keyring), str(repo / 'InRelease')], capture_output=True)
    assert verify.returncode == 0, verify.stderr
