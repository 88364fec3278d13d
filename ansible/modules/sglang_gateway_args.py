#!/usr/bin/python
from __future__ import annotations

DOCUMENTATION = r'''
---
module: sglang_gateway_args
short_description: Check the gateway's launch line with the installed SGLang model gateway's own argument parser
description:
  - Runs, in the given Python (the gateway's environment, PyPI C(smg)), the gateway's own C(parse_router_args) and
    C(RouterArgs._validate_router_args) on exactly the argument list, as C(smg launch) would. An unknown flag, an
    unknown policy or an invalid value fails with the parser's own message.
  - Changes nothing; runs in check mode too.
options:
  python:
    description: The Python of the gateway's environment (its bin/python).
    type: path
    required: true
  argv:
    description: The arguments after C(smg launch).
    type: list
    elements: str
    required: true
  timeout:
    description: Seconds the check may take.
    type: int
    default: 120
author: GLM-5 node maintainers
'''

EXAMPLES = r'''
- name: The gateway's flags, checked by the installed gateway before its unit is written
  sglang_gateway_args:
    python: /opt/glm5/gateway/bin/python
    argv: [--worker-urls, http://10.0.0.11:30000, --policy, power_of_two, --port, "8000"]
'''

RETURN = r'''
smg_version:
  description: The gateway version that parsed the arguments.
  returned: success
  type: str
args:
  description: The parsed settings the launch line sets (policy, worker URLs, health check, retries, circuit breaker,
    ports); secrets never returned.
  returned: success
  type: dict
parser_message:
  description: On failure, what the parser said (argparse's error line without its usage; else the last line).
  returned: failure
  type: str
'''

import json
import subprocess

from ansible.module_utils.basic import AnsibleModule

# Runs inside the gateway's environment on the launch arguments; prints the settings worth showing, never a key.
CHECK = r'''
import dataclasses, importlib.metadata, json, sys
from smg.launch_router import parse_router_args
args = parse_router_args(sys.argv[1:])
args._validate_router_args()
shown = ("host", "port", "worker_urls", "policy", "power_of_two_load_metric", "worker_overload_protection",
         "health_check_endpoint", "health_check_interval_secs", "health_check_timeout_secs", "health_failure_threshold",
         "health_success_threshold", "retry_max_retries", "cb_failure_threshold", "cb_timeout_duration_secs",
         "prometheus_port", "prometheus_host", "request_timeout_secs", "shutdown_grace_period_secs")
values = dataclasses.asdict(args)
print("GLM5-RESULT " + json.dumps({"smg_version": importlib.metadata.version("smg"),
                                   "args": dict((k, values.get(k)) for k in shown)}, default=str))
'''


def check(python, argv, timeout=120):
    """(ok, result): the parsed settings, or {'parser_message', 'rc'} when refused."""
    try:
        proc = subprocess.run([python, '-c', CHECK] + list(argv), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return False, {'parser_message': '{0} not found: is the gateway environment installed?'.format(python),
                       'rc': None}
    except OSError as exc:              # a folder, a file that is not executable
        return False, {'parser_message': '{0} cannot be run ({1}): is the gateway environment installed?'.format(
            python, exc.strerror or exc), 'rc': None}
    except subprocess.TimeoutExpired:
        return False, {'parser_message': 'the check took longer than {0} s'.format(timeout), 'rc': None}
    for line in proc.stdout.splitlines():
        if line.startswith('GLM5-RESULT ') and proc.returncode == 0:
            return True, json.loads(line[len('GLM5-RESULT '):])
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    if proc.returncode == 2 and lines and ': error: ' in lines[-1]:
        # argparse: "<prog>: error: ..." after the long usage, which says nothing more
        message = lines[-1].split(': error: ', 1)[1]
    else:
        message = lines[-1] if lines else 'exit status {0} and no message'.format(proc.returncode)
    return False, {'parser_message': message, 'rc': proc.returncode}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type='path', required=True),
            argv=dict(type='list', elements='str', required=True),
            timeout=dict(type='int', default=120),
        ),
        supports_check_mode=True,
    )
    p = module.params
    ok, result = check(p['python'], p['argv'], p['timeout'])
    if not ok:
        module.fail_json(msg='the gateway refused its launch arguments: {0}'.format(result['parser_message']), **result)
    module.exit_json(changed=False, **result)


if __name__ == '__main__':
    main()
