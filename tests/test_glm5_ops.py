"""glm5, the day-2 ops command (scripts/glm5/, installed by make as .venv/bin/glm5), against the lab: a real SSH
connection through Fabric into make test's full-stack fleet's second node (molecule/default's, deployed by site.yml;
these run after the scenario's verify; the emulator serving at the test speed), the lab's PVE API and the node's
bench history on the lab host. Every call goes through -i with the node's own one-node inventory (its entry in the
fleet's hosts file and the lab's group_vars). Tests that change the node put it back: the unit restarted or
redeployed, healthy at the end."""
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from glm5_lab.paths import paths
from sglang_smoke import env_file_value
from siterun import ROOT, node_contract, node_ssh, second_node, site

GLM5 = os.path.join(os.path.dirname(sys.executable), 'glm5')
NAME, NODE = second_node('default')
VMID = NODE['pve_container_vmid']
PORT = NODE['sglang_service_port']          # the lab inventory's formula for the stack node
# the node's contract (sglang_service_contract): its unit, environment file, readiness, lock
CONTRACT = node_contract(NAME)
SERVICE = CONTRACT['service']
READY_URL = 'http://127.0.0.1:{0}{1}'.format(PORT, CONTRACT['ready_path'])
HISTORY = NODE['pve_container_bench_history_dir']
SPEED = NODE['lab_emulator_speed']
# What `glm5 bench` runs by default on this node: the node's smoke settings (4 prompts per concurrent request, at
# least sglang_smoke_min_prompts)
PROMPTS_PER_CONCURRENCY = 4
HOSTS = """---
all:
  children:
    pve_hosts:
      hosts:
        pve-lab:
    inference_nodes:
      hosts:
        {name}:
          pve_container_vmid: {vmid}
          ansible_port: {port}
"""


def write_inventory(path, name=NAME, port=NODE['ansible_port'], extra=''):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, 'hosts.yml'), 'w') as fh:
        fh.write(HOSTS.format(name=name, vmid=VMID, port=port) + extra)
    os.symlink(os.path.join(ROOT, 'inventories', 'lab', 'group_vars'), os.path.join(path, 'group_vars'))
    return str(path)


def glm5(*args, inventory=None, timeout=900):
    cmd = [GLM5] + (['-i', inventory] if inventory else []) + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    p.out = p.stdout
    return p


def ssh(*cmd, stdin=None, timeout=120):
    """Plain OpenSSH into the node (not the command under test)."""
    return node_ssh(NODE, *cmd, stdin=stdin, timeout=timeout)


LOCK = CONTRACT['lock_unit']      # the engine's lock in the container (sglang_service's tasks/lock.yml)


def hold_lock(description, node=None, lock=LOCK):
    """Hold the engine's lock as another run would, with its description (who holds it): this node's, or that of
    another node (its hostvars) whose lock unit is lock."""
    run = (lambda *cmd: node_ssh(node, *cmd)) if node else ssh
    held = run('systemd-run', '--unit=' + lock, '--collect', shlex.quote('--description=' + description), 'sleep', '600')
    assert held.returncode == 0, held.stderr
    assert run('systemctl', 'is-active', lock).stdout.strip() == 'active'


def history_runs():
    """The run ids of the node's bench-history index, in its order."""
    with open(os.path.join(HISTORY, 'index.jsonl')) as fh:
        return [json.loads(line)['run'] for line in fh if line.strip()]


def one_line_error(p, code, *words):
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert 'Traceback' not in p.stderr + p.stdout, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('glm5: '), p.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope='module')
def inventory(stack_node2):
    assert os.access(GLM5, os.X_OK), 'make venv installs {0}'.format(GLM5)
    return stack_node2[0]


@pytest.fixture(scope='module')
def deployed_run(inventory):
    """The smoke test the deploy ran, as the history has it."""
    p = glm5('history', '--json', inventory=inventory)
    assert p.returncode == 0, p.stderr
    runs = json.loads(p.out)['runs']
    assert runs and runs[-1]['node'] == NAME and runs[-1]['passed'], runs
    return runs[-1]


@pytest.mark.stack2
def test_status_of_a_healthy_node_shows_every_field(inventory, deployed_run):
    p = glm5('status', '--json', inventory=inventory)
    assert p.returncode == 0, (p.stdout, p.stderr)
    doc = json.loads(p.out)
    assert doc['healthy'] is True and len(doc['nodes']) == 1
    st = doc['nodes'][0]
    assert st['node'] == NAME and st['problems'] == []
    assert st['container']['status'] == 'running' and st['container']['vmid'] == VMID
    assert st['container']['node'] == 'pve1' and st['container']['uptime_s'] >= 0
    assert st['unit']['name'] == 'glm5-sglang' and (st['unit']['active'], st['unit']['sub']) == ('active', 'running')
    assert st['unit']['uptime_s'] >= 0 and st['unit']['since'].endswith('UTC')
    assert st['health']['ok'] and st['health']['status'] == 200
    assert st['health']['url'] == READY_URL
    # what the deploy's smoke test recorded is what runs: version, profile, flag set
    summary = json.loads(open(os.path.join(HISTORY, deployed_run['run'], 'summary.json')).read())
    meta = summary['meta']
    assert st['sglang']['version'] == meta['sglang'] == '0.5.12.post1'
    assert st['sglang']['profile'] == meta['profile'] == 'seed-validated'
    assert st['sglang']['flags_sha256'] == meta['flags_sha256'] == deployed_run['flags_sha256']
    manifest = json.loads(ssh('cat', '/opt/glm5/sglang/glm5-manifest.json').stdout)
    assert [{k: x[k] for k in ('name', 'applied', 'validated_on_hardware', 'sha256')} for x in st['sglang']['patches']] \
        == [{k: x[k] for k in ('name', 'applied', 'validated_on_hardware', 'sha256')} for x in manifest['patches']] != []
    assert [x['state'] for x in st['sglang']['patches']] == \
        ['applied' if x['applied'] else 'not applied' for x in manifest['patches']]
    assert st['drivers']['host_kernel_module'] == {'version': '580.95.05', 'open': True}
    assert st['drivers']['container_userspace'] == {'version': '580.95.05', 'cuda': '13.0'}
    assert [g['index'] for g in st['gpus']] == list(range(NODE['pve_container_gpu_count']))
    for g in st['gpus']:
        assert g['name'] == 'NVIDIA RTX PRO 6000 Blackwell Workstation Edition' and g['power_limit_w'] == 600.0
        for key in ('utilization_gpu_pct', 'power_draw_w', 'memory_used_mib', 'memory_total_mib', 'temperature_c',
                    'clocks_sm_mhz'):
            assert isinstance(g[key], (int, float)), (key, g)
    last = st['last_smoke']
    assert last['run'] == deployed_run['run'] and last['passed'] is True
    assert last['headline_concurrency'] == 1 and last['headline_total_tok_s'] > 0

    p = glm5('status', inventory=inventory)
    assert p.returncode == 0, p.stderr
    assert p.out.startswith(NAME + ': HEALTHY\n'), p.out
    for text in ('container   CT {0} on pve1: running, up '.format(VMID), 'unit        glm5-sglang active (running) since ',
                 'health      /health_generate 200 in ', 'sglang      0.5.12.post1, profile seed-validated, flags ' +
                 meta['flags_sha256'][:12], 'patches     ' + manifest['patches'][0]['name'],
                 'driver      host kernel module 580.95.05 (open) | container userspace 580.95.05 (CUDA 13.0)',
                 'last smoke  {0} PASSED'.format(deployed_run['run']), 'power W / limit'):
        assert text in p.out, (text, p.out)
    assert 'PROBLEM' not in p.out


@pytest.mark.stack2
def test_status_of_a_stopped_unit_says_why_and_exits_1_and_restart_brings_it_back(inventory, deployed_run):
    assert ssh('systemctl', 'stop', SERVICE).returncode == 0
    try:
        p = glm5('status', inventory=inventory)
        assert p.returncode == 1, p.out
        assert p.out.startswith(NAME + ': UNHEALTHY\n'), p.out
        assert '  PROBLEM: unit glm5-sglang is inactive (dead)' in p.out, p.out
        assert '  PROBLEM: {0} answered URLError'.format(READY_URL) in p.out
        doc = json.loads(glm5('status', '--json', inventory=inventory).out)
        assert doc['healthy'] is False and doc['nodes'][0]['unit']['active'] == 'inactive'
        # no bench against a node that does not answer (the smoke test would wait out its readiness timeout)
        one_line_error(glm5('bench', inventory=inventory), 1, 'glm5-sglang is not ready',
                       READY_URL)
    finally:
        p = glm5('restart', inventory=inventory)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert 'stopping glm5-sglang (running requests drain first' in p.out
    assert 'glm5-sglang ready after ' in p.out and '/health_generate 200' in p.out, p.out
    assert ssh('systemctl', 'is-active', SERVICE).stdout.strip() == 'active'
    p = glm5('status', inventory=inventory)
    assert p.returncode == 0 and 'HEALTHY' in p.out, p.out
    # restart of a running unit: it drains and stops, then comes back (a new main process)
    before = ssh('systemctl', 'show', '-p', 'MainPID', '--value', SERVICE).stdout.strip()
    p = glm5('restart', '--json', inventory=inventory)
    doc = json.loads(p.out)
    assert p.returncode == 0 and doc['ready'] is True and doc['unit']['active'] == 'active', p.out
    assert ssh('systemctl', 'show', '-p', 'MainPID', '--value', SERVICE).stdout.strip() != before


@pytest.mark.stack2
def test_status_checks_the_patched_files_not_only_the_manifest(inventory):
    """A patched file that no longer has the sha256 the deploy left is 'drifted' and a problem (exit 1); it was
    shown as applied, from the manifest alone. The file is put back at the end."""
    manifest = json.loads(ssh('cat', '/opt/glm5/sglang/glm5-manifest.json').stdout)
    patch = [x for x in manifest['patches'] if x['applied']][0]
    path = '/opt/glm5/sglang/lib/python{0}/site-packages/{1}'.format(manifest['python'], patch['target'])
    assert ssh('cp', '-p', path, path + '.glm5-test').returncode == 0
    try:
        assert ssh('sh', '-c', 'echo "# drifted" >> {0}'.format(path)).returncode == 0
        p = glm5('status', '--json', inventory=inventory)
        assert p.returncode == 1, p.stderr
        st = json.loads(p.out)['nodes'][0]
        state = {x['name']: x['state'] for x in st['sglang']['patches']}
        assert state[patch['name']] == 'drifted', state
        problem = 'patch {0}: {1} has sha256 '.format(patch['name'], path)
        assert [x for x in st['problems'] if x.startswith(problem) and 'the deploy left {0}'.format(
            patch['sha256']) in x], st['problems']
        assert '{0} (drifted)'.format(patch['name']) in glm5('status', inventory=inventory).out
    finally:
        assert ssh('mv', path + '.glm5-test', path).returncode == 0
    assert glm5('status', inventory=inventory).returncode == 0


@pytest.mark.stack2
def test_gpus_and_watch(inventory):
    p = glm5('gpus', '--json', inventory=inventory)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.out)['nodes'][0]
    assert doc['node'] == NAME and doc['driver'] == '580.95.05'
    assert len(doc['gpus']) == NODE['pve_container_gpu_count']
    p = glm5('gpus', '--watch', '--count', '2', '--interval', '0.2', inventory=inventory)
    assert p.returncode == 0, p.stderr
    assert p.out.count('{0}  '.format(NAME)) == 2 and p.out.count('power W / limit') == 2, p.out


@pytest.mark.stack2
def test_logs(inventory):
    p = glm5('logs', '--lines', '200', inventory=inventory)
    assert p.returncode == 0, p.stderr
    assert 'sglang-emulator: serving glm-5 on http://127.0.0.1:{0}'.format(PORT) in p.out, p.out
    p = glm5('logs', '--since=-1h', '--json', inventory=inventory)
    assert p.returncode == 0, p.stderr
    lines = [json.loads(x) for x in p.out.splitlines()]
    # the service's own lines, and systemd's about it (UNIT=)
    assert lines and all('glm5-sglang.service' in (x.get('_SYSTEMD_UNIT'), x.get('UNIT')) for x in lines), lines
    assert any('sglang-emulator: serving glm-5' in x['MESSAGE'] for x in lines), lines
    # the newest lines of the window, not its oldest (journalctl's -n with --since)
    p = glm5('logs', '--since=-1h', '--lines', '3', '--json', inventory=inventory)
    assert p.returncode == 0, p.stderr
    newest = [json.loads(x) for x in p.out.splitlines()]
    assert len(newest) == 3 and len(lines) > 3, p.out
    assert all(int(x['__REALTIME_TIMESTAMP']) >= int(lines[-3]['__REALTIME_TIMESTAMP']) for x in newest), p.out
    # bad input: exit 2 (the README's promise), one line
    one_line_error(glm5('logs', '--since', 'not-a-time', inventory=inventory), 2,
                   NAME, 'journalctl: Failed to parse timestamp')
    for args in (['gpus', '--interval', '-1'], ['gpus', '--count', '-2'], ['logs', '--lines', '0']):
        p = glm5(*args, inventory=inventory)
        assert p.returncode == 2 and '{0} must be a number >= '.format(args[1]) in p.stderr, (args, p.stderr)


@pytest.mark.stack2
def test_logs_follow_until_ctrl_c(inventory):
    # Ctrl-C as a terminal sends it: SIGINT at its default in the child, whatever this process inherited (a suite
    # started in the background by a shell without job control ignores SIGINT, and so would glm5: CI runs 35 and 36
    # waited 20 s, then 60 s, on a glm5 that never saw the signal)
    p = subprocess.Popen([GLM5, '-i', inventory, 'logs', '-f', '--lines', '1'], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    reader = threading.Thread(target=lambda: seen.extend(iter(p.stdout.readline, '')), daemon=True)
    reader.start()
    try:
        time.sleep(3)
        assert glm5('restart', inventory=inventory).returncode == 0             # new lines while it follows
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any('sglang-emulator: serving' in x for x in seen[1:]):
            time.sleep(0.5)
        assert any('Stopped glm5-sglang.service' in x for x in seen), seen
        assert any('sglang-emulator: serving' in x for x in seen[1:]), seen
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            raise AssertionError('glm5 logs -f still ran 60 s after Ctrl-C; it had printed: {0}'.format(seen[-5:])) from None
    assert p.returncode == 0, p.stderr.read()


@pytest.mark.stack2
def test_bench_writes_a_run_that_history_lists_and_compare_sets_beside_the_last(inventory, deployed_run, tmp_path):
    p = glm5('bench', '--levels', '1,2', inventory=inventory)
    assert p.returncode == 0, (p.stdout, p.stderr)
    lines = p.out.splitlines()
    assert lines[0] == '{0}: the smoke test on demand, concurrency 1, 2'.format(NAME)
    # a bar per level, from bench_serving's own progress in the level's log (2 prompts per concurrent request)
    one, two = PROMPTS_PER_CONCURRENCY, 2 * PROMPTS_PER_CONCURRENCY
    assert lines[1].startswith('concurrency     1 [' + '#' * 30 + ']      {0}/{0}'.format(one)), lines[1]
    assert lines[2].startswith('concurrency     2 [' + '#' * 30 + ']      {0}/{0}'.format(two)), lines[2]
    assert '# Smoke test ' in p.out and ': PASSED' in p.out and 'Report: pve-lab:{0}/'.format(HISTORY) in p.out
    history = json.loads(glm5('history', '--json', inventory=inventory).out)['runs']
    new = history[-1]
    assert history[-2]['run'] == deployed_run['run'] and new['run'] != deployed_run['run']
    assert new['passed'] and sorted(new['levels'], key=int) == ['1', '2'], new
    folder = os.path.join(HISTORY, new['run'])
    for f in ('bench.jsonl', 'bench-c1.log', 'bench-c2.log', 'gpu.jsonl', 'summary.json', 'report.md',
              'throughput.png', 'latency.png', 'gpus.png'):
        assert os.path.getsize(os.path.join(folder, f)) > 0, f
    text = glm5('history', inventory=inventory).out
    assert deployed_run['run'] in text and new['run'] in text and '{0}: '.format(NAME) in text

    # compare: the last two by default, older first
    out = str(tmp_path / 'cmp.png')
    p = glm5('compare', '--json', '--out', out, inventory=inventory)
    assert p.returncode == 0, p.stderr
    cmp = json.loads(p.out)
    assert [r['run'] for r in cmp['runs']] == [deployed_run['run'], new['run']]
    assert [row['concurrency'] for row in cmp['levels']] == [1, 2]
    one = cmp['levels'][0]['total_tok_s']
    assert one['a'] == deployed_run['levels']['1']['total_tok_s'] and one['b'] == new['levels']['1']['total_tok_s']
    assert one['change_pct'] == pytest.approx(100 * (one['b'] - one['a']) / one['a'])
    assert cmp['levels'][1]['total_tok_s']['a'] is None          # level 2 only in the newer run
    assert all(m['same'] for m in cmp['meta']), cmp['meta']
    with open(out, 'rb') as fh:
        assert fh.read(8) == b'\x89PNG\r\n\x1a\n'
    # by name prefix, in either order; the table
    p = glm5('compare', new['run'][:16], deployed_run['run'], '--out', out, inventory=inventory)
    assert p.returncode == 0, p.stderr
    assert p.out.startswith('# {0} (pass) vs {1} (pass)'.format(deployed_run['run'], new['run'])), p.out
    assert '| 1 | {0} -> '.format('{0:,.1f}'.format(one['a'])) in p.out and 'Plot: ' + out in p.out


@pytest.mark.stack2
def test_bad_input_gives_one_line_and_a_non_zero_exit(inventory, tmp_path):
    one_line_error(glm5('-n', 'nosuch', 'status', inventory=inventory), 2, "unknown node 'nosuch'", NAME)
    one_line_error(glm5('status', '-n', 'pve-lab', inventory=inventory), 2, "unknown node 'pve-lab'")
    one_line_error(glm5('compare', '19990101T000000Z', inventory=inventory), 2,
                   "no run '19990101T000000Z' in pve-lab:" + HISTORY)
    one_line_error(glm5('status', inventory=str(tmp_path / 'none')), 2, 'no inventory at')
    p = glm5('bench', '--levels', '64,1', inventory=inventory)
    assert p.returncode == 2 and '--levels must be ascending, distinct and >= 1' in p.stderr, p.stderr
    p = glm5('bench', '--lengths', '256', inventory=inventory)
    assert p.returncode == 2 and '--lengths takes INPUT/OUTPUT tokens like 256/128' in p.stderr, p.stderr
    # a node nothing answers for: status says so and exits 1, other subcommands give the one line
    down = write_inventory(tmp_path / 'down', name='glm5-ops-down', port=29)
    p = glm5('status', '--json', inventory=down)
    assert p.returncode == 1, p.stderr
    problems = json.loads(p.out)['nodes'][0]['problems']
    assert 'cannot reach root@127.0.0.1:29 over SSH' in ' '.join(problems), problems
    one_line_error(glm5('gpus', inventory=down), 1, 'glm5-ops-down: cannot reach root@127.0.0.1:29 over SSH')
    one_line_error(glm5('restart', inventory=down), 1, 'cannot reach root@127.0.0.1:29 over SSH')
    # a host key nobody recorded is refused, as OpenSSH's StrictHostKeyChecking does
    empty = tmp_path / 'known_hosts'
    empty.write_text('')
    unknown = write_inventory(tmp_path / 'unknown', extra='          ansible_ssh_common_args: ""\n'
                                                          '          pve_container_known_hosts_file: {0}\n'.format(empty))
    one_line_error(glm5('gpus', inventory=unknown), 1, "cannot reach root@127.0.0.1:{0} over SSH: Server "
                   "'[127.0.0.1]:{0}' not found in known_hosts".format(NODE['ansible_port']))


@pytest.mark.stack2
def test_restart_drains_a_request_in_flight(inventory):
    key = env_file_value(ssh('cat', CONTRACT['env_file']).stdout, 'SGLANG_API_KEY')
    tokens = 40 * SPEED                 # ~5 s at the node's speed: the seeds' single stream is 8.2 tok/s
    body = json.dumps({'model': 'glm-5', 'max_tokens': tokens, 'temperature': 0, 'ignore_eos': True,
                       'messages': [{'role': 'user', 'content': 'Write a long story.'}]}).encode()
    answer = {}

    def ask():
        req = urllib.request.Request('http://127.0.0.1:{0}/v1/chat/completions'.format(PORT), data=body,
                                     headers={'Authorization': 'Bearer ' + key, 'Content-Type': 'application/json'})
        with urllib.request.urlopen(req, timeout=300) as r:
            answer.update(status=r.status, body=json.loads(r.read()))

    t = threading.Thread(target=ask)
    t.start()
    time.sleep(1.5)                     # still running
    p = glm5('restart', '--json', inventory=inventory)
    t.join(60)
    doc = json.loads(p.out)
    assert p.returncode == 0 and doc['ready'] is True, (p.stdout, p.stderr)
    assert answer.get('status') == 200, answer
    assert answer['body']['usage']['completion_tokens'] == tokens, answer      # finished, not cut off
    assert doc['stopped_after_s'] >= 1.5, doc                                  # the stop waited for it


@pytest.mark.stack2
def test_a_unit_past_its_start_limit_is_reported_and_a_deploy_brings_it_back(inventory):
    """Another process on the service's port: sglang exits at every start (address in use), past StartLimitBurst
    (sglang_service_start_limit_burst: 3 in 20 minutes). A deploy's readiness wait ends as soon as the unit has
    failed, naming the unit, the squatter and the journal's last words (it polled /health_generate for
    sglang_service_ready_timeout, an hour, and then said only "Status code was 404"); glm5 status reports the unit;
    with the port free again, a deploy brings it back."""
    port = PORT
    assert ssh('systemctl', 'stop', SERVICE).returncode == 0
    squatter = ssh('systemd-run', '--unit', 'glm5-test-squatter', '--', 'python3', '-m', 'http.server', '--bind',
                   '127.0.0.1', str(port))
    assert squatter.returncode == 0, squatter.stderr
    try:
        t0 = time.monotonic()
        run = site({'sglang_smoke_levels': [1], 'sglang_service_ready_poll': 2}, '--tags', 'sglang',
                   inventory=inventory, sglang=True)
        took = time.monotonic() - t0
        assert run.rc != 0, run
        # systemd keeps the last start's result (exit-code) when its automatic restarts hit the start limit
        assert 'glm5-sglang is not ready: it failed. The unit: glm5-sglang is failed (failed, result exit-code)' \
            in run.out, run
        assert '{0}: HTTP 404 (not the service: the unit does not run, so another process holds the port)'.format(
            READY_URL) in run.out, run
        assert 'Its last words: ' in run.out and 'address already in use' in run.out, run    # the service's own
        assert took < 600, took                                               # not sglang_service_ready_timeout
    finally:
        ssh('systemctl', 'stop', 'glm5-test-squatter')
    assert ssh('systemctl', 'is-failed', SERVICE).stdout.strip() == 'failed'
    p = glm5('status', inventory=inventory)
    assert p.returncode == 1, p.out
    assert '  PROBLEM: unit glm5-sglang is failed (failed, result exit-code)' in p.out, p.out
    run = site(None, '--tags', 'sglang', '--skip-tags', 'smoke', inventory=inventory, sglang=True)   # the service is enough
    assert run.rc == 0, run
    assert 'Service | a unit that failed (a crash loop, its start limit hit) gets a fresh start from a deploy] ' \
           '*** changed' in run.out, run
    p = glm5('status', inventory=inventory)
    assert p.returncode == 0 and 'HEALTHY' in p.out, p.out


def inventory_var(inventory, node, var, *vault_files):
    """glm5's inventory reading in a process of its own (Ansible's vault context is set once per process)."""
    code = ('from glm5.errors import OpsError\n'
            'from glm5.inventory import Inventory\n'
            'try:\n'
            '    print(Inventory({0!r}, {1!r}).host_vars({2!r}).get({3!r}))\n'
            'except OpsError as exc:\n'
            '    print("ERROR", exc)\n').format(inventory, list(vault_files), node, var)
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120).stdout.strip()


def test_vaulted_inventory_variables_are_read_with_the_vault_password(tmp_path):
    """The production example's secrets are vaulted: glm5 reads them as ansible-playbook does (no node is contacted)."""
    production = os.path.join(ROOT, 'inventories', 'production')
    pw = tmp_path / 'pw'
    pw.write_text('example\n')
    assert inventory_var(production, 'glm5', 'pve_container_api_password', str(pw)) == 'CHANGE-ME'
    out = inventory_var(production, 'glm5', 'pve_container_api_password')
    assert out == 'ERROR glm5: cannot read its variables from {0}: A vault password must be specified to decrypt ' \
                  'data. (--vault-password-file or --ask-vault-pass)'.format(production), out
    wrong = tmp_path / 'wrong'
    wrong.write_text('not-it\n')
    out = inventory_var(production, 'glm5', 'pve_container_api_password', str(wrong))
    assert out.startswith('ERROR glm5: cannot read its variables from {0}: '.format(production)), out
    assert 'Decryption failed' in out, out
    # the command itself: one line before it contacts anything
    one_line_error(glm5('status', inventory=production), 2,
                   'cannot read its variables', 'A vault password must be specified', '--vault-password-file')


def test_the_lab_inventory_password_is_the_lookup_of_the_file_labd_made(lab_api):
    """Needs the lab (lab_api: marked `lab`): the password file exists only once labd has started."""
    with open(os.path.join(paths()['password'])) as fh:
        assert inventory_var(os.path.join(ROOT, 'inventories', 'lab'), 'glm5-lab', 'pve_container_api_password') == \
            fh.read().strip()
