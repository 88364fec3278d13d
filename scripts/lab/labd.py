#!/usr/bin/env python3
"""The lab's Proxmox VE stand-in: fakepve serving the PVE API, plus a reconciler that makes every
container the API holds exist as a real LXC container on this machine, the way pve-container does.

    labd.py start     start the daemon in the background (idempotent), wait until the API answers
    labd.py stop      stop the lab containers and the daemon; the API state is kept for the next start
    labd.py status    print what runs, exit 1 when the daemon is down
    labd.py purge     stop, then destroy every lab container and forget the API state (host caches stay)
    labd.py serve     run in the foreground (what start runs)

Lab only: nothing here runs against a real PVE host. fakepve is used through its public Python API
(FakePve, add_ct, store_file, FakeCt.start_error, the recorded requests); none of its code is copied.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import logging
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.parse

# The PVE property-string parser the pve_container module uses: one definition for both sides.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                'ansible', 'module_utils'))
from pve_api import PROPERTY_DEFAULT_KEY, key_family, parse_property_string  # noqa: E402

STATE = os.environ.get('GLM5_LAB_STATE', '/var/lib/glm5-lab')
TEMPLATES = os.environ.get('GLM5_LAB_TEMPLATES', '/var/cache/glm5-lab/templates')
HOST, PORT, NODE = '127.0.0.1', 8006, 'pve1'
SSH_PORT_BASE = 20000          # a lab container's sshd listens on 127.0.0.1:(20000 + vmid)
FORBIDDEN_PORTS = {2024}       # taken on these machines by a process that is not ours
POLL = 0.5                     # seconds between reconcile passes
PVE_START_SECS = 2             # PVE seconds a start task takes: the window in which start_error is decided
PVE_CREATE_SECS = 2
LOG = logging.getLogger('labd')


def paths(state=STATE):
    pve = os.path.join(state, 'pve')
    return dict(state=state, pve=pve, password=os.path.join(pve, 'root-password'), ca=os.path.join(pve, 'ca.crt'),
                ca_key=os.path.join(pve, 'ca.key'), cert=os.path.join(pve, 'pve.crt'), key=os.path.join(pve, 'pve.key'),
                confdir=os.path.join(pve, 'lxc'), lxcpath=os.path.join(state, 'lxc'), pid=os.path.join(state, 'labd.pid'),
                log=os.path.join(state, 'labd.log'))


def ssh_port(vmid):
    port = SSH_PORT_BASE + int(vmid)
    if port > 65535 or port in FORBIDDEN_PORTS:
        raise ValueError('lab vmid {0} gives sshd port {1}, which the lab cannot use (vmid 100..45535)'.format(
            vmid, port))
    return port


def _write_private(path, data):
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 'wb') as out:
        out.write(data)


def ensure_secrets(p):
    """root@pam password and a lab CA with a server certificate for 127.0.0.1, made once."""
    os.makedirs(p['pve'], mode=0o700, exist_ok=True)
    if not os.path.exists(p['password']):
        _write_private(p['password'], secrets.token_urlsafe(24).encode())
    if os.path.exists(p['cert']) and os.path.exists(p['ca']):
        return
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, 'GLM-5 lab PVE CA')])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=3650))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NODE)])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=825))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName('localhost'), x509.DNSName(NODE),
                                                        x509.IPAddress(ipaddress.ip_address(HOST))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    nokey = serialization.NoEncryption()
    fmt = serialization.PrivateFormat.TraditionalOpenSSL
    _write_private(p['ca_key'], ca_key.private_bytes(pem, fmt, nokey))
    _write_private(p['key'], key.private_bytes(pem, fmt, nokey))
    with open(p['ca'], 'wb') as out:
        out.write(ca.public_bytes(pem))
    with open(p['cert'], 'wb') as out:
        out.write(cert.public_bytes(pem))


# ------------------------------------------------------------------ property strings and host checks

def _props_of(config, family):
    """Parsed property strings of one key family (dev, mp), as pve_container's own module_utils parses them."""
    return [parse_property_string(v, PROPERTY_DEFAULT_KEY[family]) for k, v in sorted(config.items())
            if key_family(k) == family]


def devices_of(config):
    return _props_of(config, 'dev')


def bind_mounts_of(config):
    return [m for m in _props_of(config, 'mp') if m.get('volume', '').startswith('/')]


def start_error(config):
    """What PVE's start says when the container cannot start on this host, or None."""
    for dev in devices_of(config):
        path = dev.get('path', '')
        try:
            st = os.stat(path)
        except OSError:
            return 'Device {0} does not exist'.format(path)
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
            return 'Path {0} is not a device'.format(path)
    for m in bind_mounts_of(config):
        if not os.path.isdir(m['volume']):
            return 'mount point {0} does not exist on the host'.format(m['volume'])
    return None


def cgroup_prefix():
    """lxc.cgroup2 on a pure cgroup v2 host (real PVE 8/9), lxc.cgroup on a v1/hybrid one (this lab)."""
    return 'lxc.cgroup2' if os.path.exists('/sys/fs/cgroup/cgroup.controllers') else 'lxc.cgroup'


def lxc_config(vmid, config, ctdir):
    """The LXC config for one container, and the passthrough device nodes it needs (path, mode, uid, gid, rdev)."""
    cg = cgroup_prefix()
    lines = [
        '# Written by the GLM-5 lab reconciler from the PVE API config of CT {0}; do not edit.'.format(vmid),
        'lxc.include = /usr/share/lxc/config/debian.common.conf',
        'lxc.arch = amd64',
        'lxc.uts.name = {0}'.format(config.get('hostname', 'CT{0}'.format(vmid))),
        'lxc.rootfs.path = dir:{0}'.format(os.path.join(ctdir, 'rootfs')),
        'lxc.net.0.type = none',
        'lxc.apparmor.profile = unconfined',
        'lxc.log.file = {0}'.format(os.path.join(ctdir, 'lxc.log')),
        'lxc.log.level = WARN',
    ]
    memory = int(config.get('memory', 512))
    cores = int(config.get('cores', 0) or 0)
    if cg == 'lxc.cgroup2':
        lines.append('lxc.cgroup2.memory.max = {0}'.format(memory * 1024 ** 2))
        if cores:
            lines.append('lxc.cgroup2.cpu.max = {0} 100000'.format(cores * 100000))
    else:
        lines.append('lxc.cgroup.memory.limit_in_bytes = {0}'.format(memory * 1024 ** 2))
        if cores:
            lines += ['lxc.cgroup.cpu.cfs_period_us = 100000', 'lxc.cgroup.cpu.cfs_quota_us = {0}'.format(cores * 100000)]
    nodes = []
    for dev in devices_of(config):
        path = dev['path']
        try:
            st = os.stat(path)
        except OSError:
            continue  # start_error() refuses the start
        kind = 'c' if stat.S_ISCHR(st.st_mode) else 'b'
        access = 'rm' if dev.get('deny-write') == '1' else 'rwm'
        lines.append('{0}.devices.allow = {1} {2}:{3} {4}'.format(cg, kind, os.major(st.st_rdev), os.minor(st.st_rdev),
                                                                   access))
        mode = int(dev.get('mode', '0660'), 8)
        node = os.path.join(ctdir, 'passthrough', path.lstrip('/'))
        nodes.append((node, kind, mode, int(dev.get('uid', 0)), int(dev.get('gid', 0)), st.st_rdev))
        lines.append('lxc.mount.entry = {0} {1} none bind,create=file 0 0'.format(node, path.lstrip('/')))
    for m in bind_mounts_of(config):
        opts = 'bind,create=dir' + (',ro' if m.get('ro') == '1' else '')
        lines.append('lxc.mount.entry = {0} {1} none {2} 0 0'.format(m['volume'], m['mp'].lstrip('/'), opts))
    return '\n'.join(lines) + '\n', nodes


# ------------------------------------------------------------------ the LXC side

def write_if_changed(path, content):
    """Write content to path (atomically, making its folder) unless it already holds it; True if written."""
    try:
        with open(path) as fh:
            if fh.read() == content:
                return False
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + '.tmp', 'w') as out:
        out.write(content)
    os.replace(path + '.tmp', path)
    return True


def _node_is(path, kind, mode, uid, gid, rdev):
    try:
        st = os.stat(path)
    except OSError:
        return False
    is_kind = stat.S_ISCHR(st.st_mode) if kind == 'c' else stat.S_ISBLK(st.st_mode)
    return is_kind and st.st_rdev == rdev and stat.S_IMODE(st.st_mode) == mode and (st.st_uid, st.st_gid) == (uid, gid)


def _count_nodes(top):
    return sum(len(files) for _, _, files in os.walk(top))


def lxc(*args, check=True, timeout=120):
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=timeout)


class LabLxc(object):
    """Lab containers live under their own lxcpath as pve-<vmid>; nothing else is ever touched."""

    def __init__(self, p):
        self.p = p
        self.lxcpath = p['lxcpath']
        os.makedirs(self.lxcpath, exist_ok=True)

    def name(self, vmid):
        return 'pve-{0}'.format(vmid)

    def ctdir(self, vmid):
        return os.path.join(self.lxcpath, self.name(vmid))

    def exists(self, vmid):
        return os.path.exists(os.path.join(self.ctdir(vmid), 'rootfs', 'etc'))

    def vmids(self):
        out = []
        for entry in os.listdir(self.lxcpath):
            m = re.fullmatch(r'pve-(\d+)', entry)
            if m and os.path.exists(os.path.join(self.lxcpath, entry, 'lab-created')):
                out.append(int(m.group(1)))
        return out

    def state(self, vmid):
        if not os.path.exists(os.path.join(self.ctdir(vmid), 'config')):
            return 'absent'
        r = lxc('lxc-info', '-P', self.lxcpath, '-n', self.name(vmid), '-sH', check=False)
        return r.stdout.strip().lower() or 'stopped'

    def create(self, vmid, template, keys):
        ctdir = self.ctdir(vmid)
        rootfs = os.path.join(ctdir, 'rootfs')
        os.makedirs(rootfs, exist_ok=True)
        with open(os.path.join(ctdir, 'lab-created'), 'w') as out:
            out.write('{0}\n'.format(vmid))
        LOG.info('CT %s: extracting %s', vmid, template)
        lxc('tar', '-xpzf', template, '-C', rootfs, '--numeric-owner', timeout=900)
        for old in os.listdir(os.path.join(rootfs, 'etc/ssh')):
            if old.startswith('ssh_host_'):
                os.unlink(os.path.join(rootfs, 'etc/ssh', old))
        lxc('ssh-keygen', '-A', '-f', rootfs)
        # Like pve-container on create: a new container gets its own machine-id at first boot.
        with open(os.path.join(rootfs, 'etc/machine-id'), 'w'):
            pass
        try:
            os.unlink(os.path.join(rootfs, 'var/lib/dbus/machine-id'))
        except FileNotFoundError:
            pass
        if keys:
            sshdir = os.path.join(rootfs, 'root/.ssh')
            os.makedirs(sshdir, mode=0o700, exist_ok=True)
            _write_private(os.path.join(sshdir, 'authorized_keys'), (keys.strip() + '\n').encode())

    def write_config(self, vmid, config):
        ctdir = self.ctdir(vmid)
        text, nodes = lxc_config(vmid, config, ctdir)
        rootfs = os.path.join(ctdir, 'rootfs')
        hostname = config.get('hostname', 'CT{0}'.format(vmid))
        files = {
            os.path.join(ctdir, 'config'): text,
            os.path.join(rootfs, 'etc/hostname'): hostname + '\n',
            os.path.join(rootfs, 'etc/hosts'): '127.0.0.1 localhost\n127.0.1.1 {0}\n'.format(hostname),
            os.path.join(rootfs, 'etc/ssh/sshd_config.d/00-glm5-lab.conf'):
                '# lab: the container shares the host network; listen on loopback only\n'
                'ListenAddress 127.0.0.1\nPort {0}\n'.format(ssh_port(vmid)),
        }
        changed = False
        for path, content in files.items():
            changed = write_if_changed(path, content) or changed
        if all(_node_is(*n) for n in nodes) and len(nodes) == _count_nodes(os.path.join(ctdir, 'passthrough')):
            return changed
        shutil.rmtree(os.path.join(ctdir, 'passthrough'), ignore_errors=True)
        for node, kind, mode, uid, gid, rdev in nodes:
            os.makedirs(os.path.dirname(node), exist_ok=True)
            os.mknod(node, mode | (stat.S_IFCHR if kind == 'c' else stat.S_IFBLK), rdev)
            os.chmod(node, mode)
            os.chown(node, uid, gid)
        return changed

    def start(self, vmid):
        r = lxc('lxc-start', '-P', self.lxcpath, '-n', self.name(vmid), check=False)
        if r.returncode != 0:
            tail = ''
            try:
                with open(os.path.join(self.ctdir(vmid), 'lxc.log')) as fh:
                    tail = ' | '.join(fh.read().strip().splitlines()[-3:])
            except OSError:
                pass
            return (r.stderr.strip() or 'lxc-start failed') + (' ' + tail if tail else '')
        return None

    def stop(self, vmid, timeout=30):
        if self.state(vmid) == 'running':
            lxc('lxc-stop', '-P', self.lxcpath, '-n', self.name(vmid), '-t', str(timeout), check=False,
                timeout=timeout + 30)

    def destroy(self, vmid):
        """Remove the container and its rootfs; never a bind-mounted host path."""
        self.stop(vmid, timeout=10)
        ctdir = os.path.realpath(self.ctdir(vmid))
        with open('/proc/self/mountinfo') as fh:
            mounted = [line.split()[4] for line in fh if line.split()[4].startswith(ctdir + '/')]
        if mounted:
            raise RuntimeError('CT {0}: refusing to remove {1}: still mounted: {2}'.format(vmid, ctdir, mounted))
        shutil.rmtree(ctdir)


# ------------------------------------------------------------------ fakepve in this process

class Serving(object):
    """One FakePve on a private event loop in a thread; the reconciler talks to it over HTTPS."""

    def __init__(self, p):
        from fakepve import FakePve
        with open(p['password']) as fh:
            password = fh.read().strip()
        self.pve = FakePve(user='root@pam', password=password, host=HOST, port=PORT)
        self.pve.time_scale = 1.0
        self.pve.ct_secs['create'] = PVE_CREATE_SECS
        self.password = password
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name='fakepve', daemon=True)
        self.thread.start()
        self.call(self.pve.start(p['cert'], p['key']))

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def do(self, fn, *args):
        """Run fn in fakepve's loop thread (its state belongs to that thread) and return the result."""
        async def run():
            return fn(*args)
        return self.call(run())

    def stop(self):
        self.call(self.pve.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)


def new_requests(recorded, last):
    """The requests recorded after `last` (found by identity: fakepve drops the oldest past its limit, so
    positions shift while the list stays full)."""
    if last is not None:
        for i in range(len(recorded) - 1, -1, -1):
            if recorded[i] is last:
                return recorded[i + 1:]
    return recorded


def restore_ct(pve, saved, running):
    """Put a persisted container back into fakepve after a lab restart, as PVE reads /etc/pve at boot.

    The saved config is what GET /config gave: complete, with defaults left out as PVE leaves them
    out, so fakepve must not add its own defaults (unprivileged=1 would turn a privileged CT around).
    """
    ct = pve.add_ct(saved['vmid'], saved['config'].get('hostname'), NODE, 'running' if running else 'stopped',
                    saved['config'], defaults=False)
    ct.start_secs = PVE_START_SECS
    return ct


class Reconciler(object):
    def __init__(self, p, serving):
        from proxmoxer import ProxmoxAPI
        self.p = p
        self.serving = serving
        self.lxc = LabLxc(p)
        self.api = ProxmoxAPI(HOST, port=PORT, user='root@pam', password=serving.password, verify_ssl=p['ca'],
                              timeout=30)
        self.started_pid = {}     # vmid -> the PVE pid of the start the LXC side has carried out
        self.failed_start = {}    # vmid -> the PVE pid whose LXC start failed (not retried)
        self.last_request = None  # the newest recorded request already read (fakepve keeps the last 10000)
        self.fresh = set()        # vmids created again in the API while the old LXC container still exists
        self.create_params = {}   # vmid -> {ostemplate, ssh-public-keys} from its create request
        os.makedirs(p['confdir'], exist_ok=True)

    # state that PVE keeps in /etc/pve survives a lab restart here
    def load(self):
        for name in sorted(os.listdir(self.p['confdir'])):
            if not name.endswith('.json'):
                continue
            with open(os.path.join(self.p['confdir'], name)) as fh:
                saved = json.load(fh)
            vmid = saved['vmid']
            self.create_params[vmid] = saved.get('create', {})
            running = self.lxc.state(vmid) == 'running'
            onboot = str(saved['config'].get('onboot', '0')) == '1'
            ct = self.serving.do(restore_ct, self.serving.pve, saved, running or onboot)
            if running:
                self.started_pid[vmid] = self.serving.do(lambda c: c.pid, ct)
            LOG.info('CT %s: restored (%s)', vmid, 'running' if running else 'onboot' if onboot else 'stopped')

    def persist(self, vmid, config):
        config = {k: v for k, v in config.items() if k not in ('digest', 'lock')}
        data = json.dumps({'vmid': vmid, 'config': config, 'create': self.create_params.get(vmid, {})}, indent=1,
                          sort_keys=True)
        write_if_changed(os.path.join(self.p['confdir'], '{0}.json'.format(vmid)), data)

    def read_requests(self):
        """ostemplate and ssh-public-keys are create-only parameters: PVE uses them while it builds the rootfs
        and keeps no copy in the config, so the lab reads them from the create request fakepve recorded."""
        reqs = self.serving.do(lambda: list(self.serving.pve.requests))
        for method, path, body in new_requests(reqs, self.last_request):
            if method == 'POST' and re.fullmatch(r'/api2/json/nodes/[^/]+/lxc', path):
                form = urllib.parse.parse_qs(body.decode(errors='replace'))
                if 'vmid' in form:
                    vmid = int(form['vmid'][0])
                    if self.lxc.exists(vmid):
                        self.fresh.add(vmid)  # a new container under an old id: never reuse the old rootfs
                    self.create_params[vmid] = {
                        k: form[k][0] for k in ('ostemplate', 'ssh-public-keys') if k in form}
        self.last_request = reqs[-1] if reqs else self.last_request

    def set_start_error(self, vmid, message):
        ct = self.serving.do(self.serving.pve.ct, vmid)
        if ct is not None and (ct.start_error != message or ct.start_secs != PVE_START_SECS):
            def apply():
                ct.start_error = message
                ct.start_secs = PVE_START_SECS
            self.serving.do(apply)

    def template_path(self, config_volid):
        name = config_volid.split('/', 1)[-1]
        return os.path.join(TEMPLATES, name)

    def once(self):
        self.read_requests()
        api_cts = {int(c['vmid']): c for c in self.api.nodes(NODE).lxc.get()}
        for vmid in sorted(api_cts):
            try:
                self.reconcile(vmid)
            except Exception as exc:  # keep the lab serving; the log says what went wrong
                LOG.exception('CT %s: %s', vmid, exc)
        for vmid in self.lxc.vmids():
            if vmid not in api_cts:
                LOG.info('CT %s: destroyed in the API, removing the LXC container', vmid)
                self.lxc.destroy(vmid)
                self.started_pid.pop(vmid, None)
                try:
                    os.unlink(os.path.join(self.p['confdir'], '{0}.json'.format(vmid)))
                except FileNotFoundError:
                    pass

    def reconcile(self, vmid):
        ct = self.api.nodes(NODE).lxc(vmid)
        config = ct.config.get()
        self.set_start_error(vmid, start_error(config))
        if vmid in self.fresh:
            LOG.info('CT %s: created again in the API, removing the old LXC container first', vmid)
            self.lxc.destroy(vmid)
            self.started_pid.pop(vmid, None)
            self.failed_start.pop(vmid, None)
            self.fresh.discard(vmid)
        if config.get('lock') == 'create':
            return
        status = ct.status.current.get()
        if not self.lxc.exists(vmid):
            params = self.create_params.get(vmid, {})
            tmpl = params.get('ostemplate') or default_template()
            self.lxc.create(vmid, self.template_path(tmpl), params.get('ssh-public-keys'))
        self.persist(vmid, config)
        self.lxc.write_config(vmid, config)
        lxc_state = self.lxc.state(vmid)
        pid = status.get('pid')
        if status['status'] == 'running':
            if lxc_state == 'running' and self.started_pid.get(vmid) not in (None, pid):
                LOG.info('CT %s: restarted through the API', vmid)
                self.lxc.stop(vmid)
                lxc_state = 'stopped'
            if lxc_state != 'running' and self.failed_start.get(vmid) != pid:
                LOG.info('CT %s: starting', vmid)
                err = self.lxc.start(vmid)
                if err:
                    LOG.error('CT %s: start failed: %s', vmid, err)
                    self.failed_start[vmid] = pid
                else:
                    self.started_pid[vmid] = pid
            elif lxc_state == 'running':
                self.started_pid[vmid] = pid
        elif lxc_state == 'running':
            LOG.info('CT %s: stopping', vmid)
            self.lxc.stop(vmid)
            self.started_pid.pop(vmid, None)

    def run(self, stop_event):
        while not stop_event.is_set():
            try:
                self.once()
            except Exception as exc:
                LOG.exception('reconcile pass failed: %s', exc)
            stop_event.wait(POLL)


def default_template():
    names = sorted(n for n in os.listdir(TEMPLATES) if n.endswith('.tar.gz'))
    if not names:
        raise RuntimeError('no lab template in {0}: run make lab-up'.format(TEMPLATES))
    return names[-1]


def register_templates(serving):
    for name in sorted(os.listdir(TEMPLATES)) if os.path.isdir(TEMPLATES) else []:
        if name.endswith(('.tar.gz', '.tar.zst', '.tar.xz')):
            size = os.path.getsize(os.path.join(TEMPLATES, name))
            serving.do(serving.pve.store_file, 'local', name, size, 'vztmpl')
            LOG.info('template local:vztmpl/%s registered', name)


# ------------------------------------------------------------------ commands

def serve(p):
    logging.basicConfig(level=logging.INFO, format='%(asctime)s %(levelname)s %(message)s')
    logging.getLogger('aiohttp.access').setLevel(logging.WARNING)
    ensure_secrets(p)
    serving = Serving(p)
    register_templates(serving)
    rec = Reconciler(p, serving)
    rec.load()
    stop_event = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop_event.set())
    signal.signal(signal.SIGINT, lambda *a: stop_event.set())
    LOG.info('fakepve listening on https://%s:%s (lab PVE node %s)', HOST, PORT, NODE)
    rec.run(stop_event)
    LOG.info('stopping: shutting down lab containers')
    for vmid in rec.lxc.vmids():
        rec.lxc.stop(vmid)
    serving.stop()


def read_pid(p):
    try:
        with open(p['pid']) as fh:
            pid = int(fh.read().strip())
        os.kill(pid, 0)
        with open('/proc/{0}/cmdline'.format(pid), 'rb') as fh:
            if b'labd.py' not in fh.read():
                return None
        return pid
    except (OSError, ValueError):
        return None


def api_answers(p, timeout=1.0):
    import requests
    try:
        requests.get('https://{0}:{1}/api2/json/version'.format(HOST, PORT), verify=p['ca'], timeout=timeout)
        return True
    except requests.RequestException:
        return False


def start(p):
    if read_pid(p):
        print('labd already running (pid {0})'.format(read_pid(p)))
        return 0
    ensure_secrets(p)
    os.makedirs(p['state'], exist_ok=True)
    log = open(p['log'], 'ab')
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), 'serve'], stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    with open(p['pid'], 'w') as out:
        out.write(str(proc.pid))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            print('labd exited with {0}; see {1}'.format(proc.returncode, p['log']), file=sys.stderr)
            return 1
        if api_answers(p):
            print('labd started (pid {0}): https://{1}:{2}'.format(proc.pid, HOST, PORT))
            return 0
        time.sleep(0.5)
    print('labd did not answer within 60 s; see {0}'.format(p['log']), file=sys.stderr)
    return 1


def stop(p):
    pid = read_pid(p)
    if not pid:
        print('labd not running')
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and read_pid(p):
        time.sleep(0.5)
    if read_pid(p):
        os.kill(pid, signal.SIGKILL)
    print('labd stopped')
    return 0


def purge(p):
    stop(p)
    lab = LabLxc(p)
    for vmid in lab.vmids():
        lab.destroy(vmid)
        print('destroyed lab CT {0}'.format(vmid))
    shutil.rmtree(p['confdir'], ignore_errors=True)
    return 0


def status(p):
    pid = read_pid(p)
    print('labd: {0}'.format('running (pid {0})'.format(pid) if pid else 'stopped'))
    lab = LabLxc(p)
    for vmid in sorted(lab.vmids()):
        print('CT {0}: {1} (sshd 127.0.0.1:{2})'.format(vmid, lab.state(vmid), ssh_port(vmid)))
    return 0 if pid and api_answers(p) else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('command', choices=['start', 'stop', 'status', 'purge', 'serve'])
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error('the lab runs LXC containers and must run as root')
    p = paths()
    if args.command == 'serve':
        serve(p)
        return 0
    return {'start': start, 'stop': stop, 'status': status, 'purge': purge}[args.command](p)


if __name__ == '__main__':
    sys.exit(main())
