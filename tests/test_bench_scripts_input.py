"""The benchmark scripts refuse bad input in one line before they touch the lab (they restart nodes and purge it):
scripts/bench_fleet.py's stage names and numbers, scripts/bench_harness.py's numbers."""
import os
import subprocess
import sys

import pytest

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'scripts')


def refused(script, *args):
    p = subprocess.run([sys.executable, os.path.join(SCRIPTS, script), *args], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, GLM5_LAB_STATE='/nonexistent/glm5-lab-state'))
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert p.stdout == ''                   # nothing ran: no table header, no stage
    return p.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize('skip', ['failling', 'all', 'throughput,kil'])
def test_bench_fleet_refuses_a_stage_it_does_not_know(skip):
    """A typo in --skip ran the very stage it meant to skip (failing: a NaN fault rolled out), and --skip all none."""
    line = refused('bench_fleet.py', '--skip', skip)
    assert '--skip: unknown stage(s)' in line and 'the stages are throughput, overhead, rolling, failing, kill' in line


@pytest.mark.parametrize('option, value', [('--concurrency', '0'), ('--concurrency', '-8'), ('--load', '0'),
                                           ('--down', '-5'), ('--prompts-per-concurrency', '0'), ('--load', 'x')])
def test_bench_fleet_refuses_numbers_below_one(option, value):
    """--load 0 reported a rolling deploy 'under load' with no load; --concurrency 0 and -8 went on as rows."""
    line = refused('bench_fleet.py', option, value)
    assert option + ': a whole number >= 1' in line


@pytest.mark.parametrize('script, option, value', [
    ('bench_harness.py', '--concurrency', '0'), ('bench_harness.py', '--concurrency', '-5'),
    ('bench_harness.py', '--prompts', '0'), ('bench_gateway.py', '--prompts-per-concurrency', '0'),
    ('bench_gateway.py', '--max-running-requests', '-1')])
def test_the_other_benchmarks_refuse_numbers_below_one(script, option, value):
    """bench_harness --concurrency 0 (unbounded to bench_serving) printed a row and the goal met from 8 requests;
    --prompts 0 and bench_gateway --prompts-per-concurrency 0 were bench_serving tracebacks after the engines started."""
    line = refused(script, option, value)
    assert option + ': a whole number >= 1' in line


def test_bench_deploy_says_it_purges_and_keeps_a_wheel_cache_a_failed_run_set_aside(monkeypatch, tmp_path, capsys):
    """bench_deploy.py purges the lab at once: its --help said nothing of it. With --cold-wheels, a run that failed
    left the wheel cache set aside; the next one purged the lab, then crashed renaming onto it (found by a review).
    Now that is refused before anything is destroyed."""
    help_text = subprocess.run([sys.executable, os.path.join(SCRIPTS, 'bench_deploy.py'), '--help'],
                               capture_output=True, text=True, timeout=60).stdout
    assert 'It purges the lab first' in ' '.join(help_text.split())
    sys.path.insert(0, SCRIPTS)
    import bench_deploy
    cache = tmp_path / 'uv'
    (tmp_path / 'uv.set-aside-by-bench').mkdir()
    monkeypatch.setattr(bench_deploy, 'wheel_cache', lambda: str(cache))

    class NoLab:
        def __init__(self):
            raise AssertionError('the lab was touched')
    monkeypatch.setattr(bench_deploy, 'Context', NoLab)
    monkeypatch.setattr(sys, 'argv', ['bench_deploy.py', '--cold-wheels'])
    with pytest.raises(SystemExit) as e:
        bench_deploy.main()
    assert 'is left from an earlier --cold-wheels run' in str(e.value) and 'nothing was changed' in str(e.value)


@pytest.mark.parametrize('script, args, words', [
    ('lab/hf_hub.py', ['/nonexistent/hub'], 'root: /nonexistent/hub is not a folder'),
    ('lab/hf_hub.py', ['/etc/hostname'], 'root: /etc/hostname is not a folder'),
    ('lab/hf_hub.py', ['/tmp', '--port', '70000'], '--port: 0 to 65535, got 70000'),
    ('lab/nvidia_installer.py', [], 'usage: nvidia_installer.py RUN_FILE_NAME PAYLOAD_DIR')])
def test_the_lab_stand_ins_refuse_what_they_cannot_serve(script, args, words):
    """The stand-in hub served a ROOT that does not exist (every repository then 404) or a port past 65535 (an
    OverflowError); the stand-in installer run without its arguments was an IndexError (found by a review)."""
    p = subprocess.run([sys.executable, os.path.join(SCRIPTS, script), *args], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode in (1, 2) and p.stdout == '' and words in p.stderr.strip().splitlines()[-1], p.stderr
