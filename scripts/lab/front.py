"""fakepve and labd's front, in the daemon's process: the front answers on https://127.0.0.1:8006 (pveproxy's
place) and forwards every request to fakepve on an internal loopback port. After a write (POST/PUT/DELETE) or a
task read, and before it answers, it writes the API state to <state>/pve/lxc/<vmid>.json (like /etc/pve), so
whatever a client has seen finish survives a kill; restore_ct puts those containers back after a restart. Beside
them, the lab's download site: <state>/www over plain HTTP.

fakepve is used through its public Python API (FakePve, cts, ct, add_ct, store_file, FakeCt.config/pending/
start_error); none of its code is copied.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
import urllib.parse

from glm5_lab.lxc import LabLxc
from glm5_lab.paths import FILES_PORT, HOST, NODE, PORT, PVE_CREATE_SECS, PVE_START_SECS, write_if_changed

LOG = logging.getLogger('labd')


class Shared(object):
    """What the front (loop thread) tells the reconciler (its own thread), under one lock.

    create_params: vmid -> {ostemplate, ssh-public-keys}: create-only parameters, which PVE uses while it
    builds the rootfs and keeps no copy of in the config.
    fresh: vmids created again in the API while an old LXC container of that id still exists.
    wake: set by the front after a write or a task read (a client changed something or waits for it): the
    reconciler passes at once instead of at its next interval.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.create_params = {}
        self.fresh = set()
        self.wake = threading.Event()

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
        # its firewall too (PVE's /etc/pve/firewall/<vmid>.fw): the rules and options, kept, never enforced
        data = json.dumps({'vmid': vmid, 'config': saved_config(ct), 'create': create_params.get(vmid, {}),
                           'firewall': pve.firewall_config('ct', NODE, vmid)}, indent=1, sort_keys=True)
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
TASK_STATUS = re.compile(r'/api2/json/nodes/[^/]+/tasks/(?P<upid>[^/]+)/status')
# Tasks that end, in PVE, only when the container has stopped: a stop, a shutdown, a destroy (which stops first)
STOPPING_TASKS = ('vzstop', 'vzshutdown', 'vzdestroy')
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

    def until_stopped(self, path, data):
        """A stop, shutdown or destroy task that fakepve has ended is still running here while the LXC container of
        its id runs: PVE's task ends when the container has stopped, and the reconciler carries it out a pass later.
        Without this a client that destroyed a container and created one under the same id could reach the old one's
        sshd on the same port (make test's full-stack lane once recorded the old host key for the new node so)."""
        from proxmoxer.tools import Tasks
        m = TASK_STATUS.fullmatch(urllib.parse.unquote(path))
        if not m:
            return data
        try:
            upid = Tasks.decode_upid(m.group('upid'))
        except (AssertionError, ValueError):  # not a UPID: fakepve's own answer stands
            return data
        if upid['type'] not in STOPPING_TASKS or not upid['id'].isdigit():
            return data
        try:
            body = json.loads(data)
            task = body['data']
        except (ValueError, KeyError, TypeError):
            return data
        if task.get('status') != 'stopped' or self.lxc.state(int(upid['id'])) != 'running':
            return data
        task = dict((k, v) for k, v in task.items() if k != 'exitstatus')
        task['status'] = 'running'
        body['data'] = task
        return json.dumps(body).encode()

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
        if request.method == 'GET' and status == 200:
            data = self.until_stopped(request.path, data)
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
            finally:
                self.shared.wake.set()
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
    pve.firewall_config('ct', NODE, saved['vmid']).update(saved.get('firewall') or {})
    return ct
