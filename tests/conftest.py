"""The project's module_utils importable as Ansible imports them (`ansible.module_utils.<name>`); the modules, filters
and scripts come from pytest's pythonpath (pyproject.toml)."""
import os
import subprocess

import pytest
from glm5.project import ROOT

try:
    from glm5.project import use_module_utils
    use_module_utils()
except ImportError:  # a GPU machine running only tests/test_gpu_host.py has no Ansible
    pass

LANE_MARKERS = ('stack', 'stack2', 'ct', 'host')


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """A test on a lane node, or one that asks for the lab's API, needs the lab: it is marked `lab` as well, so
    `-m 'not lab'` (make check) leaves it out."""
    for item in items:
        if 'lab_api' in item.fixturenames or any(item.get_closest_marker(m) for m in LANE_MARKERS):
            item.add_marker(pytest.mark.lab)


class SmallFilesystem(object):
    """A tmpfs of a chosen size at `path` (a real filesystem that fills up; resized in place, keeping its files)."""

    def __init__(self, path):
        self.path = str(path)
        self.mounted = False

    def size(self, nbytes):
        """Mount it, or resize it, to nbytes (rounded up to a 4 KiB page)."""
        opts = 'size={0}'.format(-(-int(nbytes) // 4096) * 4096)
        cmd = ['mount', '-o', 'remount,' + opts, self.path] if self.mounted else \
            ['mount', '-t', 'tmpfs', '-o', opts + ',mode=0755', 'glm5-test-fs', self.path]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        self.mounted = True
        return self

    def free(self):
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize


@pytest.fixture
def small_fs(tmp_path):
    """A filesystem that can be filled: a tmpfs mounted under tmp_path (root only: skipped otherwise)."""
    if os.geteuid() != 0:
        pytest.skip('mounting a small tmpfs needs root')
    fs = SmallFilesystem(tmp_path / 'small-fs')
    os.makedirs(fs.path)
    yield fs
    if fs.mounted:
        subprocess.run(['umount', '-l', fs.path], check=True)


@pytest.fixture(scope='session')
def lab_api():
    """proxmoxer on the running lab's PVE API (root@pam, TLS checked against the lab CA).

    `make test` brings the lab up and sets GLM5_LAB=1: there a missing lab fails; elsewhere these tests skip.
    """
    if os.environ.get('GLM5_LAB') != '1':
        pytest.skip('needs the running lab: run through `make test` (it sets GLM5_LAB=1 after make lab-up)')
    from glm5_lab.labd import api_answers
    from glm5_lab.paths import paths
    from proxmoxer import ProxmoxAPI
    p = paths()
    if not api_answers(p):
        pytest.fail('GLM5_LAB=1 but the lab API does not answer on 127.0.0.1:8006: see {0}'.format(p['log']))
    with open(p['password']) as fh:
        password = fh.read().strip()
    return ProxmoxAPI('127.0.0.1', port=8006, user='root@pam', password=password, verify_ssl=p['ca'])


def lab_node_inventory(tmp_path_factory, scenario, second=False):
    """An inventory for one of make test's lane nodes, as its Molecule scenario sees it: the scenario's hosts file
    (molecule/<scenario>/inventory/hosts.yml, the one place its vmid and ports are written) and the lab's group_vars;
    second: the fleet's second node alone (its entry in hosts_fleet.yml, with the PVE host: no gateway, no other node).
    -> (inventory path, node name, host variables)."""
    import yaml
    from siterun import scenario_nodes, second_node
    path = tmp_path_factory.mktemp(scenario + ('-second' if second else '') + '-inventory')
    if second:
        name, hostvars = second_node(scenario)
        with open(os.path.join(ROOT, 'molecule', scenario, 'inventory', 'hosts_fleet.yml')) as fh:
            entry = yaml.safe_load(fh)['all']['children']['inference_nodes']['hosts'][name]
        with open(str(path / 'hosts.yml'), 'w') as fh:
            yaml.safe_dump({'all': {'children': {'pve_hosts': {'hosts': {'pve-lab': None}},
                                                 'inference_nodes': {'hosts': {name: entry}}}}}, fh)
    else:
        os.symlink(os.path.join(ROOT, 'molecule', scenario, 'inventory', 'hosts.yml'), str(path / 'hosts.yml'))
        (name, hostvars), = scenario_nodes(scenario).items()
    os.symlink(os.path.join(ROOT, 'inventories', 'lab', 'group_vars'), str(path / 'group_vars'))
    return str(path), name, hostvars


def node_status(lab_api, vmid):
    """The lab API's status of a container ('running', 'stopped'), None when there is none."""
    return {int(c['vmid']): c['status'] for c in lab_api.nodes('pve1').lxc.get()}.get(vmid)


def _lane_node(lab_api, tmp_path_factory, scenario, what, how, second=False):
    inventory, name, hostvars = lab_node_inventory(tmp_path_factory, scenario, second)
    vmid = hostvars['pve_container_vmid']
    status = node_status(lab_api, vmid)
    if status != 'running':
        pytest.fail('{0} ({1}, CT {2}) is {3}: these tests run on it after `{4}` (make test does this in its '
                    'lanes, tests/README.md)'.format(what, name, vmid, status or 'absent', how))
    return inventory, name, hostvars


@pytest.fixture(scope='session')
def stack_node(lab_api, tmp_path_factory):
    """make test's full-stack node (molecule/default), deployed and verified before the tests marked `stack`."""
    return _lane_node(lab_api, tmp_path_factory, 'default', 'the full-stack node',
                      'molecule test -s default --destroy=never')


@pytest.fixture(scope='session')
def stack_node2(lab_api, tmp_path_factory):
    """The full-stack fleet's second node, deployed by molecule/default, in a one-node inventory of its own: the tests
    marked `stack2` (the ops command, the history's and the lock's faults) run on it after the first node's verify."""
    return _lane_node(lab_api, tmp_path_factory, 'default', "the full-stack fleet's second node",
                      'molecule converge -s default', second=True)


@pytest.fixture(scope='session')
def ct_deploy(lab_api, tmp_path_factory):
    """make test's container-stage node (molecule/pve_container's inventory): when it is not running (lane-ct destroys
    it first), deployed by site.yml less the SGLang plays -> (inventory, node, hostvars, that Run or None)."""
    from siterun import site
    inventory, name, hostvars = lab_node_inventory(tmp_path_factory, 'pve_container')
    if node_status(lab_api, hostvars['pve_container_vmid']) == 'running':
        return inventory, name, hostvars, None
    run = site(None, inventory=inventory)
    if run.rc != 0:
        pytest.fail('site.yml could not deploy the container-stage node ({0}, CT {1}):\n{2}'.format(
            name, hostvars['pve_container_vmid'], run))
    return inventory, name, hostvars, run


@pytest.fixture(scope='session')
def ct_node(ct_deploy):
    """make test's container-stage node, deployed (ct_deploy), for the tests marked `ct` and `host`."""
    return ct_deploy[:3]
