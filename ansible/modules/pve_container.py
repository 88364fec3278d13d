#!/usr/bin/python
from __future__ import annotations

DOCUMENTATION = r'''
---
module: pve_container
short_description: An LXC container on Proxmox VE with GPU passthrough (dev[n]) and bind mounts
description:
  - Creates, reconfigures, starts, stops and destroys one LXC container through the PVE API with proxmoxer.
  - Idempotent. When the container exists, the wanted config is compared with C(GET /config) after
    normalisation (numbers as strings, property strings in any key order) and only the keys that differ
    are sent with C(PUT /config). C(dev[n]) and C(mp[n]) slots the module no longer wants are deleted.
  - Changes that PVE leaves pending on a running container need a restart; the module restarts only
    when I(allow_restart=true) and otherwise returns C(restart_required=true) and a warning.
  - Only containers that carry I(managed_tag) are changed or destroyed, unless I(adopt=true).
  - Supports check mode and diff mode; in check mode nothing is written.
options:
  api_host: {description: PVE API host name or address., type: str, required: true}
  api_port: {description: PVE API port., type: int, default: 8006}
  api_user: {description: User for password logins (a ticket). Also the user part of a token., type: str, default: root@pam}
  api_password: {description: Password of I(api_user)., type: str}
  api_token_id: {description: "API token id, C(name) or C(user@realm!name).", type: str}
  api_token_secret: {description: API token secret., type: str}
  validate_certs: {description: Verify the API's TLS certificate., type: bool, default: true}
  ca_file: {description: CA bundle to verify the API certificate against (a lab or private CA)., type: path}
  api_timeout: {description: Seconds for one HTTP request., type: int, default: 30}
  node: {description: PVE node that holds the container., type: str, required: true}
  vmid: {description: Container id (100 to 999999999)., type: int, required: true}
  state:
    description: C(started) and C(stopped) imply C(present).
    type: str
    choices: [present, started, stopped, absent]
    default: started
  hostname: {description: Container host name (required unless I(state=absent))., type: str}
  ostemplate:
    description: Template volume, for example C(local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst). Used at creation only.
    type: str
  storage: {description: Storage for the root file system. Used at creation only., type: str, default: local-lvm}
  disk_size: {description: Root file system size in GiB. Used at creation only., type: int, default: 32}
  memory: {description: Memory in MiB., type: int, default: 4096}
  swap: {description: Swap in MiB., type: int, default: 0}
  cores: {description: CPU cores., type: int, default: 4}
  cpuunits:
    description:
      - CPU weight against the host's other guests when they compete for the CPU (PVE's C(cpuunits), 0 to 500000;
        PVE's default is 1024 on cgroup v1 hosts and 100 on cgroup v2). Applied to a running container at once.
      - Unset, the container's weight is not managed.
    type: int
  unprivileged: {description: Unprivileged container. Cannot change after creation., type: bool, default: false}
  features: {description: "Features, for example C([nesting=1])).", type: list, elements: str, default: [nesting=1]}
  onboot: {description: Start with the host., type: bool, default: true}
  netif: {description: "Network interfaces: C(net0) -> C(name=eth0,bridge=vmbr0,ip=dhcp).", type: dict, default: {}}
  nameserver: {description: DNS servers, space separated., type: str}
  tags: {description: Extra tags; I(managed_tag) is always added., type: list, elements: str, default: []}
  managed_tag: {description: Tag that marks containers this package created., type: str, default: glm5-managed}
  adopt: {description: Allow changing or destroying an existing container that lacks I(managed_tag)., type: bool, default: false}
  description: {description: "Container notes; empty: none (an existing one is deleted).", type: str}
  devices:
    description: Device nodes passed through as C(dev0), C(dev1), ... in list order.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Device node on the PVE host., type: path, required: true}
      mode: {description: Octal mode inside the container., type: str}
      uid: {description: Owner inside the container., type: int}
      gid: {description: Group inside the container., type: int}
      deny_write: {description: Read-only device., type: bool, default: false}
  mounts:
    description: Host directories bind-mounted as C(mp0), C(mp1), ... in list order.
    type: list
    elements: dict
    default: []
    suboptions:
      host_path: {description: Absolute directory on the PVE host., type: path, required: true}
      path: {description: Absolute mount point inside the container., type: str, required: true}
      read_only: {description: Mount read-only., type: bool, default: false}
      backup: {description: Include in vzdump backups., type: bool, default: false}
  ssh_public_keys: {description: Keys for root's authorized_keys. Used at creation only., type: str}
  allow_restart: {description: Restart a running container when a change needs it., type: bool, default: false}
  allow_device_removal:
    description:
      - Allow a run to remove device nodes the existing container passes through now (a GPU that is missing
        from I(devices)). Off, such a run fails before anything is written, in check mode too, naming the devices.
    type: bool
    default: false
  timeout: {description: Seconds to wait for each PVE task., type: int, default: 600}
  firewall:
    description:
      - The container's own PVE firewall (C(/nodes/{node}/lxc/{vmid}/firewall)). Unset, it is not touched.
      - The module owns the rules whose comment begins with I(managed_tag) and a colon; it keeps them first, in the
        order of I(firewall.rules), and leaves every other rule where it is below them.
      - Turning the firewall on sets the container's input policy to C(ACCEPT) when none is set (PVE's default for a
        guest is C(DROP), which would cut every connection the rules do not name, SSH too), so only the rules' ports
        are filtered. A policy that is set is left as it is.
      - PVE enforces a guest's rules only when the datacenter firewall is on and on interfaces with C(firewall=1).
        When either is missing the module warns and returns C(firewall.enforced=false) with the reasons.
    type: dict
    suboptions:
      enabled:
        description: On, with I(rules). Off, the module's rules are removed (the firewall switch and other rules stay).
        type: bool
        default: true
      rules:
        description: Inbound rules, first to last.
        type: list
        elements: dict
        default: []
        suboptions:
          action: {description: What happens to a match., type: str, required: true, choices: [ACCEPT, DROP, REJECT]}
          source: {description: "Source address or CIDR; unset: any.", type: str}
          proto: {description: Protocol., type: str, default: tcp}
          dport: {description: "Destination port or range (C(30000), C(8000:8010)).", type: str, required: true}
          comment:
            description: What the rule is for (the module puts I(managed_tag) and a colon before it).
            type: str
            required: true
notes:
  - PVE lets only C(root@pam) set C(dev[n]), bind mounts, hookscripts and features other than C(nesting).
    With an API token such a request fails before any API call. Tokens work for containers without them.
  - Messages name the options as the C(pve_container) role's variables (C(pve_container_adopt) for I(adopt),
    C(pve_container_api_ca_file) for I(ca_file), ...), since that is how most runs set them.
  - Failure results report in C(status) the state the module saw (C(absent), C(stopped), C(running)).
requirements: [proxmoxer >= 2.0]
author: GLM-5 node maintainers
'''

EXAMPLES = r'''
- name: GLM-5 container with 8 GPUs
  pve_container:
    api_host: pve1.example.com
    api_password: "{{ vault_pve_root_password }}"
    node: pve1
    vmid: 120
    hostname: glm5
    ostemplate: local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst
    devices:
      - {path: /dev/nvidia0, mode: "0666"}
      - {path: /dev/nvidiactl, mode: "0666"}
    mounts:
      - {host_path: /srv/models, path: /models}
'''

RETURN = r'''
vmid: {description: Container id., returned: always, type: int}
created: {description: The container was created by this run., returned: always, type: bool}
destroyed: {description: The container was destroyed by this run., returned: always, type: bool}
changed_keys: {description: Config keys written (or that would be in check mode)., returned: always, type: list}
deleted_keys: {description: Config keys deleted (or that would be)., returned: always, type: list}
restart_required: {description: A change waits for a restart that was not allowed., returned: always, type: bool}
restarted: {description: The container was restarted to apply changes., returned: always, type: bool}
status_before: {description: "Container status the module found: absent, stopped or running.", returned: always, type: str}
status:
  description: Container status after the run (predicted in check mode; on failure the status seen).
  returned: always
  type: str
removed_devices:
  description: Device paths the existing container passes through and the run would remove.
  returned: always
  type: list
config: {description: The managed part of the container config after the run., returned: always, type: dict}
firewall:
  description:
    - "With I(firewall): C(enabled), C(rules) (the module's, as PVE keeps them), C(changed) (rules or options written,
      or that would be), C(enforced) and C(not_enforced) (why PVE filters nothing with them)."
  returned: when firewall is set
  type: dict
'''

import ipaddress
import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.pve_api import (
    PVE_AUTH_MUTUALLY_EXCLUSIVE, PVE_AUTH_REQUIRED_ONE_OF, PVE_AUTH_REQUIRED_TOGETHER, PveApi, PveTaskFailed,
    format_property_string, key_family, normalise_value, parse_property_string, pve_auth_argument_spec,
    values_match)

VMID_MIN, VMID_MAX = 100, 999999999
# Keys PVE applies to a running container at once; anything else on a running container waits for a restart.
HOT_KEYS = {'memory', 'swap', 'cores', 'cpuunits', 'onboot', 'tags', 'description', 'nameserver'}
CPUUNITS_MAX = 500000
# How users of the pve_container role know each option (messages name these).
ROLE_VARIABLES = dict(
    {o: 'pve_container_' + o for o in ('api_host', 'api_port', 'api_user', 'api_password', 'api_token_id',
                                       'api_token_secret', 'vmid', 'adopt', 'allow_restart')},
    validate_certs='pve_container_api_validate_certs', ca_file='pve_container_api_ca_file',
    timeout='pve_container_task_timeout', allow_device_removal='pve_container_allow_gpu_removal')
SAFE_PATH = re.compile(r'^/[^,=;\s]*$')
TAG_RE = re.compile(r'^[a-z0-9_][a-z0-9_\-+.]*$')
ONLY_ROOT_FEATURES_OK = {'nesting'}
# A destination port or range as PVE's firewall takes it (one of each, no lists: the module's rules name one port).
DPORT_RE = re.compile(r'^([0-9]{1,5})(:[0-9]{1,5})?$')
# The fields of a rule the module compares (what it sends; PVE adds pos, digest and ipversion).
RULE_FIELDS = ('type', 'action', 'source', 'proto', 'dport', 'enable', 'comment')


def argument_spec():
    spec = pve_auth_argument_spec()
    spec.update(
        node=dict(type='str', required=True),
        vmid=dict(type='int', required=True),
        state=dict(type='str', default='started', choices=['present', 'started', 'stopped', 'absent']),
        hostname=dict(type='str'),
        ostemplate=dict(type='str'),
        storage=dict(type='str', default='local-lvm'),
        disk_size=dict(type='int', default=32),
        memory=dict(type='int', default=4096),
        swap=dict(type='int', default=0),
        cores=dict(type='int', default=4),
        cpuunits=dict(type='int'),
        unprivileged=dict(type='bool', default=False),
        features=dict(type='list', elements='str', default=['nesting=1']),
        onboot=dict(type='bool', default=True),
        netif=dict(type='dict', default={}),
        nameserver=dict(type='str'),
        tags=dict(type='list', elements='str', default=[]),
        managed_tag=dict(type='str', default='glm5-managed'),
        adopt=dict(type='bool', default=False),
        description=dict(type='str'),
        devices=dict(type='list', elements='dict', default=[], options=dict(
            path=dict(type='path', required=True),
            mode=dict(type='str'),
            uid=dict(type='int'),
            gid=dict(type='int'),
            deny_write=dict(type='bool', default=False),
        )),
        mounts=dict(type='list', elements='dict', default=[], options=dict(
            host_path=dict(type='path', required=True),
            path=dict(type='str', required=True),
            read_only=dict(type='bool', default=False),
            backup=dict(type='bool', default=False),
        )),
        ssh_public_keys=dict(type='str', no_log=False),
        allow_restart=dict(type='bool', default=False),
        allow_device_removal=dict(type='bool', default=False),
        timeout=dict(type='int', default=600),
        firewall=dict(type='dict', options=dict(
            enabled=dict(type='bool', default=True),
            rules=dict(type='list', elements='dict', default=[], options=dict(
                action=dict(type='str', required=True, choices=['ACCEPT', 'DROP', 'REJECT']),
                source=dict(type='str'),
                proto=dict(type='str', default='tcp'),
                dport=dict(type='str', required=True),
                comment=dict(type='str', required=True),
            )),
        )),
    )
    return spec


def validate(params):
    """Every input error we can see without the API, as one list of messages."""
    errors = []
    vmid = params['vmid']
    if not VMID_MIN <= vmid <= VMID_MAX:
        errors.append('vmid {0} is out of range: PVE guest ids are {1}..{2}'.format(vmid, VMID_MIN, VMID_MAX))
    if params['state'] != 'absent':
        if not params['hostname']:
            errors.append('hostname is required unless state=absent')
        elif not re.fullmatch(r'[A-Za-z0-9]([A-Za-z0-9\-.]{0,61}[A-Za-z0-9])?', params['hostname']):
            errors.append('hostname {0!r} is not a valid DNS name'.format(params['hostname']))
        for name in ('memory', 'cores', 'disk_size'):
            if params[name] < 1:
                errors.append('{0} must be at least 1, got {1}'.format(name, params[name]))
        if params['swap'] < 0:
            errors.append('swap must not be negative')
        if params['cpuunits'] is not None and not 0 <= params['cpuunits'] <= CPUUNITS_MAX:
            errors.append('cpuunits must be 0..{0} (PVE\'s CPU weight), got {1}'.format(CPUUNITS_MAX,
                                                                                      params['cpuunits']))
    for i, dev in enumerate(params['devices']):
        if not dev['path'].startswith('/dev/') or not SAFE_PATH.match(dev['path']):
            errors.append('devices[{0}].path {1!r} must be an absolute path under /dev/ without , = ; or spaces'.format(
                i, dev['path']))
        if dev['mode'] is not None and not re.fullmatch(r'0?[0-7]{3}', dev['mode']):
            errors.append('devices[{0}].mode {1!r} must be octal like 0666'.format(i, dev['mode']))
    paths = [d['path'] for d in params['devices']]
    if len(paths) != len(set(paths)):
        errors.append('devices lists a path twice: {0}'.format(sorted({p for p in paths if paths.count(p) > 1})))
    if len(paths) > 256:
        errors.append('PVE allows at most 256 devices (dev0..dev255)')
    for i, mnt in enumerate(params['mounts']):
        for field in ('host_path', 'path'):
            value = mnt[field]
            if not SAFE_PATH.match(value) or value == '/' or '/../' in value + '/':
                errors.append('mounts[{0}].{1} {2!r} must be an absolute path other than / without , = ; '
                              'spaces or ..'.format(i, field, value))
    targets = [m['path'] for m in params['mounts']]
    if len(targets) != len(set(targets)):
        errors.append('mounts use a container path twice: {0}'.format(sorted({t for t in targets if targets.count(t) > 1})))
    for tag in params['tags'] + [params['managed_tag']]:
        if not TAG_RE.match(tag):
            errors.append('tag {0!r} is not a valid PVE tag (lower case letters, digits, _ - + .)'.format(tag))
    for key in params['netif']:
        if not re.fullmatch(r'net\d+', key):
            errors.append('netif key {0!r} must be net0, net1, ...'.format(key))
    errors += firewall_errors(params['firewall'])
    if params['api_token_id']:
        # PVE reserves these for root@pam: a token (even root@pam!x) is refused, so say so before calling.
        reasons = []
        if params['devices']:
            reasons.append('device passthrough (dev[n])')
        if params['mounts']:
            reasons.append('bind mounts (mp[n] with a host path)')
        extra = [f for f in params['features'] if f.split('=', 1)[0] not in ONLY_ROOT_FEATURES_OK]
        if extra:
            reasons.append('features other than nesting ({0})'.format(', '.join(extra)))
        if reasons:
            errors.append('API token {0!r} cannot configure {1}: PVE allows that only to root@pam logged in with '
                          'a password (ticket). Use api_password for root@pam, or drop those settings.'.format(
                              params['api_token_id'], ' and '.join(reasons)))
    return errors


def firewall_errors(firewall):
    """What is wrong with the firewall option's rules (PVE would refuse them, or read them otherwise)."""
    errors = []
    for i, rule in enumerate((firewall or {}).get('rules') or []):
        if rule['source']:
            try:
                ipaddress.ip_network(rule['source'], strict=False)
            except ValueError:
                errors.append('firewall.rules[{0}].source {1!r} is not an IP address or CIDR (PVE\'s firewall takes '
                              'addresses, not host names)'.format(i, rule['source']))
        m = DPORT_RE.match(rule['dport'])
        if not m or not all(1 <= int(x.lstrip(':')) <= 65535 for x in m.groups() if x):
            errors.append('firewall.rules[{0}].dport {1!r} is not a port 1..65535 or a range a:b'.format(
                i, rule['dport']))
        if not rule['comment'].strip() or '\n' in rule['comment']:
            errors.append('firewall.rules[{0}].comment must be one non-empty line'.format(i))
    return errors


def wanted_rules(firewall, tag):
    """The module's rules as PVE keeps them (each field a string; the comment tagged), first to last."""
    if not firewall or not firewall['enabled']:
        return []
    out = []
    for rule in firewall['rules']:
        want = {'type': 'in', 'action': rule['action'], 'proto': rule['proto'], 'dport': rule['dport'], 'enable': '1',
                'comment': '{0}: {1}'.format(tag, rule['comment'].strip())}
        if rule['source']:
            net = ipaddress.ip_network(rule['source'], strict=False)
            # PVE drops a CIDR's host bits and keeps a single address as it is
            want['source'] = rule['source'] if '/' not in rule['source'] else str(net)
        out.append(want)
    return out


def netif_firewall(netif):
    """Whether a net[n] property string has firewall=1."""
    try:
        return str(parse_property_string(netif, 'name').get('firewall', '0')) == '1'
    except ValueError:
        return False


def rule_view(rule):
    """A rule of GET .../firewall/rules in the form wanted_rules gives."""
    return {k: str(rule[k]) for k in RULE_FIELDS if rule.get(k) not in (None, '')}


def desired_config(params):
    """The keys this module manages, in PVE's property-string form."""
    cfg = {
        'hostname': params['hostname'],
        'memory': params['memory'],
        'swap': params['swap'],
        'cores': params['cores'],
        'onboot': int(params['onboot']),
        'tags': ';'.join(sorted(set(params['tags']) | {params['managed_tag']})),
    }
    if params['cpuunits'] is not None:
        cfg['cpuunits'] = params['cpuunits']
    if params['features']:
        cfg['features'] = ','.join(params['features'])
    if params['description']:           # '' is none: PVE keeps no empty description (it would never match)
        cfg['description'] = params['description']
    if params['nameserver']:
        cfg['nameserver'] = params['nameserver']
    for key, value in params['netif'].items():
        cfg[key] = value
    for i, dev in enumerate(params['devices']):
        props = {'path': dev['path']}
        if dev['mode'] is not None:
            props['mode'] = dev['mode'] if dev['mode'].startswith('0') else '0' + dev['mode']
        for field in ('uid', 'gid'):
            if dev[field] is not None:
                props[field] = dev[field]
        if dev['deny_write']:
            props['deny-write'] = 1
        cfg['dev{0}'.format(i)] = format_property_string(props, 'path')
    for i, mnt in enumerate(params['mounts']):
        props = {'volume': mnt['host_path'], 'mp': mnt['path'], 'backup': int(mnt['backup'])}
        if mnt['read_only']:
            props['ro'] = 1
        cfg['mp{0}'.format(i)] = format_property_string(props, 'volume')
    return {k: str(v) for k, v in cfg.items()}


class PveContainer(object):
    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.pve = PveApi(module, ROLE_VARIABLES)
        self.result = dict(changed=False, vmid=self.p['vmid'], created=False, destroyed=False, changed_keys=[],
                           deleted_keys=[], restart_required=False, restarted=False, status_before='absent',
                           status='absent', removed_devices=[], config={})
        self.api = None

    # Thin API wrappers (one line each, so tests and readers see every call).
    def _ct(self):
        return self.api.nodes(self.p['node']).lxc(self.p['vmid'])

    def _get_config(self):
        return self._ct().config.get()

    def _get_status(self):
        return self._ct().status.current.get()['status']

    def _task(self, upid, what):
        self.pve.wait_task(upid, what, self.p['timeout'])

    def fail(self, msg, **kwargs):
        self.module.fail_json(msg=msg, **dict(self.result, **kwargs))

    def call(self, what, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PveTaskFailed as exc:
            self.fail(str(exc))
        except Exception as exc:  # proxmoxer's ResourceException and transport errors
            self.fail('{0}: {1}'.format(what, self.pve.describe(exc)))

    def find(self):
        """(node, type) of the guest with our vmid anywhere in the cluster, or None."""
        for res in self.api.cluster.resources.get(type='vm'):
            if int(res.get('vmid', -1)) == self.p['vmid']:
                return res.get('node'), res.get('type')
        return None

    def check_storage(self):
        storages = {s['storage']: s for s in self.api.nodes(self.p['node']).storage.get()}
        if self.p['storage'] not in storages:
            self.fail('storage {0!r} does not exist on node {1} or {2} may not see it (visible: {3})'.format(
                self.p['storage'], self.p['node'], self.p['api_token_id'] or self.p['api_user'],
                ', '.join(sorted(storages)) or 'none'))
        content = storages[self.p['storage']].get('content', '')
        if 'rootdir' not in content.split(','):
            self.fail('storage {0!r} cannot hold container root file systems (content: {1})'.format(
                self.p['storage'], content))
        tmpl = self.p['ostemplate']
        if not tmpl:
            self.fail('ostemplate is required to create container {0}'.format(self.p['vmid']))
        tstore = tmpl.split(':', 1)[0]
        if tstore not in storages:
            self.fail('ostemplate {0!r} names storage {1!r}, which does not exist on node {2}'.format(
                tmpl, tstore, self.p['node']))
        volumes = [v['volid'] for v in self.api.nodes(self.p['node']).storage(tstore).content.get(content='vztmpl')]
        if tmpl not in volumes:
            self.fail('ostemplate {0!r} is not on storage {1!r} (templates there: {2})'.format(
                tmpl, tstore, ', '.join(volumes) or 'none'))

    def run(self):
        self.api = self.pve.connect()
        found = self.call('listing guests', self.find)
        if found and (found[0] != self.p['node'] or found[1] != 'lxc'):
            self.fail('vmid {0} is already used by a {1} guest on node {2}: pick another {3}'.format(
                self.p['vmid'], found[1], found[0], ROLE_VARIABLES['vmid']), status_before='other guest',
                status='other guest')
        config = None
        if found:
            # What is there, before anything else: a failure result then reports the state actually seen.
            status = self.call('reading status', self._get_status)
            self.result.update(status_before=status, status=status)
            config = self.call('reading config', self._get_config)
            self.ensure_ours(config)
        if self.p['state'] == 'absent':
            return self.absent(config)
        if not found:
            self.create()
        else:
            self.update(config)
        if self.p['firewall'] is not None:
            self.firewall()
        self.power()
        return self.result

    # ---------------------------------------------------------------- absent
    def ensure_ours(self, config):
        tags = normalise_value('tags', config.get('tags', '')).split(';')
        if self.p['managed_tag'] not in tags and not self.p['adopt']:
            self.fail('container {0} ({1}, {2}) exists but was not created by this package (no {3!r} tag); '
                      'refusing to change or destroy it. Pick another {4}, or set {5}: true to take it over.'.format(
                          self.p['vmid'], config.get('hostname', '?'), self.result['status'], self.p['managed_tag'],
                          ROLE_VARIABLES['vmid'], ROLE_VARIABLES['adopt']))

    def absent(self, config):
        if config is None:
            return self.result
        before = {k: normalise_value(k, v) for k, v in sorted(config.items()) if k not in ('digest', 'lock')}
        self.result.update(changed=True, destroyed=True, status='absent', diff=dict(before=before, after={}))
        if self.module.check_mode:
            return self.result
        if self.result['status_before'] == 'running':
            self.call('stopping', lambda: self._task(self._ct().status.stop.post(), 'stop CT {0}'.format(self.p['vmid'])))
        # PVE never deletes bind-mounted host paths; purge drops the container from jobs and HA.
        self.call('destroying', lambda: self._task(self._ct().delete(purge=1), 'destroy CT {0}'.format(self.p['vmid'])))
        return self.result

    # ---------------------------------------------------------------- create
    def create(self):
        self.call('checking storage', self.check_storage)
        want = desired_config(self.p)
        params = dict(want, vmid=self.p['vmid'], ostemplate=self.p['ostemplate'],
                      rootfs='{0}:{1}'.format(self.p['storage'], self.p['disk_size']),
                      unprivileged=int(self.p['unprivileged']))
        if self.p['ssh_public_keys']:
            params['ssh-public-keys'] = self.p['ssh_public_keys']
        self.result.update(changed=True, created=True, changed_keys=sorted(want), config=want, status='stopped',
                           diff=dict(before={}, after=want))
        if self.module.check_mode:
            return
        upid = self.call('creating CT {0}'.format(self.p['vmid']), self.api.nodes(self.p['node']).lxc.post, **params)
        self.call('creating', self._task, upid, 'create CT {0}'.format(self.p['vmid']))

    # ---------------------------------------------------------------- update
    def update(self, current):
        if 'unprivileged' in current or self.p['unprivileged']:
            have = str(current.get('unprivileged', '0')) == '1'
            if have != self.p['unprivileged']:
                vmid = self.p['vmid']
                self.fail('container {0} is {1}privileged and pve_container_unprivileged is {2}: PVE cannot convert a '
                          'container in place; nothing was changed. To switch it: back it up and restore it {3} '
                          '(vzdump {0}, then pct restore {0} <the backup> --unprivileged {4} --force), or rebuild it '
                          '(pve_container_state: absent, then this run again: the model weights, the SGLang cache and '
                          'the bench history are bind mounts from the host and stay)'.format(
                              vmid, 'un' if have else '', str(self.p['unprivileged']).lower(),
                              'unprivileged' if self.p['unprivileged'] else 'privileged', int(self.p['unprivileged'])))
        want = desired_config(self.p)
        changed = sorted(k for k, v in want.items() if not values_match(k, v, current.get(k)))
        self.refuse_device_removal(current)
        owned = re.compile(r'^(dev|mp)\d+$')
        deleted = sorted((k for k in current if owned.match(k) and k not in want), key=lambda k: (k[:2], len(k), k))
        if self.p['description'] == '' and current.get('description'):
            deleted.append('description')
        managed_now = {k: str(current[k]) for k in list(want) + deleted if k in current}
        self.result['config'] = dict((k, normalise_value(k, v)) for k, v in current.items() if k in want)
        status = self.result['status_before']
        if not changed and not deleted:
            return
        after = {k: v for k, v in managed_now.items() if k not in deleted}
        after.update({k: want[k] for k in changed})
        self.result.update(changed=True, changed_keys=changed, deleted_keys=deleted,
                           diff=dict(before=dict(sorted(managed_now.items())), after=dict(sorted(after.items()))),
                           config=dict((k, normalise_value(k, v)) for k, v in after.items() if k in want))
        needs_restart = status == 'running' and any(k not in HOT_KEYS for k in changed + deleted)
        if self.module.check_mode:
            self.result['restart_required'] = needs_restart and not self.p['allow_restart']
            self.result['restarted'] = needs_restart and self.p['allow_restart']
            return
        body = {k: want[k] for k in changed}
        if deleted:
            body['delete'] = ','.join(deleted)
        self.call('updating config', self._ct().config.put, **body)
        if status == 'running':
            pending = self.call('reading pending changes', self._ct().pending.get)
            needs_restart = any('pending' in p or p.get('delete') for p in pending)
        if needs_restart:
            if self.p['allow_restart']:
                self.restart()
            else:
                self.result['restart_required'] = True
                self.module.warn('CT {0}: {1} take effect at the next restart; set {2}: true to restart '
                                 'now'.format(self.p['vmid'], ', '.join(changed + deleted),
                                              ROLE_VARIABLES['allow_restart']))

    # -------------------------------------------------------------- firewall
    def firewall(self):
        """The container's firewall: the module's rules first and in order, the firewall on (or the rules gone)."""
        fw = self.p['firewall']
        tag = self.p['managed_tag'] + ':'
        # a container this run creates has no firewall yet, unless an old one of its id left its rules (PVE keeps a
        # guest's firewall file by id): read it then, except in check mode, where nothing was created
        exists = not (self.result['created'] and self.module.check_mode)
        rules = self.call('reading firewall rules', self._ct().firewall.rules.get) if exists else []
        options = self.call('reading firewall options', self._ct().firewall.options.get) if exists else {}
        rules = sorted(rules, key=lambda r: int(r.get('pos', 0)))
        ours = [r for r in rules if str(r.get('comment', '')).startswith(tag)]
        want = wanted_rules(fw, self.p['managed_tag'])
        in_place = [rule_view(r) for r in rules[:len(want)]] == want and len(ours) == len(want)
        set_options = {}
        if fw['enabled']:
            if str(options.get('enable', 0)) != '1':
                set_options['enable'] = 1
                if not options.get('policy_in'):
                    set_options['policy_in'] = 'ACCEPT'
        report = dict(enabled=fw['enabled'], rules=want, changed=not in_place or bool(set_options),
                      options=set_options)
        self.result['firewall'] = report
        if report['changed']:
            self.result['changed'] = True
            diff = self.result.setdefault('diff', dict(before={}, after={}))
            diff['before']['firewall'] = [rule_view(r) for r in ours]
            diff['after']['firewall'] = want
            if set_options:
                diff['before']['firewall_options'] = {k: str(options.get(k, '')) for k in sorted(set_options)}
                diff['after']['firewall_options'] = {k: str(v) for k, v in sorted(set_options.items())}
        if fw['enabled']:
            self.firewall_enforcement(report)
        if self.module.check_mode or not report['changed']:
            return
        if not in_place:
            # highest position first: each delete moves the rules below it up
            for r in sorted(ours, key=lambda r: -int(r['pos'])):
                self.call('deleting firewall rule {0}'.format(r['pos']), self._ct().firewall.rules(r['pos']).delete)
            # PVE puts a new rule first: the last one is written first
            for rule in reversed(want):
                self.call('writing firewall rule {0!r}'.format(rule['comment']), self._ct().firewall.rules.post,
                          **rule)
        if set_options:
            self.call('turning the firewall on', self._ct().firewall.options.put, **set_options)

    def firewall_enforcement(self, report):
        """Whether PVE filters anything with the rules: the datacenter firewall on, an interface with firewall=1."""
        why = []
        cluster = self.call('reading the datacenter firewall options', self.api.cluster.firewall.options.get)
        if not int(cluster.get('enable', 0) or 0):
            why.append('the datacenter firewall is off (Datacenter > Firewall > Options, or '
                       'pvesh set /cluster/firewall/options --enable 1: allow SSH and port 8006 first)')
        if not any(netif_firewall(v) for v in self.p['netif'].values()):
            why.append('no network interface of it has firewall=1 (pve_container_netif)')
        report.update(enforced=not why, not_enforced=why)
        if why:
            self.module.warn('CT {0}: PVE filters nothing with its firewall rules: {1}'.format(
                self.p['vmid'], '; '.join(why)))

    def refuse_device_removal(self, current):
        """A device the container passes through now and this run would drop: refuse unless allowed."""
        have = [parse_property_string(v, 'path').get('path') for k, v in sorted(current.items())
                if key_family(k) == 'dev']
        wanted = {d['path'] for d in self.p['devices']}
        removed = [p for p in have if p and p not in wanted]
        self.result['removed_devices'] = removed
        if removed and not self.p['allow_device_removal']:
            self.fail('refusing to remove {0} from CT {1}: the container passes {2} through now and this run\'s '
                      'device list lacks {3}. If a GPU fell off the bus or its node is missing on the PVE host, fix '
                      'the host first (nvidia-smi, dmesg); if dropping {3} is intended, set {4}: true'.format(
                          ', '.join(removed), self.p['vmid'], 'it' if len(removed) == 1 else 'them',
                          'it' if len(removed) == 1 else 'them', ROLE_VARIABLES['allow_device_removal']))

    def restart(self):
        vmid = self.p['vmid']
        self.call('shutting down', lambda: self._task(self._ct().status.shutdown.post(timeout=120, forceStop=1),
                                                      'shutdown CT {0}'.format(vmid)))
        self.call('starting', lambda: self._task(self._ct().status.start.post(), 'start CT {0}'.format(vmid)))
        self.result.update(restarted=True, status='running')

    # ---------------------------------------------------------------- power
    def power(self):
        want = self.p['state']
        if self.result['created'] and self.module.check_mode:
            status = 'stopped'
        elif self.result['created'] or self.result['restarted']:
            status = self.call('reading status', self._get_status)
        else:
            status = self.result['status_before']
        self.result['status'] = status
        vmid = self.p['vmid']
        if want == 'started' and status != 'running':
            self.result.update(changed=True, status='running')
            if not self.module.check_mode:
                self.call('starting', lambda: self._task(self._ct().status.start.post(), 'start CT {0}'.format(vmid)))
        elif want == 'stopped' and status == 'running':
            self.result.update(changed=True, status='stopped')
            if not self.module.check_mode:
                self.call('shutting down', lambda: self._task(
                    self._ct().status.shutdown.post(timeout=120, forceStop=1), 'shutdown CT {0}'.format(vmid)))


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(),
        mutually_exclusive=PVE_AUTH_MUTUALLY_EXCLUSIVE,
        required_together=PVE_AUTH_REQUIRED_TOGETHER,
        required_one_of=PVE_AUTH_REQUIRED_ONE_OF,
        supports_check_mode=True,
    )
    errors = validate(module.params)
    if errors:
        module.fail_json(msg='Invalid pve_container arguments: ' + '; '.join(errors), errors=errors)
    result = PveContainer(module).run()
    module.exit_json(**result)


if __name__ == '__main__':
    main()
