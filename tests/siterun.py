"""Run the real ansible-playbook on site.yml against the lab, the way a user does (shared by the site tests)."""
import itertools
import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping

from glm5_lab.paths import STATE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')


def node_ssh(hostvars, *cmd, stdin=None, timeout=120):
    """Plain OpenSSH into a lab container, as the lab's inventory reaches it (its port, its known_hosts file): not a
    command under test. cmd is ssh's remote command (words, joined by the remote shell)."""
    keys = os.path.join(STATE, 'ssh')
    return subprocess.run(['ssh', '-i', os.path.join(keys, 'id_ed25519'), '-o', 'BatchMode=yes',
                           '-o', 'UserKnownHostsFile=' + os.path.join(keys, hostvars['lab_known_hosts_name']),
                           '-p', str(hostvars['ansible_port']), 'root@127.0.0.1', *cmd],
                          input=stdin, capture_output=True, text=True, timeout=timeout)


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


class NodeVars(Mapping):
    """A node's variables as Ansible gives them to a play (the inventory, the lab's group_vars, the role defaults glm5
    reads), each templated when read."""
    def __init__(self, hostvars):
        self.hostvars = hostvars

    def __getitem__(self, key):
        if key not in self.hostvars.variables:
            raise KeyError(key)
        return self.hostvars.get(key)

    def __iter__(self):
        return iter(self.hostvars.variables)

    def __len__(self):
        return len(self.hostvars.variables)


_SCENARIOS = []     # [(the folder, glm5's Inventory of every scenario's hosts)]: Ansible's vault context is one a process


def scenario_inventory():
    """glm5's Inventory of every scenario's own inventory files (molecule/<scenario>/inventory/*.yml), made once."""
    from glm5.inventory import Inventory
    if not _SCENARIOS:
        folder = tempfile.TemporaryDirectory(prefix='glm5-scenario-inventories-')
        for name in sorted(os.listdir(os.path.join(ROOT, 'molecule'))):
            for path in scenario_inventory_files(name):
                os.symlink(path, os.path.join(folder.name, '{0}-{1}'.format(name, os.path.basename(path))))
        os.symlink(os.path.join(ROOT, 'inventories', 'lab', 'group_vars'), os.path.join(folder.name, 'group_vars'))
        _SCENARIOS.append((folder, Inventory(folder.name)))
    return _SCENARIOS[0][1]


def scenario_inventory_files(scenario):
    """A scenario's own inventory files: hosts.yml (its first node: the one place a lane node's vmid is written), and
    beside it the rest of a fleet (molecule/default's hosts_fleet.yml)."""
    folder = os.path.join(ROOT, 'molecule', scenario, 'inventory')
    if not os.path.isdir(folder):
        return []
    return [os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith('.yml')]


def scenario_fleet_inventory(path, scenario='default'):
    """A scenario's whole fleet as one inventory folder at path (a pathlib.Path, made empty by the caller): links to its
    inventory files and the lab's group_vars. Returns it as a string, for -i."""
    for f in scenario_inventory_files(scenario):
        os.symlink(f, str(path / os.path.basename(f)))
    os.symlink(os.path.join(ROOT, 'inventories', 'lab', 'group_vars'), str(path / 'group_vars'))
    return str(path)


# The rollouts' smoke test on make test's fleet: the single stream on each node, two prompts (the lane's other checks
# sweep more; these are about order, keys and failed requests, and the load beside them shares the machine's CPUs)
ROLLOUT_SMOKE = {'sglang_smoke_levels': [1], 'sglang_smoke_min_prompts': 2, 'sglang_smoke_prompts_per_concurrency': 2}

# The fleet's next key in make test's full-stack lane, one for the whole pytest run: the flag-change rollout
# (tests/test_fleet_rollout.py) brings it in as the secondary key - a key change's first step, in the same run -, the
# key change (tests/test_secrets.py) makes it the key; the secrets audits look for it as for the others.
FLEET_NEXT_KEY = uuid.uuid4().hex + uuid.uuid4().hex


def local_checks(top, inventory, play):
    """A play of read-only checks (site.yml's first plays: a role's validate.yml, no host contacted), with its
    inventory, written under top (a pathlib.Path) -> run(**extra) -> (rc, output)."""
    import yaml
    (top / 'hosts.yml').write_text(yaml.safe_dump(inventory))
    (top / 'play.yml').write_text(yaml.safe_dump(play))

    def run(**extra):
        r = site(extra, inventory=str(top / 'hosts.yml'), playbook=str(top / 'play.yml'))
        return r.rc, r.out
    return run


def refused_saying(rc, out, host, words):
    """Checks' outcome: passed (words None), or refused on host saying words."""
    if words is None:
        assert rc == 0, out
    else:
        assert rc != 0 and 'fatal: [{0}]'.format(host) in out and words in out, out


def stack_monitor():
    """The full-stack lane's monitoring host (molecule/default's hosts_fleet.yml) -> (name, its NodeVars)."""
    (name,) = _names(os.path.join(ROOT, 'molecule', 'default', 'inventory', 'hosts_fleet.yml'), 'monitoring')
    return name, NodeVars(scenario_inventory().host_vars(name))


def prometheus_api(url, path):
    """GET <url><path> of Prometheus' HTTP API -> the answer's data (its status 'success' asserted)."""
    import urllib.request
    with urllib.request.urlopen(url + path, timeout=10) as r:
        body = json.load(r)
    assert body['status'] == 'success', body
    return body['data']


def _names(path, group):
    import yaml
    with open(path) as fh:
        return list((yaml.safe_load(fh)['all']['children'].get(group) or {}).get('hosts') or {})


def scenario_nodes(scenario):
    """{node: NodeVars} of the inference nodes in a Molecule scenario's hosts.yml, as its scenario sees it (the node the
    role scenarios share; the ports follow from the lab inventory's formulas)."""
    inventory = scenario_inventory()
    names = _names(os.path.join(ROOT, 'molecule', scenario, 'inventory', 'hosts.yml'), 'inference_nodes')
    return {name: NodeVars(inventory.host_vars(name)) for name in names}


def second_node(scenario):
    """(name, NodeVars) of the second inference node of a scenario's fleet (molecule/default's hosts_fleet.yml)."""
    name = _names(os.path.join(ROOT, 'molecule', scenario, 'inventory', 'hosts_fleet.yml'), 'inference_nodes')[0]
    return name, NodeVars(scenario_inventory().host_vars(name))


def scenario_hosts(scenario):
    """{host: (group, NodeVars)} of every inference node and gateway in all of a scenario's inventory files."""
    inventory = scenario_inventory()
    return {name: (group, NodeVars(inventory.host_vars(name))) for path in scenario_inventory_files(scenario)
            for group in ('inference_nodes', 'gateways') for name in _names(path, group)}


def node_contract(name):
    """The node's contract (sglang_service's unit, environment file, rollback pair, readiness, key, lock) for a lane
    node, as glm5 reads it (call scenario_nodes first)."""
    return _SCENARIOS[0][1].contract(name)
