# Shared code for this project's Proxmox VE modules: the connection options,
# one proxmoxer connection, task waiting, PVE error text and property strings.
from __future__ import annotations

import re
import traceback

from ansible.module_utils.basic import env_fallback, missing_required_lib

PROXMOXER_IMP_ERR = None
try:
    import requests
    from proxmoxer import ProxmoxAPI
    from proxmoxer.core import AuthenticationError, ResourceException
    from proxmoxer.tools import Tasks
    HAS_PROXMOXER = True
except ImportError:  # pragma: no cover - reported through missing_required_lib
    HAS_PROXMOXER = False
    PROXMOXER_IMP_ERR = traceback.format_exc()
    ResourceException = AuthenticationError = Exception
    requests = None


def pve_auth_argument_spec():
    """Connection options shared by the project's PVE modules (PROXMOX_* env fallbacks)."""
    return dict(
        api_host=dict(type='str', required=True, fallback=(env_fallback, ['PROXMOX_HOST'])),
        api_port=dict(type='int', default=8006, fallback=(env_fallback, ['PROXMOX_PORT'])),
        api_user=dict(type='str', default='root@pam', fallback=(env_fallback, ['PROXMOX_USER'])),
        api_password=dict(type='str', no_log=True, fallback=(env_fallback, ['PROXMOX_PASSWORD'])),
        api_token_id=dict(type='str', fallback=(env_fallback, ['PROXMOX_TOKEN_ID'])),
        api_token_secret=dict(type='str', no_log=True, fallback=(env_fallback, ['PROXMOX_TOKEN_SECRET'])),
        validate_certs=dict(type='bool', default=True),
        ca_file=dict(type='path'),
        api_timeout=dict(type='int', default=30),
    )


PVE_AUTH_MUTUALLY_EXCLUSIVE = [('api_password', 'api_token_id')]
PVE_AUTH_REQUIRED_TOGETHER = [('api_token_id', 'api_token_secret')]
PVE_AUTH_REQUIRED_ONE_OF = [('api_password', 'api_token_id')]


class PveTaskFailed(Exception):
    """A PVE task ended with an error; the message is PVE's own exit status and log tail."""


def error_text(exc):
    """PVE's own words from a proxmoxer ResourceException (status, message and per-field errors)."""
    if isinstance(exc, ResourceException):
        text = '{0} {1}'.format(exc.status_code, (exc.content or exc.status_message or '').strip())
        if exc.errors:
            if isinstance(exc.errors, dict):
                details = '; '.join('{0}: {1}'.format(k, str(v).strip()) for k, v in sorted(exc.errors.items()))
            else:
                details = str(exc.errors)
            text = '{0} ({1})'.format(text, details)
        return text
    return str(exc)


def _ssl_reason(exc):
    """The short reason inside urllib3's long SSLError text: 'certificate verify failed: ...' or the like."""
    text = str(exc)
    m = re.search(r'(certificate verify failed: [^(\]\')"]+|Hostname mismatch[^(\]\')"]*|'
                  r'wrong version number|[a-z ]*handshake failure)', text)
    if m:
        return m.group(1).strip().rstrip(',')
    return text.rsplit(':', 1)[-1].strip(' )\'"') or text


def describe_error(exc, url, names=None, api_timeout=None, token=False):
    """One line for an error talking to the PVE API at url: what went wrong and what to check.

    names maps option names (api_host, api_password, ca_file, ...) to how the caller's users know them,
    e.g. the role variables; an option without a name there is called by its own name.
    """
    def name(*opts):
        return ' / '.join((names or {}).get(o, o) for o in opts)

    if requests is not None and isinstance(exc, requests.exceptions.SSLError):
        return ('TLS check of the PVE API at {0} failed ({1}): set {2} to the cluster CA (a copy of '
                '/etc/pve/pve-root-ca.pem from the node) and use a host name the certificate holds in {3}'.format(
                    url, _ssl_reason(exc), name('ca_file'), name('api_host')))
    if requests is not None and isinstance(exc, requests.exceptions.Timeout):
        return ('the PVE API at {0} did not answer within {1} s: check {2}, the firewall, and that pveproxy runs '
                'on the node (systemctl status pveproxy)'.format(url, api_timeout or '?', name('api_host', 'api_port')))
    if requests is not None and isinstance(exc, requests.exceptions.ConnectionError):
        text = str(exc)
        if 'Connection refused' in text:
            why = 'connection refused'
        elif re.search(r'Name or service not known|NameResolutionError|getaddrinfo failed|'
                       r'Temporary failure in name resolution', text):
            why = 'the host name does not resolve'
        elif 'No route to host' in text or 'Network is unreachable' in text:
            why = 'no route to the host'
        else:
            why = 'connection failed: ' + text.rsplit(':', 1)[-1].strip(' )\'"')
        return ('cannot reach the PVE API at {0} ({1}): check {2} and that pveproxy runs on the node '
                '(systemctl status pveproxy)'.format(url, why, name('api_host', 'api_port')))
    if isinstance(exc, AuthenticationError) or (isinstance(exc, ResourceException) and exc.status_code == 401):
        return 'the PVE API at {0} refused the login ({1}): check {2}'.format(
            url, error_text(exc) if isinstance(exc, ResourceException) else 'user or password not accepted',
            name('api_token_id', 'api_token_secret') if token else name('api_user', 'api_password'))
    return error_text(exc)


def proxmox_kwargs(p):
    """ProxmoxAPI's arguments from the connection options (pve_auth_argument_spec's names): the CA file when
    certificates are checked, a token (also in PVE's full form user@realm!name) or the password."""
    verify = p['ca_file'] if (p['validate_certs'] and p['ca_file']) else p['validate_certs']
    kwargs = dict(host=p['api_host'], port=p['api_port'], user=p['api_user'], verify_ssl=verify,
                  timeout=p['api_timeout'])
    if p.get('api_token_id'):
        token = p['api_token_id']
        if '!' in token:
            kwargs['user'], token = token.split('!', 1)
        kwargs.update(token_name=token, token_value=p['api_token_secret'])
    else:
        kwargs['password'] = p['api_password']
    return kwargs


class PveApi(object):
    """One authenticated proxmoxer connection for a module."""

    def __init__(self, module, names=None):
        self.module = module
        self.names = names or {}
        if not HAS_PROXMOXER:
            module.fail_json(msg=missing_required_lib('proxmoxer'), exception=PROXMOXER_IMP_ERR)
        self.api = None

    @property
    def url(self):
        return 'https://{0}:{1}'.format(self.module.params['api_host'], self.module.params['api_port'])

    def describe(self, exc):
        """describe_error for this connection."""
        return describe_error(exc, self.url, self.names, self.module.params.get('api_timeout'), self.using_token)

    @property
    def using_token(self):
        return bool(self.module.params.get('api_token_id'))

    def connect(self):
        try:
            self.api = ProxmoxAPI(**proxmox_kwargs(self.module.params))
            self.api.version.get()
        except Exception as exc:  # proxmoxer raises several types; all mean "cannot talk to PVE"
            self.module.fail_json(msg=self.describe(exc))
        return self.api

    def wait_task(self, upid, what, timeout):
        """Wait for a task; WARNINGS: n counts as success. Raises PveTaskFailed with PVE's text."""
        status = Tasks.blocking_status(self.api, upid, timeout=timeout, polling_interval=0.5)
        if status is None:
            raise PveTaskFailed('{0}: task {1} did not finish within {2} s; PVE may still be working on it (see the '
                                'task log on the node); raise {3} if that is normal'.format(
                                    what, upid, timeout, self.names.get('timeout', 'timeout')))
        exitstatus = status.get('exitstatus', '')
        if exitstatus == 'OK' or exitstatus.startswith('WARNINGS'):
            return status
        node = Tasks.decode_upid(upid)['node']
        try:
            log = self.api.nodes(node).tasks(upid).log.get(limit=50)
            tail = Tasks.decode_log(log).strip().splitlines()[-5:]
        except Exception:  # the log is a courtesy; the exit status is the error
            tail = []
        detail = ' | '.join(line for line in tail if line and line not in exitstatus)
        raise PveTaskFailed('{0} failed: {1}{2}'.format(what, exitstatus, (' (log: ' + detail + ')') if detail else ''))


# --------------------------------------------------------------- property strings

PROPERTY_DEFAULT_KEY = {
    'dev': 'path',
    'mp': 'volume',
    'rootfs': 'volume',
    'net': None,
    'features': None,
}

_INDEXED = re.compile(r'^(dev|mp|net|unused)(\d+)$')


def key_family(key):
    """'dev3' -> 'dev'; 'rootfs' -> 'rootfs'; 'memory' -> None (not a property string)."""
    m = _INDEXED.match(key)
    if m:
        return m.group(1)
    return key if key in PROPERTY_DEFAULT_KEY else None


def parse_property_string(text, default_key=None):
    """'path=/dev/x,mode=0666' or '/dev/x,mode=0666' -> dict. Raises ValueError on malformed text."""
    out = {}
    for i, part in enumerate(str(text).split(',')):
        if part == '':
            raise ValueError('empty element in property string {0!r}'.format(text))
        if '=' in part:
            k, v = part.split('=', 1)
            if not k:
                raise ValueError('missing key in {0!r}'.format(text))
            out[k] = v
        elif i == 0 and default_key:
            out[default_key] = part
        else:
            raise ValueError('element {0!r} of {1!r} has no key'.format(part, text))
    return out


def format_property_string(props, default_key=None):
    """dict -> property string, default key first and unnamed, the rest sorted."""
    parts = []
    if default_key and default_key in props:
        parts.append(str(props[default_key]))
    parts += ['{0}={1}'.format(k, props[k]) for k in sorted(props) if k != default_key]
    return ','.join(parts)


_BOOL_WORDS = {'1': '1', 'true': '1', 'yes': '1', 'on': '1', '0': '0', 'false': '0', 'no': '0', 'off': '0'}
_BOOL_SUBKEYS = {'backup', 'ro', 'deny-write', 'nesting', 'keyctl', 'fuse', 'mknod', 'replicate', 'shared',
                 'quota', 'acl', 'firewall', 'link_down', 'force_rw_sys'}


def normalise_value(key, value):
    """A comparable form of one config value as PVE gives it or as we send it."""
    family = key_family(key)
    if family is None:
        if isinstance(value, bool):
            return '1' if value else '0'
        if key == 'tags':
            return ';'.join(sorted(t for t in re.split(r'[;, ]+', str(value)) if t))
        return str(value).strip()
    props = parse_property_string(value, PROPERTY_DEFAULT_KEY.get(family))
    clean = {}
    for k, v in props.items():
        v = str(v)
        if k in _BOOL_SUBKEYS:
            v = _BOOL_WORDS.get(v.lower(), v)
        elif k == 'mode' and re.fullmatch(r'0?[0-7]{3,4}', v):
            v = '0' + v.lstrip('0').rjust(3, '0')
        clean[k] = v
    return format_property_string(clean, PROPERTY_DEFAULT_KEY.get(family))


def values_match(key, wanted, current):
    """True when the current value already is what we want.

    dev/mp/features compare whole; net and rootfs compare only the sub-keys we set, because PVE adds
    its own (hwaddr, type, size).
    """
    if current is None:
        return False
    family = key_family(key)
    if family in ('net', 'rootfs'):
        dk = PROPERTY_DEFAULT_KEY.get(family)
        want = parse_property_string(normalise_value(key, wanted), dk)
        have = parse_property_string(normalise_value(key, current), dk)
        return all(have.get(k) == v for k, v in want.items())
    return normalise_value(key, wanted) == normalise_value(key, current)
