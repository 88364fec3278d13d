"""The smoke test against a bench history it cannot write (read-only, full: here the index made immutable on the lab
host, as a read-only remount would make it) on make test's full-stack node: the run still ends with its table and
verdict, then fails saying that the report is not in the history, where, and what to do (it ended on a file
module's line naming a container path, no verdict, and the run was missing from the index). Puts the history back
and proves the next run is recorded."""
import json
import os
import subprocess

import pytest
from siterun import site
from test_glm5_ops import HISTORY, NAME


def runs():
    with open(os.path.join(HISTORY, 'index.jsonl')) as fh:
        return [json.loads(line)['run'] for line in fh if line.strip()]


@pytest.mark.stack
def test_a_history_that_cannot_be_written_still_tells_the_verdict_and_what_is_lost(stack_node):
    inventory, before = stack_node[0], runs()
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
    run = site({'sglang_smoke_levels': [1]}, '--tags', 'smoke', inventory=inventory, sglang=True)
    assert run.rc == 0, run
    assert len(runs()) == len(before) + 1
