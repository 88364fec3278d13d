"""SGLang profiles against the real pinned sglang: each profile's lock installed (uv, --require-hashes) into a
throwaway venv on this machine, its flags parsed by that sglang's own parser, its patches applied to that
version's real files. The venvs are hard-linked from the lab's wheel cache (the host side of the containers'
SGLang cache mount), so a second environment costs little disk and no download.

Needs PyPI (or the warm cache) and ~1 min per profile the first time: `make test` runs it (marker `sglang`).
"""
import json
import os
import re
import shutil
import subprocess
import sys

import lock_profiles
import pytest
import sglang_profiles as sglang_filters
from sglang_envs import NAMES, PROFILES, ROOT, environment, lab_wheel_cache, load, sha256, site_packages
from sglang_server_args import check

MODEL = ['--model-path', '/models/glm-5']


# ---------------------------------------------------------------- the profiles as data (no sglang needed)

@pytest.mark.parametrize('name', NAMES)
def test_profile_is_usable(name):
    profile = load(name)
    assert sglang_filters.sglang_profile_problems(profile, name, os.path.join(PROFILES, name)) == []


@pytest.mark.parametrize('name', NAMES)
def test_lock_pins_the_whole_environment_with_hashes(name):
    profile = load(name)
    with open(os.path.join(PROFILES, name, profile['lock'])) as fh:
        text = fh.read()
    entries = re.findall(r'^([A-Za-z0-9_.-]+)==(\S+) \\\n((?:    --hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)', text, re.M)
    requirement_lines = [ln for ln in text.splitlines() if ln and not ln.startswith((' ', '#'))]
    assert len(entries) == len(requirement_lines) > 100, 'every requirement pinned with == and hashed'
    pins = dict((n.lower(), v) for n, v, _ in entries)
    assert pins['sglang'] == profile['sglang']
    cuda = [r for r in profile['requirements'] if r.startswith('cuda-toolkit[')]
    assert cuda and pins['cuda-toolkit'] == cuda[0].split('==')[1], "nvcc at exactly torch's CUDA build"
    assert 'nvidia-cuda-nvcc' in pins
    assert '--exclude-newer {0}'.format(profile['resolved_as_of']) in text.splitlines()[1]


def test_seed_validated_lock_has_the_kernels_that_imports():
    """Resolved as of the release: kernels 0.14.1 (0.15.1, resolved later, breaks `import sglang`)."""
    profile = load('seed-validated')
    with open(os.path.join(PROFILES, 'seed-validated', profile['lock'])) as fh:
        assert re.search(r'^kernels==0\.14\.1 ', fh.read(), re.M)


def test_locks_resolve_the_same_again():
    """A lock resolved as of a fixed date comes out byte for byte the same: nothing drifted (needs PyPI)."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, 'scripts', 'lock_profiles.py'), '--check'],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_lock_is_written_for_none_while_any_name_is_wrong():
    """`lock_profiles.py current nosuch` rewrote current's lock before it refused nosuch (found by a review): every
    name is read first, nothing is written while one is wrong."""
    lock = os.path.join(PROFILES, 'current', load('current')['lock'])
    before = (os.stat(lock).st_mtime_ns, open(lock).read())
    r = subprocess.run([sys.executable, os.path.join(ROOT, 'scripts', 'lock_profiles.py'), 'current', 'nosuch'],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.strip() == "lock_profiles: no profile 'nosuch' ({0})".format(
        os.path.join(PROFILES, 'nosuch', 'profile.yml')), r.stderr
    assert r.stdout == '' and (os.stat(lock).st_mtime_ns, open(lock).read()) == before


def test_profile_problems_name_what_is_wrong(tmp_path):
    good = load('seed-validated')
    bad = dict(good, name='other', python='3', flags={'Bad_Flag': 1, 'tp': {'x': 1}}, env={'A': 1},
               patches=[dict(good['patches'][0], sha256='abc', file='patches/none.diff')])
    problems = sglang_filters.sglang_profile_problems(bad, 'seed-validated', str(tmp_path), {'nope': True})
    text = '\n'.join(problems)
    for words in ("its name is 'other'", 'python must be major.minor', 'lock requirements.lock not found',
                  'sha256 is not a sha256', 'patches/none.diff not found', 'sglang_env_patches names nope',
                  "'Bad_Flag' is not a flag name", 'tp: a flag value is', 'env: A must be a string'):
        assert words in text, (words, problems)
    assert sglang_filters.sglang_profile_problems({'name': 'x'}, 'x', str(tmp_path))[0].endswith('description is missing')


def test_wheel_sizes_must_cover_the_lock(tmp_path):
    """sglang_env's wheel-cache room check sums wheel-sizes.json: a profile whose lock changed since its sizes were
    measured (a pin without a size), or without the file, or with a size that is not bytes, is refused by name."""
    shutil.copytree(os.path.join(PROFILES, 'current'), str(tmp_path / 'current'))
    where = str(tmp_path / 'current')
    profile = load('current')
    assert sglang_filters.sglang_profile_problems(profile, 'current', where) == []
    path = os.path.join(where, 'wheel-sizes.json')
    with open(path) as fh:
        doc = json.load(fh)
    del doc['sizes']['torch==2.14.1']
    doc['sizes']['extra==1'] = -5
    with open(path, 'w') as fh:
        json.dump(doc, fh)
    text = '\n'.join(sglang_filters.sglang_profile_problems(profile, 'current', where))
    assert 'wheel-sizes.json has no size for 1 of its lock (torch==2.14.1): the lock changed since it was measured; ' \
        'scripts/lock_profiles.py --sizes-from <uv cache> current measures them again' in text, text
    assert 'sizes are bytes, integers above 0; not extra==1' in text, text
    os.remove(path)
    text = '\n'.join(sglang_filters.sglang_profile_problems(profile, 'current', where))
    assert "SGLang profile 'current': wheel-sizes.json cannot be read" in text, text


def test_sizes_are_measured_only_from_a_cache_that_holds_the_whole_lock(tmp_path):
    """lock_profiles.py --sizes-from writes nothing from a folder that is not a uv cache, or from a cache that lacks
    pins of the lock (a size left out would make the room check ask too little)."""
    before = open(os.path.join(PROFILES, 'current', 'wheel-sizes.json')).read()
    script = [sys.executable, os.path.join(ROOT, 'scripts', 'lock_profiles.py'), '--sizes-from']
    r = subprocess.run(script + [str(tmp_path), 'current'], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and 'is not a uv cache (no archive-v0 in it)' in r.stderr, r.stderr
    (tmp_path / 'archive-v0' / 'x1' / 'torch-2.14.1.dist-info').mkdir(parents=True)
    r = subprocess.run(script + [str(tmp_path), 'current'], capture_output=True, text=True, timeout=60)
    pins = len(sglang_filters.lock_pins(open(os.path.join(PROFILES, 'current', 'requirements.lock')).read()))
    assert r.returncode == 1 and 'current: {0} of its {1} pins are not in the cache'.format(pins - 1, pins) \
        in r.stderr, r.stderr
    assert open(os.path.join(PROFILES, 'current', 'wheel-sizes.json')).read() == before



def test_sizes_of_several_profiles_are_all_measured_before_any_is_written(tmp_path):
    """A cache that holds one profile's whole lock but not the next one's changes neither file: the first profile is
    not written with the sizes of a cache that cannot measure the second (every profile measured, then written)."""
    files = {name: os.path.join(PROFILES, name, 'wheel-sizes.json') for name in NAMES}
    before = {name: open(path).read() for name, path in files.items()}
    pins = {name: sglang_filters.lock_pins(open(os.path.join(PROFILES, name, 'requirements.lock')).read())
            for name in NAMES}
    first, second = NAMES
    lacking = [pin for pin in pins[second] if pin not in pins[first]]
    assert lacking, 'the two profiles lock the same pins: this test needs a pin the second alone has'
    for i, pin in enumerate(pins[first]):
        info = tmp_path / 'archive-v0' / 'w{0}'.format(i) / '{0}.dist-info'.format(pin.replace('==', '-'))
        info.mkdir(parents=True)
        (info / 'RECORD').write_text('x' * 100)
    r = subprocess.run([sys.executable, os.path.join(ROOT, 'scripts', 'lock_profiles.py'), '--sizes-from',
                        str(tmp_path), first, second], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and '{0}: {1} of its {2} pins are not in the cache ({3}'.format(
        second, len(lacking), len(pins[second]), lacking[0]) in r.stderr, r.stderr
    assert 'no sizes written' in r.stderr and 'wrote' not in r.stdout, (r.stdout, r.stderr)
    assert {name: open(path).read() for name, path in files.items()} == before


def test_first_few_names_three_and_says_there_are_more():
    assert sglang_filters.first_few(['a', 'b', 'c']) == 'a, b, c'
    assert sglang_filters.first_few(['a', 'b', 'c', 'd']) == 'a, b, c, ...'
    assert sglang_filters.first_few([]) == ''


def test_flags_overrides_and_argv():
    flags = sglang_filters.sglang_flags({'tp': 8, 'disable-radix-cache': True, 'x': 1},
                                        {'x': None, 'tp': 4, 'enable-metrics': True, 'disable-radix-cache': False})
    assert list(flags) == ['tp', 'disable-radix-cache', 'enable-metrics']
    assert sglang_filters.sglang_argv(flags) == ['--tp', '4', '--enable-metrics']
    assert sglang_filters.sglang_argv({'cuda-graph-bs': [1, 2, 4]}) == ['--cuda-graph-bs', '1', '2', '4']


def test_patch_overrides():
    patches = sglang_filters.sglang_profile_patches(load('seed-validated'), {'nsa-page-table-fallback': True})
    assert [(p['name'], p['enabled']) for p in patches] == [('flashinfer-autotune-cutlass', True),
                                                          ('nsa-page-table-fallback', True)]


# ---------------------------------------------------------------- the real sglang of each profile

@pytest.mark.sglang
@pytest.mark.parametrize('name', NAMES)
def test_profile_flags_parse_with_its_sglang(name):
    profile, venv = environment(name)
    ok, result = check(os.path.join(venv, 'bin', 'python'), MODEL + sglang_filters.sglang_argv(profile['flags']))
    assert ok, result['parser_message']
    assert result['sglang_version'] == profile['sglang']
    nd = result['non_default']
    assert nd.get('tp_size', nd.get('tensor_parallel_size')) == 8   # the dest was renamed between versions
    assert result['non_default']['moe_runner_backend'] == 'flashinfer_cutlass'


@pytest.mark.sglang
@pytest.mark.parametrize('name', NAMES)
def test_wheel_sizes_are_what_the_real_cache_holds(name):
    """What the room check sums is real: each pin's size in wheel-sizes.json is the disk its wheel takes unpacked in
    the lab's uv cache, which this profile's environment was installed from (the same uv as the role's)."""
    environment(name)
    measured = lock_profiles.cache_sizes(lab_wheel_cache())
    with open(os.path.join(PROFILES, name, 'wheel-sizes.json')) as fh:
        committed = json.load(fh)['sizes']
    off = {}
    for pin, size in committed.items():
        got = measured.get(lock_profiles._key(*pin.split('==', 1)))
        if got is None or abs(got - size) > max(size // 100, 65536):
            off[pin] = (size, got)
    assert not off, off
    assert sum(committed.values()) > 8 * 2 ** 30


@pytest.mark.sglang
def test_seeds_line_is_rejected_by_today_sglang_with_its_own_message():
    seeds = load('seed-validated')
    _, venv = environment('current')
    ok, result = check(os.path.join(venv, 'bin', 'python'), MODEL + sglang_filters.sglang_argv(seeds['flags']))
    assert not ok
    assert result['parser_message'].startswith('sglang.launch_server: error: unrecognized arguments:')
    assert '--nsa-decode-backend' in result['parser_message']


@pytest.mark.sglang
@pytest.mark.parametrize('argv, words', [
    (['--moe-runner-backend', 'flashinfer_cutlas'], "argument --moe-runner-backend: invalid choice: 'flashinfer_cutlas'"),
    (['--max-runing-requests', '1024'], 'unrecognized arguments: --max-runing-requests 1024'),
    (['--tp', 'eight'], "--tp-size: invalid int value: 'eight'"),
])
def test_typos_are_rejected(argv, words):
    _, venv = environment('seed-validated')
    ok, result = check(os.path.join(venv, 'bin', 'python'), MODEL + argv)
    assert not ok
    assert words in result['parser_message'], result['parser_message']
    assert result['stderr'] == result['parser_message']          # argparse's line, not its 60 lines of usage


@pytest.mark.sglang
@pytest.mark.parametrize('name', NAMES)
def test_patches_apply_to_the_real_files_and_compile(name, tmp_path):
    profile, venv = environment(name)
    site = site_packages(venv, profile)
    for patch in profile['patches']:
        upstream = os.path.join(site, patch['target'])
        assert sha256(upstream) == patch['sha256'], '{0}: the installed file is not the one the patch names'.format(
            patch['name'])
        work = tmp_path / patch['name']
        os.makedirs(os.path.dirname(str(work / patch['target'])))
        shutil.copy(upstream, str(work / patch['target']))
        r = subprocess.run(['patch', '-p1', '--forward', '-i', os.path.join(PROFILES, name, patch['file'])],
                           cwd=str(work), capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        assert sha256(str(work / patch['target'])) == patch['sha256_patched']
        r = subprocess.run([os.path.join(venv, 'bin', 'python'), '-c',
                            'import sys; compile(open(sys.argv[1]).read(), sys.argv[1], "exec")',
                            str(work / patch['target'])], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
