"""pve_container_conflicts: two inventory nodes must not share a container id, SSH endpoint or host directory;
pve_container_skip_reason: the plays inside a container enter it only when it really runs; pve_container_engine_firewall:
who may reach a node's engine port."""
import pytest
from pve_container_filters import pve_container_conflicts, pve_container_engine_firewall, pve_container_skip_reason


def node(host, vmid, port, dirs, api='pve1.example.com:8006', pve_host='pve1', address='127.0.0.1'):
    return {'host': host, 'vmid': vmid, 'api': api, 'ssh': '{0}:{1}'.format(address, port), 'pve_host': pve_host,
            'dirs': dirs}


A = node('glm5-a', 120, 20120, ['/srv/a/models', '/srv/a/cache', '/srv/a/history'])


def test_distinct_nodes_have_no_conflicts():
    b = node('glm5-b', 121, 20121, ['/srv/b/models', '/srv/b/cache', '/srv/b/history'])
    assert pve_container_conflicts([A, b], 'glm5-a') == []
    assert pve_container_conflicts([A, b], 'glm5-b') == []
    assert pve_container_conflicts([A], 'glm5-a') == []
    assert pve_container_conflicts([A], 'not-a-node') == []


def test_same_vmid_on_one_api_is_a_conflict_for_both():
    b = node('glm5-b', 120, 20121, ['/srv/b'])
    for me, other in (('glm5-a', 'glm5-b'), ('glm5-b', 'glm5-a')):
        assert pve_container_conflicts([A, b], me) == [
            '{0} and {1} both use pve_container_vmid 120 on the PVE API pve1.example.com:8006: container ids are '
            'unique in a cluster, so they would be one container; give each node its own'.format(me, other)]


def test_same_vmid_on_another_cluster_is_fine():
    b = node('glm5-b', 120, 20121, ['/srv/b'], api='pve9.example.com:8006', pve_host='pve9')
    assert pve_container_conflicts([A, b], 'glm5-a') == []


def test_same_ssh_endpoint_and_shared_directory():
    b = node('glm5-b', 121, 20120, ['/srv/b/models', '/srv/a/history'])
    problems = pve_container_conflicts([A, b], 'glm5-a')
    assert problems == [
        'glm5-a and glm5-b both reach their container at 127.0.0.1:20120 (ansible_host:ansible_port): give each '
        'node its own address or port',
        'glm5-a and glm5-b both bind-mount /srv/a/history from pve1: each node needs its own model cache, SGLang '
        'cache and benchmark history directories']


def test_same_directory_on_another_pve_host_is_fine():
    b = node('glm5-b', 121, 22, A['dirs'], pve_host='pve2', address='10.0.0.2')
    assert pve_container_conflicts([A, b], 'glm5-a') == []


@pytest.mark.parametrize('before, after, state, check, reason', [
    ('running', 'running', 'started', False, ''),
    ('stopped', 'running', 'started', False, ''),
    ('absent', 'running', 'started', False, ''),
    ('running', 'running', 'started', True, ''),
    ('absent', 'running', 'started', True, 'CT 120 does not exist yet; --check would create it'),
    ('stopped', 'running', 'started', True, 'CT 120 is stopped; --check would start it'),
    ('running', 'stopped', 'stopped', True, 'CT 120 is stopped (pve_container_state: stopped)'),
    ('running', 'stopped', 'stopped', False, 'CT 120 is stopped (pve_container_state: stopped)'),
    ('stopped', 'stopped', 'present', False, 'CT 120 is stopped (pve_container_state: present)'),
    ('absent', 'stopped', 'present', True, 'CT 120 does not exist yet; --check would create it'),
    ('running', 'absent', 'absent', True, 'CT 120 would be destroyed (pve_container_state: absent); --check leaves it'),
    ('running', 'absent', 'absent', False, 'CT 120 is absent (pve_container_state: absent)'),
    ('absent', 'absent', 'absent', True, 'CT 120 is absent (pve_container_state: absent)'),
])
def test_skip_reason_for_every_state(before, after, state, check, reason):
    result = {'vmid': 120, 'status_before': before, 'status': after}
    assert pve_container_skip_reason(result, state, check) == reason


def with_gpus(n, gpus):
    return dict(n, gpus=gpus)


@pytest.mark.parametrize('mine, theirs, words', [
    ([0, 1, 2, 3], [3, 4], 'GPU 3 of pve1'),
    ('all', [4, 5], 'every GPU (pve_container_gpus: all) of pve1'),
    ([0], 'all', 'every GPU (pve_container_gpus: all) of pve1'),
])
def test_two_nodes_sharing_a_gpu_are_refused_naming_both(mine, theirs, words):
    b = with_gpus(node('glm5-b', 121, 20121, ['/srv/b']), theirs)
    a = with_gpus(A, mine)
    for me, other in (('glm5-a', 'glm5-b'), ('glm5-b', 'glm5-a')):
        (problem,) = pve_container_conflicts([a, b], me)
        assert problem.startswith('{0} and {1} would share {2}'.format(me, other, words)), problem
        assert "each node's GPUs are its own" in problem


@pytest.mark.parametrize('mine, theirs, other_host', [
    ([0, 1, 2, 3], [4, 5, 6, 7], 'pve1'),   # split between two nodes of one host
    ('all', 'none', 'pve1'),                # the gateway's container has none
    ('none', 'none', 'pve1'),
    ('all', 'all', 'pve2'),                 # each host's GPUs are that host's
])
def test_gpus_of_their_own_are_fine(mine, theirs, other_host):
    b = with_gpus(node('glm5-b', 121, 20121, ['/srv/b'], pve_host=other_host), theirs)
    assert pve_container_conflicts([with_gpus(A, mine), b], 'glm5-a') == []


# ---- pve_container_engine_firewall: the engine port open to the node's gateways only ----
def fleet(*nodes, source='10.0.0.5'):
    return {'sglang_gateway_fleet': {'source': source, 'workers': [{'node': n, 'url': 'http://x'} for n in nodes]}}


def test_a_node_behind_a_gateway_is_open_to_it_and_the_extra_sources_only():
    hv = {'gw': fleet('n1', 'n2'), 'n1': {}, 'n2': {}}
    out = pve_container_engine_firewall('n1', hv, ['gw'], 30000, None, ['10.1.0.0/24'])
    assert out['manage'] and out['problems'] == [], out
    assert out['firewall'] == {'enabled': True, 'rules': [
        {'action': 'ACCEPT', 'source': '10.0.0.5', 'dport': '30000', 'comment': 'engine port from the gateway gw'},
        {'action': 'ACCEPT', 'source': '10.1.0.0/24', 'dport': '30000',
         'comment': 'engine port from 10.1.0.0/24 (pve_container_engine_sources)'},
        {'action': 'DROP', 'dport': '30000', 'comment': 'engine port closed to all others'}]}
    assert out['why'] == 'engine port 30000 open to gw, 10.1.0.0/24 only'


def test_the_firewall_is_left_alone_without_a_gateway_or_when_a_gateway_was_not_read():
    hv = {'gw': fleet('n2'), 'n1': {}, 'n2': {}}
    out = pve_container_engine_firewall('n1', hv, ['gw'], 30000, None, [])
    assert not out['manage'] and out['firewall'] is None and 'no gateway in front of n1' in out['why']
    # a gateway left out by --limit: its nodes are unknown, nothing is removed or added
    out = pve_container_engine_firewall('n1', {'gw': {}, 'n1': {}}, ['gw'], 30000, True, [])
    assert not out['manage'] and 'settings of gw were not read' in out['why']


def test_true_without_a_gateway_closes_the_port_to_all_but_the_sources_and_false_removes_the_rules():
    out = pve_container_engine_firewall('n1', {'n1': {}}, [], 30000, True, [])
    assert out['manage'] and [r['action'] for r in out['firewall']['rules']] == ['DROP']
    assert out['why'] == 'engine port 30000 open to no one only'
    out = pve_container_engine_firewall('n1', {'gw': {}, 'n1': {}}, ['gw'], 30000, False, [])
    assert out['manage'] and out['firewall'] == {'enabled': False}


def test_names_where_the_firewall_needs_addresses_are_refused_naming_the_variable():
    hv = {'gw': fleet('n1', source='gw.example.com'), 'n1': {}}
    out = pve_container_engine_firewall('n1', hv, ['gw'], 30000, None, ['monitor.example.com'])
    assert out['problems'] == [
        "n1 is behind gw, whose address 'gw.example.com' (sglang_gateway_source_address, else its ansible_host) is "
        "not an IP address: PVE's firewall takes addresses, not names; set sglang_gateway_source_address on gw to the "
        "address its connections come from (or pve_container_firewall: false on n1 to leave its firewall alone)",
        "pve_container_engine_sources of n1: 'monitor.example.com' is not an IP address or CIDR"]


def test_the_monitoring_hosts_reach_the_engine_port_named_and_checked():
    hv = {'gw': fleet('n1'), 'n1': {}}
    out = pve_container_engine_firewall('n1', hv, ['gw'], 30000, None, [], [['prom', '10.0.0.7'], ['prom2', 'p.lan']])
    rules = out['firewall']['rules']
    assert rules[1] == {'action': 'ACCEPT', 'source': '10.0.0.7', 'dport': '30000',
                        'comment': 'engine port (its /metrics) from the monitoring host prom'}
    assert rules[-1]['action'] == 'DROP' and out['why'] == 'engine port 30000 open to gw, prom, prom2 only'
    assert out['problems'] == [
        "n1 is scraped by the monitoring host prom2, whose address 'p.lan' (prometheus_source_address, else its "
        "ansible_host) is not an IP address: set prometheus_source_address on prom2 to the address its connections "
        "come from"]
    # no gateway in front: the monitoring hosts alone do not make the package take the firewall over
    assert not pve_container_engine_firewall('n1', {'n1': {}}, [], 30000, None, [], [['prom', '10.0.0.7']])['manage']


def test_open_ports_of_any_container_each_open_to_its_sources_only():
    ports = [{'port': 9090, 'sources': ['10.20.0.0/24', '10.0.0.9'], 'what': 'Prometheus'}]
    out = pve_container_engine_firewall('prom', {'prom': {}}, [], None, None, [], [], ports)
    assert out['manage'] and out['problems'] == [] and out['firewall'] == {'enabled': True, 'rules': [
        {'action': 'ACCEPT', 'source': '10.20.0.0/24', 'dport': '9090', 'comment': 'Prometheus from 10.20.0.0/24'},
        {'action': 'ACCEPT', 'source': '10.0.0.9', 'dport': '9090', 'comment': 'Prometheus from 10.0.0.9'},
        {'action': 'DROP', 'dport': '9090', 'comment': 'Prometheus closed to all others'}]}
    assert out['why'] == 'Prometheus (9090) open to 10.20.0.0/24, 10.0.0.9 only'
    # none listed: its firewall is left as it is
    out = pve_container_engine_firewall('prom', {'prom': {}}, [], None, None, [], [], [])
    assert not out['manage'] and 'no pve_container_open_ports' in out['why']
    # on an inference node behind a gateway: after the engine's rules
    out = pve_container_engine_firewall('n1', {'gw': fleet('n1'), 'n1': {}}, ['gw'], 30000, None, [], [], ports)
    assert [r['dport'] for r in out['firewall']['rules']] == ['30000', '30000', '9090', '9090', '9090']
    # bad input, each named
    out = pve_container_engine_firewall('prom', {'prom': {}}, [], None, None, [], [], [
        {'port': 'x', 'sources': ['10.0.0.1']}, {'port': 9090, 'sources': ['ops.lan'], 'what': 'Prometheus'}])
    assert out['problems'] == ["pve_container_open_ports of prom: port x: port 'x' is not a port number",
                               "pve_container_open_ports of prom: Prometheus: 'ops.lan' is not an IP address or CIDR"]
