"""The project's modules document themselves as Ansible reads it (ansible-doc, the docs site): DOCUMENTATION,
EXAMPLES and RETURN parse with Ansible's own reader. Four did not (a ': ' in a description's plain text), and
nothing noticed: ansible-lint does not read a module's docs."""
import glob
import os

import pytest
from ansible.parsing.plugin_docs import read_docstring

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = sorted(glob.glob(os.path.join(ROOT, 'ansible', 'modules', '*.py')))


@pytest.mark.parametrize('path', MODULES, ids=os.path.basename)
def test_the_module_documentation_parses(path):
    docs = read_docstring(path)
    name = os.path.basename(path)[:-len('.py')]
    assert docs['doc'] and docs['doc']['module'] == name, docs
    assert docs['doc']['options'] and docs['doc']['short_description'], name
    assert docs['plainexamples'].strip() and docs['returndocs'], name
