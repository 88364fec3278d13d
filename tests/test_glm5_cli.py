"""glm5's process on the controller, with no node: what it prints besides its one line."""
import subprocess
import sys

from siterun import ROOT


def test_reading_the_inventory_then_a_filter_warns_nothing():
    """glm5 reads the inventory and then the unit through the project's filter: Ansible's plugin loader was set up
    twice, and its UserWarning ('AnsibleCollectionFinder has already been configured') went to stderr, where glm5's
    errors are one line (the ops tests count them)."""
    code = ('from glm5.inventory import Inventory, filter_plugin\n'
            'Inventory("inventories/lab").contract("glm5-lab")\n'
            'assert callable(filter_plugin("sglang_unit_launch"))\n')
    p = subprocess.run([sys.executable, '-W', 'error::UserWarning', '-c', code], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and p.stderr == '', p.stderr
