"""Run one of the project's Ansible modules in-process the way Ansible does, and return its JSON answer."""
import json

import pytest
from ansible.module_utils.testing import patch_module_args


def run_module(module, capsys, check_mode=False, **args):
    """module: the imported module file (its main() exits); args: the module's parameters."""
    if check_mode:
        args['_ansible_check_mode'] = True
    with patch_module_args(args), pytest.raises(SystemExit):
        module.main()
    return json.loads(capsys.readouterr().out)
