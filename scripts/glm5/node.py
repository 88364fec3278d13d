"""One inference node: its container on the PVE API, what runs inside it (over SSH), its GPUs, its bench history
(on the PVE host), and the engine's lock."""
from __future__ import annotations

import datetime
import getpass
import json
import os
import re
import shlex
import socket

from glm5.contract import LOCK_DESCRIPTION, MANIFEST
from glm5.errors import OpsError
from glm5.inventory import filter_plugin
from glm5.render import iso
from glm5.transport import Ssh, connect

PVE_NAMES = {'api_host': 'pve_container_api_host', 'api_port': 'pve_container_api_port',
             'api_user': 'pve_container_api_user', 'api_password': 'pve_container_api_password',
             'api_token_id': 'pve_container_api_token_id', 'api_token_secret': 'pve_container_api_token_secret',
             'ca_file': 'pve_container_api_ca_file'}
# The readiness URL (argv[1]: the unit's URL + the contract's ready_path) asked from inside the container (the API
# need not be reachable from the controller)
HEALTH = ('import sys, time, urllib.request, urllib.error\n'
          't = time.monotonic()\n'
          'try:\n'
          '    code = urllib.request.urlopen(sys.argv[1], timeout=30).status\n'
          'except urllib.error.HTTPError as e:\n'
          '    code = e.code\n'
          'except Exception as e:\n'
          '    code = type(e).__name__ + ": " + str(getattr(e, "reason", e))\n'
          'print(code, round(time.monotonic() - t, 2))\n')


class Node(object):
    def __init__(self, inventory, name):
        self.name = name
        self.hv = inventory.host_vars(name)
        hv = self.hv
        # what the roles build, as sglang_service defines it (glm5.inventory: Inventory.contract)
        self.contract = inventory.contract(name, self.hv)
        self.service = self.contract['service']
        self.unit = self.contract['unit']
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
            return filter_plugin('sglang_unit_launch')(r.stdout)
        except Exception as exc:  # AnsibleFilterError: a unit this package did not write
            raise OpsError('{0}: {1} cannot be read: {2}'.format(self.name, self.unit, exc)) from None

    def unit_state(self):
        return unit_state(self.ssh, self.service)

    def health(self, base_url):
        url = base_url + self.contract['ready_path']
        r = self.ssh.run('python3 -c {0} {1}'.format(shlex.quote(HEALTH), shlex.quote(url)), timeout=45)
        parts = r.stdout.strip().rsplit(' ', 1)
        if not r.ok or len(parts) != 2:
            return {'ok': False, 'status': None, 'detail': (r.stderr or r.stdout).strip()[-200:], 'url': url}
        code, secs = parts
        return {'ok': code == '200', 'status': int(code) if code.isdigit() else code, 'seconds': float(secs),
                'url': url}

    def manifest(self, launch):
        path = os.path.join(os.path.dirname(os.path.dirname(launch['python'])), MANIFEST)
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
    def history_path(self, *parts):
        if not self.history_dir:
            raise OpsError('{0}: pve_container_bench_history_dir is not set in the inventory'.format(self.name))
        return os.path.join(self.history_dir, *parts)

    def history(self):
        from ansible.module_utils.glm5_results import parse_jsonl
        path = self.history_path('index.jsonl')
        r = self.pve_host.run('cat {0}'.format(shlex.quote(path)))
        if not r.ok:
            return []
        try:   # read as the smoke test's report module reads it
            entries = parse_jsonl(r.stdout)
        except ValueError as exc:
            raise OpsError('{0}: {1}: {2}'.format(self.name, path, exc)) from None
        return [e for e in entries if e.get('node') == self.name]

    def summary(self, run):
        r = self.pve_host.run('cat {0}'.format(shlex.quote(self.history_path(run, 'summary.json'))))
        if not r.ok:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            raise OpsError('{0}: {1} is not JSON'.format(self.name, self.history_path(run, 'summary.json'))) from None

    # -- the engine's lock (sglang_service's tasks/lock.yml: the transient unit <service>-lock)
    def lock(self, what):
        """Hold the engine's lock, as a deploy or a smoke test does, or say who holds it."""
        unit = self.contract['lock_unit']
        since = datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')
        desc = LOCK_DESCRIPTION.format(what=what, user=getpass.getuser(), host=socket.gethostname(), pid=os.getpid(),
                                       since=since)
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
        r = self.pve_host.run('ls -1 {0}'.format(shlex.quote(self.history_path())))
        return set(x for x in r.stdout.split() if x.endswith('-' + self.name)) if r.ok else set()


def unit_state(shell, service):
    """A systemd unit's state in a container (a node's engine, a gateway)."""
    r = shell.run('systemctl show {0} --timestamp=unix -p LoadState,ActiveState,SubState,Result,NRestarts,'
                  'ActiveEnterTimestamp,InactiveEnterTimestamp; date +%s'.format(shlex.quote(service)))
    props = dict(line.split('=', 1) for line in r.stdout.splitlines() if '=' in line)
    now = int(r.stdout.split()[-1]) if r.stdout.split() and r.stdout.split()[-1].isdigit() else None
    since = props.get('ActiveEnterTimestamp', '').lstrip('@')
    active = props.get('ActiveState') == 'active'
    return {'name': service, 'load': props.get('LoadState'), 'active': props.get('ActiveState'),
            'sub': props.get('SubState'), 'result': props.get('Result'),
            'restarts': int(props['NRestarts']) if props.get('NRestarts', '').isdigit() else None,
            'since': iso(int(since)) if active and since.isdigit() else None,
            'uptime_s': (now - int(since)) if active and since.isdigit() and now else None}
