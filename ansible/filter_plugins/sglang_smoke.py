"""Filters of the smoke test (roles/sglang_smoke): what the installed unit runs, read from the unit itself.

The smoke test reads the unit in place rather than the inventory, so it tests what runs -- also after a rollback,
and with --tags smoke against a node deployed earlier.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex

from ansible.errors import AnsibleFilterError

# the launcher sglang_service puts before the engine's entrypoint (roles/sglang_service/files/)
LAUNCHER = 'glm5-sglang-launch'


def sglang_unit_launch(unit_text):
    """A systemd unit's text -> {python, argv, base_url, host, port, model_path, tokenizer, served_model_name,
    flags_sha256}. flags_sha256 is the sha256 of the launch arguments (the launcher and the older units' key placeholder
    left out): the flag set's identity in the report."""
    if not isinstance(unit_text, str):
        raise AnsibleFilterError('sglang_unit_launch: expected the unit file as text')
    lines = [x for x in unit_text.splitlines() if x.startswith('ExecStart=')]
    if len(lines) != 1:
        raise AnsibleFilterError('sglang_unit_launch: the unit has {0} ExecStart= lines, expected one'.format(len(lines)))
    argv = shlex.split(lines[0][len('ExecStart='):])
    # python glm5-sglang-launch <entrypoint> <flags>: the launcher adds --api-key from the environment; not a flag
    if len(argv) > 1 and os.path.basename(argv[1]) == LAUNCHER:
        del argv[1]
    # older units: the key placeholder: --api-key=${SGLANG_API_KEY} (a generated key may begin with '-', which argparse would take
    # for an option after a space), or the older --api-key ${SGLANG_API_KEY}; the same flag set either way
    if argv and argv[-1].startswith('--api-key='):
        argv = argv[:-1]
    elif argv and argv[-2:-1] == ['--api-key']:
        argv = argv[:-2]
    opts = {}
    for i, arg in enumerate(argv):
        if arg.startswith('--'):
            key, eq, value = arg[2:].partition('=')
            if eq:
                opts[key] = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith('--'):
                opts[key] = argv[i + 1]
    missing = [k for k in ('model-path', 'port') if k not in opts]
    if missing:
        raise AnsibleFilterError('sglang_unit_launch: the unit\'s ExecStart has no {0}'.format(
            ', '.join('--' + m for m in missing)))
    host = opts.get('host', '127.0.0.1')
    connect = '127.0.0.1' if host in ('0.0.0.0', '', '::') else host
    if ':' in connect and not connect.startswith('['):
        connect = '[{0}]'.format(connect)
    return {
        'python': argv[0],
        'argv': argv,
        'host': host,
        'port': int(opts['port']),
        'base_url': 'http://{0}:{1}'.format(connect, opts['port']),
        'model_path': opts['model-path'],
        'tokenizer': opts.get('tokenizer-path') or opts['model-path'],
        'served_model_name': opts.get('served-model-name') or opts['model-path'],
        'flags_sha256': hashlib.sha256(json.dumps(argv[1:]).encode()).hexdigest(),
    }


def env_file_value(text, key):
    """KEY=value from a systemd EnvironmentFile (values as sglang_service writes them: JSON-quoted)."""
    for line in (text or '').splitlines():
        m = re.match(r'^\s*' + re.escape(key) + r'=(.*)$', line)
        if m:
            value = m.group(1).strip()
            if value.startswith('"'):
                try:
                    return json.loads(value)
                except ValueError:
                    return value.strip('"')
            return value
    return ''


class FilterModule(object):
    def filters(self):
        return {'sglang_unit_launch': sglang_unit_launch, 'env_file_value': env_file_value}
