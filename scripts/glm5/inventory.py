"""The inventory, read by Ansible's own inventory, variable and template code: the inference nodes, the gateways, and
each host's variables (role defaults under them, templates rendered), never a second copy."""
from __future__ import annotations

import functools
import os

from glm5.errors import OpsError, UsageError
from glm5.project import ANSIBLE_CFG, ROOT, use_module_utils

DEFAULT_INVENTORY = os.path.join(ROOT, 'inventories', 'lab')
# Role defaults the command reads (under the inventory, as Ansible puts them).
ROLE_DEFAULTS = ('pve_container', 'gpu_preflight', 'sglang_service', 'sglang_smoke', 'sglang_gateway', 'prometheus')
# The node's contract (unit, environment file, rollback pair, readiness, key, lock): defined once, by sglang_service
CONTRACT = (os.path.join('roles', 'sglang_service', 'vars', 'main.yml'), 'sglang_service_contract')
# The gateway's (unit, environment file, control plane URL, metrics, drained list, nodes): by sglang_gateway
GATEWAY_CONTRACT = (os.path.join('roles', 'sglang_gateway', 'vars', 'main.yml'), 'sglang_gateway_contract')
GROUP = 'inference_nodes'
GATEWAYS = 'gateways'


@functools.cache
def _ansible():
    """Ansible's inventory, variable and template code, with this project's ansible.cfg and module_utils. Once a
    process: a second init_plugin_loader warns on stderr, where glm5's errors are one line."""
    os.environ.setdefault('ANSIBLE_CONFIG', ANSIBLE_CFG)
    use_module_utils()
    from ansible.plugins.loader import init_plugin_loader
    init_plugin_loader()


def filter_plugin(name):
    """A filter of the project's filter plugins, found by Ansible's own plugin loader (ansible.cfg's filter_plugins)."""
    _ansible()
    from ansible.plugins.loader import filter_loader
    return filter_loader.get(name).j2_function


class Inventory(object):
    def __init__(self, source, vault_password_files=(), ask_vault_pass=False):
        if not os.path.exists(source):
            raise UsageError('no inventory at {0}'.format(source))
        _ansible()
        from ansible.cli import CLI
        from ansible.errors import AnsibleError
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.vars.manager import VariableManager

        from ansible import constants as C
        self.source = source
        self.vault_password_files = list(vault_password_files or [])
        self.ask_vault_pass = ask_vault_pass
        self.loader = DataLoader()
        # vaulted variables (a production inventory's secrets), as ansible-playbook reads them: --vault-password-file,
        # --ask-vault-pass, or ANSIBLE_VAULT_PASSWORD_FILE / vault_password_file in ansible.cfg
        try:
            CLI.setup_vault_secrets(self.loader, vault_ids=C.DEFAULT_VAULT_IDENTITY_LIST,
                                    vault_password_files=self.vault_password_files or None,
                                    ask_vault_pass=ask_vault_pass, auto_prompt=False)
        except AnsibleError as exc:
            raise UsageError('vault password: {0}'.format(str(exc).splitlines()[0])) from None
        self.inv = InventoryManager(loader=self.loader, sources=[source])
        self.vm = VariableManager(loader=self.loader, inventory=self.inv)
        self.defaults = {}
        for role in ROLE_DEFAULTS:
            self.defaults.update(self.loader.load_from_file(os.path.join(ROOT, 'roles', role, 'defaults', 'main.yml'),
                                                            trusted_as_template=True) or {})

    def contract(self, name, hostvars=None, which=CONTRACT):
        """The node's contract as the roles see it: sglang_service's sglang_service_contract, rendered with the node's
        variables (hostvars: its HostVars, when the caller has them) -> {service, unit, env_file, previous_suffix,
        failed_suffix, passed_file, url, ready_path, key_file, lock_unit}. which=GATEWAY_CONTRACT: a gateway's,
        sglang_gateway_contract -> {service, unit, env_file, url, metrics_url, ready_path, drained_file, nodes}."""
        path, var = which
        raw = (self.loader.load_from_file(os.path.join(ROOT, path), trusted_as_template=True) or {}).get(var)
        if not isinstance(raw, dict):
            raise OpsError('{0} defines no {1}: this checkout is broken'.format(path, var))
        return (hostvars or self.host_vars(name)).render(var, raw)

    def nodes(self, group=GROUP):
        group = self.inv.groups.get(group)
        return [h.name for h in group.get_hosts()] if group else []

    def gateways(self):
        return self.nodes(GATEWAYS)

    def host_vars(self, name):
        from ansible.template import Templar
        host = self.inv.get_host(name)
        if host is None:
            raise UsageError('{0} is not a host of {1}'.format(name, self.source))
        from ansible.errors import AnsibleError
        variables = dict(self.defaults)
        try:
            variables.update(self.vm.get_vars(host=host))
        except AnsibleError as exc:       # e.g. vaulted variables without the vault password
            raise UsageError('{0}: cannot read its variables from {1}: {2}{3}'.format(
                name, self.source, str(exc).splitlines()[0],
                ' (--vault-password-file or --ask-vault-pass)' if 'vault' in str(exc).lower() else '')) from None
        return HostVars(name, variables, Templar(loader=self.loader, variables=variables))

    def select(self, node):
        """The nodes a subcommand acts on: -n NODE, else every inference node."""
        nodes = self.nodes()
        if not nodes:
            raise UsageError('{0} has no hosts in {1}'.format(self.source, GROUP))
        if node is not None:            # -n '' is a node name too (a shell variable left empty), not "every node"
            if node not in nodes:
                raise UsageError('unknown node {0!r}: {1} has {2}'.format(node, self.source, ', '.join(nodes)))
            return [node]
        return nodes

    def one(self, node):
        nodes = self.select(node)
        if len(nodes) > 1:
            raise UsageError('{0} has {1} inference nodes ({2}): pick one with -n NODE'.format(
                self.source, len(nodes), ', '.join(nodes)))
        return nodes[0]


class HostVars(object):
    def __init__(self, name, variables, templar):
        self.name, self.variables, self.templar = name, variables, templar

    def get(self, key, default=None):
        if key not in self.variables:
            return default
        value = self.render(key, self.variables[key])
        return default if value is None else value

    def number(self, key, default=None, low=1, high=None):
        """The variable as a whole number from low to high (an inventory's port, a timeout); else a usage error naming
        it."""
        value = self.get(key, default)
        try:
            n = None if isinstance(value, bool) else int(str(value).strip())
        except ValueError:
            n = None
        if n is None or n < low or (high is not None and n > high):
            raise UsageError('{0}: {1} must be a whole number {2}, got {3!r}'.format(
                self.name, key, 'from {0} to {1}'.format(low, high) if high is not None else 'of at least {0}'.format(low),
                value))
        return n

    def render(self, key, raw):
        """raw (the value of variable key) templated with this host's variables."""
        try:
            return self.templar.template(raw)
        except Exception as exc:  # Ansible raises many types; all mean "this variable cannot be rendered"
            raise OpsError('{0}: cannot render {1} from the inventory: {2}'.format(
                self.name, key, str(exc).splitlines()[0])) from None
