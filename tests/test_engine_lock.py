"""One run at a time drives the engine (make test's full-stack node). Two `--tags smoke` runs at once (two operators;
glm5 bench beside a deploy) shared the engine, failed each other's gates, lost a run from the index (its
read-modify-write) and, started in one second, shared a run folder. Now the second waits for the first (the lock is
the transient unit glm5-sglang-lock in the container), both pass, both are in the index under their own ids; a lock
held too long fails a run naming its holder, before anything is done, and glm5 restart refuses it the same way."""
import concurrent.futures
import json
import os
import shlex
import socket
import subprocess

import pytest
from siterun import site
from test_glm5_ops import GLM5, HISTORY, NAME, glm5, one_line_error, ssh

LOCK = 'glm5-sglang-lock'


def runs():
    with open(os.path.join(HISTORY, 'index.jsonl')) as fh:
        return [json.loads(line)['run'] for line in fh if line.strip()]


@pytest.mark.stack
def test_two_smoke_runs_at_once_both_pass_and_both_are_in_the_index(stack_node):
    inventory, before = stack_node[0], runs()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        done = [pool.submit(site, {'sglang_smoke_levels': [1]}, '--tags', 'smoke', inventory=inventory, sglang=True)
                for _ in range(2)]
        first, second = [f.result() for f in done]
    assert first.rc == 0, first
    assert second.rc == 0, second
    new = runs()[len(before):]
    assert len(new) == 2 and len(set(new)) == 2 and runs()[:len(before)] == before, new
    assert all(os.path.isfile(os.path.join(HISTORY, run, 'summary.json')) for run in new), new
    assert ssh('systemctl', 'is-active', LOCK).stdout.strip() in ('inactive', 'unknown'), 'the lock was let go'


@pytest.mark.stack
def test_a_lock_held_too_long_fails_the_run_naming_its_holder_and_glm5_restart_refuses(stack_node):
    inventory, before = stack_node[0], runs()
    held = ssh('systemd-run', '--unit=' + LOCK, '--collect', shlex.quote('--description=a test holds the engine'),
               'sleep', '600')
    assert held.returncode == 0, held.stderr
    assert ssh('systemctl', 'is-active', LOCK).stdout.strip() == 'active'
    try:
        run = site({'sglang_smoke_levels': [1], 'sglang_service_lock_wait': 6}, '--tags', 'smoke',
                   inventory=inventory, sglang=True)
        assert os.access(GLM5, os.X_OK)
        restart = glm5('restart', inventory=inventory)
        state = ssh('systemctl', 'show', '-p', 'ActiveEnterTimestamp', '--value', 'glm5-sglang').stdout
    finally:
        ssh('systemctl', 'stop', LOCK)
    assert run.rc != 0, run
    assert '{0}: another run drives the engine: {1} is held by "a test holds the engine" and was not let go ' \
           'within 6 s (sglang_service_lock_wait). Nothing was changed. If that run is gone (killed), release the ' \
           'lock inside the container: systemctl stop {1}.'.format(NAME, LOCK) in run.out, run
    assert runs() == before
    one_line_error(restart, 1, 'another run drives the engine: {0} is held by "a test holds the engine"'.format(LOCK))
    assert ssh('systemctl', 'show', '-p', 'ActiveEnterTimestamp', '--value', 'glm5-sglang').stdout == state, \
        'glm5 restart did not restart the engine under the lock'


@pytest.mark.stack
def test_a_lock_left_by_a_run_that_is_gone_is_taken_over(stack_node):
    """A deploy killed or interrupted (Ctrl-C: its `always` does not run) leaves the lock held: the next run from this
    controller sees that the holder's process is gone and takes it over at once, instead of waiting and failing."""
    inventory, before = stack_node[0], runs()
    gone = subprocess.Popen(['true'])
    gone.wait()
    desc = 'smoke test 1 from root@{0} pid {1} since 2026-01-01T00:00:00Z'.format(socket.gethostname(), gone.pid)
    held = ssh('systemd-run', '--unit=' + LOCK, '--collect', shlex.quote('--description=' + desc), 'sleep', '600')
    assert held.returncode == 0, held.stderr
    try:
        run = site({'sglang_smoke_levels': [1], 'sglang_service_lock_wait': 6}, '--tags', 'smoke',
                   inventory=inventory, sglang=True)
    finally:
        ssh('systemctl', 'stop', LOCK)
    assert run.rc == 0, run
    assert 'took over {0}, left by "{1}": that process is gone from this controller'.format(LOCK, desc) in run.out, run
    assert len(runs()) == len(before) + 1
