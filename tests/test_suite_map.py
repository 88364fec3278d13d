"""The suite's own map holds: tests/checks.md lists every check where make test runs it, and the two lanes that run
side by side never share a container id, a port or a bench history (tests/README.md)."""
import json
import os
import re
import subprocess
import sys

import yaml
from siterun import ROOT, scenario_hosts

# Which lane runs each Molecule scenario's node (the Makefile's lane-stack and lane-ct).
LANES = {'default': 'stack', 'pve_container': 'ct', 'nvidia_host_driver': 'ct', 'sglang_gateway': 'ct'}
# Containers the pytest tests of the container-stage lane make through the API themselves (besides the lane nodes).
OWN_VMIDS = {'tests/test_site_validation.py': 'ct', 'tests/test_lab_reconciler.py': 'ct',
             'molecule/sglang_gateway/inventory/hosts.yml': 'ct'}


def load(path):
    with open(os.path.join(ROOT, path)) as fh:
        return yaml.safe_load(fh)


def lab_defaults():
    return dict(load('inventories/lab/group_vars/all.yml'), **load('inventories/lab/group_vars/inference_nodes.yml'))


def lane_nodes():
    """[(lane, scenario, host, group, hostvars)] of every node and gateway a Molecule scenario's own inventory holds."""
    out = []
    for scenario in sorted(os.listdir(os.path.join(ROOT, 'molecule'))):
        if os.path.exists(os.path.join(ROOT, 'molecule', scenario, 'inventory', 'hosts.yml')):
            for host, (group, hv) in scenario_hosts(scenario).items():
                out.append((LANES[scenario], scenario, host, group, hv))
    return out


def test_every_scenario_shares_a_lane_node_or_has_its_own_inventory():
    for scenario in sorted(os.listdir(os.path.join(ROOT, 'molecule'))):
        path = os.path.join('molecule', scenario, 'molecule.yml')
        if not os.path.exists(os.path.join(ROOT, path)):
            continue
        hosts = load(path)['provisioner']['inventory']['links']['hosts']
        owner = os.path.normpath(os.path.join('molecule', scenario, hosts)).split(os.sep)[1]
        assert owner in LANES, '{0} uses the inventory of {1}, which no lane runs'.format(scenario, owner)


def test_the_lanes_share_no_container_id_port_or_bench_history():
    defaults = lab_defaults()
    used = {}                       # (kind, value) -> lane

    def claim(kind, value, lane, who):
        other = used.setdefault((kind, value), (lane, who))
        assert other[0] == lane, '{0} {1} is used by {2} ({3}) and {4} ({5})'.format(
            kind, value, who, lane, other[1], other[0])

    for lane, _scenario, node, group, hv in lane_nodes():
        vmid = hv['pve_container_vmid']
        claim('vmid', vmid, lane, node)
        claim('ssh port', hv['ansible_port'], lane, node)
        claim('service port', hv['sglang_service_port' if group == 'inference_nodes' else 'sglang_gateway_port'],
              lane, node)
        claim('bench history', hv.get('pve_container_bench_history_dir',
                                      defaults['pve_container_bench_history_dir']), lane, node)
        # both lanes create containers at once: one known_hosts file would be rewritten by both
        claim('known_hosts file', hv.get('lab_known_hosts_name', defaults['lab_known_hosts_name']), lane, node)
    for path, lane in OWN_VMIDS.items():
        with open(os.path.join(ROOT, path)) as fh:
            text = fh.read()
        found = {int(v) for v in re.findall(r"(?:vmid['\"]?\s*[:=]\s*|vmid, node = )(\d{3})", text)}
        assert found, 'no container id found in {0}'.format(path)
        for vmid in found:
            claim('vmid', vmid, lane, path)
    # make deploy's node (the lab inventory's) is no lane's
    lab = load('inventories/lab/hosts.yml')['all']['children']['inference_nodes']['hosts']
    for node, hv in lab.items():
        assert ('vmid', hv['pve_container_vmid']) not in used, node
        assert ('bench history', defaults['pve_container_bench_history_dir']) not in used, \
            "a lane writes into make deploy's bench history"
        assert ('known_hosts file', defaults['lab_known_hosts_name']) not in used, \
            "a lane rewrites make deploy's known_hosts file"


HOST_DIRS = ('pve_container_model_cache_dir', 'pve_container_sglang_cache_dir', 'pve_container_bench_history_dir')


def test_no_lane_node_mounts_a_host_directory_of_make_deploys_nodes():
    # The caches hold a node's state besides the cache: its API key file (sglang_service_api_key_file), the model's
    # completion marker (molecule/sglang's verify moves it). A lane node on make deploy's caches wrote its key over
    # make deploy's (the key change of tests/test_secrets.py): make deploy's next run was no longer changed=0.
    defaults = lab_defaults()
    # the lanes' wheel caches start as hard links to make deploy's first node's (ansible/playbooks/lab_up.yml)
    assert defaults['lab_wheel_cache_dir'] == defaults['pve_container_sglang_cache_dir'] + '/uv'
    lab = load('inventories/lab/hosts.yml')['all']['children']['inference_nodes']['hosts']
    deploy = {(hv or {}).get(var, defaults[var]) for hv in lab.values() for var in HOST_DIRS}
    for lane, _scenario, node, group, hv in lane_nodes():
        for var in HOST_DIRS:
            path = hv.get(var, defaults[var]) if group == 'inference_nodes' else hv.get(var)
            if not path:
                continue
            inside = [d for d in deploy if path == d or path.startswith(d.rstrip('/') + '/')
                      or d.startswith(path.rstrip('/') + '/')]
            assert not inside, "{0} ({1} lane) mounts {2} {3}: make deploy's {4}".format(node, lane, var, path, inside)


def test_the_full_stack_node_runs_at_the_test_speed_and_make_deploy_at_the_seeds():
    defaults = lab_defaults()
    assert defaults['lab_emulator_speed'] == 1
    assert defaults['sglang_smoke_speed_factor'] == '{{ lab_emulator_speed }}'
    assert defaults['lab_sglang_service_env'] == {'GLM5_EMULATOR_SPEED': '{{ lab_emulator_speed }}'}
    stack = [hv for lane, _, _, group, hv in lane_nodes() if lane == 'stack' and group == 'inference_nodes']
    # the node sets the emulator's speed; the smoke test's factor follows it (one variable, both places)
    assert stack and all(hv['lab_emulator_speed'] > 1 and hv['sglang_smoke_speed_factor'] == hv['lab_emulator_speed']
                         for hv in stack)


def test_checks_md_lists_every_check_where_it_runs():
    r = subprocess.run([sys.executable, os.path.join(ROOT, 'scripts', 'suite_checks.py')], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    with open(os.path.join(ROOT, 'tests', 'checks.md')) as fh:
        assert fh.read() == r.stdout, 'tests/checks.md is not current: run scripts/suite_checks.py --write'
    assert '| make check (and make test) |' in r.stdout and '| make test: full-stack lane' in r.stdout
    # every row says where it runs (the gateway scenario's 35 assertions said '?' while SCENARIOS lacked it)
    assert '| ? |' not in r.stdout


def test_the_map_is_not_written_short_of_a_test_or_a_scenario(monkeypatch, tmp_path):
    """A test module that did not import was left out of the map silently, and --write wrote the short list with exit
    0; a scenario not in SCENARIOS got '?' for its lane and node. Both now stop it, nothing written."""
    sys.path.insert(0, os.path.join(ROOT, 'scripts'))
    import pytest
    import suite_checks
    out = tmp_path / 'checks.md'
    monkeypatch.setattr(suite_checks, 'OUT', str(out))

    def broken_collection(args, plugins):
        print('ERROR tests/test_broken.py - ModuleNotFoundError: No module named nonexistent_module_xyz')
        return 2
    monkeypatch.setattr(pytest, 'main', broken_collection)
    with pytest.raises(SystemExit) as e:
        suite_checks.main(['--write'])
    assert 'could not collect every test (exit 2)' in str(e.value) and 'tests/test_broken.py' in str(e.value)
    assert not out.exists()
    monkeypatch.setattr(suite_checks, 'pytest_items', lambda: [])
    monkeypatch.setattr(suite_checks, 'verify_checks', lambda: [('newrole', 'molecule/newrole/verify.yml', 'p', 't')])
    with pytest.raises(SystemExit) as e:
        suite_checks.main(['--write'])
    assert 'molecule/newrole is not said: add it to SCENARIOS' in str(e.value) and not out.exists()


def test_the_durations_table_adds_up_steps_tests_and_tasks(tmp_path):
    """scripts/suite_durations.py: a step is timed as it runs; the table sums pytest's and Ansible's JUnit XML per
    step, and marks what runs longer than the limit."""
    script = os.path.join(ROOT, 'scripts', 'suite_durations.py')
    env = dict(os.environ, GLM5_TEST_REPORTS=str(tmp_path))
    r = subprocess.run([sys.executable, script, 'step', 'quick', '--', 'sh', '-c', 'exit 3'], env=env, timeout=60)
    assert r.returncode == 3                          # the step's own exit code
    # its own CPU: the work of its process tree (here 0.3 s or more of a loop in a child of a child)
    loop = 'import time; t = time.process_time()\nwhile time.process_time() - t < 0.3: pass'
    busy = subprocess.run([sys.executable, script, 'step', 'busy', '--', 'sh', '-c',
                           '{0} -c "{1}"'.format(sys.executable, loop)], env=env, timeout=60)
    assert busy.returncode == 0
    with open(tmp_path / 'steps.jsonl') as fh:
        own = {json.loads(line)['step']: json.loads(line)['own_cpu_s'] for line in fh}
    assert own['busy'] >= 0.3 and own['quick'] < 0.3, own
    (tmp_path / 'quick.xml').write_text(
        '<testsuites><testsuite name="pytest"><testcase classname="tests.test_a" name="test_x" time="400.5"/>'
        '<testcase classname="tests.test_a" name="test_y" time="1.5"/></testsuite></testsuites>')
    (tmp_path / 'quick').mkdir()
    # a playbook run's time is its wall: from the step's start to its end (the epoch in its file's name); its tasks'
    # times are theirs (two hosts at once: 5 s each in 7 s), one Ansible counted from another batch's start left out
    start = [json.loads(line)['start'] for line in (tmp_path / 'steps.jsonl').open()][0]
    (tmp_path / 'quick' / 'converge-{0}.xml'.format(start + 12.0)).write_text(
        '<testsuites><testsuite name="converge"><testcase classname="x" name="[n] Play: task" time="5.0"/>'
        '<testcase classname="x" name="[m] Play: task" time="5.0"/>'
        '<testcase classname="x" name="[m] Play: later batch" time="40.0"/></testsuite></testsuites>')
    out = subprocess.run([sys.executable, script, 'table', str(tmp_path)], capture_output=True, text=True,
                         timeout=60).stdout
    assert '| quick | +0.0s |' in out and '| 3 |' in out and '(some FAILED)' in out, out
    assert '| quick | tests/test_a.py | 6:42 **over 5:00** |' in out, out
    assert '| quick | converge | 12.0s |' in out, out
    assert out.index('test_x') < out.index('Play: task'), out          # slowest first
    assert 'later batch' not in out, out


def test_each_lane_resets_the_molecule_state_of_the_scenarios_it_keeps_a_node_for():
    """A scenario whose Molecule state still says created/prepared (an earlier run, another checkout of the same path)
    skips building the node under --destroy=never and fails on a node that is not there: CI failed so at 85eb5b2.
    A scenario that builds its own containers destroys first what a killed run left (a half-done dpkg failed the next
    run so)."""
    for lane in ('lane-stack', 'lane-ct'):
        dry = subprocess.run(['make', '-n', '--no-print-directory', lane], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
        assert dry.returncode == 0, dry.stderr
        reset = set()
        for line in dry.stdout.splitlines():
            for command in re.split(r'&&|;', line):
                scenarios = set(re.findall(r'-s (\w+)', command))
                if re.search(r'molecule reset\b', command):
                    reset |= scenarios
                # a run that keeps its node (test --destroy=never, or converge then the checks) starts from nothing
                if re.search(r'molecule test\b', command) and '--destroy=never' in command \
                        or re.search(r'molecule converge\b', command):
                    assert scenarios and scenarios <= reset, \
                        '{0}: {1} not reset before `molecule test --destroy=never` or converge'.format(
                            lane, scenarios - reset)
                elif re.search(r'molecule test\b', command):
                    # a scenario with containers of its own destroys what a killed run left before building
                    for scenario in scenarios:
                        sequence = load(os.path.join('molecule', scenario, 'molecule.yml'))['scenario']['test_sequence']
                        assert sequence[0] == 'destroy', '{0}: {1} starts with {2}'.format(lane, scenario, sequence[0])


def test_each_kind_of_lab_test_runs_in_exactly_one_step_of_make_test():
    """A marker the lane-ct's catch-all step did not leave out ran the second node's tests there too, at the same time
    as their own step on the same node (each waiting for the other's engine lock)."""
    from _pytest.mark.expression import Expression
    from conftest import LANE_MARKERS
    dry = subprocess.run(['make', '-n', '--no-print-directory', 'lanes', 'host-checks'], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    expressions = [m.group(1) or m.group(2) for m in re.finditer(r"pytest .*?-m (?:'([^']+)'|(\w+))", dry.stdout)]
    assert len(expressions) >= 6, expressions
    for marks in [{'lab', m} for m in LANE_MARKERS] + [{'lab'}, {'sglang'}]:
        steps = [e for e in expressions if Expression.compile(e).evaluate(lambda name, marks=marks: name in marks)]
        assert len(steps) == 1, '{0}: selected by {1}'.format(sorted(marks), steps)


def test_only_make_test_records_into_the_suites_reports():
    """make deploy's lab-up recorded its step beside make test's, so the table after a deploy read 81:21 for a make
    test of 43:12 (its wall time runs from the first step's start to the last one's end). Every step make test runs
    writes its times, logs and JUnit reports under build/test-reports; a step run any other way (make deploy's lab-up,
    make check's lint and unit, a lane by hand) under build/step-reports."""
    # (as a user types it: under make test, its SUITE=1 reaches this make through MAKEFLAGS)
    env = {k: v for k, v in os.environ.items() if k not in ('MAKEFLAGS', 'MFLAGS', 'MAKELEVEL', 'SUITE')}

    def reports_of(*targets):
        dry = subprocess.run(['make', '-n', '--no-print-directory'] + list(targets), cwd=ROOT, capture_output=True,
                             text=True, timeout=60, env=env)
        assert dry.returncode == 0, dry.stderr
        steps = re.findall(r'GLM5_TEST_REPORTS=(\S+) \S+ scripts/suite_durations.py step ([\w.-]+)', dry.stdout)
        junit = re.findall(r'(?:--junitxml=|JUNIT_OUTPUT_DIR=)(\S+)', dry.stdout)
        return steps, junit

    suite, other = os.path.join(ROOT, 'build', 'test-reports'), os.path.join(ROOT, 'build', 'step-reports')
    steps, junit = reports_of('test')
    assert {name for _, name in steps} >= {'lint', 'unit', 'lab-up', 'stack-molecule', 'ct-pytest', 'host-pytest'}, steps
    assert {folder for folder, _ in steps} == {suite}, steps
    assert junit and all(os.path.abspath(os.path.join(ROOT, j)).startswith(suite + os.sep) for j in junit), junit
    for targets in (['deploy'], ['check'], ['lab-up'], ['lane-stack']):
        steps, junit = reports_of(*targets)
        assert steps and {folder for folder, _ in steps} == {other}, (targets, steps)
        assert all(os.path.abspath(os.path.join(ROOT, j)).startswith(other + os.sep) for j in junit), (targets, junit)


def test_durations_are_written_as_minutes_and_seconds():
    """119.6 s was written 1:00 (the minutes truncated, the seconds rounded)."""
    import suite_durations
    assert [suite_durations.fmt(s) for s in (59.94, 60.0, 119.4, 119.6, 3599.5)] == \
        ['59.9s', '1:00', '1:59', '2:00', '60:00']


def test_a_failed_step_is_named_with_its_failed_tests_and_the_end_of_its_log(tmp_path):
    """make test prints `suite_durations.py failed` when it fails: CI shows only the end of the output, and with the
    lanes' output kept together (--output-sync) the failed lane's lines are not at the end."""
    script = os.path.join(ROOT, 'scripts', 'suite_durations.py')
    env = dict(os.environ, GLM5_TEST_REPORTS=str(tmp_path))
    r = subprocess.run([sys.executable, script, 'step', 'ok', '--', 'echo', 'fine'], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == 'fine\n'                     # passed through as it runs
    r = subprocess.run([sys.executable, script, 'step', 'bad', '--', 'sh', '-c',
                        'seq 1 100; printf "\\033[31mTASK failed: no such host\\033[0m\\n" >&2; exit 2'],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and 'TASK failed' in r.stdout
    (tmp_path / 'bad').mkdir()
    # a verify's refusal provoked on purpose (its block rescued it: the host went on) is not what stopped the run
    (tmp_path / 'bad' / 'verify-1795999999.5.xml').write_text(
        '<testsuites><testsuite name="verify"><testcase classname="v" name="[n] Verify: refused on purpose" time="1">'
        '<failure message="a bad flag: refused">d</failure></testcase>'
        '<testcase classname="v" name="[m] Verify: another host" time="1"/>'
        '<testcase classname="v" name="[n] Verify: the refusal said so" time="1"/></testsuite></testsuites>')
    (tmp_path / 'bad' / 'converge-1796000000.5.xml').write_text(
        '<testsuites><testsuite name="converge"><testcase classname="x" name="[n] Converge: the task" time="1.0">'
        '<failure message="unreachable: glm5-molecule-ct">details</failure></testcase></testsuite></testsuites>')
    os.utime(tmp_path / 'bad' / 'verify-1795999999.5.xml', (1, 1))
    (tmp_path / 'bad.xml').write_text(
        '<testsuites><testsuite name="pytest"><testcase classname="tests.t" name="test_site" time="2.0">'
        '<failure message="AssertionError: rc=4&#10;fatal: [n]: UNREACHABLE! =&gt; changed=false&#10;  msg: timed out'
        '&#10;...&#10;the tail">tb</failure></testcase></testsuite></testsuites>')
    out = subprocess.run([sys.executable, script, 'failed', str(tmp_path), '--tail', '5'], capture_output=True,
                         text=True, timeout=60).stdout
    assert 'FAILED step bad (exit 2' in out and 'FAILED step ok' not in out, out
    assert 'failed: x::[n] Converge: the task: unreachable: glm5-molecule-ct' in out, out
    assert 'Verify: refused on purpose: a bad flag' not in out, out
    assert '  1 failed task(s) in verify-1795999999.5.xml that its play went on from (rescued: refusals provoked on ' \
           'purpose, cleanups), the last: v::[n] Verify: refused on purpose\n' in out, out
    # a site.yml test's failure says which task failed and why, not only its exit code
    assert 'failed: tests.t::test_site: AssertionError: rc=4 | fatal: [n]: UNREACHABLE! => changed=false | msg: timed ' \
           'out\n' in out, out
    assert '  | TASK failed: no such host' in out and '  | 97' in out and '  | 96' not in out, out   # no colours
    assert out.rstrip().splitlines()[-1] == '  failed: x::[n] Converge: the task: unreachable: glm5-molecule-ct', out


def test_a_step_run_again_counts_as_it_last_ran_and_one_that_cannot_start_is_recorded(tmp_path):
    """`make check` after `make test` appends lint and unit to the same record: `failed` showed an old lint failure
    beside a log that now ended 'All checks passed', and the table's wall ran from the first record ever. A command
    that could not start was a traceback and no record, so `failed` said nothing failed (found by a review)."""
    script = os.path.join(ROOT, 'scripts', 'suite_durations.py')
    env = dict(os.environ, GLM5_TEST_REPORTS=str(tmp_path))

    def run(*args):
        return subprocess.run([sys.executable, script, *args], env=env, capture_output=True, text=True, timeout=60)
    assert run('step', 'lint', '--', 'sh', '-c', 'echo lint error; exit 1').returncode == 1
    assert run('step', 'lint', '--', 'sh', '-c', 'echo All checks passed').returncode == 0
    out = run('failed', str(tmp_path)).stdout
    assert 'FAILED step lint' not in out and 'no failed step recorded' in out, out
    cannot = run('step', 'gone', '--', '/nonexistent/cmd')
    assert cannot.returncode == 127 and cannot.stderr.strip() == \
        'step gone: cannot run /nonexistent/cmd: No such file or directory', cannot.stderr
    assert 'Traceback' not in cannot.stderr
    out = run('failed', str(tmp_path)).stdout
    assert 'FAILED step gone (exit 127' in out and 'cannot run /nonexistent/cmd' in out, out
    table = run('table', str(tmp_path)).stdout
    assert table.count('| lint |') == 1 and '2 steps' in table, table
    # a record cut short (a killed run) is left out, not a traceback
    with open(tmp_path / 'steps.jsonl', 'a') as fh:
        fh.write('{"step": "half", "start": 1\n{"step": "x"}\n')
    assert run('table', str(tmp_path)).returncode == 0
    # so is a JUnit file cut short, or a time that is not a number: left out or 0, said, not a traceback
    (tmp_path / 'lint.xml').write_text('<testsuite><testcase name="x"/>')
    (tmp_path / 'gone.xml').write_text('<testsuite><testcase name="y" time="abc"/></testsuite>')
    for cmd in ('table', 'failed'):
        r = run(cmd, str(tmp_path))
        assert r.returncode == 0 and 'Traceback' not in r.stderr, r.stderr
    assert 'lint.xml left out' in run('table', str(tmp_path)).stderr
    # no command, or a name that would write outside the logs folder: usage, nothing run
    for args in (['step', 'empty', '--'], ['step', '../../x', '--', 'true'], ['step', 'a/b', '--', 'true']):
        r = run(*args)
        assert r.returncode == 2 and r.stderr.startswith('usage: suite_durations.py step'), (args, r.stderr)
    assert not (tmp_path.parent / 'x.log').exists()


def test_a_junit_report_ansible_could_not_write_is_said(tmp_path):
    """The gateway verify's results held a nested run's coloured output: an escape character is not well-formed XML,
    Ansible's junit callback wrote no report of that playbook (a warning in the log, wrapped and boxed by Molecule),
    and make test's summary of a failed verify named no failed task, with nothing saying why."""
    script = os.path.join(ROOT, 'scripts', 'suite_durations.py')
    env = dict(os.environ, GLM5_TEST_REPORTS=str(tmp_path))
    warning = ("printf '  \\342\\224\\202 \\033[1;35m[WARNING]: Callback dispatch \\047v2_playbook_on_stats\\047 failed for "
               "plugin\\033[0m\\n  \\342\\224\\202 \\047ansible_collections.ansible.builtin.plugins.callback.junit\\047: not"
               "\\n  \\342\\224\\202   well-formed (invalid token): line 3828, column 2591\\n  \\342\\224\\202 \\n"
               "  \\342\\224\\202 PLAYBOOK RECAP ****\\n'")
    assert subprocess.run([sys.executable, script, 'step', 'gw', '--', 'sh', '-c', warning + '; exit 2'], env=env,
                          capture_output=True, timeout=60).returncode == 2
    assert subprocess.run([sys.executable, script, 'step', 'fine', '--', 'echo', 'ok'], env=env,
                          capture_output=True, timeout=60).returncode == 0
    why = 'not well-formed (invalid token): line 3828, column 2591'
    out = subprocess.run([sys.executable, script, 'failed', str(tmp_path)], capture_output=True, text=True,
                         timeout=60).stdout
    assert out.rstrip().splitlines()[-1] == "  a playbook of gw left no JUnit report, its failed task not named here " \
        "(Ansible's junit callback failed: {0}): read its log".format(why), out
    out = subprocess.run([sys.executable, script, 'table', str(tmp_path)], capture_output=True, text=True,
                         timeout=60).stdout
    assert out.rstrip().splitlines()[-1] == "JUnit report lost in gw (its playbook's tasks are not above): Ansible's " \
        "junit callback failed: {0}".format(why), out
    assert 'lost in fine' not in out
