"""model_weights with source=hub: the real huggingface_hub (the version the seed-validated lock pins) downloading
from the lab's stand-in hub (scripts/lab/hf_hub.py) on 127.0.0.1: pinned revision, allow_patterns, the hub's sha256
checked, the completeness marker written last; a dropped connection resumed with Range, never marked complete
half-way; a wrong revision, a missing token and a hub that serves other bytes are refused with one line."""
import json
import os
import shutil
import subprocess
import sys

import model_weights
import modrun
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HUB = os.path.join(ROOT, 'scripts', 'lab', 'hf_hub.py')
REPO = 'glm5-lab/GLM-5-NVFP4-mini'
PATTERNS = ['*.json', '*.safetensors']


def run_module(capsys, check_mode=False, **args):
    return modrun.run_module(model_weights, capsys, check_mode, **args)


@pytest.fixture(scope='module')
def hub_root(tmp_path_factory):
    root = tmp_path_factory.mktemp('hub')
    repo = root / REPO
    subprocess.run([sys.executable, os.path.join(ROOT, 'scripts', 'lab', 'stand_in_model.py'), str(repo)], check=True,
                   capture_output=True)
    # larger than huggingface_hub's 10 MiB download chunk, so a cut after 12 MiB leaves a part on disk to resume from
    (repo / 'model-00001-of-00001.safetensors').write_bytes(os.urandom(24 * 1024 * 1024 + 17))
    (repo / 'README.md').write_text('not wanted by allow_patterns\n')
    return str(root)


class Hub(object):
    def __init__(self, root, *args):
        self.proc = subprocess.Popen([sys.executable, HUB, root] + list(args), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith('hf-hub listening on '), line + self.proc.stderr.read()
        self.url = line.split()[-1]

    def stop(self):
        if self.proc.returncode is None:
            self.proc.terminate()
            self.log, _ = self.proc.communicate(timeout=10)
        return self.log


def revision(hub):
    from huggingface_hub import HfApi
    return HfApi(endpoint=hub.url).model_info(REPO).sha


@pytest.fixture
def hub(hub_root, request):
    marker = request.node.get_closest_marker('hub_args')
    h = Hub(hub_root, *(marker.args if marker else ()))
    yield h
    h.stop()


def args(hub, dest, **extra):
    out = dict(source='hub', repo=REPO, allow_patterns=PATTERNS, dest=str(dest), endpoint=hub.url)
    out.update(extra)
    if 'revision' not in out:
        out['revision'] = revision(hub)
    return out


def test_download_verify_mark_then_nothing_to_do(capsys, hub, tmp_path):
    dest = tmp_path / 'models' / 'GLM-5-NVFP4'
    out = run_module(capsys, **args(hub, dest))
    assert out['changed'] and out['files'] == 7, out
    assert 'model-00001-of-00001.safetensors' in out['written'] and 'README.md' not in out['written']
    assert not (dest / 'README.md').exists()
    marker = json.loads((dest / '.glm5-complete').read_text())
    assert marker['source'] == 'hub:{0}@{1}'.format(REPO, revision(hub))
    again = run_module(capsys, **args(hub, dest))
    assert not again['changed'] and again['written'] == []


def test_check_mode_writes_nothing(capsys, hub, tmp_path):
    out = run_module(capsys, check_mode=True, **args(hub, tmp_path / 'm'))
    assert out['changed'] and len(out['written']) == 7
    assert not (tmp_path / 'm').exists()


@pytest.mark.hub_args('--cut-after', str(12 * 1024 * 1024))
def test_a_dropped_download_is_resumed_and_only_then_marked(capsys, hub, tmp_path):
    dest = tmp_path / 'm'
    first = run_module(capsys, **args(hub, dest))
    if first.get('failed'):                      # huggingface_hub gave up: nothing marked, a second run resumes
        assert 'not marked complete' in first['msg'] and not (dest / '.glm5-complete').exists()
        first = run_module(capsys, **args(hub, dest))
    assert first['changed'] and not first.get('failed'), first
    log = hub.stop()
    ranges = [line for line in log.splitlines() if 'safetensors' in line and 'model-0' in line]
    assert ranges[0].endswith('range=-') and any('range=bytes=' in r for r in ranges[1:]), log
    assert (dest / '.glm5-complete').exists()


def test_a_revision_the_hub_does_not_have(capsys, hub, tmp_path):
    out = run_module(capsys, **args(hub, tmp_path / 'm', revision='0' * 40))
    assert out['failed'] and out['msg'].startswith('revision {0} not found in {1}'.format('0' * 40, REPO))
    assert not (tmp_path / 'm').exists()


@pytest.mark.hub_args('--token', 'right')
def test_token_needed(capsys, hub, tmp_path):
    from huggingface_hub import HfApi
    rev = HfApi(endpoint=hub.url, token='right').model_info(REPO).sha
    out = run_module(capsys, **args(hub, tmp_path / 'm', revision=rev, token='wrong'))
    assert out['failed'] and 'no access with this token' in out['msg'] and 'wrong' not in out['msg']
    ok = run_module(capsys, **args(hub, tmp_path / 'm', revision=rev, token='right'))
    assert ok['changed'] and ok['files'] == 7


@pytest.mark.hub_args('--corrupt', 'model-00001-of-00001.safetensors')
def test_bytes_that_are_not_the_published_ones_are_refused_and_removed_so_a_rerun_heals(capsys, hub, hub_root, tmp_path):
    out = run_module(capsys, **args(hub, tmp_path / 'm'))
    assert out['failed'], out
    assert 'model-00001-of-00001.safetensors: sha256 ' in out['msg'] and 'not marked complete' in out['msg'], out
    assert 'removed (with its download record), not marked complete: the next run downloads it again' in out['msg']
    assert not (tmp_path / 'm' / '.glm5-complete').exists()
    assert not (tmp_path / 'm' / 'model-00001-of-00001.safetensors').exists()
    # it heals: the next run against a good hub fetches that file again (it used to fail the same way for ever,
    # huggingface_hub's record saying the bad file was there)
    good = Hub(hub_root)
    try:
        out = run_module(capsys, **args(good, tmp_path / 'm'))
    finally:
        log = good.stop()
    assert not out.get('failed') and out['changed'], out
    assert (tmp_path / 'm' / '.glm5-complete').exists()
    assert 'model-00001-of-00001.safetensors' in log, log


def test_weights_damaged_after_they_were_marked_are_downloaded_again(capsys, hub, tmp_path):
    """Same size, other bytes, in a complete-marked download (its mtime moves): the next run hashes that file, finds
    it is not the hub's, forgets huggingface_hub's record of it (which says it is there) and downloads it again."""
    dest = tmp_path / 'm'
    run_module(capsys, **args(hub, dest))
    path = dest / 'model-00001-of-00001.safetensors'
    good = path.read_bytes()
    path.write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))
    out = run_module(capsys, **args(hub, dest))
    assert out['changed'] and out['written'] == ['model-00001-of-00001.safetensors'], out
    assert out['damaged'] == ['model-00001-of-00001.safetensors'], out
    assert path.read_bytes() == good and (dest / '.glm5-complete').exists()


MIB, GIB = 1024 ** 2, 1024 ** 3


def used(fs):
    st = os.statvfs(fs.path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


@pytest.mark.hub_args('--cut-after', str(12 * 1024 * 1024))
def test_a_download_that_does_not_fit_is_refused_before_it_starts_and_a_resumed_part_counts(capsys, hub, tmp_path,
                                                                                            small_fs):
    """huggingface_hub only warns when the disk is short, then fills it. The files still to download must fit with
    reserve_gb (1 GiB) left, before anything is fetched; the part of a cut download it resumes is counted as there
    (a 400 GB download cut at 90% is not refused for the whole)."""
    small_fs.size(GIB + 8 * MIB)
    dest = os.path.join(small_fs.path, 'models', 'GLM-5-NVFP4')
    out = run_module(capsys, **args(hub, dest))
    assert out.get('failed') and '7 files to write need 24.' in out['msg'] and 'nothing was written' in out['msg'], out
    assert os.listdir(small_fs.path) == []
    # a download cut after 12 MiB elsewhere (huggingface_hub keeps a 10 MiB part), carried onto the small filesystem
    part = tmp_path / 'cut'
    assert run_module(capsys, **args(hub, part)).get('failed')
    parts = [f for f in (part / '.cache' / 'huggingface' / 'download').iterdir() if f.name.endswith('.incomplete')]
    assert [f.stat().st_size for f in parts] == [10 * MIB], parts
    shutil.copytree(str(part), dest, symlinks=True)
    small_fs.size(used(small_fs) + GIB + MIB)
    short = run_module(capsys, **args(hub, dest))
    assert short.get('failed') and 'nothing was written' in short['msg'], short
    assert short['need'] < 24 * MIB + 17 - 10 * MIB + 64 * 1024, short          # the part counted as there
    small_fs.size(used(small_fs) + GIB + short['need'] + 64 * 1024)
    done = run_module(capsys, **args(hub, dest))
    assert done['changed'] and not done.get('failed'), done
    assert any('range=bytes=' in line for line in hub.stop().splitlines()), 'not resumed from the part'
