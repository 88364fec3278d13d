"""One run at a time drives the engine (make test's full-stack node; the lock is the transient unit glm5-sglang-lock
in the container): a lock held too long fails a run naming its holder, before anything is done, and glm5 restart
refuses it the same way. Two runs at once, and a lock left by a run that is gone: tests/test_history_faults.py (its
recovery runs are those two)."""
import os

import pytest
from siterun import site
from test_glm5_ops import GLM5, LOCK, NAME, SERVICE, glm5, hold_lock, one_line_error, ssh
from test_glm5_ops import history_runs as runs


@pytest.mark.stack2
def test_a_lock_held_too_long_fails_the_run_naming_its_holder_and_glm5_restart_refuses(stack_node2):
    inventory, before = stack_node2[0], runs()
    hold_lock('a test holds the engine')
    try:
        run = site({'sglang_smoke_levels': [1], 'sglang_service_lock_wait': 6}, '--tags', 'smoke',
                   inventory=inventory, sglang=True)
        assert os.access(GLM5, os.X_OK)
        restart = glm5('restart', inventory=inventory)
        state = ssh('systemctl', 'show', '-p', 'ActiveEnterTimestamp', '--value', SERVICE).stdout
    finally:
        ssh('systemctl', 'stop', LOCK)
    assert run.rc != 0, run
    assert '{0}: another run drives the engine: {1} is held by "a test holds the engine" and was not let go ' \
           'within 6 s (sglang_service_lock_wait). Nothing was changed. If that run is gone (killed), release the ' \
           'lock inside the container: systemctl stop {1}.'.format(NAME, LOCK) in run.out, run
    assert runs() == before
    one_line_error(restart, 1, 'another run drives the engine: {0} is held by "a test holds the engine"'.format(LOCK))
    assert ssh('systemctl', 'show', '-p', 'ActiveEnterTimestamp', '--value', SERVICE).stdout == state, \
        'glm5 restart did not restart the engine under the lock'

