"""A role input that its meta/argument_specs.yml refuses is told in a few lines: Ansible's validation result carries
the role's whole spec (~100 lines for sglang_smoke, after the one line that matters); the project's stdout callback
(ansible/callback_plugins/glm5.py, set in ansible.cfg) leaves it out. No lab: the refusal comes before any task."""
from siterun import site

PLAY = """- hosts: localhost
  gather_facts: false
  roles:
    - role: sglang_smoke
      sglang_smoke_levels: [1, "sixty"]
"""


def test_a_refused_role_input_is_the_error_line_not_the_whole_spec(tmp_path):
    playbook = tmp_path / 'play.yml'
    playbook.write_text(PLAY)
    run = site(None, '-c', 'local', '--check', inventory='localhost,', playbook=str(playbook))
    assert run.rc == 2, run
    assert "Elements value for option 'sglang_smoke_levels' is of type str and we were unable to convert to int" \
        in run.out, run
    assert 'argument_spec_data' not in run.raw and 'sglang_smoke_baseline' not in run.raw, run   # the spec's options
    assert len(run.raw.splitlines()) < 30, run


WAIT = """- hosts: localhost
  gather_facts: false
  tasks:
    - name: Wait | the flag file
      ansible.builtin.command:
        argv: [test, -e, {0}]
      register: flag
      changed_when: false
      until: flag.rc == 0
      retries: 2
      delay: 0
"""


def test_a_task_that_asks_again_says_waiting_not_failed(tmp_path):
    """until/retries (a service becoming ready, a node leaving the gateway): each try is "waiting", not "FAILED -
    RETRYING"; the task fails, said as a failure, once its tries run out."""
    playbook = tmp_path / 'play.yml'
    playbook.write_text(WAIT.format(tmp_path / 'flag'))
    run = site(None, '-c', 'local', inventory='localhost,', playbook=str(playbook))
    assert run.rc == 2, run
    assert 'waiting: [localhost]: Wait | the flag file (2 tries left)' in run.raw, run
    assert 'waiting: [localhost]: Wait | the flag file (1 try left)' in run.raw, run
    assert 'RETRYING' not in run.raw and 'fatal: [localhost]: FAILED!' in run.raw, run
