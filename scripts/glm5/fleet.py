"""The gateway in front of the nodes (SGLang's model gateway, smg): its view of the fleet (glm5 fleet, glm5 status),
and an operator's drain and undrain of a node.

Every request is made from inside a container, over its shell (SSH, or this machine for ansible_connection: local),
as the deploy makes them: the gateway's control plane from the gateway's own container (its contract's url), with
the control plane key read there from the unit's environment file; a node's load report from the node's container,
with the node's key read there (its contract's key_file). A key is never on a command line (the far side's ps shows
it), in the output or in --json; the one key that travels, a node's key for its POST back into a gateway, goes on
the helper's standard input.
"""
from __future__ import annotations

import datetime
import getpass
import json
import shlex
import socket
import time

from glm5.contract import GATEWAY_ADMIN_KEY_VAR
from glm5.errors import Interrupted, OpsError, UsageError
from glm5.inventory import GATEWAY_CONTRACT, GATEWAYS, filter_plugin
from glm5.node import unit_state
from glm5.render import ago, table
from glm5.transport import connect

# An HTTP request, run in a container: argv[1:] method, URL, the file holding the bearer key ('': none), for an
# environment file the key's variable, and how long to wait for the answer (s); a body (JSON) on stdin. One line of
# JSON: status (a number, 'refused' when nothing listens, else the error's type), body (the key sent, where the far
# side echoes it, as ***), seconds.
REQUEST = r'''
import json, sys, time, urllib.error, urllib.request
method, url, keyfile, var, wait = sys.argv[1:6]
headers = {'Content-Type': 'application/json'}
if keyfile:
    key = open(keyfile).read()
    if var:
        found = [x.split('=', 1)[1].strip() for x in key.splitlines() if x.strip().startswith(var + '=')]
        if not found:
            sys.exit('no ' + var + ' in ' + keyfile)
        key = found[-1].strip('"\'')
    key = key.strip()
    headers['Authorization'] = 'Bearer ' + key
body = sys.stdin.read().encode() if method in ('POST', 'PUT') else None
t = time.monotonic()
try:
    r = urllib.request.urlopen(urllib.request.Request(url, data=body, method=method, headers=headers),
                               timeout=float(wait))
    code, out = r.status, r.read()
except urllib.error.HTTPError as e:
    code, out = e.code, e.read()
except Exception as e:
    why = getattr(e, 'reason', e)
    code, out = 'refused' if isinstance(why, ConnectionRefusedError) else type(e).__name__, str(why).encode()
if keyfile and key:
    out = out.replace(key.encode(), b'***')     # a far side that echoes the request shows no key
print(json.dumps({'status': code, 'body': out.decode('utf-8', 'replace'), 'seconds': round(time.monotonic() - t, 3)}))
'''
# The drained list changed in the gateway's container: argv[1:] the file, add or remove, the node; the entry (JSON)
# on stdin for add. Under a lock on its folder (two operators at once), written to a temporary file then renamed
# (0644, root's when root writes it); a node drained already keeps its entry. Prints the node's entry before (or null).
DRAINED = r'''
import fcntl, json, os, sys, tempfile
path, op, node = sys.argv[1:4]
folder = os.path.dirname(path)
lock = os.open(folder, os.O_RDONLY)
fcntl.flock(lock, fcntl.LOCK_EX)
try:
    with open(path) as fh:
        items = json.load(fh)
except FileNotFoundError:
    items = []
except ValueError as exc:
    sys.exit(path + ' is not JSON (' + str(exc) + '): mend it, or remove it')
if not isinstance(items, list):
    sys.exit(path + ' is not a JSON list: mend it, or remove it')
bad = [i + 1 for i, x in enumerate(items) if not isinstance(x, dict) or not isinstance(x.get('node'), str) or not x['node']]
if bad:
    sys.exit(path + ' is not a list of drained nodes (entry %d): mend it, or remove it' % bad[0])
mine = [x for x in items if isinstance(x, dict) and x.get('node') == node]
new = items if op == 'add' and mine else [x for x in items if x not in mine]
if op == 'add' and not mine:
    new = new + [json.loads(sys.stdin.read())]
if new != items:
    tmp = tempfile.NamedTemporaryFile('w', dir=folder, prefix='.' + os.path.basename(path) + '.', delete=False)
    with tmp:
        json.dump(new, tmp, indent=1)
        tmp.write('\n')
        tmp.flush()
        os.fsync(tmp.fileno())
    os.chmod(tmp.name, 0o644)
    if os.geteuid() == 0:
        os.chown(tmp.name, 0, 0)
    os.replace(tmp.name, path)
print(json.dumps(mine[0] if mine else None))
'''
# smg's smg_worker_cb_state gauge, per worker URL
CIRCUIT = {0: 'closed', 1: 'open', 2: 'half-open'}
GONE_TIMEOUT = 30           # as the deploy's leave (roles/sglang_gateway/tasks/leave_one.yml)
BACK_TIMEOUT = 30           # a restart's leave interrupted: the node, ready a moment ago, healthy again in its gateways


def ask(shell, method, url, keyfile='', var='', body=None, timeout=60, secret=None, wait=30):
    """method url, asked in the container `shell` runs in -> {status, body, seconds}; body: JSON, sent on stdin.
    secret: a value the answer must not show (a body the far side echoes); wait: seconds for the answer."""
    r = shell.run('python3 -c {0} {1} {2} {3} {4} {5}'.format(shlex.quote(REQUEST), method, shlex.quote(url),
                                                             shlex.quote(keyfile), shlex.quote(var), float(wait)),
                  timeout=timeout, stdin=json.dumps(body) if body is not None else None)
    lines = r.stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1]) if r.ok and lines else None
    except ValueError:
        out = None
    if out is None:
        said = ((r.stderr or r.stdout).strip().splitlines() or ['exit {0}'.format(r.exited)])[-1]
        raise OpsError('{0}: cannot ask {1} {2} in its container: {3}'.format(shell.name, method, url, said))
    if secret:
        out['body'] = out['body'].replace(secret, '***')
    return out


def circuit_states(metrics):
    """{worker URL: closed / open / half-open} from the gateway's Prometheus text."""
    out = {}
    for line in metrics.splitlines():
        if line.startswith('smg_worker_cb_state{') and 'worker="' in line:
            url = line.split('worker="', 1)[1].split('"', 1)[0]
            try:
                out[url.rstrip('/')] = CIRCUIT.get(int(float(line.rsplit(None, 1)[1])), line.rsplit(None, 1)[1])
            except (ValueError, IndexError):            # a line without its value: no state for that worker
                continue
    return out


def fleet_view(name, nodes, workers, drained, circuits):
    """The gateway's view: a row per node of the inventory (in it or not) and per other worker it has, with what is wrong
    (problems: a node not drained that is out or unhealthy) and what is odd (notes). nodes: [{node, url}] (the
    inventory's, sglang_fleet_workers); workers: its /workers list; drained: its drained file's entries."""
    by_url = {n['url']: n['node'] for n in nodes}
    marks = {d.get('node'): d for d in drained if isinstance(d, dict)}
    rows, problems, notes = [], [], []

    def row(node, url, **kw):
        d = marks.get(node) or {}
        rows.append(dict({'node': node, 'url': url, 'drained': bool(d), 'drained_by': d.get('by'),
                          'drained_since': d.get('since')}, **kw))
        return rows[-1]

    for w in workers:
        url = (w.get('url') or '').rstrip('/')
        r = row(by_url.get(url), url, in_gateway=True, id=w.get('id'), healthy=bool(w.get('is_healthy')),
                status=w.get('status'), load=w.get('load'), circuit=circuits.get(url))
        if r['node'] is None:
            notes.append('{0} routes to {1}, which is no node of the inventory'.format(name, url))
        elif r['drained']:
            notes.append('{0} is drained (by {1} since {2}) but {3} still routes to it: glm5 drain {0} takes it out '
                         'again'.format(r['node'], r['drained_by'], r['drained_since'], name))
        elif not r['healthy']:
            problems.append('{0} is unhealthy in {1} (status {2}{3})'.format(
                r['node'], name, r['status'], ', circuit ' + r['circuit'] if r['circuit'] else ''))
        elif w.get('model_id') == 'unknown':
            # smg could not ask the node what it serves (the node refused the key it was given): healthy (/health
            # takes no key), and every request for its model refused
            problems.append('{0} is in {1} under the model unknown: the gateway could not ask it what it serves (the '
                            'node refuses the key it was added with); every request for it is refused (glm5 drain then '
                            'undrain {0} adds it again with the node\'s key)'.format(r['node'], name))
        elif r['circuit'] in ('open', 'half-open'):
            notes.append('{0}: its circuit in {1} is {2} (failed requests; the gateway tries it again)'.format(
                r['node'], name, r['circuit']))
    inside = {r['url'] for r in rows}
    for n in nodes:
        if n['url'] not in inside:
            r = row(n['node'], n['url'], in_gateway=False, id=None, healthy=None, status='out', load=None, circuit=None)
            if n.get('known') is False:
                problems.append('sglang_gateway_nodes of {0} names {1}, which is not an inventory host'.format(
                    name, n['node']))
            elif not r['drained']:
                problems.append('{0} is not in {1} and not drained: a deploy adds it once its smoke test passes; '
                                'glm5 undrain {0} adds it now'.format(n['node'], name))
    order = {n['node']: i for i, n in enumerate(nodes)}
    rows.sort(key=lambda r: order.get(r['node'], len(order)))        # the inventory's order, strays last
    return {'gateway': name, 'total': len(nodes), 'in': sum(1 for r in rows if r['in_gateway'] and r['node']),
            'healthy_in': sum(1 for r in rows if r['healthy'] and r['node']),
            'drained': sum(1 for r in rows if r['drained']), 'workers': rows, 'problems': problems, 'notes': notes}


def fleet_text(v, indent='', head='{gateway}: '):
    def yn(value):
        return '-' if value is None else ('yes' if value else 'NO')

    head = head.format(**v) + '{0} of {1} nodes in, {2} healthy, {3} drained'.format(v['in'], v['total'], v['healthy_in'],
                                                                                   v['drained'])
    rows = [('node', 'worker', 'healthy', 'status', 'in flight', 'circuit', 'drained')]
    for r in v['workers']:
        rows.append((r['node'] or '?', r['url'], yn(r['healthy']), r['status'] or '?',
                     '-' if r['load'] is None else r['load'], r['circuit'] or '-',
                     'yes, by {0} since {1}'.format(r['drained_by'], r['drained_since']) if r['drained'] else 'no'))
    lines = [indent + x for x in table(rows, right={4}).splitlines()]
    lines += [indent + 'PROBLEM: ' + p for p in v['problems']] + [indent + 'note: ' + n for n in v['notes']]
    return '\n'.join([head] + lines)


class Gateway(object):
    """One gateway: its contract (sglang_gateway_contract, rendered), the shell of its container, and the inventory's
    nodes behind it ([{node, url}])."""
    def __init__(self, name, contract, shell, nodes, hv=None):
        self.name, self.contract, self.shell, self.nodes, self.hv = name, contract, shell, nodes, hv
        self.url = contract['url'].rstrip('/')

    def close(self):
        self.shell.close()

    def worker_url(self, node):
        return next((n['url'] for n in self.nodes if n['node'] == node), None)

    def request(self, method, path, body=None, secret=None):
        return ask(self.shell, method, self.url + path, self.contract['env_file'], GATEWAY_ADMIN_KEY_VAR, body,
                   secret=secret)

    def _fail(self, what, out):
        if out['status'] == 'refused':
            raise OpsError('{0}: nothing listens at {1} in its container: is {2} running? (glm5 status)'.format(
                self.name, self.url, self.contract['service']))
        raise OpsError('{0}: its control plane ({1}) answered {2}: {3}'.format(
            self.name, what, out['status'], ' '.join(out['body'].split())[:200] or 'nothing'))

    def workers(self):
        out = self.request('GET', '/workers')
        if out['status'] != 200:
            self._fail('GET {0}/workers'.format(self.url), out)
        try:
            workers = json.loads(out['body'])['workers']
        except (ValueError, KeyError, TypeError):
            workers = None
        if not isinstance(workers, list) or not all(isinstance(w, dict) for w in workers):
            raise OpsError('{0}: GET {1}/workers is not the gateway\'s worker list'.format(self.name, self.url))
        return workers

    def remove(self, worker_id):
        out = self.request('DELETE', '/workers/' + worker_id)
        if out['status'] not in (200, 202, 204, 404):
            self._fail('DELETE {0}/workers/{1}'.format(self.url, worker_id), out)

    def add(self, url, key):
        out = self.request('POST', '/workers', {'url': url, 'api_key': key}, secret=key)
        if out['status'] not in (200, 201, 202, 409):           # 409: there already (its addition pending)
            self._fail('POST {0}/workers'.format(self.url), out)

    def drained(self):
        path = self.contract['drained_file']
        r = self.shell.run('cat {0}'.format(shlex.quote(path)))
        if not r.ok:
            if 'No such file' in r.stderr:
                return []
            raise OpsError('{0}: cannot read {1}: {2}'.format(self.name, path, r.stderr.strip()))
        # read as a deploy reads it (the sglang_drained_text filter): anything but a list of drained nodes is a problem
        out = filter_plugin('sglang_drained_text')(r.stdout, path, self.name)
        if out['problem']:
            raise OpsError(out['problem'])
        return out['entries']

    def mark(self, op, node, entry=None):
        """add (entry) or remove node in the drained file -> the node's entry before, or None."""
        path = self.contract['drained_file']
        r = self.shell.run('python3 -c {0} {1} {2} {3}'.format(shlex.quote(DRAINED), shlex.quote(path), op,
                                                              shlex.quote(node)),
                           stdin=json.dumps(entry) if entry else '')
        if not r.ok:
            raise OpsError('{0}: cannot {1} {2} in {3}: {4}'.format(
                self.name, op, node, path, ((r.stderr or r.stdout).strip().splitlines() or ['?'])[-1]))
        return json.loads(r.stdout.strip().splitlines()[-1])

    def circuits(self):
        try:
            out = ask(self.shell, 'GET', self.contract['metrics_url'])
        except OpsError:
            return {}
        return circuit_states(out['body']) if out['status'] == 200 else {}

    def view(self):
        return dict(fleet_view(self.name, self.nodes, self.workers(), self.drained(), self.circuits()), url=self.url)


class _Hostvars(object):
    """The inventory's hosts as Ansible's hostvars reads them (hostvars[host][variable], rendered), for the fleet
    filter, less the keys: a worker's URL needs none, and glm5 reads a node's key on the node."""
    def __init__(self, inv):
        self.inv, self.cache = inv, {}

    def hv(self, name):
        if name not in self.cache:
            self.cache[name] = self.inv.host_vars(name)
        return self.cache[name]

    def __contains__(self, name):
        return name in self.inv.inv.hosts

    def __getitem__(self, name):
        hv = self.hv(name)

        class Vars(object):
            def __getitem__(self, key):
                if key not in hv.variables or key.endswith('_api_key'):
                    raise KeyError(key)
                return hv.get(key)
        return Vars()


def gateway_contract(inv, name, hv):
    return inv.contract(name, hv, GATEWAY_CONTRACT)


def gateways(inv, wanted=None, every=False):
    """The inventory's gateways as Gateway objects: -g GATEWAY, else the only one (every: all of them)."""
    names = inv.gateways()
    if not names:
        raise UsageError('{0} has no gateway (no hosts in {1})'.format(inv.source, GATEWAYS))
    if wanted and wanted not in names:
        raise UsageError('unknown gateway {0!r}: {1} has {2}'.format(wanted, inv.source, ', '.join(names)))
    if wanted:
        names = [wanted]
    elif len(names) > 1 and not every:
        raise UsageError('{0} has {1} gateways ({2}): pick one with -g GATEWAY'.format(
            inv.source, len(names), ', '.join(names)))
    hostvars, out = _Hostvars(inv), []
    for name in names:
        hv = hostvars.hv(name)
        contract = gateway_contract(inv, name, hv)
        # each node's worker URL exactly as the role computes it (its filter), never a key
        workers = filter_plugin('sglang_fleet_workers')(list(contract['nodes'] or []), hostvars, inv.defaults)
        out.append(Gateway(name, contract, connect(hv), [{'node': w['node'], 'url': w['url'], 'known': w['known']}
                                                         for w in workers], hv))
    return out


def in_front(inv, node, required=True):
    """The gateways in front of an inference node (their sglang_gateway_nodes name it); none is a usage error
    unless not required (glm5 restart: a node behind no gateway restarts alone)."""
    inv.select(node)
    if not required and not inv.gateways():
        return []
    found = []
    for g in gateways(inv, every=True):
        if g.worker_url(node):
            found.append(g)
        else:
            g.close()
    if not found and required:
        raise UsageError('{0} is behind no gateway of {1} (sglang_gateway_nodes)'.format(node, inv.source))
    return found


def _operator_drained(gw, node):
    return next((d for d in gw.drained() if isinstance(d, dict) and d.get('node') == node), None)


# -- glm5 status's section
def gateway_status(gw):
    st = {'gateway': gw.name, 'url': gw.url, 'problems': []}
    problems = st['problems']
    try:
        st['ssh'] = getattr(gw.shell, 'where', None)
        st['unit'] = u = unit_state(gw.shell, gw.contract['service'])
        if u['load'] != 'loaded':
            problems.append('unit {0} is not installed ({1})'.format(u['name'], u['load']))
        elif u['active'] != 'active':
            problems.append('unit {0} is {1} ({2})'.format(u['name'], u['active'], u['sub']))
        # the front door (HAProxy) holds the client port; the hand-off's second smg runs only while a deploy restarts
        # the first
        st['front'] = f = unit_state(gw.shell, gw.contract['front_service'])
        if f['active'] != 'active':
            problems.append('the front door {0} is {1} ({2}): clients cannot reach the gateway'.format(
                f['name'], f['active'], f['sub']))
        st['handoff'] = unit_state(gw.shell, gw.contract['handoff_service'])
        h = ask(gw.shell, 'GET', gw.url + gw.contract['ready_path'])
        st['health'] = {'ok': h['status'] == 200, 'status': h['status'], 'seconds': h['seconds'],
                        'url': gw.url + gw.contract['ready_path']}
        if not st['health']['ok']:
            problems.append('{0} answered {1}'.format(st['health']['url'], h['status']))
        st['fleet'] = gw.view()
        problems.extend(st['fleet']['problems'])
    except OpsError as exc:
        problems.append(str(exc).split(': ', 1)[-1])
    return st


def gateway_text(st):
    lines = ['{0} (gateway): {1}'.format(st['gateway'], 'HEALTHY' if not st['problems'] else 'UNHEALTHY')]
    u, h = st.get('unit'), st.get('health')
    if u:
        lines.append('  unit        {0} {1} ({2}){3}, {4} restarts'.format(
            u['name'], u['active'], u['sub'], ' since {0}, up {1}'.format(u['since'], ago(u['uptime_s']))
            if u['since'] else '', u['restarts']))
    f, ho = st.get('front'), st.get('handoff')
    if f:
        lines.append('  front door  {0} {1} ({2}){3}'.format(f['name'], f['active'], f['sub'], ', the hand-off\'s {0} {1}'
                     .format(ho['name'], ho['active']) if ho and ho['active'] != 'inactive' else ''))
    if h:
        lines.append('  health      {0} {1} in {2} s'.format(h['url'], h['status'], h['seconds']))
    f = st.get('fleet')
    if f:
        lines.append(fleet_text(dict(f, problems=[]), '  ', '  fleet       '))
    lines += ['  PROBLEM: ' + p for p in st['problems']]
    return '\n'.join(lines)


# -- drain and undrain
def _now():
    return datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')


def in_flight(node, wait=30):
    """The node's own count of running and waiting requests (sglang's /v1/loads, asked in its container with its key):
    {status, running, waiting, total}; total None when the engine does not say, 0 when nothing listens."""
    out = ask(node.ssh, 'GET', node.contract['url'] + '/v1/loads', node.contract['key_file'], wait=wait)
    res = {'status': out['status'], 'running': None, 'waiting': None, 'total': None}
    if out['status'] == 'refused':
        res.update(running=0, waiting=0, total=0)
    elif out['status'] == 200:
        try:
            loads = json.loads(out['body'])['loads']
            res['running'] = sum(int(x.get('num_running_reqs') or 0) for x in loads)
            res['waiting'] = sum(int(x.get('num_waiting_reqs') or 0) for x in loads)
            res['total'] = res['running'] + res['waiting']
        except (ValueError, KeyError, TypeError, AttributeError):     # not sglang's shape: the load is not known
            res['running'] = res['waiting'] = None
    return res


def listed(gw, worker):
    """The gateway's workers at the worker URL (its list, asked now)."""
    return [w for w in gw.workers() if (w.get('url') or '').rstrip('/') == worker]


def _wait(check, timeout, interval):
    """check() until it returns a true value or timeout seconds have passed -> its last value."""
    t0 = time.monotonic()
    while True:
        value = check()
        if value or time.monotonic() - t0 >= timeout:
            return value
        time.sleep(interval)


def last_serving(gws, node):
    """Why node may not leave its gateways now ('' when it may): the last node serving through one of them while it
    has others (the role's own check, the sglang_leave_problem filter); a gateway whose sglang_gateway_allow_outage
    is true lets it."""
    check = filter_plugin('sglang_leave_problem')
    return '; '.join(p for p in (check(gw.workers(), gw.worker_url(node.name), gw.name, node.name, gw.nodes)
                                 for gw in gws if not gw.contract.get('allow_outage')) if p)


def drain(gws, node, timeout, say, interval=2, record=True, force=False):
    """Take node out of each gateway (recorded first in its drained file, so that a deploy or a gateway restart keeps
    it out), then wait up to timeout s for its in-flight requests to finish. node: name, ssh, contract.
    record False (glm5 restart): out for a moment, not recorded as an operator's drain. The last node serving through
    a gateway is refused before anything changes (last_serving) unless force."""
    problem = '' if force else last_serving(gws, node)
    if problem:
        raise OpsError('{0}: nothing was changed; undrain another node first, or --force'.format(problem))
    marked, taken = [], []      # the gateways that hold its mark, and those it was taken out of: what Ctrl-C leaves
    try:
        return _drain(gws, node, timeout, say, interval, record, marked, taken)
    except KeyboardInterrupt:
        raise Interrupted(_drain_interrupted(gws, node, say, record, marked, taken)) from None


def _drain_interrupted(gws, node, say, record, marked, taken):
    """What a drain interrupted (Ctrl-C) leaves, in one line. An operator's drain (record) stays: the node is marked
    drained where it was, only the wait for its in-flight requests was cut short. glm5 restart's leave (not record)
    had restarted nothing yet: the node goes back into the gateways it was taken out of."""
    if not record:
        if not taken:
            return '{0}: interrupted before it left {1}: nothing restarted'.format(
                node.name, ', '.join(g.name for g in gws))
        try:
            back = undrain(taken, node, BACK_TIMEOUT, say, record=False)
        except OpsError as exc:         # (a second Ctrl-C too: undrain's Interrupted)
            return '{0}: interrupted before the restart: out of {1}, and putting it back failed ({2}): glm5 undrain {0} ' \
                   'puts it back'.format(node.name, ', '.join(g.name for g in taken), exc)
        return '{0}: interrupted before the restart: nothing restarted, put back into {1}{2}'.format(
            node.name, ', '.join(g.name for g in taken), '' if back['healthy'] else ' (not healthy there yet: glm5 fleet)')
    if not marked:
        return '{0}: interrupted before anything changed'.format(node.name)
    still_in = [g.name for g in marked if g not in taken]
    return '{0}: interrupted: marked drained in {1}{2}{3}; its in-flight requests were not waited for (glm5 drain {0} ' \
           'again, glm5 undrain {0} puts it back)'.format(
               node.name, ', '.join(g.name for g in marked),
               ', out of {0}'.format(', '.join(g.name for g in taken)) if taken else '',
               ', still in {0}'.format(', '.join(still_in)) if still_in else '')


def _drain(gws, node, timeout, say, interval, record, marked, taken):
    entry = {'node': node.name, 'since': _now(), 'by': '{0}@{1}'.format(getpass.getuser(), socket.gethostname())}
    res = {'node': node.name, 'gateways': [], 'drained': False}
    for gw in gws:
        worker = gw.worker_url(node.name)
        if record:
            marked.append(gw)           # (before the mark and the removal: rather said of one a moment early than missed)
        before = gw.mark('add', node.name, dict(entry, worker=worker)) if record else _operator_drained(gw, node.name)
        ids = [w['id'] for w in listed(gw, worker)]
        taken.append(gw)                # out of it from here: taken out now, or not in it
        if not _take_out(gw, worker, ids):
            raise OpsError('{0} still routes to {1} {2} s after its removal: {3} is marked drained there; glm5 drain '
                           '{3} tries again (journalctl -u {4} on {0})'.format(gw.name, worker, GONE_TIMEOUT, node.name,
                                                                                gw.contract['service']))
        say('{0}: {1}{2}'.format(node.name, 'out of {0} ({1})'.format(gw.name, worker) if ids else
                                'not in {0} ({1})'.format(gw.name, worker),
                                ', drained already by {0} since {1}'.format(before.get('by'), before.get('since'))
                                if before else ', marked drained' if record else ''))
        res['gateways'].append({'gateway': gw.name, 'worker': worker, 'removed': bool(ids), 'drained_before': before})
    t0, last, told = time.monotonic(), None, 0
    while True:
        try:
            # an engine that does not answer is waited for no longer than the drain's bound (at least a second)
            n = in_flight(node, max(1.0, min(30.0, timeout - (time.monotonic() - t0))))
        except OpsError as exc:
            raise OpsError('{0}; it stays drained (out of {1})'.format(
                exc, ', '.join(g['gateway'] for g in res['gateways']))) from None
        waited = round(time.monotonic() - t0, 1)
        if n['total'] == 0:
            break
        if n['total'] is None and n['status'] in (401, 403, 404):
            break                       # an engine that does not report its load (or refuses its key) will not start to
        if waited >= timeout:
            break
        if n['total'] != last or time.monotonic() - told >= 10:
            say('{0}: {1} in flight after {2} s'.format(node.name, '{0} ({1} running, {2} waiting)'.format(
                n['total'], n['running'], n['waiting']) if n['total'] is not None else '? (/v1/loads: {0})'.format(
                n['status']), waited))
            last, told = n['total'], time.monotonic()
        time.sleep(interval)
    res.update(in_flight=n['total'], loads_status=n['status'], waited_s=waited, drained=n['total'] == 0)
    if res['drained']:
        say('{0}: drained, nothing in flight{1}'.format(
            node.name, ' (its engine does not answer)' if n['status'] == 'refused' else ' after {0} s'.format(waited)))
    return res


def drain_error(res, node, timeout):
    where = ', '.join(g['gateway'] for g in res['gateways'])
    if res['in_flight'] is None:
        said = '{0}{1}'.format(res['loads_status'], ', not a load report' if res['loads_status'] == 200 else '')
        return ('{0}: its in-flight requests cannot be seen ({1}/v1/loads answered {2}): it stays drained (out of {3}); '
                'glm5 undrain {0} puts it back'.format(node.name, node.contract['url'], said, where))
    return ('{0}: {1} requests still in flight after {2} s (--timeout): it stays drained (out of {3}); glm5 drain {0} '
            'waits again, glm5 undrain {0} puts it back'.format(node.name, res['in_flight'], timeout, where))


def undrain(gws, node, timeout, say, interval=1, record=True):
    """Put node back into each gateway: off its drained file, added with the node's key (read on the node) unless it
    is there, then healthy in each gateway's view within timeout s. record False (glm5 restart): the drained file is
    only read - a gateway whose operator drained the node keeps it out."""
    try:
        return _undrain(gws, node, timeout, say, interval, record)
    except KeyboardInterrupt:
        raise Interrupted('{0}: interrupted while it was put back into {1}: glm5 fleet shows where it stands, glm5 '
                          'undrain {0} puts it back'.format(node.name, ', '.join(g.name for g in gws))) from None


def _undrain(gws, node, timeout, say, interval, record):
    res, key = {'node': node.name, 'gateways': [], 'healthy': False}, None
    for gw in list(gws):
        worker = gw.worker_url(node.name)
        if not record:
            kept = _operator_drained(gw, node.name)
            if kept:
                say('{0}: stays out of {1}: drained by {2} since {3} (glm5 undrain {0} puts it back)'.format(
                    node.name, gw.name, kept.get('by'), kept.get('since')))
                res['gateways'].append({'gateway': gw.name, 'worker': worker, 'added': False, 'drained_before': kept,
                                        'kept_out': True})
                gws = [g for g in gws if g is not gw]
                continue
        # what the gateway has and the node's key first: a node whose key cannot be read stays drained
        there = listed(gw, worker)
        if any(w.get('status') == 'draining' for w in there):
            # smg letting it go (a removal under way, ~5 s; a drain interrupted a moment ago): on its way out, not
            # in - taken for in, it would leave after the put-back. Added once it has gone.
            _wait(lambda gw=gw, worker=worker: not any(w.get('status') == 'draining' for w in listed(gw, worker)),
                  GONE_TIMEOUT, 1)
            there = listed(gw, worker)
        if not there and key is None:
            r = node.ssh.run('cat {0}'.format(shlex.quote(node.contract['key_file'])))
            if not r.ok or not r.stdout.strip():
                raise OpsError('{0}: cannot read its key {1}: {2}'.format(
                    node.name, node.contract['key_file'], r.stderr.strip() or 'empty'))
            key = r.stdout.strip()
        before = gw.mark('remove', node.name) if record else None
        if not there:
            try:
                gw.add(worker, key)
            except OpsError as exc:
                if before:              # not added: drained again, as it was
                    gw.mark('add', node.name, before)
                raise OpsError('{0}{1}'.format(exc, '; it stays drained' if before else '')) from None
        say('{0}: {1} {2} ({3}){4}'.format(node.name, 'in' if there else 'added to', gw.name, worker,
                                           ', no longer drained' if before else ''))
        res['gateways'].append({'gateway': gw.name, 'worker': worker, 'added': not there, 'drained_before': before})
    key = None
    t0, state = time.monotonic(), {}
    if not gws:                         # every gateway keeps it out (an operator's drain): nothing to wait for
        res.update(healthy=True, waited_s=0, state={})
        return res

    def healthy():
        for gw in gws:
            worker = gw.worker_url(node.name)
            w = listed(gw, worker)
            state[gw.name] = ('healthy' if w[0].get('is_healthy') else 'unhealthy ({0})'.format(w[0].get('status'))) \
                if w else 'not listed yet'
        return all(s == 'healthy' for s in state.values())

    res['healthy'] = bool(_wait(healthy, timeout, interval))
    res['waited_s'], res['state'] = round(time.monotonic() - t0, 1), state
    if res['healthy']:
        say('{0}: healthy in {1} after {2} s'.format(node.name, ', '.join(state), res['waited_s']))
    if not record:
        _drained_meanwhile(gws, node, res, say)
    return res


def _take_out(gw, worker, ids):
    """worker's ids (as gw lists them) removed from gw -> whether it is gone from gw's list within GONE_TIMEOUT s."""
    for i in ids:
        gw.remove(i)
    return not ids or bool(_wait(lambda: not listed(gw, worker), GONE_TIMEOUT, 1))


def _drained_meanwhile(gws, node, res, say):
    """glm5 restart's put-back (unrecorded), the node now in gws: an operator's glm5 drain since the drained file was
    read found it not in yet and took nothing out - out again, as the deploy's join does (drained_meanwhile.yml)."""
    for gw in gws:
        kept = _operator_drained(gw, node.name)
        if not kept:
            continue
        worker = gw.worker_url(node.name)
        gone = _take_out(gw, worker, [w['id'] for w in listed(gw, worker)])
        say('{0}: drained by {1} since {2} while it was put back into {3}: {4} (glm5 undrain {0} puts it back)'.format(
            node.name, kept.get('by'), kept.get('since'), gw.name, 'out of it again' if gone else
            'taken out again, still listed {0} s after (glm5 drain {1} tries again)'.format(GONE_TIMEOUT, node.name)))
        for g in res['gateways']:
            if g['gateway'] == gw.name:
                g.update(kept_out=True, drained_before=kept)


def undrain_error(res, node, timeout):
    return ('{0}: not healthy in the gateway {1} s after it was put back (--timeout): {2}; it is no longer drained, so '
            'the gateway keeps checking it (glm5 fleet; the gateway\'s journal says why)'.format(
                node.name, timeout, ', '.join('{0} {1}'.format(g, s) for g, s in res['state'].items())))
