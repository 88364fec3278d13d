"""The smoke test against a bench history it cannot write (read-only, full: here the index made immutable on the lab
host, as a read-only remount would make it) on make test's full-stack node: the run still ends with its table and
verdict, then fails saying that the report is not in the history, where, and what to do (it ended on a file
module's line naming a container path, no verdict, and the run was missing from the index). Puts the history back
and proves the next runs are recorded: two at once, after a deploy killed while it held the engine's lock.

Two runs at once (two operators; glm5 bench beside a deploy) shared the engine, failed each other's gates, lost a
run from the index (its read-modify-write) and, started in one second, shared a run folder; a killed deploy's lock
(its `always` never ran) would hold up every later run. Now the first takes the gone run's lock over at once, the
second (glm5 bench) waits for it and follows its own run, both pass and both are in the index under their own ids."""
import concurrent.futures
import os
import socket
import subprocess
import time

import pytest
from siterun import site
from test_glm5_ops import HISTORY, LOCK, NAME, glm5, hold_lock, ssh
from test_glm5_ops import history_runs as runs


@pytest.mark.stack2
def test_a_history_that_cannot_be_written_still_tells_the_verdict_and_what_is_lost(stack_node2):
    inventory, before = stack_node2[0], runs()
    index = os.path.join(HISTORY, 'index.jsonl')
    subprocess.run(['chattr', '+i', index], check=True)
    try:
        run = site({'sglang_smoke_levels': [1]}, '--tags', 'smoke', inventory=inventory, sglang=True)
    finally:
        subprocess.run(['chattr', '-i', index], check=True)
    assert run.rc != 0, run
    assert '# Smoke test ' in run.out and ': PASSED' in run.out, run                  # the table, with its verdict
    assert 'The smoke test of {0} passed ('.format(NAME) in run.out, run
    assert 'but its report could not be written into the bench history pve-lab:{0}: '.format(HISTORY) in run.out, run
    assert 'is missing from its index, so glm5 history and glm5 status do not see it: make pve-lab:{0} writable, ' \
           'then run --tags smoke again'.format(HISTORY) in run.out, run
    assert runs() == before

    # the next runs: a deploy killed while it held the engine's lock, then two runs at once
    gone = subprocess.Popen(['true'])
    gone.wait()
    desc = 'smoke test 1 from root@{0} pid {1} since 2026-01-01T00:00:00Z'.format(socket.gethostname(), gone.pid)
    hold_lock(desc)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            smoke = pool.submit(site, {'sglang_smoke_levels': [1], 'sglang_service_lock_wait': 120}, '--tags', 'smoke',
                                inventory=inventory, sglang=True)
            t0 = time.monotonic()       # the smoke run takes the gone run's lock over, then glm5 bench comes
            while desc in ssh('systemctl', 'show', '-p', 'Description', '--value', LOCK).stdout and not smoke.done():
                assert time.monotonic() - t0 < 120, 'the gone run\'s lock was not taken over'
                time.sleep(0.5)
            bench = glm5('bench', '--levels', '1', inventory=inventory)
            run = smoke.result()
    finally:
        ssh('systemctl', 'stop', LOCK)
    assert run.rc == 0, run
    assert 'took over {0}, left by "{1}": that process is gone from this controller'.format(LOCK, desc) in run.out, run
    assert bench.returncode == 0, (bench.stdout, bench.stderr)
    new = runs()[len(before):]
    assert len(new) == 2 and len(set(new)) == 2, new
    # glm5 bench followed its own run, not the other one beside it
    (mine,) = [r for r in new if 'Report: pve-lab:{0}/{1}/report.md'.format(HISTORY, r) in bench.stdout]
    assert 'concurrency     1 [' + '#' * 30 + ']' in bench.stdout, bench.stdout
    assert all(os.path.isfile(os.path.join(HISTORY, r, 'summary.json')) for r in new), new
