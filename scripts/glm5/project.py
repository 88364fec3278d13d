"""Where the checkout is, and the one way its Python reaches the project's Ansible module_utils.

The package is installed editable (`make venv`), so its files stay in the checkout: ROOT is the checkout.
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANSIBLE_CFG = os.path.join(ROOT, 'ansible.cfg')
MODULE_UTILS = os.path.join(ROOT, 'ansible', 'module_utils')


def use_module_utils():
    """Make `ansible.module_utils.<name>` import the project's module_utils (ansible/module_utils), as Ansible does
    for the modules it ships: Ansible finds a configured module_utils folder for a module it runs, not for Python
    that imports one on the controller (glm5, the lab daemon, the tests). Idempotent."""
    if not os.path.exists(os.path.join(ROOT, 'site.yml')):
        raise RuntimeError('glm5 runs from its checkout (installed with `uv pip install -e .`); '
                           'no site.yml at {0}'.format(ROOT))
    import ansible.module_utils
    if MODULE_UTILS not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(MODULE_UTILS)


def stdout_reader_gone():
    """For a command's `except BrokenPipeError` (`glm5 status | head`: the reader has gone): nothing more to say, and
    nothing left for Python to flush into the closed pipe as it exits (a traceback). Returns the exit status, 1."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1
