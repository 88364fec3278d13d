"""Contracts that keep the roles and inventories honest: documented defaults, parseable inventories."""
import glob
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, 'roles', '*')))
BIN = os.path.dirname(sys.executable)


def load(path):
    with open(os.path.join(ROOT, path)) as fh:
        return yaml.safe_load(fh) or {}


@pytest.mark.parametrize('role', ROLES)
def test_every_default_is_in_the_argument_spec_and_back(role):
    defaults = load('roles/{0}/defaults/main.yml'.format(role))
    options = load('roles/{0}/meta/argument_specs.yml'.format(role))['argument_specs']['main']['options']
    # a required input has no default (with one, Ansible's check of the spec could never refuse it)
    assert sorted(defaults) == sorted(name for name, spec in options.items() if not spec.get('required'))
    for name, spec in options.items():
        assert spec.get('description') and spec['description'] != name, '{0} has no real description'.format(name)
        assert name.startswith(role + '_'), '{0}: public variables carry the role prefix'.format(name)


@pytest.mark.parametrize('role', ROLES)
def test_every_default_sits_under_a_comment(role):
    """Each group of defaults (lines between blank lines) opens with a comment saying what it is for."""
    text = open(os.path.join(ROOT, 'roles', role, 'defaults', 'main.yml')).read()
    for block in text.split('\n\n'):
        lines = [line for line in block.splitlines() if line.strip() and line != '---']
        if any(line[0].isalpha() for line in lines):
            assert lines[0].startswith('#'), 'undocumented defaults in {0}: {1}'.format(role, lines[0])


# Every file of tasks or plays: the project's plays, its roles' tasks and handlers, the scenarios' plays and tasks.
TASK_FILES = ('*.yml', 'roles/*/tasks/*.yml', 'roles/*/handlers/*.yml', 'ansible/playbooks/*.yml', 'molecule/*/*.yml',
              'molecule/*/tasks/*.yml')


def task_files():
    """(path relative to the project, its YAML) of every file of TASK_FILES."""
    for pattern in TASK_FILES:
        for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
            yield os.path.relpath(path, ROOT), load(os.path.relpath(path, ROOT))


def role_includes():
    """(file, role, tasks_from) of every include_role and import_role that names a tasks file, in the project's plays,
    roles and scenarios."""
    found = []

    def walk(node, path):
        if isinstance(node, dict):
            for key, value in node.items():
                if str(key).split('.')[-1] in ('include_role', 'import_role') and isinstance(value, dict) \
                        and 'tasks_from' in value:
                    found.append((path, value['name'], value['tasks_from']))
                walk(value, path)
        elif isinstance(node, list):
            for item in node:
                walk(item, path)
    for path, doc in task_files():
        walk(doc, path)
    return found


def test_every_entry_point_is_included_by_its_name_so_ansible_checks_its_arguments():
    """Ansible checks an include's variables against the argument_specs entry point named exactly as its tasks_from:
    `tasks_from: fleet` is checked against the entry point fleet, `tasks_from: fleet.yml` against none, silently
    (found 2026-12-05: sglang_smoke's fleet and sglang_env's profile entry points had never been applied)."""
    includes = role_includes()
    assert includes, 'no include_role with tasks_from found: the walk is broken'
    for role in ROLES:
        points = set(load('roles/{0}/meta/argument_specs.yml'.format(role))['argument_specs']) - {'main'}
        for point in points:
            assert os.path.exists(os.path.join(ROOT, 'roles', role, 'tasks', point + '.yml')), (role, point)
            named = [(f, t) for f, r, t in includes if r == role and t in (point, point + '.yml')]
            assert named, '{0}: entry point {1} is included nowhere'.format(role, point)
            wrong = [f for f, t in named if t != point]
            assert not wrong, '{0}: tasks_from: {1}.yml in {2} skips the argument check (write tasks_from: {1})'.format(
                role, point, ', '.join(wrong))



CONDITIONALS = ('when', 'failed_when', 'changed_when', 'until', 'that')


def conditionals():
    """(file, task name, key, value) of every conditional of every task: when, failed_when, changed_when, until, and
    an assert's that (each item of a list)."""
    found = []

    def walk(node, path, task):
        if isinstance(node, dict):
            task = node.get('name', task)
            for key, value in node.items():
                if key in CONDITIONALS and (key != 'that' or task is not None):
                    for item in value if isinstance(value, list) else [value]:
                        found.append((path, task, key, item))
                walk(value, path, task)
        elif isinstance(node, list):
            for item in node:
                walk(item, path, task)
    for path, doc in task_files():
        walk(doc, path, None)
    return found


def test_every_conditional_is_a_string_as_yaml_reads_it():
    """A condition written as a plain YAML scalar with ': ' in it (search(': entry 1')) is a mapping, not a string:
    Ansible fails it only when the task runs ("Conditional expressions must be strings"), in a verify minutes in
    (found 2026-12-07 in molecule/sglang_gateway's verify). Every condition here is a string or a boolean."""
    found = conditionals()
    assert len(found) > 500, 'the walk found {0} conditions: it is broken'.format(len(found))
    bad = ['{0}: {1!r}: {2}: {3!r}'.format(f, t, k, v) for f, t, k, v in found if not isinstance(v, (str, bool))]
    assert not bad, '\n'.join(bad)


def included_file(path, key, value):
    """The task file an include or import in path names (relative to the project), or None (a templated name)."""
    kind = str(key).split('.')[-1]
    if kind in ('include_tasks', 'import_tasks'):
        name = value if isinstance(value, str) else (value or {}).get('file', '')
        target = os.path.normpath(os.path.join(os.path.dirname(path), name))
    elif kind in ('include_role', 'import_role') and isinstance(value, dict):
        name, tasks = str(value.get('name', '')), str(value.get('tasks_from', 'main'))
        target = os.path.join('roles', name, 'tasks', tasks if tasks.endswith('.yml') else tasks + '.yml')
    else:
        return None
    return None if '{{' in target else target


def facts_set(tasks, path, seen):
    """The names the tasks set (set_fact's keys, register) - their blocks' and the files they include or import too."""
    out = set()
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        if 'register' in task:
            out.add(task['register'])
        for key, value in task.items():
            if str(key).split('.')[-1] == 'set_fact' and isinstance(value, dict):
                out |= set(value) - {'cacheable'}
            target = included_file(path, key, value)
            if target and target not in seen and os.path.exists(os.path.join(ROOT, target)):
                seen.add(target)
                out |= facts_set(load(target), target, seen)
        for part in ('block', 'rescue', 'always'):
            out |= facts_set(task.get(part), path, seen)
    return out


def test_no_block_asks_a_variable_its_own_tasks_set():
    """A block's `when` is asked again at every task in it, the tasks of a file it includes too: a task after the one
    that changes what it asks is skipped, silently. Found 2026-12-07: a join's second reading of the drained file,
    included in the block that asks whether the first reading found the node drained - the removal after it never ran
    (and gpu_container's read of the version installed, harmless there as its last task). Every block of every task
    file asks nothing its tasks set."""
    bad, blocks = [], 0

    def walk(tasks, path):
        nonlocal blocks
        for task in tasks if isinstance(tasks, list) else []:
            if not isinstance(task, dict):
                continue
            if 'block' in task and task.get('when') is not None:
                blocks += 1
                conditions = task['when'] if isinstance(task['when'], list) else [task['when']]
                asked = set(re.findall(r'[A-Za-z_][A-Za-z0-9_]*', ' '.join(map(str, conditions))))
                both = asked & facts_set(task['block'], path, set())
                if both:
                    bad.append('{0}: block {1!r} asks {2}, which its tasks set'.format(path, task.get('name'),
                                                                                      ', '.join(sorted(both))))
            for part in ('block', 'rescue', 'always', 'pre_tasks', 'tasks', 'post_tasks', 'handlers'):
                walk(task.get(part), path)
    for path, doc in task_files():
        walk(doc, path)
    assert blocks > 10, 'the walk found {0} blocks with a condition: it is broken'.format(blocks)
    assert not bad, '\n'.join(bad)


def inventory(name, *extra):
    out = subprocess.run([os.path.join(BIN, 'ansible-inventory'), '-i', os.path.join(ROOT, 'inventories', name),
                          '--list', *extra], capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(out.stdout)


def test_lab_inventory_has_a_pve_host_two_nodes_and_a_gateway():
    inv = inventory('lab')
    assert inv['pve_hosts']['hosts'] == ['pve-lab']
    assert inv['inference_nodes']['hosts'] == ['glm5-lab', 'glm5-lab2']
    assert inv['gateways']['hosts'] == ['glm5-gw']
    hv = inv['_meta']['hostvars']
    assert [hv[h]['pve_container_vmid'] for h in ('glm5-lab', 'glm5-lab2', 'glm5-gw')] == [120, 121, 130]
    # the nodes split the lab's eight stand-in GPUs; the gateway has none, said so
    assert hv['glm5-lab']['pve_container_gpus'] == [0, 1, 2, 3] and hv['glm5-lab2']['pve_container_gpus'] == [4, 5, 6, 7]
    assert hv['glm5-gw']['pve_container_gpus'] == 'none'


def test_production_example_decrypts_with_the_documented_password(tmp_path):
    pw = tmp_path / 'pw'
    pw.write_text('example\n')
    inv = inventory('production', '--vault-password-file', str(pw))
    node = inv['_meta']['hostvars']['glm5']
    assert node['vault_pve_root_password'] == 'CHANGE-ME'
    assert node['pve_container_api_user'] == 'root@pam'


@pytest.mark.parametrize('name', ['lab', 'production'])
def test_every_container_of_an_inventory_names_its_pve_host(name, tmp_path):
    """Each host of site.yml's container play (nodes, gateways, monitoring) names a PVE host of the inventory:
    pve_container's first assert refuses one without it. (The production example set it for the nodes only, so its
    Prometheus container, glm5-prom, stopped the run there.)"""
    pw = tmp_path / 'pw'
    pw.write_text('example\n')
    inv = inventory(name, *(['--vault-password-file', str(pw)] if name == 'production' else []))
    containers = [h for g in ('inference_nodes', 'gateways', 'monitoring') for h in inv.get(g, {}).get('hosts', [])]
    assert inv['monitoring']['hosts'], containers                     # both examples watch their nodes
    for host in containers:
        assert inv['_meta']['hostvars'][host].get('pve_container_pve_host') in inv['pve_hosts']['hosts'], host


def test_nodes_created_in_one_play_forget_their_old_host_keys_one_at_a_time(tmp_path):
    """pve_container's known_hosts step for ten nodes created in one play (a fleet; the host-driver scenario's two):
    ssh-keygen -R rewrites the file, so run at once it failed ('known_hosts.old: File exists') and lost removals."""
    known = tmp_path / 'known_hosts'
    key = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK0wmN/Cr3JXqmLW7u+g9pTh+mjqs9vPjcQRXy+ZXEd0'
    ports = range(21000, 21010)
    known.write_text(''.join('[127.0.0.1]:{0} {1}\n'.format(p, key) for p in ports) + '[127.0.0.1]:22222 ' + key + '\n')
    (tmp_path / 'hosts').write_text('[all]\n' + ''.join(
        'node{0} ansible_connection=local ansible_host=127.0.0.1 ansible_port={1}\n'.format(i, p)
        for i, p in enumerate(ports)))
    (tmp_path / 'play.yml').write_text(yaml.safe_dump([{
        'hosts': 'all', 'gather_facts': False,
        'vars': {'pve_container_result': {'created': True}, 'pve_container_known_hosts_file': str(known),
                 'ansible_python_interpreter': sys.executable},
        'tasks': [{'ansible.builtin.include_role': {'name': 'pve_container', 'tasks_from': 'known_hosts.yml'}}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_FORKS='10')
    r = subprocess.run([os.path.join(BIN, 'ansible-playbook'), '-i', str(tmp_path / 'hosts'), str(tmp_path / 'play.yml')],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert known.read_text() == '[127.0.0.1]:22222 ' + key + '\n'       # every node's removed, the other kept


@pytest.mark.parametrize('tag,role', [('gateway', 'sglang_gateway'), ('monitoring', 'prometheus')])
def test_a_tagged_run_on_a_new_container_sets_its_base_up_first(tag, role):
    """--tags monitoring (or gateway) on a container that was just made: its apt lists and CA certificates come from
    container_base, so the tag runs that role first in the play. (Without it, `site.yml --tags monitoring` on a new
    monitoring container failed: "No package matching 'prometheus' is available".)"""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), PATH=BIN + os.pathsep + os.environ['PATH'])
    out = subprocess.run([os.path.join(BIN, 'ansible-playbook'), 'site.yml', '--list-tasks', '--tags', tag],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    plays = [p for p in out.stdout.split('\n  play #') if '\n      {0} : '.format(role) in p]
    assert plays, out.stdout[-2000:]
    for play in plays:
        tasks = [line.strip() for line in play.splitlines() if line.startswith('      ')]
        first_own = next(i for i, t in enumerate(tasks) if t.startswith(role + ' : ') and 'Validating' not in t)
        base = [i for i, t in enumerate(tasks) if t.startswith('container_base : Base | apt knows the packages')]
        assert base and base[0] < first_own, tasks
