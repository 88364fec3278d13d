#!/usr/bin/python
from __future__ import annotations

DOCUMENTATION = r'''
---
module: sglang_ready
short_description: Wait until a systemd-run SGLang server is ready, watching the unit as well as the port
description:
  - >-
    Polls C(url), the server's readiness URL (sglang's /health_generate generates one token: 503 while it loads or
    drains; the node's contract names it: sglang_service_contract), until it answers 200,
    and watches the C(unit) meanwhile (C(systemctl show)). The wait ends at once, failed, when the unit has failed
    (its start limit hit, say: a port already taken makes sglang exit at every start) or when it has restarted
    C(max_restarts) times since the wait began; the message names the unit's state and result, its restarts, what
    answered at the URL, and the unit's last journal lines. A server that answers something else than 200 while the
    unit does not run (another process on the port) is named as such.
  - >-
    Changes nothing. In check mode it reports what it would wait for, and waits for nothing.
options:
  url: {description: "The server's readiness URL (http://host:port/health_generate).", type: str, required: true}
  unit: {description: The systemd unit that runs it (glm5-sglang)., type: str, required: true}
  timeout: {description: Seconds to wait at most (a large model loads for minutes)., type: int, default: 3600}
  poll: {description: Seconds between polls., type: float, default: 10}
  max_restarts:
    description: Restarts of the unit during the wait that end it (a crash loop), before systemd's start limit would.
    type: int
    default: 3
  journal_lines: {description: "The service's own last journal lines returned on failure (3 in msg).", type: int, default: 10}
author: GLM-5 node maintainers
'''

EXAMPLES = r'''
- name: Ready
  sglang_ready:
    url: http://127.0.0.1:30000/health_generate
    unit: glm5-sglang
    timeout: 3600
'''

RETURN = r'''
status: {description: The last HTTP status of the readiness URL (null when nothing answered)., returned: always, type: int}
seconds: {description: How long the wait took., returned: always, type: float}
unit: {description: "The unit at the end: ActiveState, SubState, Result, NRestarts, MainPID.", returned: always, type: dict}
restarts: {description: Restarts of the unit during the wait., returned: always, type: int}
journal: {description: The unit's last journal lines (on failure)., returned: failure, type: list}
'''

import subprocess
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.glm5_systemd import unit_state


def health(url, timeout=30):
    """(status or None, what answered: 'HTTP 404', 'connection refused', ...)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, 'HTTP {0}'.format(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code, 'HTTP {0}'.format(exc.code)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, 'reason', exc)
        return None, str(getattr(reason, 'strerror', None) or reason)


def journal(unit, lines):
    """The service's own last lines (its output, not systemd's lines about it: those say only that it failed)."""
    name = unit if '.' in unit else unit + '.service'
    r = subprocess.run(['journalctl', '_SYSTEMD_UNIT=' + name, '-n', str(lines), '--no-pager', '-o', 'cat'],
                       capture_output=True, text=True, timeout=60)
    return [x for x in r.stdout.splitlines() if x.strip()]


def describe(unit, state):
    return '{0} is {1} ({2}{3}), {4} restarts'.format(
        unit, state.get('ActiveState'), state.get('SubState'),
        ', result ' + state['Result'] if state.get('Result') not in (None, '', 'success') else '', state['NRestarts'])


def wait(p, clock=time.monotonic, sleep=time.sleep):
    """-> (ok, result). The loop: health first (a ready server ends the wait whatever the unit says), then the unit."""
    t0 = clock()
    first = unit_state(p['unit'])
    while True:
        status, answered = health(p['url'])
        state = unit_state(p['unit'])
        restarts = state['NRestarts'] - first['NRestarts']
        result = dict(status=status, seconds=round(clock() - t0, 1), unit=state, restarts=restarts)
        if status == 200:
            return True, result
        why = None
        if state.get('ActiveState') == 'failed':
            why = 'it failed'
        elif restarts >= p['max_restarts']:
            why = 'it restarted {0} times while it was awaited (a crash loop)'.format(restarts)
        elif clock() - t0 > p['timeout']:
            why = 'not ready after {0} s'.format(p['timeout'])
        if why:
            result['journal'] = journal(p['unit'], p['journal_lines'])
            squatter = ' (not the service: the unit does not run, so another process holds the port)' \
                if status is not None and state.get('ActiveState') != 'active' else ''
            result['msg'] = '{0} is not ready: {1}. The unit: {2}. {3}: {4}{5}. Its last words: {6}'.format(
                p['unit'], why, describe(p['unit'], state), p['url'], answered, squatter,
                ' | '.join(x.strip() for x in result['journal'][-3:]) or '(no journal lines)')
            return False, result
        sleep(p['poll'])


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type='str', required=True),
            unit=dict(type='str', required=True),
            timeout=dict(type='int', default=3600),
            poll=dict(type='float', default=10),
            max_restarts=dict(type='int', default=3),
            journal_lines=dict(type='int', default=10),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p['timeout'] < 1 or p['poll'] <= 0 or p['max_restarts'] < 1:
        module.fail_json(msg='timeout and max_restarts must be >= 1 and poll > 0')
    parts = urlsplit(p['url'])
    if parts.scheme not in ('http', 'https') or not parts.netloc:
        # urllib would take it for a URL of another kind, and the wait would last the whole timeout
        module.fail_json(msg='url must be http(s)://host:port/path, got {0!r}'.format(p['url']))
    if module.check_mode:
        module.exit_json(changed=False, status=None, seconds=0.0, unit={}, restarts=0,
                         msg='check mode: would wait up to {0} s for {1}'.format(p['timeout'], p['url']))
    ok, result = wait(p)
    if not ok:
        module.fail_json(**result)
    module.exit_json(changed=False, **result)


if __name__ == '__main__':
    main()
