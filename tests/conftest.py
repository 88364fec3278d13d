"""Make the project's own modules and module_utils importable the way Ansible imports them."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for sub in ('ansible/modules', 'ansible/filter_plugins', 'ansible/module_utils', 'scripts/lab', 'tests'):
    sys.path.insert(0, os.path.join(ROOT, sub))
try:
    import ansible.module_utils
except ImportError:  # a GPU machine running only tests/test_gpu_host.py has no Ansible
    pass
else:
    ansible.module_utils.__path__.append(os.path.join(ROOT, 'ansible', 'module_utils'))


import pytest  # noqa: E402


@pytest.fixture(scope='module')
def lab_api():
    """proxmoxer on the running lab's PVE API (root@pam, TLS checked against the lab CA).

    `make test` brings the lab up and sets GLM5_LAB=1: there a missing lab fails; elsewhere these tests skip.
    """
    if os.environ.get('GLM5_LAB') != '1':
        pytest.skip('needs the running lab: run through `make test` (it sets GLM5_LAB=1 after make lab-up)')
    import labd
    from proxmoxer import ProxmoxAPI
    p = labd.paths()
    if not labd.api_answers(p):
        pytest.fail('GLM5_LAB=1 but the lab API does not answer on 127.0.0.1:8006: see {0}'.format(p['log']))
    with open(p['password']) as fh:
        password = fh.read().strip()
    return ProxmoxAPI('127.0.0.1', port=8006, user='root@pam', password=password, verify_ssl=p['ca'])
