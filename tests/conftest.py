"""Make the project's own modules and module_utils importable the way Ansible imports them."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for sub in ('ansible/modules', 'ansible/filter_plugins', 'scripts/lab'):
    sys.path.insert(0, os.path.join(ROOT, sub))
try:
    import ansible.module_utils
except ImportError:  # a GPU machine running only tests/test_gpu_host.py has no Ansible
    pass
else:
    ansible.module_utils.__path__.append(os.path.join(ROOT, 'ansible', 'module_utils'))
