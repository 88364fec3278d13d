"""The model_weights module run in-process on real files: a staged model into a cache directory, hard-linked or
copied, sha256-checked, the completeness marker written last; a re-run changes nothing; a cut or damaged copy is
completed again, never marked complete as it is; check mode writes nothing."""
import json
import os
import subprocess
import sys

import model_weights
import modrun
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAND_IN = os.path.join(ROOT, 'scripts', 'lab', 'stand_in_model.py')


def run_module(capsys, check_mode=False, **args):
    return modrun.run_module(model_weights, capsys, check_mode, **args)


@pytest.fixture(scope='module')
def staged(tmp_path_factory):
    """The lab's stand-in model, built by its real script, plus a nested file (like a snapshot's subfolders), and its
    SHA256SUMS made again by sha256sum itself, as a user makes it."""
    return make_staged(tmp_path_factory.mktemp('staged') / 'GLM-5-NVFP4')


def make_staged(path):
    subprocess.run([sys.executable, STAND_IN, str(path)], check=True, capture_output=True)
    (path / 'extra').mkdir()
    (path / 'extra' / 'notes.txt').write_text('nested\n')
    subprocess.run('find . -type f ! -name SHA256SUMS -print0 | sort -z | xargs -0 sha256sum > SHA256SUMS', shell=True,
                   cwd=str(path), check=True)
    return str(path)


def test_copy_verify_mark_then_nothing_to_do(capsys, staged, tmp_path):
    dest = str(tmp_path / 'cache' / 'GLM-5-NVFP4')
    first = run_module(capsys, src=staged, dest=dest, link=False)
    assert first['changed'] and first['files'] == 8
    assert 'model.safetensors' in first['written'] and 'extra/notes.txt' in first['written']
    marker = json.load(open(os.path.join(dest, '.glm5-complete')))
    assert marker['source'] == staged and set(marker['files']) == set(first['written'])
    assert os.stat(os.path.join(dest, 'config.json')).st_ino != os.stat(os.path.join(staged, 'config.json')).st_ino
    again = run_module(capsys, src=staged, dest=dest, link=False)
    assert not again['changed'] and again['written'] == []


def test_hard_links_on_the_same_filesystem(capsys, staged):
    dest = os.path.join(os.path.dirname(staged), 'cache', 'm')
    out = run_module(capsys, src=staged, dest=dest, link=True)
    assert out['changed']
    assert os.stat(os.path.join(dest, 'model.safetensors')).st_ino == os.stat(
        os.path.join(staged, 'model.safetensors')).st_ino


def test_a_cut_copy_is_completed_and_only_then_marked(capsys, staged, tmp_path):
    dest = str(tmp_path / 'm')
    run_module(capsys, src=staged, dest=dest, link=False)
    # a download/copy cut short: one file truncated, the marker gone with it
    with open(os.path.join(dest, 'tokenizer.json'), 'r+b') as fh:
        fh.truncate(100)
    os.unlink(os.path.join(dest, '.glm5-complete'))
    out = run_module(capsys, src=staged, dest=dest, link=False)
    assert out['changed'] and out['written'] == ['tokenizer.json']
    assert os.path.getsize(os.path.join(dest, 'tokenizer.json')) == os.path.getsize(os.path.join(staged, 'tokenizer.json'))
    assert os.path.exists(os.path.join(dest, '.glm5-complete'))


def test_same_size_different_bytes_is_replaced(capsys, staged, tmp_path):
    dest = str(tmp_path / 'm')
    run_module(capsys, src=staged, dest=dest, link=False)
    path = os.path.join(dest, 'model.safetensors')
    data = bytearray(open(path, 'rb').read())
    data[-1] ^= 0xFF
    open(path, 'wb').write(bytes(data))
    os.unlink(os.path.join(dest, '.glm5-complete'))
    out = run_module(capsys, src=staged, dest=dest, link=False)
    assert out['written'] == ['model.safetensors']
    assert open(path, 'rb').read() == open(os.path.join(staged, 'model.safetensors'), 'rb').read()


def test_check_mode_writes_nothing(capsys, staged, tmp_path):
    dest = str(tmp_path / 'm')
    out = run_module(capsys, check_mode=True, src=staged, dest=dest)
    assert out['changed'] and len(out['written']) == 8
    assert not os.path.exists(dest)


@pytest.mark.parametrize('make, words', [
    (lambda p: None, 'does not exist'),
    (lambda p: os.makedirs(p), 'has no config.json: not a model directory'),
])
def test_bad_source(capsys, tmp_path, make, words):
    src = str(tmp_path / 'staged')
    make(src)
    out = run_module(capsys, src=src, dest=str(tmp_path / 'm'))
    assert out['failed'] and words in out['msg']
    assert not os.path.exists(str(tmp_path / 'm'))


def test_copies_by_default_so_damage_to_the_cache_heals_from_the_staged_copy(capsys, staged, tmp_path):
    """Same size, other bytes, in the cache of a complete-marked model (its mtime moves): the next run notices
    without hashing the rest, says so, and places the staged file again."""
    dest = str(tmp_path / 'm')
    run_module(capsys, src=staged, dest=dest)
    path = os.path.join(dest, 'model.safetensors')
    assert os.stat(path).st_ino != os.stat(os.path.join(staged, 'model.safetensors')).st_ino
    data = bytearray(open(path, 'rb').read())
    data[-1] ^= 0xFF
    with open(path, 'r+b') as fh:
        fh.write(bytes(data))
    os.utime(path, (1, 1))
    out = run_module(capsys, src=staged, dest=dest)
    assert out['changed'] and out['written'] == ['model.safetensors'], out
    assert out['damaged'] == ['model.safetensors'], out            # and a warning naming it
    assert open(path, 'rb').read() == open(os.path.join(staged, 'model.safetensors'), 'rb').read()
    again = run_module(capsys, src=staged, dest=dest)
    assert not again['changed']


def test_a_damaged_staged_copy_is_caught_by_its_sums_not_blessed(capsys, tmp_path):
    """Hard-linked (asked for), a weights file truncated in the cache is truncated in the staged copy too: it was
    re-verified against itself and marked complete. Against SHA256SUMS it fails, naming the file, unmarked."""
    staged = make_staged(tmp_path / 'staged' / 'GLM-5-NVFP4')
    dest = str(tmp_path / 'staged' / 'cache')
    run_module(capsys, src=staged, dest=dest, link=True)
    with open(os.path.join(dest, 'model.safetensors'), 'r+b') as fh:
        fh.truncate(10)
    out = run_module(capsys, src=staged, dest=dest, link=True)
    assert out['failed'], out
    assert 'the staged file {0} is damaged: sha256 '.format(os.path.join(staged, 'model.safetensors')) in out['msg']
    assert 'SHA256SUMS says' in out['msg'] and 'nothing is marked complete' in out['msg']
    assert not os.path.exists(os.path.join(dest, '.glm5-complete'))


def test_a_staged_model_without_its_sums_is_refused_before_anything(capsys, tmp_path):
    staged = make_staged(tmp_path / 'staged')
    os.unlink(os.path.join(staged, 'SHA256SUMS'))
    out = run_module(capsys, src=staged, dest=str(tmp_path / 'm'))
    assert out['failed'] and 'has no list of sha256 sums to check it against' in out['msg'], out
    assert 'sha256sum > SHA256SUMS' in out['msg'] and not os.path.exists(str(tmp_path / 'm'))
    trusted = run_module(capsys, src=staged, dest=str(tmp_path / 'm'), checksums='')      # the user's choice
    assert trusted['changed'] and trusted['marker']['verified_against'].startswith('the staged files themselves')


def test_a_list_of_sums_kept_in_a_subfolder_is_not_a_file_it_lists(capsys, tmp_path):
    """checksums: meta/SHA256SUMS was refused as 'not in the list: meta/SHA256SUMS' (only a list at the top was left
    out of the files to copy)."""
    staged = make_staged(tmp_path / 'staged')
    os.mkdir(os.path.join(staged, 'meta'))
    os.rename(os.path.join(staged, 'SHA256SUMS'), os.path.join(staged, 'meta', 'SHA256SUMS'))
    out = run_module(capsys, src=staged, dest=str(tmp_path / 'm'), checksums='meta/SHA256SUMS', link=False)
    assert out['changed'] and out['files'] == 8 and 'meta/SHA256SUMS' not in out['written'], out
    assert out['marker']['verified_against'].endswith('meta/SHA256SUMS'), out['marker']


def test_a_staged_file_missing_from_its_sums_is_refused(capsys, tmp_path):
    staged = make_staged(tmp_path / 'staged')
    with open(os.path.join(staged, 'stray.bin'), 'w') as fh:
        fh.write('x')
    out = run_module(capsys, src=staged, dest=str(tmp_path / 'm'))
    assert out['failed'] and 'not in the list: stray.bin' in out['msg'] and 'nothing was changed' in out['msg'], out
    assert not os.path.exists(str(tmp_path / 'm'))


def test_a_file_touched_but_sound_is_hashed_once_and_recorded(capsys, staged, tmp_path):
    """A marker whose mtimes are not the files' (touched; or written by an older version, without mtimes): the files
    are hashed, found sound, and the marker records their mtimes, so the run after hashes nothing."""
    dest = str(tmp_path / 'm')
    run_module(capsys, src=staged, dest=dest)
    os.utime(os.path.join(dest, 'config.json'), (2, 2))
    out = run_module(capsys, src=staged, dest=dest)
    assert out['changed'] and out['written'] == [] and out['damaged'] == [], out
    assert out['marker']['files']['config.json']['mtime_ns'] == 2 * 10 ** 9
    assert not run_module(capsys, src=staged, dest=dest)['changed']


def test_the_stand_in_model_script_never_writes_over_a_folder_that_is_not_its_own(tmp_path):
    """scripts/lab/stand_in_model.py DIR replaced config.json, the tokenizer and model.safetensors of any folder without
    its marker - a real snapshot named by mistake - and `--help` built a model in ./--help."""
    real = tmp_path / 'real'
    real.mkdir()
    (real / 'config.json').write_text('{"architectures": ["RealThing"]}')
    p = subprocess.run([sys.executable, STAND_IN, str(real)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and 'holds files and is not a stand-in model' in p.stderr, p.stderr
    assert sorted(os.listdir(real)) == ['config.json'] and 'RealThing' in (real / 'config.json').read_text()
    assert not (tmp_path / 'real.partial').exists()
    # an empty folder is built into (renamed over from DIR.partial), and a second run leaves it as it is
    empty = tmp_path / 'empty'
    empty.mkdir()
    assert subprocess.run([sys.executable, STAND_IN, str(empty)], capture_output=True, text=True,
                          timeout=120).stdout.strip() == 'built'
    assert (empty / '.glm5-stand-in').exists() and not (tmp_path / 'empty.partial').exists()
    assert subprocess.run([sys.executable, STAND_IN, str(empty)], capture_output=True, text=True,
                          timeout=120).stdout.strip() == 'unchanged'
    # --help is help, in the folder it runs in
    h = subprocess.run([sys.executable, STAND_IN, '--help'], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert h.returncode == 0 and 'stand_in_model.py DIR' in h.stdout and not (tmp_path / '--help').exists()


MIB, GIB = 1024 ** 2, 1024 ** 3


def big_staged(path):
    """The stand-in model with an 8 MiB shard (with its sum), so that the room it needs shows on a small filesystem."""
    make_staged(path)
    (path / 'model-00002-of-00002.safetensors').write_bytes(os.urandom(8 * MIB))
    subprocess.run('find . -type f ! -name SHA256SUMS -print0 | sort -z | xargs -0 sha256sum > SHA256SUMS', shell=True,
                   cwd=str(path), check=True)
    return str(path)


def test_a_model_that_does_not_fit_is_refused_before_anything_is_written(capsys, tmp_path, small_fs):
    """Found when two fleets shared the lab's disk: a copy onto a filesystem without room stopped half-way with the
    disk full. Now the files to write, and reserve_gb (1 GiB) left free, are counted first: refused with what is
    needed and what is free, in check mode too, nothing made; with room the same run goes through."""
    staged = big_staged(tmp_path / 'staged' / 'GLM-5-NVFP4')
    small_fs.size(GIB + 4 * MIB)
    dest = os.path.join(small_fs.path, 'models', 'GLM-5-NVFP4')
    for check in (True, False):
        out = run_module(capsys, check_mode=check, src=staged, dest=dest)
        assert out.get('failed') and 'nothing was written' in out['msg'], out
        assert out['filesystem'] == small_fs.path and '9 files to write need 8.1 MiB' in out['msg'], out['msg']
        assert 8 * MIB < out['need'] < 9 * MIB and out['free'] == small_fs.free() < out['need'] + GIB
        assert os.listdir(small_fs.path) == []
    small_fs.size(GIB + 12 * MIB)
    out = run_module(capsys, src=staged, dest=dest)
    assert out['changed'] and not out.get('failed') and len(out['written']) == 9, out
    # a model there already needs nothing more, however full the disk is now
    small_fs.size(GIB + 9 * MIB)
    assert not run_module(capsys, src=staged, dest=dest)['changed']


def test_a_negative_reserve_is_refused(capsys, staged, tmp_path):
    out = run_module(capsys, src=staged, dest=str(tmp_path / 'm'), reserve_gb=-1)
    assert out.get('failed') and out['msg'] == 'reserve_gb must be 0 or more (GiB left free), got -1.0', out
    assert not (tmp_path / 'm').exists()


def test_hard_links_need_no_room_on_the_staged_copys_own_filesystem(capsys, small_fs):
    """link=true with the staged copy on the cache's filesystem writes no new bytes: not refused for the copy's size."""
    small_fs.size(GIB + 12 * MIB)
    import pathlib
    staged = big_staged(pathlib.Path(small_fs.path, 'staging', 'GLM-5-NVFP4'))
    assert small_fs.free() < GIB + 8 * MIB
    dest = os.path.join(small_fs.path, 'models', 'GLM-5-NVFP4')
    copied = run_module(capsys, src=staged, dest=dest, link=False)
    assert copied.get('failed') and 'need 8.1 MiB' in copied['msg'], copied
    linked = run_module(capsys, src=staged, dest=dest, link=True)
    assert linked['changed'] and not linked.get('failed'), linked
    assert os.stat(os.path.join(dest, 'model-00002-of-00002.safetensors')).st_nlink == 2
