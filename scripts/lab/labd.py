#!/usr/bin/env python3
"""The lab's Proxmox VE stand-in: fakepve serving the PVE API, plus a reconciler that makes every
container the API holds exist as a real LXC container on this machine, the way pve-container does.

    glm5-lab start      start the daemon in the background (idempotent), wait until the API answers
    glm5-lab stop       stop the lab containers and the daemon; the API state is kept for the next start
    glm5-lab status     print what runs, exit 1 when the daemon is down
    glm5-lab purge      stop, then destroy every lab container and forget the API state (host caches stay)
    glm5-lab serve      run in the foreground (what start runs)

Like pveproxy in front of pvedaemon, labd's own front answers on https://127.0.0.1:8006 and forwards
every request to fakepve on an internal loopback port. After a write (POST/PUT/DELETE) or a task read,
and before it answers, the front writes the API state to <state>/pve/lxc/<vmid>.json (like /etc/pve),
so whatever a client has seen finish survives a kill; a restart puts those containers back.

Environment (a second instance, e.g. a test's, sets all three):
    GLM5_LAB_STATE      state directory (default: lab_state_dir in inventories/lab/group_vars/all.yml)
    GLM5_LAB_PORT       the API port on 127.0.0.1 (default 8006)
    GLM5_LAB_POLL       seconds between reconcile passes (default 0.5)
    GLM5_LAB_FILES_PORT the lab's download site on 127.0.0.1 (default 8480; 0: none): <state>/www read-only,
                        plain HTTP, where the lab puts what real hosts download (NVIDIA's apt repository)
    GLM5_LAB_TEMPLATES  the template cache registered as local:vztmpl (default: lab_template_dir in the same file)

The lab's paths are set once, in the lab inventory (inventories/lab/group_vars/all.yml); labd reads them from there.

Lab only: nothing here runs against a real PVE host. fakepve is used through its public Python API
(FakePve, cts, ct, add_ct, store_file, FakeCt.config/pending/start_error); none of its code is copied.
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

from glm5.project import ROOT, use_module_utils

# The PVE property-string parser the pve_container module uses: one definition for both sides.
use_module_utils()
from ansible.module_utils.pve_api import PROPERTY_DEFAULT_KEY, key_family, parse_property_string  # noqa: E402

LAB_VARS_FILE = os.path.join(ROOT, 'inventories', 'lab', 'group_vars', 'all.yml')


def lab_paths_from_inventory(path=LAB_VARS_FILE):
    """lab_state_dir and lab_template_dir as the lab inventory sets them (plain absolute paths, no templating)."""
    import yaml
    with open(path) as fh:
        data = yaml.safe_load(fh) or {}
    out = {}
    for key in ('lab_state_dir', 'lab_template_dir'):
        value = data.get(key)
        if not isinstance(value, str) or not os.path.isabs(value) or '{' in value:
            raise SystemExit('{0}: {1} must be a plain absolute path (labd reads it without Ansible), got {2!r}'.format(
                path, key, value))
        out[key] = value
    return out


_LAB_PATHS = lab_paths_from_inventory()
STATE = os.environ.get('GLM5_LAB_STATE') or _LAB_PATHS['lab_state_dir']
TEMPLATES = os.environ.get('GLM5_LAB_TEMPLATES') or _LAB_PATHS['lab_template_dir']
HOST, NODE = '127.0.0.1', 'pve1'
PORT = int(os.environ.get('GLM5_LAB_PORT', '8006'))
SSH_PORT_BASE = 20000          # a lab container's sshd listens on 127.0.0.1:(20000 + vmid)
FORBIDDEN_PORTS = {2024}       # taken on these machines by a process that is not ours
POLL = float(os.environ.get('GLM5_LAB_POLL', '0.5'))  # seconds between reconcile passes
FILES_PORT = int(os.environ.get('GLM5_LAB_FILES_PORT', '8480'))
PVE_START_SECS = 2             # PVE seconds a start task takes: the window in which start_error is decided
PVE_CREATE_SECS = 2
LOG = logging.getLogger('labd')


def paths(state=STATE):
    pve = os.path.join(state, 'pve')
    return dict(state=state, pve=pve, password=os.path.join(pve, 'root-password'), ca=os.path.join(pve, 'ca.crt'),
                ca_key=os.path.join(pve, 'ca.key'), cert=os.path.join(pve, 'pve.crt'), key=os.path.join(pve, 'pve.key'),
                confdir=os.path.join(pve, 'lxc'), lxcpath=os.path.join(state, 'lxc'), pid=os.path.join(state, 'labd.pid'),
                log=os.path.join(state, 'labd.log'), www=os.path.join(state, 'www'))


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


# ------------------------------------------------------------------ fakepve and the front, in this process

class Shared(object):
    """What the front (loop thread) tells the reconciler (its own thread), under one lock.

    create_params: vmid -> {ostemplate, ssh-public-keys}: create-only parameters, which PVE uses while it
    builds the rootfs and keeps no copy of in the config.
    fresh: vmids created again in the API while an old LXC container of that id still exists.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.create_params = {}
        self.fresh = set()

    def created(self, vmid, params, old_lxc_exists):
        with self.lock:
            self.create_params[vmid] = dict(params)
            if old_lxc_exists:
                self.fresh.add(vmid)  # a new container under an old id: never reuse the old rootfs
            else:
                self.fresh.discard(vmid)

    def restored(self, vmid, params):
        with self.lock:
            self.create_params[vmid] = dict(params)

    def params(self, vmid):
        with self.lock:
            return dict(self.create_params.get(vmid, {}))

    def all_params(self):
        with self.lock:
            return dict((vmid, dict(v)) for vmid, v in self.create_params.items())

    def take_fresh(self, vmid):
        """True once if vmid was created again over an old LXC container."""
        with self.lock:
            if vmid in self.fresh:
                self.fresh.discard(vmid)
                return True
            return False

    def keep_only(self, vmids):
        """Forget what belongs to containers the API no longer holds (a failed create, a destroy)."""
        with self.lock:
            for vmid in set(self.create_params) - set(vmids):
                del self.create_params[vmid]
            self.fresh &= set(vmids)


def saved_config(ct):
    """The config as GET /config shows it (pending values applied), less digest and lock."""
    config = dict(ct.config)
    for key, value in getattr(ct, 'pending', {}).items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return dict((k, v) for k, v in config.items() if k not in ('digest', 'lock'))


def persist_all(pve, confdir, create_params):
    """Write every container fakepve holds to <confdir>/<vmid>.json and remove those it no longer holds.

    Runs in fakepve's loop thread, where its state may be read. A container still being created
    (lock: create) has no config yet: whatever file its id has is left as it is until the task ends.
    """
    os.makedirs(confdir, exist_ok=True)
    held = set()
    for ct in list(pve.cts):
        vmid = int(ct.vmid)
        held.add(vmid)
        if ct.config.get('lock') == 'create':
            continue
        data = json.dumps({'vmid': vmid, 'config': saved_config(ct), 'create': create_params.get(vmid, {})},
                          indent=1, sort_keys=True)
        write_if_changed(os.path.join(confdir, '{0}.json'.format(vmid)), data)
    for name in os.listdir(confdir):
        m = re.fullmatch(r'(\d+)\.json', name)
        if m and int(m.group(1)) not in held:
            os.unlink(os.path.join(confdir, name))
    return held


def create_values(query, body, content_type):
    """The parameters of a create request as PVE reads them: query string, then a form or JSON body."""
    values = {}
    for key, val in urllib.parse.parse_qsl(query):
        values.setdefault(key, val)
    if body:
        if content_type == 'application/json':
            data = json.loads(body)
            values.update(data if isinstance(data, dict) else {})
        else:
            form = {}
            for key, val in urllib.parse.parse_qsl(body.decode(errors='replace')):
                form.setdefault(key, val)
            values.update(form)
    return values


def answered_ok(path, status, data):
    """True if the API call succeeded: HTTP 200, and under /api2/extjs also success=1 in the envelope."""
    if status != 200:
        return False
    if not path.startswith('/api2/extjs/'):
        return True
    try:
        return bool(json.loads(data).get('success'))
    except (ValueError, AttributeError):
        return False


WRITES = ('POST', 'PUT', 'DELETE')
TASK_READ = re.compile(r'/api2/(?:json|extjs)/(?:nodes/[^/]+|cluster)/tasks(?:/.*)?')
LXC_CREATE = re.compile(r'/api2/(?:json|extjs)/nodes/[^/]+/lxc/?')
FORWARDED = ('Cookie', 'CSRFPreventionToken', 'Authorization', 'Content-Type')


class Front(object):
    """labd's own HTTPS server on HOST:PORT (pveproxy's place): forwards every request to fakepve and
    persists the API state after a write or a task read, before the client gets the answer."""

    def __init__(self, p, pve, shared):
        self.p = p
        self.pve = pve
        self.shared = shared
        self.lxc = LabLxc(p)
        self.runner = None
        self.session = None

    async def start(self, host, port):
        import ssl

        import aiohttp
        from aiohttp import web
        client = ssl.create_default_context(cafile=self.p['ca'])
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=client), cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=600))
        self.upstream = 'https://{0}:{1}'.format(HOST, self.pve.port)
        # fakepve decides on body sizes (and answers with PVE's text); the front only must not refuse first.
        app = web.Application(client_max_size=getattr(self.pve, 'client_max_size', 64 * 1024 ** 2) + 1024 ** 2)
        app.router.add_route('*', '/{tail:.*}', self.handle)
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(self.p['cert'], self.p['key'])
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, host, port, ssl_context=server).start()

    async def stop(self):
        if self.runner:
            await self.runner.cleanup()
            self.runner = None
        if self.session:
            await self.session.close()
            self.session = None

    def persist(self):
        held = persist_all(self.pve, self.p['confdir'], self.shared.all_params())
        self.shared.keep_only(held)

    def note_create(self, request, body):
        values = create_values(request.query_string, body, request.content_type)
        if 'vmid' not in values:
            return
        vmid = int(values['vmid'])
        params = dict((k, values[k]) for k in ('ostemplate', 'ssh-public-keys') if k in values)
        self.shared.created(vmid, params, self.lxc.exists(vmid))

    async def handle(self, request):
        import aiohttp
        import yarl
        from aiohttp import web
        body = await request.read()
        headers = dict((k, request.headers[k]) for k in FORWARDED if k in request.headers)
        try:
            async with self.session.request(request.method, yarl.URL(self.upstream + request.raw_path, encoded=True),
                                            headers=headers, data=body or None, allow_redirects=False) as resp:
                data = await resp.read()
                status, reason = resp.status, resp.reason
                ctype = resp.headers.get('Content-Type')
                cookies = resp.headers.getall('Set-Cookie', [])
        except (TimeoutError, aiohttp.ClientError) as exc:
            LOG.error('front: %s %s: fakepve did not answer: %s', request.method, request.path, exc)
            return web.json_response({'data': None, 'message': 'lab front: fakepve did not answer\n'}, status=502)
        if request.method in WRITES or (request.method == 'GET' and TASK_READ.fullmatch(request.path)):
            try:
                if (request.method == 'POST' and LXC_CREATE.fullmatch(request.path)
                        and answered_ok(request.path, status, data)):
                    self.note_create(request, body)
                self.persist()
            except Exception as exc:  # the change happened but is not on disk: the client must not think it is
                LOG.exception('front: persisting the API state after %s %s failed', request.method, request.path)
                return web.json_response({'data': None, 'message': 'lab: unable to write the container config: '
                                          '{0}\n'.format(exc)}, status=500)
        out = web.Response(status=status, reason=reason, body=data,
                           headers={'Content-Type': ctype} if ctype else None)
        for cookie in cookies:
            out.headers.add('Set-Cookie', cookie)
        return out


class Serving(object):
    """One FakePve on an internal loopback port and the front on HOST:PORT, both on one private event
    loop in a thread; the reconciler talks to fakepve directly."""

    def __init__(self, p):
        from fakepve import FakePve
        with open(p['password']) as fh:
            password = fh.read().strip()
        self.p = p
        self.pve = FakePve(user='root@pam', password=password, host=HOST, port=0)
        self.pve.time_scale = 1.0
        self.pve.ct_secs['create'] = PVE_CREATE_SECS
        self.password = password
        self.front = None
        self.files = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name='fakepve', daemon=True)
        self.thread.start()
        self.call(self.pve.start(p['cert'], p['key']))

    def start_front(self, shared, host=HOST, port=PORT):
        """Answer clients from now on (after the saved state is back in fakepve)."""
        self.front = Front(self.p, self.pve, shared)
        self.call(self.front.start(host, port))

    def start_files(self, host=HOST, port=FILES_PORT):
        """The lab's download site: <state>/www over plain HTTP, read-only (aiohttp's static files)."""
        from aiohttp import web

        async def start():
            os.makedirs(self.p['www'], exist_ok=True)
            app = web.Application()
            app.router.add_static('/', self.p['www'], show_index=True)
            self.files = web.AppRunner(app, access_log=None)
            await self.files.setup()
            await web.TCPSite(self.files, host, port).start()
        self.call(start())

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def do(self, fn, *args):
        """Run fn in fakepve's loop thread (its state belongs to that thread) and return the result."""
        async def run():
            return fn(*args)
        return self.call(run())

    def stop(self):
        if self.files:
            self.call(self.files.cleanup())
        if self.front:
            self.call(self.front.stop())
            self.do(self.front.persist)  # what finished since the last client read is kept too
        self.call(self.pve.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)


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
    def __init__(self, p, serving, shared):
        self.p = p
        self.serving = serving
        self.shared = shared
        self.lxc = LabLxc(p)
        self.connect()
        self.started_pid = {}     # vmid -> the PVE pid of the start the LXC side has carried out
        self.failed_start = {}    # vmid -> the PVE pid whose LXC start failed (not retried)
        os.makedirs(p['confdir'], exist_ok=True)

    def connect(self):
        """Log in to fakepve itself, not the front: the reconciler only reads, and fakepve's own state needs no
        persisting. Again after an hour: proxmoxer renews its ticket by sending it as the password, which
        fakepve 0.5.0 refuses (401), so the reconciler logs in anew instead of going blind."""
        from proxmoxer import ProxmoxAPI
        self.api = ProxmoxAPI(HOST, port=self.serving.pve.port, user='root@pam', password=self.serving.password,
                              verify_ssl=self.p['ca'], timeout=30)

    # state that PVE keeps in /etc/pve survives a lab restart here (the front writes it)
    def load(self):
        for name in sorted(os.listdir(self.p['confdir'])):
            if not re.fullmatch(r'\d+\.json', name):
                continue
            with open(os.path.join(self.p['confdir'], name)) as fh:
                saved = json.load(fh)
            vmid = saved['vmid']
            self.shared.restored(vmid, saved.get('create', {}))
            running = self.lxc.state(vmid) == 'running'
            onboot = str(saved['config'].get('onboot', '0')) == '1'
            ct = self.serving.do(restore_ct, self.serving.pve, saved, running or onboot)
            if running:
                self.started_pid[vmid] = self.serving.do(lambda c: c.pid, ct)
            LOG.info('CT %s: restored (%s)', vmid, 'running' if running else 'onboot' if onboot else 'stopped')

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
                self.failed_start.pop(vmid, None)

    def reconcile(self, vmid):
        ct = self.api.nodes(NODE).lxc(vmid)
        config = ct.config.get()
        self.set_start_error(vmid, start_error(config))
        if self.shared.take_fresh(vmid):
            if os.path.exists(self.lxc.ctdir(vmid)):
                LOG.info('CT %s: created again in the API, removing the old LXC container first', vmid)
                self.lxc.destroy(vmid)
            self.started_pid.pop(vmid, None)
            self.failed_start.pop(vmid, None)
        if config.get('lock') == 'create':
            return
        status = ct.status.current.get()
        if not self.lxc.exists(vmid):
            params = self.shared.params(vmid)
            tmpl = params.get('ostemplate') or default_template()
            self.lxc.create(vmid, self.template_path(tmpl), params.get('ssh-public-keys'))
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
        from proxmoxer import AuthenticationError
        while not stop_event.is_set():
            try:
                self.once()
            except AuthenticationError as exc:
                LOG.warning('reconciler login refused (%s): logging in again', exc)
                self.connect()
                continue
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
    shared = Shared()
    serving = Serving(p)
    register_templates(serving)
    rec = Reconciler(p, serving, shared)
    rec.load()
    # Clients only now: a write before the saved state is back would persist an API without it.
    serving.start_front(shared)
    if FILES_PORT:
        serving.start_files()
        LOG.info('download site http://%s:%s/ from %s', HOST, FILES_PORT, p['www'])
    stop_event = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop_event.set())
    signal.signal(signal.SIGINT, lambda *a: stop_event.set())
    LOG.info('PVE API on https://%s:%s (lab PVE node %s; fakepve on port %s; state %s)', HOST, PORT, NODE,
             serving.pve.port, p['state'])
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
            cmdline = fh.read()
            # the daemon as `python -m glm5_lab.labd serve`, or one started by an older checkout (labd.py serve)
            if b'glm5_lab.labd' not in cmdline and b'labd.py' not in cmdline:
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
    # The daemon gets this environment (GLM5_LAB_PORT, _POLL, _TEMPLATES) and the state p names.
    env = dict(os.environ, GLM5_LAB_STATE=p['state'], GLM5_LAB_PORT=str(PORT), GLM5_LAB_FILES_PORT=str(FILES_PORT))
    proc = subprocess.Popen([sys.executable, '-m', 'glm5_lab.labd', 'serve'], stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL, start_new_session=True, close_fds=True, env=env)
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
