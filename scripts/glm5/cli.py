#!/usr/bin/env python3
"""glm5: day-2 operations on the GLM-5 inference node(s) of an Ansible inventory, over SSH (Fabric).

    glm5 status                   one screen per node; exit 1 when anything is wrong (for cron and monitors)
    glm5 gpus [--watch]           the per-GPU table (utilisation, power / limit, memory, temperature, clocks)
    glm5 logs [-f] [--since T]    the SGLang unit's journal
    glm5 bench [--levels 1,64] [--lengths 256/128]
                                  the smoke test's probe and sweep on demand (ansible/playbooks/bench.yml: the
                                  sglang_smoke role, its report folder), a progress bar per level
    glm5 history                  the node's runs in the bench history
    glm5 compare [RUN [RUN]]      two runs side by side (table + plot), the last two by default
    glm5 restart                  graceful: the unit drains and stops, starts, and /health_generate answers

Every subcommand takes -i INVENTORY (default: the lab, inventories/lab), -n NODE (an inference_nodes host; needed
when the inventory has several and the subcommand acts on one) and --json. Hosts, ports, keys, paths and the PVE
API come from the inventory through Ansible's own inventory and variable code (role defaults under it, templates
rendered), never from a second copy. Bad input and unreachable nodes give one line on stderr and a non-zero exit:
2 for bad input, 1 for a node that is unhealthy, unreachable or failed.
"""
from __future__ import annotations

import argparse
import datetime
import getpass
import json
import os
import re
import secrets
import shlex
import socket
import subprocess
import sys
import tempfile
import time

from glm5.project import ANSIBLE_CFG, ROOT, use_module_utils

DEFAULT_INVENTORY = os.path.join(ROOT, 'inventories', 'lab')
BENCH_PLAYBOOK = os.path.join(ROOT, 'ansible', 'playbooks', 'bench.yml')
# Role defaults the command reads (under the inventory, as Ansible puts them).
ROLE_DEFAULTS = ('pve_container', 'gpu_preflight', 'sglang_service', 'sglang_smoke')
GROUP = 'inference_nodes'
PVE_NAMES = {'api_host': 'pve_container_api_host', 'api_port': 'pve_container_api_port',
             'api_user': 'pve_container_api_user', 'api_password': 'pve_container_api_password',
             'api_token_id': 'pve_container_api_token_id', 'api_token_secret': 'pve_container_api_token_secret',
             'ca_file': 'pve_container_api_ca_file'}
# /health_generate from inside the container (the API need not be reachable from the controller)
HEALTH = ('import sys, time, urllib.request, urllib.error\n'
          't = time.monotonic()\n'
          'try:\n'
          '    code = urllib.request.urlopen(sys.argv[1] + "/health_generate", timeout=30).status\n'
          'except urllib.error.HTTPError as e:\n'
          '    code = e.code\n'
          'except Exception as e:\n'
          '    code = type(e).__name__ + ": " + str(getattr(e, "reason", e))\n'
          'print(code, round(time.monotonic() - t, 2))\n')


class OpsError(Exception):
    """One line for the user; exit 1."""
    code = 1


class UsageError(OpsError):
    """Bad input; exit 2."""
    code = 2


def _ansible():
    """Ansible's inventory, variable and template code, with this project's ansible.cfg and module_utils."""
    os.environ.setdefault('ANSIBLE_CONFIG', ANSIBLE_CFG)
    use_module_utils()
    from ansible.plugins.loader import init_plugin_loader
    init_plugin_loader()


def _filter(name):
    """A filter of the project's filter plugins, found by Ansible's own plugin loader (ansible.cfg's filter_plugins)."""
    _ansible()
    from ansible.plugins.loader import filter_loader
    return filter_loader.get(name).j2_function


# ---------------------------------------------------------------- the inventory
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
            self.defaults.update(self.loader.load_from_file(os.path.join(ROOT, 'roles', role, 'defaults', 'main.yml'))
                                 or {})

    def nodes(self):
        group = self.inv.groups.get(GROUP)
        return [h.name for h in group.get_hosts()] if group else []

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
        if node:
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
        try:
            value = self.templar.template(self.variables[key])
        except Exception as exc:  # Ansible raises many types; all mean "this variable cannot be rendered"
            raise OpsError('{0}: cannot render {1} from the inventory: {2}'.format(
                self.name, key, str(exc).splitlines()[0])) from None
        return default if value is None else value


# ---------------------------------------------------------------- where commands run
class Result(object):
    def __init__(self, stdout, stderr, exited):
        self.stdout, self.stderr, self.exited = stdout, stderr, exited

    @property
    def ok(self):
        return self.exited == 0


class Local(object):
    """A host with ansible_connection: local (the lab's PVE host is this machine)."""
    def __init__(self, hv):
        self.hv, self.name, self.where = hv, hv.name, 'local'

    def run(self, cmd, timeout=60):
        try:
            p = subprocess.run(['/bin/sh', '-c', cmd], capture_output=True, encoding='utf-8', errors='replace',
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            return Result('', 'timed out after {0} s'.format(timeout), 124)
        return Result(p.stdout, p.stderr, p.returncode)

    def close(self):
        pass


class Ssh(object):
    """A host over SSH with Fabric, with the inventory's user, port, key and known-hosts file. Unknown host keys are
    refused (the deploy records them), as OpenSSH's StrictHostKeyChecking does."""
    def __init__(self, hv):
        import paramiko
        from fabric import Connection
        self.hv, self.name = hv, hv.name
        host = hv.get('ansible_host', hv.name)
        port = int(hv.get('ansible_port', 22))
        user = hv.get('ansible_user') or hv.get('ansible_ssh_user') or getpass.getuser()
        self.where = '{0}@{1}:{2}'.format(user, host, port)
        kwargs = {'look_for_keys': True, 'allow_agent': True, 'banner_timeout': 10, 'auth_timeout': 10}
        key = hv.get('ansible_ssh_private_key_file') or hv.get('ansible_private_key_file')
        if key:
            kwargs.update(key_filename=os.path.expanduser(key), look_for_keys=False)
        password = hv.get('ansible_password') or hv.get('ansible_ssh_pass')
        if password:
            kwargs['password'] = password
        self.known_hosts = []
        for args in (hv.get('ansible_ssh_common_args', ''), hv.get('ansible_ssh_extra_args', '')):
            self.known_hosts += re.findall(r'UserKnownHostsFile=(\S+)', args or '')
        self.known_hosts += [hv.get('pve_container_known_hosts_file', ''), '~/.ssh/known_hosts']
        self.known_hosts = [os.path.expanduser(p) for p in dict.fromkeys(self.known_hosts) if p]
        self.conn = Connection(host, user=user, port=port, connect_kwargs=kwargs, connect_timeout=10)
        self.conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        for path in self.known_hosts:
            if os.path.exists(path):
                self.conn.client.load_host_keys(path)
        self._opened = False

    def _open(self):
        if self._opened:
            return
        import paramiko
        try:
            self.conn.open()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            why = str(exc) or type(exc).__name__
            if 'not found in known_hosts' in why:
                why += ' (site.yml records a node\'s key when it deploys it; looked in {0})'.format(
                    ', '.join(self.known_hosts))
            raise OpsError('{0}: cannot reach {1} over SSH: {2}'.format(self.name, self.where, why)) from None
        self._opened = True

    def run(self, cmd, timeout=60, stream=False, pty=False):
        """pty: a terminal on the far side, so that Ctrl-C here reaches the command there (journalctl -f)."""
        self._open()
        try:
            # stream: True shows stdout and stderr as they come, 'out' only stdout (stderr is kept for the error line)
            hide = 'err' if stream == 'out' else not stream
            r = self.conn.run(cmd, hide=hide, warn=True, in_stream=False, timeout=timeout, pty=pty)
        except Exception as exc:  # invoke's CommandTimedOut, paramiko's errors: the node, not bad input
            if type(exc).__name__ == 'CommandTimedOut':
                return Result('', 'timed out after {0} s'.format(timeout), 124)
            raise OpsError('{0}: SSH to {1} failed: {2}'.format(self.name, self.where, exc)) from None
        return Result(r.stdout, r.stderr, r.exited)

    def close(self):
        self.conn.close()


def connect(hv):
    return Local(hv) if hv.get('ansible_connection') == 'local' else Ssh(hv)


# ---------------------------------------------------------------- one node
class Node(object):
    def __init__(self, inventory, name):
        self.name = name
        self.hv = inventory.host_vars(name)
        hv = self.hv
        self.service = hv.get('sglang_service_name')
        self.unit = '/etc/systemd/system/{0}.service'.format(self.service)
        self.nvidia_smi = hv.get('sglang_smoke_nvidia_smi', 'nvidia-smi')
        self.vmid = hv.get('pve_container_vmid')
        self.pve_host_name = hv.get('pve_container_pve_host')
        self.history_dir = hv.get('pve_container_bench_history_dir')
        self.gpu_count = hv.get('pve_container_gpu_count')
        self._inventory = inventory
        self._ssh = self._pve_host = None

    @property
    def ssh(self):
        if self._ssh is None:
            self._ssh = Ssh(self.hv)
        return self._ssh

    @property
    def pve_host(self):
        """The Proxmox VE host: its driver, and the bench history (host-side, it outlives the container)."""
        if self._pve_host is None:
            if not self.pve_host_name:
                raise OpsError('{0}: pve_container_pve_host is not set in the inventory'.format(self.name))
            self._pve_host = connect(self._inventory.host_vars(self.pve_host_name))
        return self._pve_host

    def close(self):
        for c in (self._ssh, self._pve_host):
            if c is not None:
                c.close()

    # -- the PVE API
    def container(self):
        from proxmoxer import ProxmoxAPI

        from ansible.module_utils.pve_api import describe_error, proxmox_kwargs
        hv = self.hv
        # the pve_container role's connection variables, as its module gets them (PVE_NAMES: option -> variable)
        params = {opt: hv.get(var) for opt, var in PVE_NAMES.items()}
        params.update(api_port=int(params['api_port'] or 8006), api_user=params['api_user'] or 'root@pam',
                      validate_certs=hv.get('pve_container_api_validate_certs', True), api_timeout=15)
        url = 'https://{0}:{1}'.format(params['api_host'], params['api_port'])
        try:
            api = ProxmoxAPI(**proxmox_kwargs(params))
            cur = api.nodes(hv.get('pve_container_node')).lxc(self.vmid).status.current.get()
        except Exception as exc:  # proxmoxer raises several types; all mean "cannot ask PVE"
            return {'status': None, 'error': describe_error(exc, url, PVE_NAMES, 15, bool(params['api_token_id']))}
        return {'status': cur.get('status'), 'uptime_s': cur.get('uptime'), 'name': cur.get('name'),
                'node': hv.get('pve_container_node'), 'vmid': self.vmid, 'api': url}

    # -- inside the container
    def launch(self):
        r = self.ssh.run('cat {0}'.format(shlex.quote(self.unit)))
        if not r.ok:
            return None
        try:
            return _filter('sglang_unit_launch')(r.stdout)
        except Exception as exc:  # AnsibleFilterError: a unit this package did not write
            raise OpsError('{0}: {1} cannot be read: {2}'.format(self.name, self.unit, exc)) from None

    def unit_state(self):
        r = self.ssh.run('systemctl show {0} --timestamp=unix -p LoadState,ActiveState,SubState,Result,NRestarts,'
                         'ActiveEnterTimestamp,InactiveEnterTimestamp; date +%s'.format(shlex.quote(self.service)))
        props = dict(line.split('=', 1) for line in r.stdout.splitlines() if '=' in line)
        now = int(r.stdout.split()[-1]) if r.stdout.split() and r.stdout.split()[-1].isdigit() else None
        since = props.get('ActiveEnterTimestamp', '').lstrip('@')
        active = props.get('ActiveState') == 'active'
        return {'name': self.service, 'load': props.get('LoadState'), 'active': props.get('ActiveState'),
                'sub': props.get('SubState'), 'result': props.get('Result'),
                'restarts': int(props['NRestarts']) if props.get('NRestarts', '').isdigit() else None,
                'since': _iso(int(since)) if active and since.isdigit() else None,
                'uptime_s': (now - int(since)) if active and since.isdigit() and now else None}

    def health(self, base_url):
        r = self.ssh.run('python3 -c {0} {1}'.format(shlex.quote(HEALTH), shlex.quote(base_url)), timeout=45)
        parts = r.stdout.strip().rsplit(' ', 1)
        if not r.ok or len(parts) != 2:
            return {'ok': False, 'status': None, 'detail': (r.stderr or r.stdout).strip()[-200:]}
        code, secs = parts
        return {'ok': code == '200', 'status': int(code) if code.isdigit() else code, 'seconds': float(secs),
                'url': base_url + '/health_generate'}

    def manifest(self, launch):
        path = os.path.join(os.path.dirname(os.path.dirname(launch['python'])), 'glm5-manifest.json')
        r = self.ssh.run('cat {0}'.format(shlex.quote(path)))
        try:
            return json.loads(r.stdout) if r.ok else None
        except ValueError:
            return None

    def patch_state(self, launch, manifest):
        """The manifest's patches, each checked against its file as it is now: {name, applied, validated_on_hardware,
        state}, state 'applied' / 'not applied' as the manifest says, or 'drifted' when the file's sha256 is not the
        one the manifest recorded (an edited or reinstalled file: what runs is not what was deployed)."""
        patches = manifest.get('patches') or []
        site = os.path.join(os.path.dirname(os.path.dirname(launch['python'])), 'lib',
                            'python{0}'.format(manifest.get('python')), 'site-packages')
        paths = [os.path.join(site, p.get('target') or '') for p in patches]
        found = {}
        if paths:
            r = self.ssh.run('sha256sum -- {0}'.format(' '.join(map(shlex.quote, paths))))
            for line in r.stdout.splitlines():                    # sha256sum: "<sha256>  <path>"
                digest, _, path = line.partition('  ')
                found[path] = digest
        out = []
        for p, path in zip(patches, paths, strict=True):
            now = found.get(path)
            state = ('applied' if p.get('applied') else 'not applied') if now and now == p.get('sha256') else 'drifted'
            out.append({'name': p.get('name'), 'applied': p.get('applied'), 'state': state, 'file': path,
                        'sha256': now, 'sha256_deployed': p.get('sha256'),
                        'validated_on_hardware': p.get('validated_on_hardware')})
        return out

    def gpus(self):
        """The container's nvidia-smi: {driver, cuda, gpus: [{index, name, utilisation, power, ...}]}."""
        from ansible.module_utils.nvidia_facts import QUERY_ARGS, SAMPLE_ARGS, NvidiaParseError, parse_query_csv, parse_sample_csv
        smi = shlex.quote(self.nvidia_smi)
        r = self.ssh.run('{0} {1} && echo ---- && {0} {2} && echo ---- && {0} --version'.format(
            smi, ' '.join(map(shlex.quote, QUERY_ARGS)), ' '.join(map(shlex.quote, SAMPLE_ARGS))))
        if not r.ok:
            return {'error': 'nvidia-smi in the container failed: {0}'.format(
                ((r.stderr or r.stdout).strip().splitlines() or ['exit {0}'.format(r.exited)])[-1])}
        query, sample, banner = (r.stdout.split('----\n') + ['', ''])[:3]
        try:
            facts, load = parse_query_csv(query), {g['index']: g for g in parse_sample_csv(sample)}
        except NvidiaParseError as exc:
            return {'error': 'nvidia-smi in the container: {0}'.format(exc)}
        cuda = re.search(r'CUDA Version\s*:\s*([\d.]+)', banner)
        gpus = [dict(load.get(g['index'], {}), index=g['index'], name=g['name'], pci_bus_id=g['pci_bus_id'])
                for g in facts]
        return {'driver': facts[0]['driver_version'] if facts else None, 'cuda': cuda.group(1) if cuda else None,
                'gpus': gpus}

    def host_driver(self):
        """The PVE host's kernel module (what the container's userspace must match)."""
        from ansible.module_utils.nvidia_facts import NvidiaParseError, parse_proc_version
        h = self.pve_host
        proc = h.hv.get('gpu_preflight_proc_root', '/proc')
        r = h.run('cat {0}'.format(shlex.quote(os.path.join(proc, 'driver', 'nvidia', 'version'))))
        if not r.ok:
            return {'version': None, 'error': 'no NVIDIA kernel module on {0} ({1})'.format(h.name, r.stderr.strip())}
        try:
            v = parse_proc_version(r.stdout)
        except NvidiaParseError as exc:
            return {'version': None, 'error': str(exc)}
        return {'version': v['version'], 'open': v['open']}

    # -- the bench history (on the PVE host)
    def _history_path(self, *parts):
        if not self.history_dir:
            raise OpsError('{0}: pve_container_bench_history_dir is not set in the inventory'.format(self.name))
        return os.path.join(self.history_dir, *parts)

    def history(self):
        from ansible.module_utils.glm5_smoke import parse_jsonl
        path = self._history_path('index.jsonl')
        r = self.pve_host.run('cat {0}'.format(shlex.quote(path)))
        if not r.ok:
            return []
        try:   # read as the smoke test's report module reads it
            entries = parse_jsonl(r.stdout)
        except ValueError as exc:
            raise OpsError('{0}: {1}: {2}'.format(self.name, path, exc)) from None
        return [e for e in entries if e.get('node') == self.name]

    def summary(self, run):
        r = self.pve_host.run('cat {0}'.format(shlex.quote(self._history_path(run, 'summary.json'))))
        if not r.ok:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            raise OpsError('{0}: {1} is not JSON'.format(self.name, self._history_path(run, 'summary.json'))) from None

    # -- the engine's lock (sglang_service's tasks/lock.yml: the transient unit <service>-lock)
    def lock(self, what):
        """Hold the engine's lock, as a deploy or a smoke test does, or say who holds it."""
        unit = self.service + '-lock'
        since = datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')
        desc = '{0} from {1}@{2} pid {3} since {4}'.format(what, getpass.getuser(), socket.gethostname(), os.getpid(),
                                                          since)
        r = self.ssh.run('systemd-run --unit={0} --collect --quiet --description={1} --property=RuntimeMaxSec={2} '
                         'sleep infinity'.format(shlex.quote(unit), shlex.quote(desc),
                                                 int(self.hv.get('sglang_service_lock_max') or 14400)))
        if r.ok:
            self._locked = unit
            return
        holder = self.ssh.run('systemctl show -p Description --value {0}'.format(shlex.quote(unit)))
        raise OpsError('{0}: another run drives the engine: {1} is held by "{2}"; try again when it is done (if that '
                       'run is gone: systemctl stop {1} in the container)'.format(
                           self.name, unit, holder.stdout.strip() if holder.ok else r.stderr.strip()))

    def unlock(self):
        if getattr(self, '_locked', None):
            self.ssh.run('systemctl stop {0}'.format(shlex.quote(self._locked)))
            self._locked = None

    def run_folders(self):
        r = self.pve_host.run('ls -1 {0}'.format(shlex.quote(self._history_path())))
        return set(x for x in r.stdout.split() if x.endswith('-' + self.name)) if r.ok else set()


def _iso(epoch):
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime('%Y-%m-%d %H:%M:%S UTC')


def _ago(seconds):
    if seconds is None:
        return '?'
    seconds = int(seconds)
    d, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return ' '.join(x for x in ('{0}d'.format(d) if d else '', '{0}h'.format(h) if h or d else '',
                                '{0}m'.format(m) if not d else '', '{0}s'.format(s) if not (d or h) else '') if x)


def _num(value, digits=1):
    if value is None:
        return '-'
    if isinstance(value, float):
        return '{0:,.{1}f}'.format(value, digits)
    return '{0:,}'.format(value) if isinstance(value, int) else str(value)


# ---------------------------------------------------------------- status
def node_status(node):
    """Everything `status` shows for one node, and what is wrong with it (problems)."""
    st = {'node': node.name, 'problems': []}
    problems = st['problems']
    st['container'] = node.container()
    c = st['container']
    if c.get('error'):
        problems.append('PVE API: ' + c['error'])
    elif c['status'] != 'running':
        problems.append('container {0} is {1}'.format(node.vmid, c['status']))
    try:
        host = node.host_driver()
    except OpsError as exc:
        host = {'version': None, 'error': str(exc)}
    st['drivers'] = {'host_kernel_module': host}
    try:
        history = node.history()
    except OpsError as exc:
        history, st['last_smoke'] = [], {'error': str(exc)}
    if history:
        e = history[-1]
        st['last_smoke'] = {k: e.get(k) for k in ('run', 'started', 'passed', 'reasons', 'rolled_back', 'flags_sha256',
                                                  'headline_concurrency', 'headline_total_tok_s',
                                                  'headline_output_tok_s')}
    elif 'last_smoke' not in st:
        st['last_smoke'] = None
    try:
        st['ssh'] = node.ssh.where
        _inside(node, st, host)
    except OpsError as exc:
        problems.append(str(exc).split(': ', 1)[1])
    if host.get('error'):
        problems.append(host['error'])
    last = st.get('last_smoke') or {}
    if last.get('error'):
        problems.append(last['error'])
    elif not last:
        problems.append('no smoke test run in the bench history')
    elif not last.get('passed'):
        problems.append('the last smoke test {0} FAILED: {1}'.format(last['run'], '; '.join(last.get('reasons') or [])))
    return st


def _inside(node, st, host):
    """status's part from inside the container (over SSH): unit, health, what runs, GPUs, the driver match."""
    problems = st['problems']
    node.ssh._open()
    st['unit'] = node.unit_state()
    u = st['unit']
    if u['load'] != 'loaded':
        problems.append('unit {0} is not installed ({1})'.format(node.service, u['load']))
    elif u['active'] != 'active':
        problems.append('unit {0} is {1} ({2}{3})'.format(node.service, u['active'], u['sub'],
                                                           ', result ' + u['result'] if u['result'] not in
                                                           (None, 'success') else ''))
    launch = node.launch()
    if launch:
        st['health'] = node.health(launch['base_url'])
        h = st['health']
        if not h['ok']:
            problems.append('{0}/health_generate answered {1}'.format(launch['base_url'], h.get('status') or
                                                                      h.get('detail') or 'nothing'))
        manifest = node.manifest(launch) or {}
        st['sglang'] = {'version': manifest.get('sglang'), 'profile': manifest.get('profile'),
                        'flags_sha256': launch['flags_sha256'], 'url': launch['base_url'],
                        'served_model_name': launch['served_model_name'], 'model_path': launch['model_path'],
                        'patches': node.patch_state(launch, manifest) if manifest else []}
        if not manifest:
            problems.append('no SGLang environment manifest next to {0}'.format(launch['python']))
        for p in st['sglang']['patches']:
            if p['state'] == 'drifted':
                problems.append('patch {0}: {1} has sha256 {2}, the deploy left {3}: deploy again (site.yml --tags '
                                'sglang) to restore it'.format(p['name'], p['file'], p['sha256'] or '(no such file)',
                                                               p['sha256_deployed']))
        last = st.get('last_smoke') or {}
        if last.get('flags_sha256') and last['flags_sha256'] != launch['flags_sha256']:
            st['last_smoke']['other_flags'] = True
    else:
        st['health'] = st['sglang'] = None
        problems.append('no unit {0} in the container'.format(node.unit))
    gpus = node.gpus()
    st['gpus'] = gpus.get('gpus')
    st['drivers']['container_userspace'] = {'version': gpus.get('driver'), 'cuda': gpus.get('cuda')}
    if gpus.get('error'):
        problems.append(gpus['error'])
    elif node.gpu_count is not None and len(gpus['gpus']) != int(node.gpu_count):
        problems.append('{0} GPUs visible, the inventory says {1} (pve_container_gpu_count)'.format(
            len(gpus['gpus']), node.gpu_count))
    if host.get('version') and gpus.get('driver') and host['version'] != gpus['driver']:
        problems.append('driver mismatch: host kernel module {0}, container userspace {1}'.format(
            host['version'], gpus['driver']))


def gpu_table(gpus):
    rows = [('GPU', 'name', 'util %', 'power W / limit', 'memory MiB', 'temp C', 'SM MHz')]
    for g in gpus or []:
        rows.append((str(g['index']), (g.get('name') or '').replace('NVIDIA ', ''), _num(g.get('utilization_gpu_pct'), 0),
                     '{0} / {1}'.format(_num(g.get('power_draw_w')), _num(g.get('power_limit_w'), 0)),
                     '{0} / {1}'.format(_num(g.get('memory_used_mib'), 0), _num(g.get('memory_total_mib'), 0)),
                     _num(g.get('temperature_c'), 0), _num(g.get('clocks_sm_mhz'), 0)))
    return _table(rows)


def _table(rows, right=None):
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, r in enumerate(rows):
        out.append('  '.join((str(v).ljust(w) if i == 0 or (right is not None and i not in right) else str(v).rjust(w))
                             if n else str(v).ljust(w) for i, (v, w) in enumerate(zip(r, widths, strict=True))).rstrip())
    return '\n'.join(out)


def status_text(st):
    lines = ['{0}: {1}'.format(st['node'], 'HEALTHY' if not st['problems'] else 'UNHEALTHY')]
    c = st['container']
    lines.append('  container   ' + ('CT {0} on {1}: {2}{3}'.format(c['vmid'], c['node'], c['status'],
                                                                    ', up ' + _ago(c['uptime_s'])
                                                                    if c['status'] == 'running' else '')
                                     if not c.get('error') else 'unknown (' + c['error'] + ')'))
    u = st.get('unit')
    if u:
        lines.append('  unit        {0} {1} ({2}){3}, {4} restarts'.format(
            u['name'], u['active'], u['sub'], ' since {0}, up {1}'.format(u['since'], _ago(u['uptime_s']))
            if u['since'] else '', u['restarts']))
    h = st.get('health')
    if h:
        lines.append('  health      /health_generate {0}{1}'.format(
            h.get('status') or h.get('detail'), ' in {0} s'.format(h['seconds']) if h.get('seconds') is not None else ''))
    s = st.get('sglang')
    if s:
        lines.append('  sglang      {0}, profile {1}, flags {2}, {3} as {4}'.format(
            s['version'], s['profile'], s['flags_sha256'][:12], s['url'], s['served_model_name']))
        lines.append('  patches     ' + (', '.join('{0} ({1})'.format(p['name'], p['state']) for p in s['patches'])
                                         or 'none'))
    d = st.get('drivers') or {}
    hk, cu = d.get('host_kernel_module') or {}, d.get('container_userspace')
    lines.append('  driver      host kernel module {0}{1} | container userspace {2}'.format(
        hk.get('version') or '?', ' (open)' if hk.get('open') else '',
        '{0} (CUDA {1})'.format(cu['version'], cu['cuda']) if cu and cu.get('version') else '?'))
    last = st.get('last_smoke')
    if last and not last.get('error'):
        lines.append('  last smoke  {0} {1}{2}{3}'.format(
            last['run'], 'PASSED' if last['passed'] else 'FAILED',
            ', {0} total tok/s ({1} output) at concurrency {2}'.format(
                _num(last['headline_total_tok_s']), _num(last['headline_output_tok_s']), last['headline_concurrency'])
            if last.get('headline_total_tok_s') is not None else '',
            (' (rolled back)' if last.get('rolled_back') else '') +
            (' (another flag set than the running one)' if last.get('other_flags') else '')))
    if st.get('gpus'):
        lines.append('')
        lines.extend('  ' + x for x in gpu_table(st['gpus']).splitlines())
    for p in st['problems']:
        lines.append('  PROBLEM: ' + p)
    return '\n'.join(lines)


def cmd_status(args, inv):
    results = []
    for name in inv.select(args.node):
        node = Node(inv, name)
        try:
            results.append(node_status(node))
        finally:
            node.close()
    if args.json:
        print(json.dumps({'healthy': not any(r['problems'] for r in results), 'nodes': results}, indent=1))
    else:
        print('\n\n'.join(status_text(r) for r in results))
    return 1 if any(r['problems'] for r in results) else 0


# ---------------------------------------------------------------- gpus
def cmd_gpus(args, inv):
    names = inv.select(args.node)
    nodes = [Node(inv, n) for n in names]
    n = 0
    try:
        while True:
            shown = []
            for node in nodes:
                g = node.gpus()
                if g.get('error'):
                    raise OpsError('{0}: {1}'.format(node.name, g['error']))
                shown.append({'node': node.name, 'time': _iso(time.time()), 'driver': g['driver'], 'cuda': g['cuda'],
                              'gpus': g['gpus']})
            if args.json:
                print(json.dumps(shown if args.watch else {'nodes': shown}), flush=True)
            else:
                if args.watch and sys.stdout.isatty():
                    sys.stdout.write('\x1b[H\x1b[2J')
                for s in shown:
                    print('{0}  {1}  driver {2}, CUDA {3}\n{4}\n'.format(s['node'], s['time'], s['driver'], s['cuda'],
                                                                        gpu_table(s['gpus'])), flush=True)
            n += 1
            if not args.watch or (args.count and n >= args.count):
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
    finally:
        for node in nodes:
            node.close()


# ---------------------------------------------------------------- logs
def cmd_logs(args, inv):
    node = Node(inv, inv.one(args.node))
    cmd = ['journalctl', '-u', node.service, '--no-pager', '-o', 'json' if args.json else 'short-iso']
    if args.since:
        cmd += ['--since', args.since]
    if args.follow:
        cmd += ['-n', str(args.lines), '-f']
    # journalctl's -n with --since gives the window's oldest lines: the newest are the last lines of the whole window
    line = ' '.join(map(shlex.quote, cmd))
    if args.since and not args.follow:
        line = 'set -o pipefail; {0} | tail -n {1}'.format(line, args.lines)
    elif not args.follow:
        line += ' -n {0}'.format(args.lines)
    try:
        r = node.ssh.run('bash -c {0}'.format(shlex.quote(line)), timeout=None if args.follow else 120,
                         stream='out', pty=args.follow)
    except KeyboardInterrupt:
        return 0
    finally:
        node.close()
    if args.follow and r.exited in (-1, 130):  # Ctrl-C: the far side's journalctl ended by it
        return 0
    if not r.ok:
        said = (r.stderr.strip().splitlines() or ['exit {0}'.format(r.exited)])[-1]
        # a --since journalctl cannot read is bad input (exit 2), as the README says
        error = UsageError if 'Failed to parse' in said else OpsError
        raise error('{0}: journalctl: {1}'.format(node.name, said))
    return 0


# ---------------------------------------------------------------- bench
def _levels(text):
    try:
        levels = [int(x) for x in text.split(',') if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError('--levels takes concurrency levels like 1,64,256, not {0!r}'.format(text)) from None
    if not levels or any(x < 1 for x in levels) or levels != sorted(set(levels)):
        raise argparse.ArgumentTypeError('--levels must be ascending, distinct and >= 1, got {0!r}'.format(text))
    return levels


def _number(kind, least, what):
    """An argparse type: a number of that kind, at least `least`."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError('{0} must be a number >= {1}, not {2!r}'.format(what, least, text))
        return value
    return parse


def _lengths(text):
    m = re.match(r'^\s*(\d+)\s*/\s*(\d+)\s*$', text)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise argparse.ArgumentTypeError('--lengths takes INPUT/OUTPUT tokens like 256/128, not {0!r}'.format(text))
    return int(m.group(1)), int(m.group(2))


TQDM = re.compile(r'(\d+)/(\d+) \[')


class Progress(object):
    """A bar per level from bench_serving's own progress bar in the level's log (the run folder)."""
    def __init__(self, node, levels, prompts, out, run):
        self.node, self.levels, self.prompts, self.out = node, levels, prompts, out
        self.run, self.started, self.done, self.tty = run, False, set(), out.isatty()
        self.t0, self.level_t0 = time.monotonic(), {}

    def _count(self, level):
        # the last 'done/total [' of tqdm's bar in the log (the bar's own characters are not UTF-8 safe to cut)
        log = shlex.quote(self.node._history_path(self.run, 'bench-c{0}.log'.format(level)))
        r = self.node.pve_host.run('test -e {0} && {{ LC_ALL=C tr -cd "0-9/[ \\r\\n" < {0} | tr "\\r" "\\n" | '
                                   'grep -o "[0-9]*/[0-9]* \\[" | tail -n 1; }}'.format(log))
        if not r.ok:
            return None
        found = TQDM.findall(r.stdout)
        return (int(found[-1][0]), int(found[-1][1])) if found else (0, self.prompts[level])

    def _bar(self, level, count, final=False):
        total = self.prompts[level]
        done = count[0] if count else 0
        width = 30
        fill = int(width * done / total) if total else 0
        secs = time.monotonic() - self.level_t0.get(level, self.t0)
        return 'concurrency {0:>5} [{1}{2}] {3:>6}/{4:<6} {5:>5.0f} s{6}'.format(
            level, '#' * fill, '.' * (width - fill), done, total, secs,
            '' if not final or done == total else '  (incomplete)')

    def poll(self, finished=False):
        if not self.started:              # its folder not there yet: it may wait for the engine's lock
            self.started = self.run in self.node.run_folders()
            if not self.started:
                return
        counts = {}
        for lv in self.levels:          # the levels run in order: one that has not started, nor have the later ones
            if lv in self.done:
                continue
            count = self._count(lv)
            if count is None:
                break
            counts[lv] = count
        started = list(counts)
        for n, lv in enumerate(started):
            self.level_t0.setdefault(lv, time.monotonic())
            if finished or n < len(started) - 1:
                self.done.add(lv)
                self.out.write(('\r' if self.tty else '') + self._bar(lv, counts[lv], final=True) + '\n')
            elif self.tty:
                self.out.write('\r' + self._bar(lv, counts[lv]))
            self.out.flush()


def cmd_bench(args, inv):
    name = inv.one(args.node)
    node = Node(inv, name)
    hv = node.hv
    levels = args.levels or hv.get('sglang_smoke_levels')
    # its own run id: another run beside it (a deploy, a second operator) makes a folder of its own
    run_id = '{0}-{1}-{2}'.format(time.strftime('%Y%m%dT%H%M%SZ', time.gmtime()), secrets.token_hex(4), name)
    extra = {'sglang_smoke_levels': levels, 'sglang_smoke_run_id': run_id}
    note = None
    if args.lengths:
        extra['sglang_smoke_input_len'], extra['sglang_smoke_output_len'] = args.lengths
        if list(args.lengths) != [hv.get('sglang_smoke_input_len'), hv.get('sglang_smoke_output_len')]:
            # the baseline and limits are for the deployment's lengths: other lengths are measured, not gated
            extra.update(sglang_smoke_baseline={}, sglang_smoke_limits={})
            note = ('lengths {0}/{1} are not the baseline\'s ({2}/{3}): gated on failed requests and the probe '
                    'only'.format(args.lengths[0], args.lengths[1], hv.get('sglang_smoke_input_len'),
                                  hv.get('sglang_smoke_output_len')))
    launch = node.launch()
    if launch is None:
        raise OpsError('{0}: no unit {1} in the container: deploy it first (site.yml)'.format(name, node.unit))
    health = node.health(launch['base_url'])
    if not health['ok']:
        raise OpsError('{0}: {1} is not ready ({2}/health_generate: {3}): glm5 status says more'.format(
            name, node.service, launch['base_url'], health.get('status') or health.get('detail')))
    per, least = int(hv.get('sglang_smoke_prompts_per_concurrency')), int(hv.get('sglang_smoke_min_prompts'))
    prompts = {lv: max(least, per * lv) for lv in levels}
    env = dict(os.environ, ANSIBLE_CONFIG=ANSIBLE_CFG, ANSIBLE_STDOUT_CALLBACK='ansible.posix.json',
               ANSIBLE_NOCOLOR='1', ANSIBLE_LOAD_CALLBACK_PLUGINS='1')
    env['PATH'] = os.path.dirname(sys.executable) + os.pathsep + env.get('PATH', '')
    cmd = [os.path.join(os.path.dirname(sys.executable), 'ansible-playbook'), BENCH_PLAYBOOK, '-i', inv.source,
           '-l', name, '-e', json.dumps(extra)]
    for path in inv.vault_password_files:
        cmd += ['--vault-password-file', path]
    if inv.ask_vault_pass:
        cmd.append('--ask-vault-pass')      # it asks on the terminal (/dev/tty) again: its output goes to a log
    progress = Progress(node, levels, prompts, sys.stderr if args.json else sys.stdout, run_id)
    if not args.json:
        print('{0}: the smoke test on demand, concurrency {1}{2}'.format(name, ', '.join(map(str, levels)),
                                                                        ' (' + note + ')' if note else ''), flush=True)
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
        output = log.read()
    run = progress.run
    summary = node.summary(run)
    node.close()
    if summary is None:
        raise OpsError('{0}: the bench playbook ended (exit {1}) without a report: {2}'.format(
            name, proc.returncode, _playbook_error(output)))
    folder = '{0}:{1}'.format(node.pve_host_name, node._history_path(run))
    if args.json:
        print(json.dumps({'run': run, 'folder': folder, 'passed': summary['passed'], 'reasons': summary['reasons'],
                          'note': note, 'summary': summary}, indent=1))
    else:
        from ansible.module_utils.glm5_smoke import markdown
        print('\n' + markdown(summary).rstrip() + '\nReport: {0}/report.md'.format(folder))
    return 0 if summary['passed'] else 1


def _playbook_error(output):
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


# ---------------------------------------------------------------- history and compare
def cmd_history(args, inv):
    from ansible.module_utils.glm5_smoke import entry_note
    node = Node(inv, inv.one(args.node))
    try:
        entries = node.history()
    finally:
        node.close()
    if args.json:
        print(json.dumps({'node': node.name, 'folder': '{0}:{1}'.format(node.pve_host_name, node.history_dir),
                          'runs': entries}, indent=1))
        return 0
    if not entries:
        print('{0}: no runs in {1}:{2}'.format(node.name, node.pve_host_name, node.history_dir))
        return 0
    rows = [('run', 'verdict', 'sglang', 'profile', 'flags', 'levels', 'headline total tok/s', 'output tok/s', 'note')]
    for e in entries:
        note = entry_note(e, 70)
        rows.append((e['run'], 'pass' if e.get('passed') else 'FAIL', e.get('sglang') or '', e.get('profile') or '',
                     (e.get('flags_sha256') or '')[:12], ','.join(sorted(e.get('levels') or {}, key=int)),
                     '{0} @{1}'.format(_num(e.get('headline_total_tok_s')), e.get('headline_concurrency'))
                     if e.get('headline_total_tok_s') is not None else '-', _num(e.get('headline_output_tok_s')), note))
    print('{0}: {1} runs in {2}:{3}\n{4}'.format(node.name, len(entries), node.pve_host_name, node.history_dir,
                                                 _table(rows, right={6, 7})))
    return 0


def cmd_compare(args, inv):
    from ansible.module_utils.glm5_smoke import compare, compare_markdown, plot_compare
    node = Node(inv, inv.one(args.node))
    try:
        runs = [e['run'] for e in node.history()]
        if len(args.runs) > 2:
            raise UsageError('compare takes at most two runs, got {0}'.format(len(args.runs)))
        if len(args.runs) == 2:
            wanted = list(args.runs)
        elif len(args.runs) == 1:
            if len(runs) < 1:
                raise UsageError('{0}: no runs in the bench history'.format(node.name))
            wanted = [args.runs[0], runs[-1]]
        else:
            if len(runs) < 2:
                raise UsageError('{0}: {1} run(s) in the bench history, compare needs two (glm5 bench makes one)'.format(
                    node.name, len(runs)))
            wanted = runs[-2:]
        resolved = [_resolve(r, runs, node) for r in wanted]
        if resolved[0] == resolved[1]:
            raise UsageError('{0}: both runs are {1}: name two runs'.format(node.name, resolved[0]))
        a, b = (node.summary(r) for r in resolved)
    finally:
        node.close()
    for r, s in zip(resolved, (a, b), strict=True):
        if s is None:
            raise OpsError('{0}: run {1} has no summary.json in {2}'.format(node.name, r, node._history_path(r)))
    a, b = sorted((a, b), key=lambda s: (s.get('started') or '', s['run']))
    cmp = compare(a, b)
    out = args.out or os.path.abspath('glm5-compare-{0}-vs-{1}.png'.format(a['run'], b['run']))
    plot_compare(a, b, out)
    cmp['plot'] = out
    if args.json:
        print(json.dumps(cmp, indent=1))
    else:
        print(compare_markdown(cmp).rstrip() + '\nPlot: {0}'.format(out))
    return 0


def _resolve(wanted, runs, node):
    """A run by its full name or a unique prefix (e.g. the timestamp)."""
    if wanted in runs:
        return wanted
    found = [r for r in runs if r.startswith(wanted)]
    if len(found) == 1:
        return found[0]
    if found:
        raise UsageError('{0}: {1!r} matches {2} runs ({3}): give more of it'.format(
            node.name, wanted, len(found), ', '.join(found[:4])))
    raise UsageError('{0}: no run {1!r} in {2}:{3} (glm5 history lists them)'.format(
        node.name, wanted, node.pve_host_name, node.history_dir))


# ---------------------------------------------------------------- restart
def cmd_restart(args, inv):
    node = Node(inv, inv.one(args.node))
    try:
        launch = node.launch()
        if launch is None:
            raise OpsError('{0}: no unit {1} in the container'.format(node.name, node.unit))
        timeout = args.timeout or int(node.hv.get('sglang_service_ready_timeout'))
        stop_timeout = int(node.hv.get('sglang_service_stop_timeout')) + 60
        say = (lambda text: None) if args.json else (lambda text: print(text, flush=True))
        node.lock('glm5 restart')
        say('{0}: stopping {1} (running requests drain first, up to {2} s)'.format(node.name, node.service,
                                                                                   stop_timeout - 60))
        t0 = time.monotonic()
        r = node.ssh.run('systemctl stop {0}'.format(shlex.quote(node.service)), timeout=stop_timeout)
        stopped = round(time.monotonic() - t0, 1)
        if not r.ok:
            raise OpsError('{0}: systemctl stop {1}: {2}'.format(node.name, node.service, r.stderr.strip() or r.exited))
        say('{0}: stopped after {1} s; starting'.format(node.name, stopped))
        # an operator's restart is not a crash loop: the unit's start limit (StartLimitBurst) is reset first
        r = node.ssh.run('systemctl reset-failed {0}; systemctl start {0}'.format(shlex.quote(node.service)),
                         timeout=120)
        if not r.ok:
            raise OpsError('{0}: systemctl start {1}: {2}'.format(node.name, node.service, r.stderr.strip() or r.exited))
        t1 = time.monotonic()
        health = None
        while time.monotonic() - t1 < timeout:
            health = node.health(launch['base_url'])
            if health['ok']:
                break
            if node.unit_state()['active'] in ('failed', 'inactive'):
                break
            time.sleep(2)
        ready = round(time.monotonic() - t1, 1)
        unit = node.unit_state()
    finally:
        node.unlock()
        node.close()
    ok = bool(health and health['ok'])
    if args.json:
        print(json.dumps({'node': node.name, 'service': node.service, 'stopped_after_s': stopped, 'ready': ok,
                          'ready_after_s': ready if ok else None, 'unit': unit, 'health': health}, indent=1))
    elif ok:
        print('{0}: {1} ready after {2} s ({3}/health_generate 200)'.format(node.name, node.service, ready,
                                                                           launch['base_url']))
    if not ok:
        raise OpsError('{0}: {1} is not ready after {2} s: unit {3} ({4}), /health_generate {5} (glm5 logs -n {0})'.format(
            node.name, node.service, ready, unit['active'], unit['sub'],
            (health or {}).get('status') or (health or {}).get('detail')))
    return 0


# ---------------------------------------------------------------- the command line
def parser():
    def options(suppress):
        # before or after the subcommand alike; after it, only what is given overrides what came before
        common = argparse.ArgumentParser(add_help=False)
        default = (lambda value: argparse.SUPPRESS) if suppress else (lambda value: value)
        common.add_argument('-i', '--inventory', default=default(DEFAULT_INVENTORY),
                            help='the Ansible inventory (default: the lab, {0})'.format(DEFAULT_INVENTORY))
        common.add_argument('-n', '--node', default=default(None),
                            help='one host of inference_nodes (default: all, or the only one)')
        common.add_argument('--json', action='store_true', default=default(False), help='JSON instead of tables')
        common.add_argument('--vault-password-file', action='append', default=default([]), metavar='FILE',
                            help="for an inventory with vaulted secrets, as ansible-playbook's")
        common.add_argument('--ask-vault-pass', action='store_true', default=default(False),
                            help='ask for the vault password')
        return common

    common = options(True)
    p = argparse.ArgumentParser(prog='glm5', description=__doc__.splitlines()[0], parents=[options(False)],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog='\n'.join(__doc__.splitlines()[2:]))
    sub = p.add_subparsers(dest='command', metavar='COMMAND', required=True)
    sub.add_parser('status', parents=[common], help='one screen per node; exit 1 when anything is wrong')
    g = sub.add_parser('gpus', parents=[common], help='the per-GPU table')
    g.add_argument('--watch', action='store_true', help='refresh until Ctrl-C')
    g.add_argument('--interval', type=_number(float, 0.1, '--interval'), default=2.0,
                   help='seconds between refreshes (default %(default)s)')
    g.add_argument('--count', type=_number(int, 0, '--count'), default=0,
                   help='with --watch: stop after this many tables (0: until Ctrl-C)')
    lg = sub.add_parser('logs', parents=[common], help="the unit's journal")
    lg.add_argument('-f', '--follow', action='store_true', help='keep following (Ctrl-C ends)')
    lg.add_argument('--since', help='journalctl --since: "1 hour ago", "2026-11-30 12:00", today, or --since=-1h')
    lg.add_argument('--lines', type=_number(int, 1, '--lines'), default=100,
                    help='how many of the newest lines (default %(default)s)')
    b = sub.add_parser('bench', parents=[common], help="the smoke test's sweep on demand")
    b.add_argument('--levels', type=_levels, help='concurrency levels, e.g. 1,64,256 (default: the inventory\'s)')
    b.add_argument('--lengths', type=_lengths, help='INPUT/OUTPUT tokens, e.g. 1024/256 (default: the inventory\'s)')
    sub.add_parser('history', parents=[common], help='the runs in the bench history')
    c = sub.add_parser('compare', parents=[common], help='two runs side by side (default: the last two)')
    c.add_argument('runs', nargs='*', metavar='RUN', help='a run (its folder name, or a unique prefix)')
    c.add_argument('--out', help='where the plot goes (default: ./glm5-compare-A-vs-B.png)')
    r = sub.add_parser('restart', parents=[common], help='graceful restart: drain, stop, start, ready')
    r.add_argument('--timeout', type=int, help='seconds to wait for readiness (default: sglang_service_ready_timeout)')
    return p


COMMANDS = {'status': cmd_status, 'gpus': cmd_gpus, 'logs': cmd_logs, 'bench': cmd_bench, 'history': cmd_history,
            'compare': cmd_compare, 'restart': cmd_restart}


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        inv = Inventory(os.path.abspath(args.inventory), args.vault_password_file, args.ask_vault_pass)
        return COMMANDS[args.command](args, inv)
    except OpsError as exc:
        print('glm5: {0}'.format(exc), file=sys.stderr)
        return exc.code
    except BrokenPipeError:             # glm5 status | head: the reader has gone, nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (OSError, EOFError) as exc:
        print('glm5: {0}'.format(exc), file=sys.stderr)
        return 1


if __name__ == '__main__':
    sys.exit(main())
