"""Filters of the pve_container role: cross-host checks on the inventory's inference nodes (preflight), why the
plays inside a container must skip it (connect), and who may reach a node's engine port (its firewall)."""
from __future__ import annotations

import ipaddress

DOCUMENTATION = r'''
name: pve_container_conflicts
short_description: What two inventory nodes share that they must not (container id, SSH endpoint, host directories)
description:
  - Takes one entry per inventory node (C(host), C(vmid), C(api) = API host:port, C(ssh) = address:port,
    C(pve_host), C(dirs) = host directories bind-mounted into it) and returns one line for every clash that
    involves I(host), empty when there is none.
  - Container ids are unique in a PVE cluster, so two nodes with one vmid on one API would be one container
    (the second run renames and re-mounts the first's). Two nodes on one SSH endpoint reach one container.
    Two nodes bind-mounting one host directory on one PVE host share a model cache, SGLang cache or history.
options:
  _input: {description: The nodes (see above)., type: list, elements: dict, required: true}
  host: {description: The inventory host to check., type: str, required: true}
notes:
  - C(pve_container_skip_reason) takes the pve_container module's result, the wanted state and whether this is
    check mode, and says why the plays inside the container cannot enter it (absent, stopped, or running only in
    check mode's prediction); empty when it runs.
  - C(pve_container_engine_firewall) takes the node's name, hostvars, the gateways' names, the engine's port, the
    node's pve_container_firewall (true, false or null) and pve_container_engine_sources, and returns
    C({manage, firewall, why, problems}) - C(firewall) is the pve_container module's firewall option: the engine port
    open to the node's gateways (their sglang_gateway_fleet's C(source)) and the extra sources, closed to all others.
'''

EXAMPLES = r'''
problems: "{{ nodes | pve_container_conflicts(inventory_hostname) }}"
reason: "{{ pve_container_result | pve_container_skip_reason(pve_container_state, ansible_check_mode) }}"
'''

RETURN = r'''
_value: {description: One message per clash involving host., type: list, elements: str}
'''


def pve_container_conflicts(nodes, host):
    me = next((n for n in nodes if n['host'] == host), None)
    if me is None:
        return []
    problems = []
    for other in nodes:
        if other['host'] == host:
            continue
        if other['api'] == me['api'] and int(other['vmid']) == int(me['vmid']):
            problems.append('{0} and {1} both use pve_container_vmid {2} on the PVE API {3}: container ids are unique '
                            'in a cluster, so they would be one container; give each node its own'.format(
                                host, other['host'], me['vmid'], me['api']))
        if other['ssh'] == me['ssh']:
            problems.append('{0} and {1} both reach their container at {2} (ansible_host:ansible_port): give each '
                            'node its own address or port'.format(
                                host, other['host'], me['ssh']))
        if other['pve_host'] == me['pve_host']:
            shared = sorted(set(me['dirs']) & set(other['dirs']))
            if shared:
                problems.append('{0} and {1} both bind-mount {2} from {3}: each node needs its own model cache, '
                                'SGLang cache and benchmark history directories'.format(
                                    host, other['host'], ', '.join(shared), me['pve_host']))
            clash = _shared_gpus(me.get('gpus', 'none'), other.get('gpus', 'none'))
            if clash:
                problems.append('{0} and {1} would share {2} of {3}: each node\'s GPUs are its own; give each node its '
                                'own list (pve_container_gpus: [0, 1, ...]), or pve_container_gpus: none for a '
                                'container without GPUs'.format(host, other['host'], clash, me['pve_host']))
    return problems


def _shared_gpus(mine, theirs):
    """The GPUs two selections on one PVE host would both take, in words ('' when none)."""
    if mine == 'none' or theirs == 'none':
        return ''
    if mine == 'all' or theirs == 'all':
        return 'every GPU (pve_container_gpus: all)'
    try:
        both = sorted(set(int(g) for g in mine) & set(int(g) for g in theirs))
    except (TypeError, ValueError):
        return ''
    return 'GPU {0}'.format(', '.join(str(g) for g in both)) if both else ''


def pve_container_skip_reason(result, state, check_mode=False):
    """Why the plays inside the container cannot enter it, or '' when it really runs."""
    ct = 'CT {0}'.format(result['vmid'])
    before, after = result['status_before'], result['status']
    if after == 'absent':
        if check_mode and before != 'absent':
            return '{0} would be destroyed (pve_container_state: absent); --check leaves it'.format(ct)
        return '{0} is absent (pve_container_state: absent)'.format(ct)
    if check_mode and before == 'absent':
        return '{0} does not exist yet; --check would create it'.format(ct)
    if after != 'running':
        return '{0} is {1} (pve_container_state: {2})'.format(ct, after, state)
    if check_mode and before != 'running':
        return '{0} is {1}; --check would start it'.format(ct, before)
    return ''


def _is_address(text):
    try:
        ipaddress.ip_network(str(text), strict=False)
    except ValueError:
        return False
    return True


def pve_container_engine_firewall(node, hostvars, gateways, port, setting=None, sources=(), watchers=(), open_ports=()):
    """The firewall of a container: an inference node's engine port open to its gateways, the monitoring hosts that
    scrape it (watchers: [[name, address]]) and the extra sources only; then any container's open_ports
    (pve_container_open_ports: [{port, sources, what}]), each open to its sources only.
    {'manage': bool, 'firewall': the module's option or None, 'why': str, 'problems': [str]}.
    node: None for a container that is no inference node (only its open_ports count)."""
    own, own_problems = _open_port_rules(node, open_ports)
    fronting, unknown = [], []
    for g in gateways or []:
        fleet = hostvars[g].get('sglang_gateway_fleet') if g in hostvars else None
        if not fleet:
            unknown.append(g)
        elif node in [w.get('node') for w in fleet.get('workers', [])]:
            fronting.append((g, str(fleet.get('source') or '')))
    if setting is False:
        return dict(manage=True, firewall={'enabled': False}, problems=[],
                    why='pve_container_firewall: false: the package\'s rules are removed')
    if unknown:
        return dict(manage=False, firewall=None, problems=[],
                    why='the settings of {0} were not read in this run (--limit leaves their first play out): the '
                        'firewall of {1} is left as it is'.format(', '.join(unknown), node))
    if port is None and setting is None and not own:
        return dict(manage=False, firewall=None, problems=own_problems,
                    why='no pve_container_open_ports (pve_container_firewall: null): the firewall of {0} is left as '
                        'it is'.format(node))
    if setting is None and not fronting and not own:
        return dict(manage=False, firewall=None, problems=own_problems,
                    why='no gateway in front of {0} and no pve_container_open_ports (pve_container_firewall: null): '
                        'its firewall is left as it is'.format(node))
    if port is None:                # not an inference node: its open ports only
        return dict(manage=True, firewall={'enabled': True, 'rules': own}, problems=own_problems,
                    why=_open_why(open_ports))
    problems, rules = [], []
    for g, source in fronting:
        if not _is_address(source):
            problems.append('{0} is behind {1}, whose address {2!r} (sglang_gateway_source_address, else its '
                            'ansible_host) is not an IP address: PVE\'s firewall takes addresses, not names; set '
                            'sglang_gateway_source_address on {1} to the address its connections come from (or '
                            'pve_container_firewall: false on {0} to leave its firewall alone)'.format(node, g, source))
        rules.append({'action': 'ACCEPT', 'source': source, 'dport': str(port),
                      'comment': 'engine port from the gateway {0}'.format(g)})
    for source in sources or []:
        if not _is_address(source):
            problems.append('pve_container_engine_sources of {0}: {1!r} is not an IP address or CIDR'.format(
                node, source))
        rules.append({'action': 'ACCEPT', 'source': str(source), 'dport': str(port),
                      'comment': 'engine port from {0} (pve_container_engine_sources)'.format(source)})
    for name, source in watchers or []:
        if not _is_address(source):
            problems.append('{0} is scraped by the monitoring host {1}, whose address {2!r} (prometheus_source_address, '
                            'else its ansible_host) is not an IP address: set prometheus_source_address on {1} to the '
                            'address its connections come from'.format(node, name, source))
        rules.append({'action': 'ACCEPT', 'source': str(source), 'dport': str(port),
                      'comment': 'engine port (its /metrics) from the monitoring host {0}'.format(name)})
    rules.append({'action': 'DROP', 'dport': str(port), 'comment': 'engine port closed to all others'})
    opened = [g for g, _ in fronting] + [str(s) for s in sources or []] + [n for n, _ in watchers or []]
    why = 'engine port {0} open to {1} only'.format(port, ', '.join(opened) or 'no one')
    return dict(manage=True, firewall={'enabled': True, 'rules': rules + own}, problems=problems + own_problems,
                why=why + ('; ' + _open_why(open_ports) if own else ''))


def _open_port_rules(name, entries):
    """pve_container_open_ports -> (rules, problems): each port open to its sources, then closed to all others."""
    rules, problems = [], []
    for e in entries or []:
        what = str(e.get('what') or 'port {0}'.format(e.get('port')))
        try:
            port = int(e.get('port'))
        except (TypeError, ValueError):
            port = 0
        if not 0 < port < 65536:
            problems.append('pve_container_open_ports of {0}: {1}: port {2!r} is not a port number'.format(
                name, what, e.get('port')))
            continue
        sources = e.get('sources') or []
        if isinstance(sources, str):
            sources = [sources]
        for source in sources:
            if not _is_address(source):
                problems.append('pve_container_open_ports of {0}: {1}: {2!r} is not an IP address or CIDR'.format(
                    name, what, source))
            rules.append({'action': 'ACCEPT', 'source': str(source), 'dport': str(port),
                          'comment': '{0} from {1}'.format(what, source)})
        rules.append({'action': 'DROP', 'dport': str(port), 'comment': '{0} closed to all others'.format(what)})
    return rules, problems


def _open_why(entries):
    return '; '.join('{0} ({1}) open to {2} only'.format(e.get('what') or 'port', e.get('port'),
                                                        ', '.join(map(str, e.get('sources') or [])) or 'no one')
                     for e in entries or [])


class FilterModule(object):
    def filters(self):
        return {'pve_container_conflicts': pve_container_conflicts, 'pve_container_skip_reason': pve_container_skip_reason,
                'pve_container_engine_firewall': pve_container_engine_firewall}
