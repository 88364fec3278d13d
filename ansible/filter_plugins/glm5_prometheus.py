"""What Prometheus scrapes, from the inventory: each inference node's engine (/metrics on its own port), each gateway's
metrics port, and each node's throughput floor for the alert rules; what is wrong with it, one line a problem."""
import re
from urllib.parse import urlsplit

LOOPBACK = ('127.', 'localhost', '::1', '[::1]')
DURATION = re.compile(r'^([0-9]+(ms|s|m|h|d|w|y))+$')
SIZE = re.compile(r'^([0-9]+)(B|[KMGTPE]i?B)$')
GIB = 1024 ** 3


def _get(hv, name, default):
    try:
        value = hv[name]
    except KeyError:
        return default
    return default if value is None else value


def _floor(hv, smoke_defaults):
    """The node's generation throughput floor (output tok/s) while requests queue: its prometheus_engine_min_output_tok_s,
    else the smoke test's: the highest baseline level with output_tok_s, x tolerance x speed factor."""
    own = _get(hv, 'prometheus_engine_min_output_tok_s', None)
    if own is not None:
        return float(own)
    baseline = _get(hv, 'sglang_smoke_baseline', smoke_defaults.get('sglang_smoke_baseline')) or {}
    levels = sorted((int(k), v) for k, v in baseline.items() if (v or {}).get('output_tok_s') is not None)
    if not levels:
        return None
    tolerance = float(_get(hv, 'sglang_smoke_tolerance', smoke_defaults.get('sglang_smoke_tolerance', 1)))
    speed = float(_get(hv, 'sglang_smoke_speed_factor', smoke_defaults.get('sglang_smoke_speed_factor', 1)))
    return round(float(levels[-1][1]['output_tok_s']) * tolerance * speed, 3)


def _host(address):
    """An address as it goes before :port in a target: an IPv6 address in brackets."""
    address = str(address)
    return '[{0}]'.format(address) if ':' in address and not address.startswith('[') else address


def _target(url):
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ('http', 'https') or not parts.hostname or port is None:
        return None, None
    return parts.scheme, '{0}:{1}'.format(_host(parts.hostname), port)


def prometheus_scrape(groups, hostvars, workers, smoke_defaults, gateway_defaults, gpu_defaults):
    """{engines: [{node, scheme, target, pve_host, min_output_tok_s}], gateways: [{gateway, target, handoff_target,
    nodes}], pve_hosts: [{host, gpus, target}] (those with the GPU metrics: roles/gpu_metrics), problems: [...]}.
    workers: sglang_fleet_workers over the inference nodes; gateway_defaults: sglang_gateway's role defaults (the
    metrics ports a gateway has when its inventory sets none); gpu_defaults: gpu_metrics' and gpu_preflight's (whether
    a PVE host has GPU metrics, on which port, how many GPUs it must show). A gateway's handoff_target is the metrics
    port of its second smg, which serves only while the first restarts (sglang_gateway's tasks/handoff.yml)."""
    out = {'engines': [], 'gateways': [], 'pve_hosts': [], 'problems': []}
    for w in workers:
        if not w.get('known'):
            out['problems'].append('{0} is not in the inventory'.format(w['node']))
            continue
        hv = hostvars[w['node']]
        scheme, target = _target(w['url'])
        if target is None:
            out['problems'].append('{0}: its engine URL {1!r} has no scheme, host and port to scrape'.format(
                w['node'], w['url']))
            continue
        host = target.rsplit(':', 1)[0]
        if str(w.get('listen', '')).startswith(LOOPBACK) and not host.startswith(LOOPBACK):
            out['problems'].append('{0}: its sglang listens on {1} only (sglang_service_host) and Prometheus scrapes it '
                                   'at {2}: set sglang_service_host to an address it reaches'.format(
                                       w['node'], w['listen'], target))
        floor = _floor(hv, smoke_defaults)
        if floor is not None and not floor > 0:
            out['problems'].append('{0}: prometheus_engine_min_output_tok_s must be > 0, got {1}'.format(w['node'], floor))
        out['engines'].append({'node': w['node'], 'scheme': scheme, 'target': target, 'min_output_tok_s': floor,
                               'pve_host': str(_get(hv, 'pve_container_pve_host', ''))})
    for name in groups.get('gateways', []):
        hv = hostvars[name]
        address = _host(_get(hv, 'ansible_host', name))
        ports = [_get(hv, v, gateway_defaults.get(v)) for v in ('sglang_gateway_metrics_port',
                                                                 'sglang_gateway_handoff_metrics_port')]
        out['gateways'].append({'gateway': name, 'target': '{0}:{1}'.format(address, ports[0]),
                                'handoff_target': '{0}:{1}'.format(address, ports[1]),
                                'nodes': list(_get(hv, 'sglang_gateway_nodes', groups.get('inference_nodes', [])))})
    for name in groups.get('pve_hosts', []):
        hv = hostvars[name]
        if not _get(hv, 'gpu_metrics_enabled', gpu_defaults['gpu_metrics_enabled']):
            continue            # no GPU metrics there (roles/gpu_metrics skipped): nothing to scrape, no threshold
        address = _host(_get(hv, 'ansible_host', name))
        if _get(hv, 'ansible_connection', '') == 'local':
            address = '127.0.0.1'
        out['pve_hosts'].append({
            'host': name, 'gpus': int(_get(hv, 'gpu_preflight_gpu_count', gpu_defaults['gpu_preflight_gpu_count'])),
            'target': '{0}:{1}'.format(address, int(_get(hv, 'gpu_metrics_port', gpu_defaults['gpu_metrics_port'])))})
    return out


def prometheus_duration_problems(settings):
    """{variable: value} of Prometheus durations: a line for each that Prometheus would refuse."""
    return ['{0} must be a Prometheus duration such as 30s, 2m or 1h30m, got {1!r}'.format(k, v)
            for k, v in sorted(settings.items()) if not DURATION.match(str(v))]


def prometheus_size_problems(size, disk_gb=None, name='prometheus_retention_size'):
    """A cap on the samples' size (--storage.tsdb.retention.size, base-2 units as Prometheus reads them: 1 KB = 1024 B);
    empty: no cap. A line if Prometheus would refuse it, or if it leaves less than 2 GiB of the container's disk
    (disk_gb: pve_container_disk_size, GiB; None: not known) for the system and Prometheus itself."""
    if size is None or size == '':
        return []
    m = SIZE.match(str(size))
    if not m:
        return ['{0} must be a Prometheus size such as 512MB or 4GB (B, KB, MB, GB, TB, PB, EB: 1 KB = 1024 B; or KiB...), '
                'or "" for no cap, got {1!r}'.format(name, size)]
    nbytes = int(m.group(1)) * 1024 ** 'BKMGTPE'.index(m.group(2)[0])
    if nbytes == 0:
        return ['{0} must be above 0 ("" for no cap), got {1!r}'.format(name, size)]
    if disk_gb not in (None, '') and nbytes + 2 * GIB > float(disk_gb) * GIB:
        return ['{0} {1} leaves less than 2 GiB of the container\'s {2} GiB disk (pve_container_disk_size) for the system '
                'and Prometheus itself: its samples would fill the disk first'.format(name, size, disk_gb)]
    return []


class FilterModule(object):
    def filters(self):
        return {'prometheus_scrape': prometheus_scrape, 'prometheus_duration_problems': prometheus_duration_problems,
                'prometheus_size_problems': prometheus_size_problems}
