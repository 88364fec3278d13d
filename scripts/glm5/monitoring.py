"""Prometheus on the monitoring hosts (roles/prometheus), for glm5 status: what fires now, and where to look. Asked
from inside the monitoring host's container, over its shell, at Prometheus' own loopback address (as the gateway's
control plane is asked: fleet.ask); nothing here needs a route from this machine to it."""
from __future__ import annotations

import json
import urllib.parse

from glm5.errors import OpsError
from glm5.fleet import ask
from glm5.inventory import filter_plugin
from glm5.render import table
from glm5.transport import connect

MONITORING = 'monitoring'
# The few queries that matter (the alert rules' own, roles/prometheus/templates/glm5-alerts.yml.j2), linked as graphs.
QUERIES = [
    ('output tok/s per node', 'sum by (node) (sglang:gen_throughput)'),
    ('requests queued per node', 'sum by (node) (sglang:num_queue_reqs)'),
    ('p99 time to first token per node (5m)',
     'histogram_quantile(0.99, sum by (node, le) (rate(sglang:time_to_first_token_seconds_bucket[5m])))'),
    ('workers in each gateway', 'sum by (gateway) (smg_worker_pool_size)'),
    ('GPU power draw / limit per host', 'sum by (pve_host) (nvidia_smi_power_draw_watts) / '
                                        'sum by (pve_host) (nvidia_smi_power_limit_watts)'),
]


def graph_link(base, expr):
    return '{0}/graph?{1}'.format(base, urllib.parse.urlencode({'g0.expr': expr, 'g0.tab': '0', 'g0.range_input': '1h'}))


def monitoring_status(inv, name):
    """{host, url, page, alerts_url, queries, firing: [{alert, where, summary, since}], problems}. url: Prometheus as
    its inventory address gives it (what a browser on the operator's network opens)."""
    hv = inv.host_vars(name)
    port = hv.number('prometheus_port', None, 1, 65535)
    base = 'http://{0}:{1}'.format(filter_plugin('glm5_url_host')(hv.get('ansible_host') or name), port)
    st = {'host': name, 'url': base, 'page': base + '/consoles/glm5.html', 'alerts_url': base + '/alerts',
          'queries': [{'what': w, 'expr': e, 'link': graph_link(base, e)} for w, e in QUERIES], 'firing': [],
          'problems': []}
    shell = None
    try:
        shell = connect(hv)
        out = ask(shell, 'GET', 'http://127.0.0.1:{0}/api/v1/alerts'.format(port), timeout=20)
        if out['status'] != 200:
            st['problems'].append('Prometheus on {0} answered {1} at /api/v1/alerts{2}'.format(
                name, out['status'], ' (is prometheus running? systemctl status prometheus)'
                if out['status'] == 'refused' else ''))
            return st
        for a in json.loads(out['body'])['data']['alerts']:
            if a['state'] != 'firing':
                continue
            labels = a['labels']
            where = labels.get('node') or labels.get('gateway') or labels.get('pve_host') or labels.get('instance', '')
            st['firing'].append({'alert': labels['alertname'], 'where': where, 'severity': labels.get('severity', ''),
                                 'summary': a.get('annotations', {}).get('summary', ''), 'since': a.get('activeAt')})
            st['problems'].append('{0} firing for {1}'.format(labels['alertname'], where))
    except (OpsError, ValueError, KeyError, TypeError, AttributeError) as exc:   # an answer of another shape too
        st['problems'].append('Prometheus on {0}: {1}'.format(name, str(exc).split(': ', 1)[-1]))
    finally:
        if shell is not None:
            shell.close()
    return st


def monitoring_text(st):
    lines = ['{0} (Prometheus): {1}'.format(st['host'], 'nothing firing' if not st['problems'] else
                                            '{0} firing'.format(len(st['firing'])) if st['firing'] else 'UNREACHABLE')]
    lines.append('  fleet page  ' + st['page'])
    lines.append('  alerts      ' + st['alerts_url'])
    if st['firing']:
        lines.extend('  ' + x for x in table([('alert', 'severity', 'where', 'since', 'summary')] + [
            (f['alert'], f['severity'], f['where'], (f['since'] or '')[:19], f['summary']) for f in st['firing']],
            right=()).splitlines())
    for p in st['problems']:
        if not st['firing']:
            lines.append('  PROBLEM: ' + p)
    lines.append('  queries')
    lines.extend('    {0}: {1}'.format(q['what'], q['link']) for q in st['queries'])
    return '\n'.join(lines)
