"""Run the real ansible-playbook on site.yml against the lab, the way a user does (shared by the site tests)."""
import itertools
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')


class Run(object):
    def __init__(self, proc):
        self.rc = proc.returncode
        self.raw = proc.stdout + proc.stderr
        self.out = ' '.join(self.raw.split())     # the YAML callback wraps long messages

    def __repr__(self):
        """rc, the lines that say what failed (a failed task, an unreachable host: first, so a cut report still
        shows them), then the end of the output."""
        lines, why = self.raw.splitlines(), []
        for i, line in enumerate(lines):
            if line.startswith(('fatal:', 'failed:', 'ERROR!', '[ERROR]')) and len(why) < 5:
                more = itertools.takewhile(lambda m: m.startswith('  '), lines[i + 1:i + 5])  # the YAML msg lines
                why.append('\n'.join(m[:600] for m in [line, *more]))
        return 'rc={0}\n{1}\n...\n{2}'.format(self.rc, '\n'.join(why), self.raw[-4000:])


def site(extra=None, *args, inventory=None, playbook='site.yml', sglang=False):
    """ansible-playbook <playbook> -e <extra as JSON> [args] with the project's ansible.cfg; returns a Run.

    The site tests are about the container and GPU plays: without sglang=True they run site.yml with
    --skip-tags sglang (the SGLang plays are covered by molecule/sglang, molecule/default and make deploy)."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_FORCE_COLOR='0')
    env['PATH'] = os.path.dirname(sys.executable) + os.pathsep + env.get('PATH', '')
    cmd = [PLAYBOOK, playbook]
    if inventory:
        cmd += ['-i', inventory]
    if extra:
        cmd += ['-e', json.dumps(extra)]
    cmd += list(args)
    if playbook == 'site.yml' and not sglang:
        cmd += ['--skip-tags', 'sglang']
    return Run(subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900))


def snapshot(api, vmids):
    """vmid -> (config digest, status) of the containers among vmids that the lab API holds (the test's own: the
    other lane changes its containers meanwhile)."""
    node = api.nodes('pve1')
    return {int(c['vmid']): (node.lxc(c['vmid']).config.get()['digest'], c['status']) for c in node.lxc.get()
            if int(c['vmid']) in vmids}


def scenario_nodes(scenario):
    """{node: host variables} of the inference nodes in a Molecule scenario's own inventory
    (molecule/<scenario>/inventory/hosts.yml: the one place a lane node's vmid and ports are written)."""
    import yaml
    with open(os.path.join(ROOT, 'molecule', scenario, 'inventory', 'hosts.yml')) as fh:
        return yaml.safe_load(fh)['all']['children']['inference_nodes']['hosts']
