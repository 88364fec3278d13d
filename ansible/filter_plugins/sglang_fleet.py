"""The fleet behind SGLang's model gateway: each node's worker URL and key, and what is wrong with the fleet's
settings (checked before anything changes, each problem one line)."""
import base64
import json
from urllib.parse import urlsplit

LOOPBACK = ('127.', 'localhost', '::1')


def _get(hv, name, default):
    try:
        value = hv[name]
    except KeyError:
        return default
    return default if value is None else value


def _host(address):
    """An address as it goes before :port in a URL: an IPv6 address in brackets."""
    address = str(address)
    return '[{0}]'.format(address) if ':' in address and not address.startswith('[') else address


def sglang_fleet_workers(names, hostvars, service_defaults):
    """Each node the gateway routes to, in order: {node, url, key, listen, known}.

    The URL is the node's sglang_gateway_worker_url, else http://<ansible_host>:<sglang_service_port>; listen is
    its sglang_service_host (what sglang binds). service_defaults: sglang_service's role defaults (a node whose
    inventory sets no port has the role's)."""
    workers = []
    for name in names or []:
        if name not in hostvars:
            workers.append({'node': name, 'url': '', 'key': '', 'listen': '', 'known': False})
            continue
        hv = hostvars[name]
        port = _get(hv, 'sglang_service_port', service_defaults.get('sglang_service_port'))
        url = _get(hv, 'sglang_gateway_worker_url', '') or 'http://{0}:{1}'.format(
            _host(_get(hv, 'ansible_host', name)), port)
        workers.append({'node': name, 'url': str(url).rstrip('/'), 'key': str(_get(hv, 'sglang_service_api_key', '')),
                        'secondary': str(_get(hv, 'sglang_service_api_key_secondary', '')),
                        'listen': str(_get(hv, 'sglang_service_host', service_defaults.get('sglang_service_host'))),
                        'known': True})
    return workers


def _endpoint(url):
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == 'https' else 80)
    except ValueError:
        return None
    return (parts.hostname or '').lower(), port


def sglang_fleet_problems(workers, gateway, api_key='', admin_key='', batch=1, allow_single_node=False,
                          api_key_secondary=''):
    """What is wrong with a gateway's fleet: no nodes, a node named twice or unknown, two nodes at one URL or
    address:port, a bad URL, a node sglang does not serve where the gateway looks, a missing key or one the gateway
    takes that a node refuses (its key and secondary key against the node's), a rolling batch that takes every node
    down at once."""
    problems = []
    if api_key_secondary and api_key_secondary == api_key:
        problems.append('sglang_gateway_api_key_secondary of {0} is its sglang_gateway_api_key: a key change gives the '
                        'other key there'.format(gateway))
    if not workers:
        return ['the gateway {0} has no nodes behind it (sglang_gateway_nodes is empty): add inference nodes, or '
                'remove the gateway from the inventory'.format(gateway)]
    if not api_key:
        problems.append('sglang_gateway_api_key is empty on {0}: set the key clients send (a vault variable)'.format(
            gateway))
    if not admin_key:
        problems.append('sglang_gateway_admin_key is empty on {0}: set the control plane key (a vault variable); the '
                        'rolling deploy and glm5 drain use it'.format(gateway))
    names = [w['node'] for w in workers]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append('{0} is listed {1} times in sglang_gateway_nodes of {2}: list each node once'.format(
            name, names.count(name), gateway))
    seen_url, seen_end = {}, {}
    for w in workers:
        if not w['known']:
            problems.append('sglang_gateway_nodes of {0} names {1}, which is not an inventory host'.format(
                gateway, w['node']))
            continue
        if names.count(w['node']) > 1 and w['node'] in seen_url.values():
            continue
        end = _endpoint(w['url'])
        if not w['url'].startswith(('http://', 'https://')) or end is None or not end[0]:
            problems.append('{0}: worker URL {1!r} is not http(s)://host:port (sglang_gateway_worker_url)'.format(
                w['node'], w['url']))
            continue
        if w['url'] in seen_url:
            problems.append('{0} and {1} are both at {2}: each node needs its own worker URL (sglang_gateway_worker_url '
                            'or sglang_service_port)'.format(seen_url[w['url']], w['node'], w['url']))
        elif end in seen_end:
            problems.append('{0} and {1} both listen at {2}:{3}: each node needs its own address or port '
                            '(sglang_service_port)'.format(seen_end[end], w['node'], end[0], end[1]))
        seen_url.setdefault(w['url'], w['node'])
        seen_end.setdefault(end, w['node'])
        if w['listen'].startswith(LOOPBACK) and not end[0].startswith(LOOPBACK):
            problems.append('{0}: sglang listens on {1} only (sglang_service_host) but the gateway reaches it at {2}: '
                            'set sglang_service_host to that address (or 0.0.0.0)'.format(
                                w['node'], w['listen'], w['url']))
        if not w['key']:
            problems.append('{0} has no sglang_service_api_key: behind the gateway every node serves the gateway\'s '
                            'key (smg forwards the client\'s key to the worker unchanged); set it to the same vault '
                            'variable as sglang_gateway_api_key'.format(w['node']))
        elif api_key:
            # smg forwards the client's key to the worker as sent: every key the gateway takes, the node must take
            accepts = {w['key'], w.get('secondary', '')} - {''}
            for var, key in (('sglang_gateway_api_key', api_key), ('sglang_gateway_api_key_secondary',
                                                                    api_key_secondary)):
                if key and key not in accepts:
                    problems.append('{0} of {1} is neither sglang_service_api_key nor sglang_service_api_key_secondary '
                                    'of {2}: smg forwards the client\'s key to the worker unchanged, so the node would '
                                    'refuse those requests; use the same variables for both (docs/security.md, '
                                    '"Changing the key")'.format(var, gateway, w['node']))
    distinct = len(set(names))
    if isinstance(batch, str) and batch.strip().isdigit():
        batch = int(batch)              # -e glm5_rolling_batch=2 (an extra var on the command line is a string)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        problems.append('glm5_rolling_batch must be a whole number >= 1 (nodes restarted at once), got {0!r}'.format(
            batch))
    elif distinct == 1 and not allow_single_node:
        problems.append('the gateway {0} has one node ({1}): a deploy that restarts it takes the service down; add a '
                        'node, or set sglang_gateway_allow_single_node: true to accept that'.format(gateway, names[0]))
    elif distinct > 1 and batch >= distinct:
        problems.append('glm5_rolling_batch {0} restarts every node behind {1} at once (it has {2}): at most {3} keeps '
                        'one serving'.format(batch, gateway, distinct, distinct - 1))
    return problems


def sglang_serving_workers(workers):
    """The URLs of the workers in a gateway's worker list (GET /workers) that serve: healthy, and under a model. A
    worker the gateway could not ask what it serves (it refused the gateway's key) is healthy - its /health takes no
    key - under the model 'unknown', and every request for it is refused."""
    return [w['url'] for w in workers or [] if isinstance(w, dict) and w.get('is_healthy')
            and w.get('model_id') != 'unknown' and w.get('url')]


def _worker_state(workers, url):
    """What a gateway's worker list says of one worker URL: 'serves', or why it does not."""
    listed = [w for w in workers or [] if isinstance(w, dict) and str(w.get('url') or '').rstrip('/') == url]
    if not listed:
        return 'out of it'
    if url in [u.rstrip('/') for u in sglang_serving_workers(listed)]:
        return 'serves'
    if not listed[0].get('is_healthy'):
        return 'unhealthy there (status {0})'.format(listed[0].get('status') or '?')
    return 'there under the model unknown (it refuses the key the gateway was given)'


def sglang_leave_problem(workers, worker, gateway, node, others, after=None):
    """Why node may not leave gateway now, or '' when it may: it is the last node serving there while the gateway has
    others - every request through the gateway would fail until it is back.

    workers: the gateway's worker list (GET /workers) before the node's removal; after: the list after it, if it was
    removed (another run took the other nodes out at the same time - a second operator, a batch of several nodes - or
    they failed meanwhile: the other nodes' states are read there); worker: the node's worker URL; others: the
    gateway's nodes ([{node, url}], from its contract; the node itself is left out). A node that does not serve there
    changes nothing by leaving; a gateway of one node (sglang_gateway_allow_single_node) has no other node to keep
    serving."""
    worker = str(worker or '').rstrip('/')
    others = [o for o in others or [] if o.get('node') != node]
    if not others or _worker_state(workers, worker) != 'serves':
        return ''
    left = after is not None
    states = [(o['node'], _worker_state(after if left else workers, str(o.get('url') or '').rstrip('/')))
              for o in others]
    if any(state == 'serves' for _, state in states):
        return ''
    said = '; '.join('{0}: {1}'.format(n, s) for n, s in states)
    if left:
        return 'once {0} left {1}, no node served there ({2}), though one did when it checked - another run took ' \
               'it out at the same time, or it failed: every request through {1} would fail until {0} is ' \
               'back'.format(node, gateway, said)
    return '{0} is the last node serving through {1} ({2}): without it every request through {1} fails until it is ' \
           'back'.format(node, gateway, said)


def sglang_in_flight(loads):
    """The requests an engine has in flight - running and waiting, over its data-parallel ranks - from the 'loads' list
    of sglang's load report (GET /v1/loads)."""
    return sum(int(rank.get('num_running_reqs') or 0) + int(rank.get('num_waiting_reqs') or 0)
               for rank in loads or [] if isinstance(rank, dict))


def _not_json(where, exc):
    return {'entries': [], 'problem': '{0} is not JSON ({1}): mend it, or remove it (every node is then taken as not '
                                      'drained)'.format(where, str(exc).splitlines()[0])}


def sglang_drained_text(text, path, gateway):
    """The gateway's drained file (glm5 drain writes it: a JSON list of {node, worker, since, by}) from its text ->
    {'entries': [...], 'problem': ''} or, where it cannot be trusted, {'entries': [], 'problem': one line}. Empty: none
    drained. A file edited by hand into something else is a problem, not "none drained": a deploy would put back a
    node an operator took out, or stop half-way on it. glm5 reads it so too."""
    where = '{0} on {1}'.format(path, gateway)
    try:
        items = json.loads(text or '[]')
    except ValueError as exc:
        return _not_json(where, exc)
    if not isinstance(items, list):
        bad = 'a JSON {0}'.format({dict: 'object', str: 'string', bool: 'true or false', type(None): 'null'}.get(
            type(items), 'number'))
    else:
        bad = next(('entry {0} ({1})'.format(i + 1, json.dumps(x)[:60]) for i, x in enumerate(items)
                    if not isinstance(x, dict) or not isinstance(x.get('node'), str) or not x.get('node')), None)
    if bad:
        return {'entries': [], 'problem': '{0} is not a list of drained nodes ({{"node": NAME, ...}} each): {1}; mend '
                                          'it, or remove it (every node is then taken as not drained)'.format(where, bad)}
    return {'entries': items, 'problem': ''}


def sglang_drained(slurped, path, gateway):
    """sglang_drained_text of a slurp of the drained file (a missing file: none drained)."""
    slurped = slurped if isinstance(slurped, dict) else {}
    if 'content' not in slurped:
        msg = str(slurped.get('msg') or '')
        if 'not found' in msg.lower() or 'no such file' in msg.lower():
            return {'entries': [], 'problem': ''}
        return {'entries': [], 'problem': '{0} on {1} cannot be read ({2})'.format(path, gateway, msg or 'no answer')}
    try:
        text = base64.b64decode(slurped['content']).decode('utf-8')
    except (ValueError, UnicodeDecodeError) as exc:
        return _not_json('{0} on {1}'.format(path, gateway), exc)
    return sglang_drained_text(text, path, gateway)


class FilterModule(object):
    def filters(self):
        return {'sglang_fleet_workers': sglang_fleet_workers, 'sglang_fleet_problems': sglang_fleet_problems,
                'sglang_serving_workers': sglang_serving_workers, 'sglang_in_flight': sglang_in_flight,
                'sglang_leave_problem': sglang_leave_problem, 'sglang_drained': sglang_drained,
                'sglang_drained_text': sglang_drained_text, 'glm5_url_host': _host}
