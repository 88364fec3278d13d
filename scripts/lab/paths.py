"""Where the lab keeps its state, the settings labd reads (the lab inventory, and the GLM5_LAB_* environment
that labd.py's docstring lists), and how it writes its state files."""
from __future__ import annotations

import os

from glm5.project import ROOT

LAB_VARS_FILE = os.path.join(ROOT, 'inventories', 'lab', 'group_vars', 'all.yml')


def lab_paths_from_inventory(path=LAB_VARS_FILE):
    """lab_state_dir and lab_template_dir (plain absolute paths) and lab_ssh_port_base (a number) as the lab inventory
    sets them: labd reads them without Ansible, so no templating."""
    import yaml
    with open(path) as fh:
        data = yaml.safe_load(fh) or {}
    out = {}
    for key in ('lab_state_dir', 'lab_template_dir'):
        value = data.get(key)
        if not isinstance(value, str) or not os.path.isabs(value) or '{' in value:
            raise SystemExit('{0}: {1} must be a plain absolute path (labd reads it without Ansible), got {2!r}'.format(
                path, key, value))
        out[key] = value
    base = data.get('lab_ssh_port_base')
    if not isinstance(base, int) or isinstance(base, bool) or not 1024 <= base <= 60000:
        raise SystemExit('{0}: lab_ssh_port_base must be a plain port number (labd reads it without Ansible), '
                         'got {1!r}'.format(path, base))
    out['lab_ssh_port_base'] = base
    return out


def env_number(name, default, kind=int, least=0, most=65535):
    """A number from the environment (default when unset or empty), or one line naming the variable."""
    text = os.environ.get(name, '')
    if text == '':
        return default
    try:
        value = kind(text)
        if not least <= value <= most:
            raise ValueError(text)
    except ValueError:
        raise SystemExit('{0} must be a number from {1} to {2}, got {3!r}'.format(name, least, most, text)) from None
    return value


def env_folder(name, default):
    """An absolute folder path from the environment (default when unset or empty), or one line naming it: a relative
    one would put the lab's state wherever a command runs."""
    text = os.environ.get(name) or default
    if not os.path.isabs(text):
        raise SystemExit('{0} must be an absolute path, got {1!r}'.format(name, text))
    if os.path.exists(text) and not os.path.isdir(text):
        raise SystemExit('{0}: {1} is not a folder'.format(name, text))
    return text


_LAB_PATHS = lab_paths_from_inventory()
STATE = env_folder('GLM5_LAB_STATE', _LAB_PATHS['lab_state_dir'])
TEMPLATES = env_folder('GLM5_LAB_TEMPLATES', _LAB_PATHS['lab_template_dir'])
HOST, NODE = '127.0.0.1', 'pve1'
PORT = env_number('GLM5_LAB_PORT', 8006, least=1)
# a lab container's sshd listens on 127.0.0.1:(base + vmid): the lab inventory's formula (its ansible_port)
SSH_PORT_BASE = _LAB_PATHS['lab_ssh_port_base']
FORBIDDEN_PORTS = {2024}       # taken on these machines by a process that is not ours
POLL = env_number('GLM5_LAB_POLL', 5.0, float, 0.1, 3600)  # seconds between reconcile passes that nothing woke
FILES_PORT = env_number('GLM5_LAB_FILES_PORT', 8480)     # 0: none
PVE_START_SECS = 2             # PVE seconds a start task takes: the window in which start_error is decided
PVE_CREATE_SECS = 2


def paths(state=STATE):
    pve = os.path.join(state, 'pve')
    return dict(state=state, pve=pve, password=os.path.join(pve, 'root-password'), ca=os.path.join(pve, 'ca.crt'),
                ca_key=os.path.join(pve, 'ca.key'), cert=os.path.join(pve, 'pve.crt'), key=os.path.join(pve, 'pve.key'),
                confdir=os.path.join(pve, 'lxc'), lxcpath=os.path.join(state, 'lxc'), pid=os.path.join(state, 'labd.pid'),
                log=os.path.join(state, 'labd.log'), www=os.path.join(state, 'www'))


def ssh_port(vmid):
    port = SSH_PORT_BASE + int(vmid)
    if port > 65535 or port in FORBIDDEN_PORTS:
        raise ValueError('lab vmid {0} gives sshd port {1}, which the lab cannot use (vmid 100..45535)'.format(
            vmid, port))
    return port


def write_private(path, data):
    """Write bytes to a file only root can read (0600)."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 'wb') as out:
        out.write(data)


def write_if_changed(path, content):
    """Write content to path (atomically, making its folder) unless it already holds it; True if written."""
    try:
        with open(path) as fh:
            if fh.read() == content:
                return False
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + '.tmp', 'w') as out:
        out.write(content)
    os.replace(path + '.tmp', path)
    return True
