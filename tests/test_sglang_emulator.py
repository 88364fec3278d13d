"""The lab's engine emulator (scripts/lab/sglang_emulator.py) run with the seed-validated profile's real sglang (its
parser, its bench_serving) and the lab's stand-in model: argv refused as sglang refuses it, the API key, the
answers the smoke test's probe asks for, streaming with usage, /generate, the load endpoints (/v1/loads, /get_load),
the fault switches, and a short run of the real sglang.bench_serving against it. Pacing is measured by scripts, not
timed here."""
import concurrent.futures
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import requests
from sglang_envs import ROOT, environment

EMULATOR = os.path.join(ROOT, 'scripts', 'lab', 'sglang_emulator.py')
LAUNCHER = os.path.join(ROOT, 'roles', 'sglang_service', 'files', 'glm5-sglang-launch')
KEY = 'test-key'

pytestmark = pytest.mark.sglang


@pytest.fixture(scope='module')
def python():
    return os.path.join(environment('seed-validated')[1], 'bin', 'python')


@pytest.fixture(scope='module')
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp('model') / 'GLM-5-NVFP4'
    subprocess.run([sys.executable, os.path.join(ROOT, 'scripts', 'lab', 'stand_in_model.py'), str(path)], check=True,
                   capture_output=True)
    return str(path)


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class Engine(object):
    def __init__(self, python, model, faults='', extra=(), speed=None, launcher_key=None, secondary_key=None):
        """launcher_key: started as the unit starts it, through sglang_service's launcher with this key in
        SGLANG_API_KEY (and no --api-key on its command line); secondary_key: and this one in SGLANG_API_KEY_SECONDARY."""
        self.port = free_port()
        self.url = 'http://127.0.0.1:{0}'.format(self.port)
        argv = [python, EMULATOR, '--model-path', model, '--served-model-name', 'glm-5', '--host', '127.0.0.1',
                '--port', str(self.port), '--tp', '8', '--max-running-requests', '64']
        if launcher_key is None:
            argv += ['--api-key', KEY]          # before extra: a test's own --api-key there wins (argparse: the last)
        else:
            argv.insert(1, LAUNCHER)
        argv += list(extra)
        # the switches it reads while it runs: a file of this engine's own (never the lab host's default)
        self.fault_file = os.path.join(tempfile.gettempdir(), 'glm5-emulator-faults-{0}'.format(self.port))
        env = dict(os.environ, GLM5_EMULATOR_FAULTS=faults, GLM5_EMULATOR_FAULTS_FILE=self.fault_file)
        if launcher_key is not None:
            env['SGLANG_API_KEY'] = launcher_key
        env.pop('SGLANG_API_KEY_SECONDARY', None)
        if secondary_key is not None:
            env['SGLANG_API_KEY_SECONDARY'] = secondary_key
        env.pop('GLM5_EMULATOR_SPEED', None)
        if speed is not None:
            env['GLM5_EMULATOR_SPEED'] = str(speed)
        self.proc = subprocess.Popen(argv, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait(self, path='/health', status=200, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()
            try:
                if requests.get(self.url + path, timeout=5).status_code == status:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.3)
        raise AssertionError('emulator not answering {0} {1}'.format(path, status))

    def post(self, path, body, key=KEY, **kw):
        headers = {'Authorization': 'Bearer ' + key} if key else {}
        return requests.post(self.url + path, json=body, headers=headers, timeout=60, **kw)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


@pytest.fixture(scope='module')
def engine(python, model):
    """One healthy emulator for the tests that do not switch faults on (each start imports sglang, ~10 s)."""
    e = Engine(python, model)
    e.wait()
    yield e
    e.stop()


@pytest.fixture(scope='module')
def started():
    """Emulators by how they were started, kept for the module (each start imports sglang: ~10 s of CPU)."""
    engines = {}
    yield engines
    for e in engines.values():
        e.stop()


@pytest.fixture
def special(python, model, request, started):
    """An emulator started as the test's `engine` marker says (faults, extra arguments); one that crashes by design
    is the test's own, the others are shared by the tests that ask for the same."""
    kwargs = request.node.get_closest_marker('engine').kwargs
    key = repr(sorted(kwargs.items()))
    if 'crash' in kwargs.get('faults', ''):
        e = Engine(python, model, **kwargs)
        e.wait()
        yield e
        e.stop()
        return
    if key not in started or started[key].proc.poll() is not None:
        started[key] = Engine(python, model, **kwargs)
        started[key].wait()
    yield started[key]


def ask(engine, question, **extra):
    r = engine.post('/v1/chat/completions', dict({'model': 'glm-5', 'max_tokens': 32,
                                                  'messages': [{'role': 'user', 'content': question}]}, **extra))
    assert r.status_code == 200, r.text
    return r.json()


def test_flags_are_parsed_by_sglang_itself(python, model):
    # the file's first import of sglang: in a venv just built (a fresh machine: CI) it compiles sglang and torch to
    # bytecode first, which took over 120 s (test_sglang_profiles' first parse 194 s) on a slow, busy machine
    r = subprocess.run([python, EMULATOR, '--model-path', model, '--dsa-decode-backend', 'flashinfer_sparse_mla'],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2
    assert 'sglang.launch_server: error: unrecognized arguments: --dsa-decode-backend' in r.stderr


def test_api_key_and_health(engine):
    assert requests.get(engine.url + '/v1/models', timeout=5).status_code == 401
    assert engine.post('/v1/completions', {'prompt': 'x'}, key='wrong').status_code == 401
    assert requests.get(engine.url + '/health_generate', timeout=30).status_code == 200
    models = requests.get(engine.url + '/v1/models', headers={'Authorization': 'Bearer ' + KEY}, timeout=5).json()
    assert [m['id'] for m in models['data']] == ['glm-5']
    info = requests.get(engine.url + '/server_info', headers={'Authorization': 'Bearer ' + KEY}, timeout=5).json()
    assert info['version'] == '0.5.12.post1' and info['max_running_requests'] == 64


def test_it_listens_with_uvicorns_backlog_as_sglang_does(engine):
    """sglang serves through uvicorn (listen backlog 2048); with aiohttp's 128 a gateway opening hundreds of connections
    at once overflowed the queue, and every refused SYN came back a second later into the gateway's p99 TTFT."""
    listening = subprocess.run(['ss', '-ltnH', 'sport = :{0}'.format(engine.port)], capture_output=True, text=True,
                               check=True).stdout.split()
    with open('/proc/sys/net/core/somaxconn') as fh:
        cap = int(fh.read())
    # a listening socket's Send-Q column is its backlog (the kernel caps it at somaxconn)
    assert listening[0] == 'LISTEN' and int(listening[2]) == min(2048, cap), listening


def test_the_key_from_the_environment_through_the_launcher_whole_and_on_no_command_line(python, model):
    """The unit starts the engine through sglang_service's launcher, which takes the key from SGLANG_API_KEY and
    gives it to sglang's parser as --api-key=<key>: secrets.token_urlsafe gives a key that begins with '-' once in 64,
    and `--api-key -x...` is a missing value and an option to argparse. The key reaches the engine whole, and is not
    on the process's command line (what every local user's ps reads)."""
    key = '-dash' + KEY
    r = subprocess.run([python, EMULATOR, '--model-path', model, '--api-key', key, '--port', '1'],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and 'argument --api-key: expected one argument' in r.stderr, r.stderr[-500:]
    e = Engine(python, model, launcher_key=key)
    try:
        e.wait()
        body = {'model': 'glm-5', 'max_tokens': 4, 'messages': [{'role': 'user', 'content': 'What is 2 + 3?'}]}
        assert e.post('/v1/chat/completions', body, key=KEY).status_code == 401
        r = e.post('/v1/chat/completions', body, key=key)
        assert r.status_code == 200, r.text
        with open('/proc/{0}/cmdline'.format(e.proc.pid), 'rb') as fh:
            cmdline = fh.read().split(b'\0')
        assert cmdline[1:3] == [LAUNCHER.encode(), EMULATOR.encode()] and b'--model-path' in cmdline, cmdline
        assert not [a for a in cmdline if key.encode() in a or a.startswith(b'--api-key')], cmdline
    finally:
        e.stop()


def test_a_secondary_key_is_let_in_beside_the_key_by_sglangs_own_decision(python, model):
    # as the unit starts it during a key change: the launcher with both keys; the emulator asks sglang's
    # decide_request_auth, which the launcher wrapped
    e = Engine(python, model, launcher_key='new-' + KEY, secondary_key=KEY)
    try:
        e.wait()
        body = {'model': 'glm-5', 'max_tokens': 4, 'messages': [{'role': 'user', 'content': 'hi'}]}
        assert e.post('/v1/chat/completions', body, key='new-' + KEY).status_code == 200
        assert e.post('/v1/chat/completions', body, key=KEY).status_code == 200
        assert e.post('/v1/chat/completions', body, key='other-' + KEY).status_code == 401
        assert e.post('/v1/chat/completions', body, key=None).status_code == 401
        loads = requests.get(e.url + '/v1/loads', headers={'Authorization': 'Bearer ' + KEY}, timeout=30)
        assert loads.status_code == 200, loads.text
    finally:
        e.stop()


def test_probe_answers(engine):
    out = ask(engine, 'What is 17 + 25? Answer with the number only.')
    assert out['choices'][0]['message']['content'] == '42' and out['choices'][0]['finish_reason'] == 'stop'
    assert ask(engine, 'What is the capital of France? One word.')['choices'][0]['message']['content'] == 'Paris'
    assert ask(engine, 'Compute 12 * 12.')['choices'][0]['message']['content'] == '144'
    assert out['usage']['prompt_tokens'] > 5 and out['usage']['completion_tokens'] >= 1


@pytest.mark.engine(extra=['--reasoning-parser', 'glm45'])
def test_reasoning_model_answers_with_reasoning_content(special):
    msg = ask(special, 'What is 2 + 3?')['choices'][0]['message']
    assert msg['reasoning_content'] and msg['content'] == '5'


def test_stream_with_ignore_eos_gives_exactly_max_tokens_and_usage(engine):
    r = engine.post('/v1/completions', {'model': 'glm-5', 'prompt': 'the city of water', 'max_tokens': 7,
                                        'ignore_eos': True, 'stream': True, 'stream_options': {'include_usage': True}},
                    stream=True)
    events = [line[6:] for line in r.iter_lines(decode_unicode=True) if line.startswith('data: ')]
    assert events[-1] == '[DONE]'
    chunks = [json.loads(e) for e in events[:-1]]
    assert sum(1 for c in chunks if c['choices'] and c['choices'][0]['text']) == 7
    assert chunks[-1]['usage']['completion_tokens'] == 7 and chunks[-1]['usage']['prompt_tokens'] == 4


def test_generate(engine):
    out = engine.post('/generate', {'text': 'What is 6 * 7?', 'sampling_params': {'max_new_tokens': 8}}).json()
    assert out['text'].strip() == '42' and out['meta_info']['completion_tokens'] == 1


def loads(engine, path='/v1/loads'):
    r = requests.get(engine.url + path, headers={'Authorization': 'Bearer ' + KEY}, timeout=5)
    assert r.status_code == 200, r.text
    return r.json()


CORE = {'dp_rank', 'num_running_reqs', 'num_waiting_reqs', 'num_used_tokens', 'num_total_tokens', 'max_total_num_tokens',
        'token_usage', 'gen_throughput', 'cache_hit_rate', 'utilization', 'max_running_requests', 'num_total_reqs'}


def test_loads_need_the_key_and_have_sglangs_shape(engine):
    for path in ('/v1/loads', '/get_load'):
        assert requests.get(engine.url + path, timeout=5).status_code == 401
        assert requests.get(engine.url + path, headers={'Authorization': 'Bearer wrong'}, timeout=5).status_code == 401
    out = loads(engine)
    assert set(out) == {'timestamp', 'version', 'dp_rank_count', 'loads', 'aggregate'}
    assert out['version'] == '0.5.12.post1' and out['dp_rank_count'] == 1
    assert datetime.datetime.fromisoformat(out['timestamp']).utcoffset() == datetime.timedelta(0)
    (rank,) = out['loads']
    assert set(rank) == CORE and rank['dp_rank'] == 0 and rank['max_running_requests'] == 64
    assert rank['num_total_reqs'] == rank['num_used_tokens'] == rank['gen_throughput'] == 0
    assert out['aggregate'] == {'total_running_reqs': 0, 'total_waiting_reqs': 0, 'total_reqs': 0, 'total_used_tokens': 0,
                                'total_tokens': 0, 'avg_token_usage': 0.0, 'avg_throughput': 0.0, 'avg_utilization': 0.0}
    (legacy,) = loads(engine, '/get_load')
    assert set(legacy) == {'dp_rank', 'num_reqs', 'num_waiting_reqs', 'num_tokens', 'num_pending_tokens', 'ts_tic'}
    assert legacy['num_reqs'] == legacy['num_tokens'] == 0


@pytest.mark.engine(faults='slow=4', extra=['--max-running-requests', '2'])
def test_loads_count_the_requests_in_flight(special):
    """Five requests on an engine that runs two at a time: two running, three waiting, then none."""
    body = {'model': 'glm-5', 'prompt': 'the city of water', 'max_tokens': 4, 'ignore_eos': True}
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        flying = [pool.submit(special.post, '/v1/completions', body) for _ in range(5)]
        deadline, seen = time.time() + 30, None
        while time.time() < deadline and not all(f.done() for f in flying):
            out = loads(special)
            (rank,) = out['loads']
            seen = rank['num_running_reqs'], rank['num_waiting_reqs']
            if seen == (2, 3):
                break
            time.sleep(0.05)
        assert seen == (2, 3), seen
        assert rank['num_total_reqs'] == 5 and rank['max_running_requests'] == 2 and rank['num_used_tokens'] >= 8
        assert rank['num_total_tokens'] > rank['num_used_tokens'] and rank['gen_throughput'] > 0
        agg = out['aggregate']
        assert (agg['total_running_reqs'], agg['total_waiting_reqs'], agg['total_reqs']) == (2, 3, 5)
        (legacy,) = loads(special, '/get_load')
        assert legacy['num_reqs'] == 5 and legacy['num_waiting_reqs'] == 3 and legacy['num_pending_tokens'] > 0
        assert all(f.result().status_code == 200 for f in flying)
    (rank,) = loads(special)['loads']
    assert rank['num_running_reqs'] == rank['num_waiting_reqs'] == rank['num_total_reqs'] == rank['num_used_tokens'] == 0


def exposition(engine):
    """{name: (type, {sample line without value: value})} of the engine's /metrics (Prometheus' text format)."""
    r = requests.get(engine.url + '/metrics', timeout=10)
    assert r.status_code == 200 and r.headers['Content-Type'].startswith('text/plain'), (r.status_code, r.text[:200])
    out = {}
    for line in r.text.splitlines():
        if line.startswith('# TYPE '):
            _, _, name, typ = line.split()
            out[name] = (typ, {})
        elif line and not line.startswith('#'):
            sample, value = line.rsplit(' ', 1)
            base = sample.split('{')[0]
            family = base if base in out else base.rsplit('_', 1)[0]     # a histogram's _bucket, _sum, _count
            out[family][1][sample] = float(value)
    return out


def metric(families, name, suffix=''):
    """The one sample of family `name` whose series name is name + suffix (the emulator has one label set)."""
    (value,) = [v for k, v in families[name][1].items() if k.split('{')[0] == name + suffix]
    return value


def declared_metrics(profile):
    """{name: type} as the profile's pinned sglang declares them (its metrics_collector.py, read as source)."""
    import glob
    import re
    (path,) = glob.glob(os.path.join(environment(profile)[1], 'lib', 'python*', 'site-packages', 'sglang', 'srt',
                                     'observability', 'metrics_collector.py'))
    with open(path) as fh:
        src = fh.read()
    return dict((m.group(2), m.group(1).lower()) for m in re.finditer(
        r'\b(Gauge|Counter|Histogram)\(\s*name="(sglang:[A-Za-z0-9_]+)"', src))


@pytest.mark.parametrize('profile', ['seed-validated', 'current'])
@pytest.mark.engine(extra=['--enable-metrics'])
def test_metrics_have_the_pinned_sglangs_names_and_types(special, profile):
    """Every family the emulator serves is one the pinned sglang declares, with the same type, and carries sglang's
    labels (the *_created gauges are prometheus_client's, written for sglang's counters and histograms as well)."""
    ask(special, 'What is 2 + 3?')
    families = exposition(special)
    declared = declared_metrics(profile)
    served = dict((k, t) for k, (t, _) in families.items() if k.startswith('sglang:') and not k.endswith('_created'))
    assert {'sglang:num_running_reqs', 'sglang:num_queue_reqs', 'sglang:gen_throughput', 'sglang:token_usage',
            'sglang:time_to_first_token_seconds', 'sglang:generation_tokens_total'} <= set(served), sorted(served)
    for name, typ in served.items():
        assert declared.get(name) == typ, (profile, name, typ)
    sample = next(iter(families['sglang:num_running_reqs'][1]))
    for label in ('model_name="glm-5"', 'engine_type="unified"', 'tp_rank="0"'):
        assert label in sample, sample


@pytest.mark.engine(faults='slow=4', extra=['--max-running-requests', '2', '--enable-metrics'])
def test_metrics_move_with_the_load(special):
    """Five requests of 4 tokens on an engine that runs two at a time: the gauges show 2 running and 3 queued while
    they run; after, the counters and histograms hold exactly those five (the engine is this test's alone)."""
    before = exposition(special)
    body = {'model': 'glm-5', 'prompt': 'the city of water', 'max_tokens': 4, 'ignore_eos': True}
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        flying = [pool.submit(special.post, '/v1/completions', body) for _ in range(5)]
        deadline, seen = time.time() + 30, None
        while time.time() < deadline and not all(f.done() for f in flying):
            now = exposition(special)
            seen = metric(now, 'sglang:num_running_reqs'), metric(now, 'sglang:num_queue_reqs')
            if seen == (2, 3):
                assert metric(now, 'sglang:gen_throughput') > 0 and metric(now, 'sglang:num_used_tokens') >= 2 * 3
                break
            time.sleep(0.05)
        assert seen == (2, 3), seen
        assert all(f.result().status_code == 200 for f in flying)
    after = exposition(special)

    def grew(name, suffix=''):
        return metric(after, name, suffix) - metric(before, name, suffix)
    assert grew('sglang:num_requests_total') == 5
    assert grew('sglang:generation_tokens_total') == 20
    assert grew('sglang:prompt_tokens_total') >= 5
    assert grew('sglang:time_to_first_token_seconds', '_count') == 5
    assert grew('sglang:inter_token_latency_seconds', '_count') == 15
    assert grew('sglang:e2e_request_latency_seconds', '_count') == 5
    # three of the five waited for the first two (4 steps of a 4x slow engine): their first token came late
    assert grew('sglang:time_to_first_token_seconds', '_sum') > grew('sglang:inter_token_latency_seconds', '_sum') / 15 * 5
    assert (metric(after, 'sglang:num_running_reqs'), metric(after, 'sglang:num_queue_reqs')) == (0, 0)


def test_no_metrics_without_the_flag(engine):
    """As sglang: /metrics exists only with --enable-metrics."""
    assert requests.get(engine.url + '/metrics', timeout=10).status_code == 404


@pytest.mark.engine(faults='nan')
def test_fault_nan_is_a_repeated_token_loop(special):
    text = ask(special, 'What is 17 + 25?', max_tokens=12)['choices'][0]['message']['content']
    assert '42' not in text and len(set(text.split())) <= 1 and len(text) >= 12


def test_a_fault_switched_on_while_it_runs_and_off_again(engine):
    """The fault file (a node that goes bad between deploys, no restart): read again within a second."""
    assert '42' in ask(engine, 'What is 17 + 25?', max_tokens=12)['choices'][0]['message']['content']
    try:
        with open(engine.fault_file, 'w') as fh:
            fh.write('nan\n')
        time.sleep(1.2)
        text = ask(engine, 'What is 17 + 25?', max_tokens=12)['choices'][0]['message']['content']
        assert '42' not in text and len(set(text.split())) <= 1, text
    finally:
        os.remove(engine.fault_file)
    time.sleep(1.2)
    assert '42' in ask(engine, 'What is 17 + 25?', max_tokens=12)['choices'][0]['message']['content']


@pytest.mark.engine(faults='garbage')
def test_fault_garbage_is_replacement_characters(special):
    assert set(ask(special, 'hello', max_tokens=5)['choices'][0]['message']['content']) == {'\ufffd'}


@pytest.mark.engine(faults='crash-after=2')
def test_fault_crash_after_n_requests(special):
    ask(special, 'one')
    with pytest.raises(requests.RequestException):
        ask(special, 'two')
        ask(special, 'three')
    assert special.proc.wait(10) == 1


def test_fault_slow_start(python, model):
    e = Engine(python, model, faults='slow-start=6')
    try:
        e.wait('/health', status=503)
        assert requests.get(e.url + '/health_generate', timeout=5).status_code == 503
        e.wait('/health_generate', status=200, timeout=30)
    finally:
        e.stop()


def test_the_real_bench_serving_runs_against_it(engine, python, model, tmp_path):
    out = tmp_path / 'bench.jsonl'
    r = subprocess.run([python, '-m', 'sglang.bench_serving', '--backend', 'sglang-oai', '--base-url', engine.url,
                        '--model', 'glm-5', '--tokenizer', model, '--dataset-name', 'random-ids',
                        '--random-input-len', '64', '--random-output-len', '8', '--num-prompts', '16',
                        '--max-concurrency', '8', '--request-rate', 'inf', '--output-file', str(out)],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, OPENAI_API_KEY=KEY))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    result = json.loads(out.read_text().splitlines()[-1])
    assert result['completed'] == 16
    assert result['total_output_tokens'] > 0 and result['output_throughput'] > 0


def single_stream(engine, python, model, tmp_path, prompts=4, output_len=24):
    """bench_serving at concurrency 1 with fixed lengths: the engine's single-stream pace."""
    out = tmp_path / 'single.jsonl'
    r = subprocess.run([python, '-m', 'sglang.bench_serving', '--backend', 'sglang-oai', '--base-url', engine.url,
                        '--model', 'glm-5', '--tokenizer', model, '--dataset-name', 'random-ids',
                        '--random-input-len', '256', '--random-output-len', str(output_len),
                        '--random-range-ratio', '1.0', '--num-prompts', str(prompts), '--max-concurrency', '1',
                        '--request-rate', 'inf', '--output-file', str(out), '--disable-tqdm'],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, OPENAI_API_KEY=KEY))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(out.read_text().splitlines()[-1])


def test_the_production_pace_is_the_seeds_single_stream(engine, python, model, tmp_path):
    """The calibration, at production pace (what make deploy runs): the seeds' single stream is TPOT 121 ms,
    8.2 output tok/s. The faster test pace (GLM5_EMULATOR_SPEED) is only ever this, divided."""
    result = single_stream(engine, python, model, tmp_path)
    assert result['completed'] == 4
    assert 121.6 * 0.95 <= result['median_tpot_ms'] <= 121.6 * 1.1, result['median_tpot_ms']
    assert 8.2 * 0.9 <= result['output_throughput'] <= 8.2 * 1.1, result['output_throughput']


def test_the_test_speed_divides_the_pace_and_a_bad_one_is_refused(python, model, tmp_path):
    e = Engine(python, model, speed=8)
    try:
        e.wait()
        result = single_stream(e, python, model, tmp_path, prompts=4, output_len=64)
        assert 121.6 / 8 * 0.9 <= result['median_tpot_ms'] <= 121.6 / 8 * 1.15, result['median_tpot_ms']
    finally:
        e.stop()
    bad = Engine(python, model, speed='fast')
    out, err = bad.proc.communicate(timeout=120)
    assert bad.proc.returncode != 0 and "GLM5_EMULATOR_SPEED must be a number > 0, got 'fast'" in err, err


def test_a_stream_keeps_its_pace_when_the_engine_waited_for_the_cpu(engine):
    """A GPU's steps do not wait for the host's CPU, so the stand-in's must not either: the emulator frozen for a
    second mid-stream (SIGSTOP, as a starved process is) makes the late tokens up, and the stream ends when its pace
    says. (A CI run failed a healthy node's smoke test so: its single stream 1.5 times the seeds' TPOT while the
    other lane had both cores.)"""
    tokens, stall = 16, 1.0
    with requests.post(engine.url + '/v1/completions', stream=True, timeout=60,
                       headers={'Authorization': 'Bearer ' + KEY},
                       json={'model': 'glm-5', 'prompt': 'pace', 'max_tokens': tokens, 'ignore_eos': True,
                             'stream': True}) as r:
        assert r.status_code == 200, r.text
        seen = []
        for line in r.iter_lines():
            if not line.startswith(b'data: {'):
                continue
            seen.append(time.monotonic())
            if len(seen) == 3:
                os.kill(engine.proc.pid, signal.SIGSTOP)
                try:
                    time.sleep(stall)
                finally:
                    os.kill(engine.proc.pid, signal.SIGCONT)
    # one chunk a token, then the final chunk with the finish reason
    assert len(seen) == tokens + 1, len(seen)
    pace = (tokens - 1) * 0.121
    took = seen[-2] - seen[0]
    assert took < pace + stall / 2, 'first to last token {0:.2f} s, the pace says {1:.2f} s'.format(took, pace)


# ---- the smoke test's modules against the emulator (sglang_probe, sglang_bench) ----
PROBES = [{'prompt': 'What is 17 + 25? Answer with the number only.', 'expect': '42'},
          {'prompt': 'What is the capital of France? Answer with one word.', 'expect': 'Paris'}]


def probe(e, capsys, **kw):
    import sglang_probe
    from modrun import run_module
    return run_module(sglang_probe, capsys, url=e.url, api_key=KEY, model='glm-5', probes=PROBES, max_tokens=24, **kw)


def test_the_probe_module_passes_a_healthy_engine(engine, capsys):
    out = probe(engine, capsys)
    assert out['passed'] and out['problems'] == [] and not out['changed']
    assert [r['answer'] for r in out['results']] == ['42', 'Paris']


def test_the_probe_module_with_a_wrong_key_fails_it(engine, capsys):
    import sglang_probe
    from modrun import run_module
    out = run_module(sglang_probe, capsys, url=engine.url, api_key='wrong', model='glm-5', probes=PROBES[:1])
    assert not out['passed'] and 'HTTP 401' in out['problems'][0]


@pytest.mark.engine(faults='nan')
def test_the_probe_module_catches_nan(special, capsys):
    out = probe(special, capsys)
    assert not out['passed']
    text = ' '.join(out['problems'])
    assert 'repeated-token loop' in text and 'not finite' in text and "expected '42'" in text


@pytest.mark.engine(faults='garbage')
def test_the_probe_module_catches_garbage(special, capsys):
    out = probe(special, capsys)
    assert not out['passed'] and 'replacement characters (U+FFFD)' in ' '.join(out['problems'])


@pytest.mark.engine(extra=['--reasoning-parser', 'glm45'])
def test_the_probe_module_reads_reasoning_content(special, capsys):
    assert probe(special, capsys)['passed']


def bench(e, python, model, tmp_path, capsys, **kw):
    import sglang_bench
    from modrun import run_module
    args = dict(python=python, base_url=e.url, model='glm-5', tokenizer=model, api_key=KEY, concurrency=4, prompts=8,
                input_len=64, output_len=8, output_file=str(tmp_path / 'bench.jsonl'),
                log_file=str(tmp_path / 'bench-c4.log'), samples_file=str(tmp_path / 'gpu.jsonl'),
                nvidia_smi=os.path.join(ROOT, 'scripts', 'lab', 'nvidia_smi.py'), sample_interval=0.5, timeout=300)
    args.update(kw)
    return run_module(sglang_bench, capsys, **args)


def test_the_bench_module_runs_one_level_and_samples_the_gpus(engine, python, model, tmp_path, capsys):
    out = bench(engine, python, model, tmp_path, capsys)
    assert out['exit_code'] == 0 and out['line'] == 0 and out['error'] is None, out
    assert out['result']['completed'] == 8 and out['result']['max_concurrency'] == 4
    assert 'OPENAI_API_KEY' not in ' '.join(out['cmd']) and KEY not in out['cmd']
    assert out['cmd'][out['cmd'].index('--dataset-name') + 1] == 'random-ids'
    # bench_serving copies /server_info (the key among sglang's args) into its line: none of it reaches the history
    assert out['result']['server_info']['api_key'] == '(redacted)', out['result']['server_info']
    for name in ('bench.jsonl', 'bench-c4.log', 'gpu.jsonl'):
        assert KEY not in (tmp_path / name).read_text(), name
    assert KEY not in json.dumps(out)
    assert not os.path.exists(os.path.dirname(out['cmd'][out['cmd'].index('--output-file') + 1]))  # its private copy
    samples = [json.loads(x) for x in (tmp_path / 'gpu.jsonl').read_text().splitlines()]
    assert len(samples) == out['samples'] >= 1
    assert [g['index'] for g in samples[0]['gpus']] == list(range(8)) and samples[0]['level'] == 4
    again = bench(engine, python, model, tmp_path, capsys, concurrency=2, prompts=4)
    assert again['line'] == 1 and again['result']['max_concurrency'] == 2


@pytest.mark.engine(faults='crash-after=5')
def test_the_bench_module_reports_a_crash_as_lost_requests(special, python, model, tmp_path, capsys):
    out = bench(special, python, model, tmp_path, capsys, prompts=16)
    assert special.proc.wait(30) == 1
    if out['line'] is None:
        assert 'wrote no result' in out['error']
    else:
        assert out['result']['completed'] < 16


def test_a_level_without_a_result_names_its_log_as_the_report_names_it(python, model, tmp_path, capsys):
    """No server at the URL: no result line; the error names the log by the path the user is told (the PVE host's,
    as the report is named), not by the container's path it was written to."""
    class Nothing(object):
        url = 'http://127.0.0.1:9'
    shown = 'pve-host:/var/lib/glm5/bench-history/run-1/bench-c4.log'
    # bench_serving waits a minute for a server that is not there: the module's bound stops it first
    out = bench(Nothing(), python, model, tmp_path, capsys, prompts=4, log_file_shown=shown, timeout=15)
    assert out['line'] is None and out['error'].endswith('(whole log: {0})'.format(shown)), out['error']
    assert str(tmp_path) not in out['error']


def test_the_bench_module_without_nvidia_smi_says_so(engine, python, model, tmp_path, capsys):
    out = bench(engine, python, model, tmp_path, capsys, prompts=4, nvidia_smi='nvidia-smi-not-here')
    assert out['samples'] == 0 and 'no GPU samples' in out['gpu_note']


def test_the_bench_module_on_sglangs_native_api_samples_nothing_when_told(engine, python, model, tmp_path, capsys):
    """The fleet smoke test's call: backend sglang (/generate, what the gateway accepts), no GPU sampling (the client
    is one node, not the fleet's GPUs), each request's TTFT kept (the fleet test leaves out the first wave), the
    rest of bench_serving's details (texts, inter-token latencies) not."""
    out = bench(engine, python, model, tmp_path, capsys, prompts=4, nvidia_smi='', backend='sglang', ttfts=True)
    assert out['exit_code'] == 0 and out['result']['completed'] == 4, out
    assert out['cmd'][out['cmd'].index('--backend') + 1] == 'sglang' and '--output-details' in out['cmd']
    assert out['samples'] == 0 and out['gpu_note'] == 'not sampled (no nvidia-smi given)'
    assert not (tmp_path / 'gpu.jsonl').read_text()
    (line,) = [json.loads(x) for x in (tmp_path / 'bench.jsonl').read_text().splitlines()]
    assert len(line['ttfts']) == 4 and all(0 < t < 60 for t in line['ttfts']), line['ttfts']
    assert not {'generated_texts', 'itls', 'errors', 'input_lens', 'output_lens'} & set(line), sorted(line)
    assert 'ttfts' not in out['result']


PARSE = '''
import importlib.machinery, importlib.util, json, sys
loader = importlib.machinery.SourceFileLoader('emulator', sys.argv[1])
spec = importlib.util.spec_from_loader('emulator', loader)
emulator = importlib.util.module_from_spec(spec)
loader.exec_module(emulator)
if sys.argv[3] == 'other-sglang':
    emulator.parser_identity = lambda: ('0.0.0', 'another server_args.py')
args = emulator.parse_args(json.loads(sys.argv[4]), sys.argv[2])
print(json.dumps({'imported': 'sglang.srt.server_args' in sys.modules, 'args': vars(args)}))
'''


def test_a_restart_with_the_flags_it_parsed_before_skips_the_import(python, model, tmp_path):
    """The emulator's parse cache: sglang's parser once per argv (less the key and port) and sglang; never the key;
    a refused argv is never kept; another sglang parses again."""
    cache = str(tmp_path / 'cache')

    def parse(argv, mode='same'):
        r = subprocess.run([python, '-c', PARSE, EMULATOR, cache, mode, json.dumps(argv)], capture_output=True,
                           text=True, timeout=300)
        return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else r.stderr)

    argv = ['--model-path', model, '--tp', '8', '--max-running-requests', '64', '--api-key=-secret-1', '--port', '31001']
    rc, first = parse(argv)
    assert rc == 0 and first['imported'] and first['args']['api_key'] == '-secret-1', first
    kept = os.listdir(cache)
    assert len(kept) == 1 and '-secret-1' not in open(os.path.join(cache, kept[0])).read()
    rc, again = parse(argv[:-3] + ['--api-key', 'other', '--port=31002'])
    assert rc == 0 and not again['imported'], again
    assert again['args'] == dict(first['args'], api_key='other', port=31002)
    assert again['args']['tensor_parallel_size'] == 8 and again['args']['max_running_requests'] == 64
    rc, refused = parse(argv + ['--dsa-decode-backend', 'x'])
    assert rc == 2 and 'unrecognized arguments: --dsa-decode-backend' in refused and len(os.listdir(cache)) == 1
    rc, other = parse(argv, 'other-sglang')
    assert rc == 0 and other['imported'] and len(os.listdir(cache)) == 2


def test_a_port_it_cannot_listen_on_is_one_line(python, model):
    """Another engine on its port was an OSError traceback (found by a review): one line, as sglang's own."""
    with socket.socket() as taken:
        taken.bind(('127.0.0.1', 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = subprocess.run([python, EMULATOR, '--model-path', model, '--host', '127.0.0.1', '--port', str(port),
                            '--api-key', KEY], capture_output=True, text=True, timeout=180,
                           env=dict(os.environ, GLM5_EMULATOR_FAULTS_FILE=''))
    assert r.returncode == 1 and 'Traceback' not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith('sglang-emulator: cannot listen on 127.0.0.1:{0}: '.format(
        port)), r.stderr
