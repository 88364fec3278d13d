"""Make the project's own modules and module_utils importable the way Ansible imports them."""
import os
import sys

import ansible.module_utils

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ansible.module_utils.__path__.append(os.path.join(ROOT, 'ansible', 'module_utils'))
for sub in ('ansible/modules', 'ansible/filter_plugins', 'scripts/lab'):
    sys.path.insert(0, os.path.join(ROOT, sub))
