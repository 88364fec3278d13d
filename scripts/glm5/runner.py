"""Running a playbook of the checkout (ansible/playbooks/bench.yml) for one node, and what its output says failed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from glm5.errors import OpsError
from glm5.project import ANSIBLE_CFG, ROOT

BENCH_PLAYBOOK = os.path.join(ROOT, 'ansible', 'playbooks', 'bench.yml')


def run_bench(inv, name, extra, progress):
    """ansible-playbook bench.yml on one node with these extra variables, the json callback's output kept in a log,
    while `progress` follows the run (its poll, every second, then once more at the end): (exit status, output)."""
    env = dict(os.environ, ANSIBLE_CONFIG=ANSIBLE_CFG, ANSIBLE_STDOUT_CALLBACK='ansible.posix.json',
               ANSIBLE_NOCOLOR='1', ANSIBLE_LOAD_CALLBACK_PLUGINS='1')
    env['PATH'] = os.path.dirname(sys.executable) + os.pathsep + env.get('PATH', '')
    cmd = [os.path.join(os.path.dirname(sys.executable), 'ansible-playbook'), BENCH_PLAYBOOK, '-i', inv.source,
           '-l', name, '-e', json.dumps(extra)]
    for path in inv.vault_password_files:
        cmd += ['--vault-password-file', path]
    if inv.ask_vault_pass:
        cmd.append('--ask-vault-pass')      # it asks on the terminal (/dev/tty) again: its output goes to a log
    with tempfile.TemporaryFile(mode='w+') as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None:
                progress.poll()
                time.sleep(1)
        except KeyboardInterrupt:
            raise OpsError('{0}: interrupted; the run folder {1} holds what ran'.format(name, progress.run)) from None
        finally:
            if proc.poll() is None:     # interrupted, or the progress display failed: the playbook goes too
                proc.terminate()
                proc.wait()
        progress.poll(finished=True)
        log.seek(0)
        return proc.returncode, log.read()


def playbook_error(output):
    """The first failed task's message from the json callback's output, else the output's last line."""
    start = output.find('{')
    try:
        doc = json.loads(output[start:]) if start >= 0 else None
    except ValueError:
        doc = None
    for play in (doc or {}).get('plays', []):
        for task in play.get('tasks', []):
            for host, res in task.get('hosts', {}).items():
                if res.get('failed') or res.get('unreachable'):
                    return '{0} ({1}): {2}'.format(task['task']['name'], host, ' '.join(str(res.get('msg')).split()))
    lines = [x for x in output.splitlines() if x.strip()]
    return lines[-1] if lines else 'no output'
