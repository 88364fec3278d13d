"""Prometheus on make test's full-stack fleet (molecule/default: two nodes, the gateway, the monitoring container that
site.yml's last play deployed): every target it was given is up, the fleet's rules are loaded with the inventory's
numbers, and an engine stopped by hand fires GLM5EngineDown through the running Prometheus within its `for:` window
(the lane's 10 s, scraped and evaluated every 2 s); the engine is started again and the alert resolves."""
import datetime
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import pytest
from siterun import node_ssh, prometheus_api, scenario_fleet_inventory, scenario_hosts, stack_monitor

pytestmark = pytest.mark.stack

HOSTS = scenario_hosts('default')
NODES = [h for h, (group, _) in HOSTS.items() if group == 'inference_nodes']
(GATEWAY,) = [h for h, (group, _) in HOSTS.items() if group == 'gateways']
PROM, PROM_VARS = stack_monitor()
URL = 'http://127.0.0.1:{0}'.format(PROM_VARS['prometheus_port'])


GLM5 = os.path.join(os.path.dirname(sys.executable), 'glm5')


@pytest.fixture(scope='module')
def fleet_inventory(tmp_path_factory):
    """The whole lane fleet as one inventory (both hosts files, the lab's group_vars), for glm5 status."""
    return scenario_fleet_inventory(tmp_path_factory.mktemp('fleet-inventory'))


def api(path):
    return prometheus_api(URL, path)


def until(what, check, timeout):
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError('{0}: not within {1} s (last: {2})'.format(what, timeout, last))


def test_every_target_is_up(stack_node):
    """Every target up but the gateway's second smg, which serves only during a hand-off (tests/test_fleet_rollout.py
    sees it scraped then)."""
    def targets():
        active = api('/api/v1/targets?state=active')['activeTargets']
        return active if active and all(t['health'] == 'up' for t in active
                                        if t['labels']['job'] != 'glm5-gateway-handoff') else None
    active = until('every target up', targets, 60)
    seen = sorted((t['labels']['job'], t['labels'].get('node') or t['labels'].get('gateway') or '') for t in active)
    assert seen == sorted([('glm5-engine', n) for n in NODES] + [('glm5-gateway', GATEWAY), ('prometheus', ''),
                                                                  ('glm5-gateway-handoff', GATEWAY)]), seen
    assert [t['health'] for t in active if t['labels']['job'] == 'glm5-gateway-handoff'] != ['up'], active
    # what the engines serve is sglang's (the emulator's stand-in of it: tests/test_sglang_emulator.py), per node
    series = api('/api/v1/query?query=sglang:num_running_reqs')['result']
    assert sorted(s['metric']['node'] for s in series) == sorted(NODES), series


def test_the_fleets_rules_are_loaded_with_the_inventorys_numbers(stack_node):
    groups = dict((g['name'], g) for g in api('/api/v1/rules')['groups'])
    alerts = [r['name'] for r in groups['glm5-alerts']['rules']]
    assert 'GLM5EngineDown' in alerts and 'GLM5NodeOutOfGateway' in alerts and len(alerts) == 9, alerts
    floors = api('/api/v1/query?query=glm5:engine_min_output_tok_s')['result']
    assert sorted(s['metric']['node'] for s in floors) == sorted(NODES)
    assert all(float(s['value'][1]) > 0 for s in floors), floors
    (expected,) = api('/api/v1/query?query=glm5:gateway_expected_workers')['result']
    assert expected['metric']['gateway'] == GATEWAY and float(expected['value'][1]) == len(NODES)


def test_its_samples_are_capped_in_time_and_size_as_the_inventory_says(stack_node):
    """The running Prometheus' own flags: prometheus_retention and prometheus_retention_size (the role's default when
    the inventory has none), which Prometheus shows in base-2 units (4GB is 4GiB to it)."""
    import yaml
    with open(os.path.join(os.path.dirname(__file__), '..', 'roles', 'prometheus', 'defaults', 'main.yml')) as fh:
        defaults = yaml.safe_load(fh)
    size = PROM_VARS.get('prometheus_retention_size', defaults['prometheus_retention_size'])
    flags = api('/api/v1/status/flags')
    assert seconds(flags['storage.tsdb.retention.time']) == seconds(
        PROM_VARS.get('prometheus_retention', defaults['prometheus_retention'])), flags   # it shows 7d as 1w
    assert size and flags['storage.tsdb.retention.size'] == re.sub(r'([KMGTPE])B$', r'\1iB', size), flags


def seconds(duration):
    """A Prometheus duration (1w2d, 30d, 90s) in seconds."""
    unit = {'ms': 0.001, 's': 1, 'm': 60, 'h': 3600, 'd': 86400, 'w': 604800, 'y': 31536000}
    parts = re.findall(r'([0-9]+)(ms|s|m|h|d|w|y)', duration)
    assert parts and ''.join(n + u for n, u in parts) == duration, duration
    return sum(int(n) * unit[u] for n, u in parts)


def test_the_fleets_page_renders_every_node_and_the_gateway(stack_node):
    """/consoles/glm5.html, rendered by Prometheus from the role's console template: a row per engine (up, with its
    figures), the gateway with both workers."""
    with urllib.request.urlopen(URL + '/consoles/glm5.html', timeout=10) as r:
        assert r.status == 200
        page = r.read().decode()
    assert '<h1>GLM-5 fleet</h1>' in page and 'error' not in page.lower(), page[:2000]
    for node in NODES:
        row = page[page.index('<td>{0}</td>'.format(node)):]
        row = row[:row.index('</tr>')]
        assert 'class="ok">yes' in row and row.count('<td>-</td>') <= 1, row     # p99 TTFT may have no requests
    row = page[page.index('<td>{0}</td>'.format(GATEWAY)):]
    row = row[:row.index('</tr>')]
    assert 'class="ok">yes' in row and '<td>{0}</td>'.format(len(NODES)) in row, row


def _when(rfc3339):
    """Prometheus' RFC 3339 time (nanoseconds, Z) as a Unix time."""
    return datetime.datetime.fromisoformat(re.sub(r'(\.\d{6})\d*', r'\1', rfc3339).replace('Z', '+00:00')).timestamp()


def test_an_engine_stopped_fires_engine_down_within_its_window(stack_node, fleet_inventory):
    node = NODES[-1]
    hv = HOSTS[node][1]
    service = hv.get('sglang_service_name', 'glm5-sglang')

    def firing():
        return [a for a in api('/api/v1/alerts')['alerts'] if a['labels']['alertname'] == 'GLM5EngineDown'
                and a['labels'].get('node') == node and a['state'] == 'firing']
    assert not firing()
    # The engine stops answering while `systemctl stop` still waits for it (and ssh returns), so the clock starts
    # before the stop: a time taken after it made a run of CI fail with 9.55 s.
    began = time.time()
    r = node_ssh(hv, 'systemctl', 'stop', service, timeout=120)
    assert r.returncode == 0, r.stderr
    try:
        # its for: (10 s) after the first failed scrape (every 2 s) and evaluation (every 2 s); slack for a busy CPU
        (alert,) = until('GLM5EngineDown firing for ' + node, firing, 10 + 2 + 2 + 30)
        seen = time.time()
        # pending since an evaluation after the stop (a scrape begun up to one interval before it may fail with it),
        # firing only once its for: window has passed since then (one clock: the containers share the host's)
        pending = _when(alert['activeAt'])
        assert pending >= began - 2, (pending, began)
        assert seen - pending >= 10, (seen, pending)
        assert seen - began <= 10 + 2 + 2 + 30, seen - began
        assert alert['labels']['severity'] == 'critical' and node in alert['annotations']['summary']
        # glm5 status says so, from Prometheus, with where to look
        p = subprocess.run([GLM5, '-i', fleet_inventory, 'status', '--json'], capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 1, p.stderr
        (watch,) = json.loads(p.stdout)['monitoring']
        assert [(f['alert'], f['where']) for f in watch['firing'] if f['alert'] == 'GLM5EngineDown'] == [
            ('GLM5EngineDown', node)], watch
        assert watch['page'].endswith('/consoles/glm5.html') and watch['queries'], watch
    finally:
        r = node_ssh(hv, 'systemctl', 'start', service, timeout=120)
        assert r.returncode == 0, r.stderr

    def back():
        up = api('/api/v1/query?query=up{{job="glm5-engine",node="{0}"}}'.format(node))['result']
        return not firing() and [u['value'][1] for u in up] == ['1']
    until('its engine scraped again and GLM5EngineDown resolved for ' + node, back, 120)
