"""What `glm5 status` finds on a node, and what is wrong with it."""
from __future__ import annotations

from glm5.errors import OpsError


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
    node.ssh.open()
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
            problems.append('{0}{1} answered {2}'.format(launch['base_url'], node.contract['ready_path'], h.get('status') or
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

