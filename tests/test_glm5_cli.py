"""glm5's process on the controller, with no node: what it prints besides its one line."""
import subprocess
import sys

from siterun import ROOT


def test_reading_the_inventory_then_a_filter_warns_nothing():
    """glm5 reads the inventory and then the unit through the project's filter: Ansible's plugin loader was set up
    twice, and its UserWarning ('AnsibleCollectionFinder has already been configured') went to stderr, where glm5's
    errors are one line (the ops tests count them)."""
    code = ('from glm5.inventory import Inventory, filter_plugin\n'
            'c = Inventory("inventories/lab").contract("glm5-lab")\n'
            'assert callable(filter_plugin("sglang_unit_launch"))\n'
            'print(c["unit"], c["lock_unit"], c["url"] + c["ready_path"], c["passed_file"])\n')
    p = subprocess.run([sys.executable, '-W', 'error::UserWarning', '-c', code], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and p.stderr == '', p.stderr
    # the node's contract as the roles render it: no template left (role variables read as trusted templates)
    assert p.stdout.split() == ['/etc/systemd/system/glm5-sglang.service', 'glm5-sglang-lock',
                                'http://127.0.0.1:30120/health_generate', '/etc/glm5/glm5-sglang.passed.json'], p.stdout
