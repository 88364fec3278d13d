#!/usr/bin/python
from __future__ import annotations

DOCUMENTATION = r'''
---
module: sglang_server_args
short_description: Check an sglang launch command line with the installed sglang's own argument parser
description:
  - Runs, in the given Python (the SGLang environment), sglang's own C(ServerArgs.add_cli_args) and C(parse_args)
    on exactly the argument list, as C(python -m sglang.launch_server) would. An unknown flag or an invalid value
    fails with the parser's own message. No GPU is needed for this.
  - With C(full=true) it also runs C(ServerArgs.from_cli_args), sglang's post-init checks; those need a GPU
    (without one sglang raises "No accelerator").
  - Changes nothing; runs in check mode too.
options:
  python:
    description: The Python of the SGLang environment (its bin/python).
    type: path
    required: true
  argv:
    description: The launch arguments, without the program (as after C(python -m sglang.launch_server)).
    type: list
    elements: str
    required: true
  full:
    description: Also run ServerArgs.from_cli_args (needs a GPU).
    type: bool
    default: false
  timeout:
    description: Seconds the check may take (importing sglang takes ~10 s on a CPU).
    type: int
    default: 300
author: GLM-5 node maintainers
'''

EXAMPLES = r'''
- name: The unit's flags, checked by the installed sglang before the unit is written
  sglang_server_args:
    python: /opt/glm5/sglang/bin/python
    argv: [--model-path, /models/glm-5, --tp, "8", --moe-runner-backend, flashinfer_cutlass]
'''

RETURN = r'''
sglang_version:
  description: The sglang that parsed the arguments.
  returned: success
  type: str
args:
  description: Every server argument as the parser set it (values made JSON-safe).
  returned: success
  type: dict
non_default:
  description: The arguments whose value differs from the parser's default.
  returned: success
  type: dict
parser_message:
  description: On failure, what the parser said (argparse's error line without its usage; else stderr's end).
  returned: failure
  type: str
'''

import json
import subprocess

from ansible.module_utils.basic import AnsibleModule

# Runs inside the SGLang environment: argv[1] is "full" or "parse", the rest the launch arguments.
CHECK = r'''
import argparse, json, sys
import sglang
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser(prog="sglang.launch_server")
ServerArgs.add_cli_args(parser)
args = parser.parse_args(sys.argv[2:])
defaults = vars(parser.parse_args(["--model-path", args.model_path])) if getattr(args, "model_path", None) else {}
if sys.argv[1] == "full":
    ServerArgs.from_cli_args(args)
def safe(v):
    return v if isinstance(v, (str, int, float, bool, type(None))) else (
        [safe(x) for x in v] if isinstance(v, (list, tuple)) else str(v))
values = dict((k, safe(v)) for k, v in vars(args).items())
print("GLM5-RESULT " + json.dumps({"sglang_version": sglang.__version__, "args": values,
    "non_default": dict((k, v) for k, v in values.items() if k not in defaults or safe(defaults[k]) != v)}))
'''


def check(python, argv, full=False, timeout=300):
    """(ok, result): result is the parsed arguments, or {'parser_message', 'rc', 'stderr'} when refused."""
    try:
        proc = subprocess.run([python, '-c', CHECK, 'full' if full else 'parse'] + list(argv),
                              capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return False, {'parser_message': '{0} not found: is the SGLang environment installed?'.format(python),
                       'rc': None, 'stderr': ''}
    except OSError as exc:              # a folder, a file that is not executable
        return False, {'parser_message': '{0} cannot be run ({1}): is the SGLang environment installed?'.format(
            python, exc.strerror or exc), 'rc': None, 'stderr': ''}
    except subprocess.TimeoutExpired:
        return False, {'parser_message': 'the check took longer than {0} s'.format(timeout), 'rc': None,
                       'stderr': ''}
    for line in proc.stdout.splitlines():
        if line.startswith('GLM5-RESULT ') and proc.returncode == 0:
            return True, json.loads(line[len('GLM5-RESULT '):])
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    if proc.returncode == 2 and lines and ': error: ' in lines[-1]:
        # argparse: "sglang.launch_server: error: ..." after ~60 lines of usage, which say nothing more
        return False, {'parser_message': lines[-1], 'rc': proc.returncode, 'stderr': lines[-1]}
    message = lines[-1] if lines else 'exit status {0} and no message'.format(proc.returncode)
    return False, {'parser_message': message, 'rc': proc.returncode, 'stderr': proc.stderr[-4000:]}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type='path', required=True),
            argv=dict(type='list', elements='str', required=True),
            full=dict(type='bool', default=False),
            timeout=dict(type='int', default=300),
        ),
        supports_check_mode=True,
    )
    p = module.params
    ok, result = check(p['python'], p['argv'], p['full'], p['timeout'])
    if not ok:
        module.fail_json(msg='sglang refused the launch arguments: {0}'.format(result['parser_message']),
                         argv=p['argv'], **result)
    module.exit_json(changed=False, argv=p['argv'], **result)


if __name__ == '__main__':
    main()
