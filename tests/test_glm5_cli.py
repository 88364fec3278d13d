"""glm5's process on the controller, with no node: what it prints besides its one line."""
import os
import subprocess
import sys

import pytest
from siterun import ROOT


def test_reading_the_inventory_then_a_filter_warns_nothing():
    """glm5 reads the inventory and then the unit through the project's filter: Ansible's plugin loader was set up
    twice, and its UserWarning ('AnsibleCollectionFinder has already been configured') went to stderr, where glm5's
    errors are one line (the ops tests count them)."""
    code = ('from glm5.inventory import Inventory, filter_plugin\n'
            'c = Inventory("inventories/lab").contract("glm5-lab")\n'
            'assert callable(filter_plugin("sglang_unit_launch"))\n'
            'print(c["unit"], c["lock_unit"], c["url"] + c["ready_path"], c["passed_file"])\n')
    p = subprocess.run([sys.executable, '-W', 'error::UserWarning', '-c', code], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and p.stderr == '', p.stderr
    # the node's contract as the roles render it: no template left (role variables read as trusted templates)
    assert p.stdout.split() == ['/etc/systemd/system/glm5-sglang.service', 'glm5-sglang-lock',
                                'http://127.0.0.1:30120/health_generate', '/etc/glm5/glm5-sglang.passed.json'], p.stdout


@pytest.mark.parametrize('unbuffered', ['', '1'])
def test_a_reader_that_has_gone_is_no_traceback(unbuffered):
    """`glm5 history | head -1`: what a command printed stays in Python's buffer until it exits, and the closed pipe
    was found there, past glm5's own BrokenPipeError handler: a traceback on stderr. The command here prints as
    history does, after the real lab inventory is read, into a pipe whose reader has gone; only the node is left
    out. Both ways Python writes stdout (PYTHONUNBUFFERED: each print at once)."""
    code = ('import os, sys\n'
            'import glm5.cli as cli\n'
            'def history(args, inv):\n'
            '    read, write = os.pipe()\n'
            '    os.close(read)\n'
            '    os.dup2(write, sys.stdout.fileno())\n'
            '    for n in range(10):\n'
            '        print("run", n)\n'
            '    return 0\n'
            'cli.COMMANDS["history"] = history\n'
            'sys.exit(cli.main(["history"]))\n')
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONUNBUFFERED'}
    p = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(env, **({'PYTHONUNBUFFERED': unbuffered} if unbuffered else {})))
    assert p.returncode == 1 and p.stderr == '', (p.returncode, p.stderr)
