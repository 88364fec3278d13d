"""Bad input to site.yml fails with a clear message before anything changes (on the running lab).

Each case runs the real ansible-playbook against the lab inventory and then checks, through the PVE
API, that no container was created or changed.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')


def snapshot(api):
    return {int(c['vmid']): api.nodes('pve1').lxc(c['vmid']).config.get()['digest'] for c in api.nodes('pve1').lxc.get()}


@pytest.mark.parametrize('extra, words', [
    ({'pve_container_vmid': 42}, 'pve_container_vmid must be 100..999999999, got 42'),
    ({'pve_container_state': 'running'}, 'pve_container_state'),
    ({'pve_container_memory': 'lots'}, 'pve_container_memory'),
    ({'pve_container_gpus': [9]}, 'GPU index(es) [9] not found on the PVE host'),
    ({'pve_container_api_password': '', 'pve_container_api_token_id': 'root@pam!ci',
      'pve_container_api_token_secret': 'x'}, 'PVE allows device passthrough (dev[n]) and bind mounts only to'),
    ({'pve_container_extra_mounts': [{'host_path': 'relative/dir', 'path': '/x'}]}, 'needs absolute host_path'),
])
def test_bad_input_fails_before_any_change(lab_api, extra, words):
    before = snapshot(lab_api)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1')
    env['PATH'] = os.path.dirname(sys.executable) + os.pathsep + env.get('PATH', '')
    run = subprocess.run([PLAYBOOK, 'site.yml', '-e', json.dumps(dict(extra, pve_container_vmid=extra.get(
        'pve_container_vmid', 194), ansible_port=20194))], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = ' '.join((run.stdout + run.stderr).split())
    assert run.returncode != 0, out[-2000:]
    assert words in out, out[-2000:]
    assert snapshot(lab_api) == before
