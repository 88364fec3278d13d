#!/usr/bin/env python3
"""Lab stand-in for the GPU inference engine: speaks sglang's HTTP API, with no GPU and no model.

Run with the SGLang environment's Python and exactly the unit's launch arguments, in place of
`python -m sglang.launch_server`:

    /opt/glm5/sglang/bin/python sglang-emulator --model-path /models/x --tp 8 ... --host 127.0.0.1 --port 30000

The arguments are parsed by the installed sglang's own parser (ServerArgs.add_cli_args), so a flag the pinned
sglang refuses makes the emulator exit 2 with argparse's message, as sglang would. It uses --host, --port,
--api-key, --served-model-name, --model-path / --tokenizer-path (tokenizer.json: token counts are real),
--max-running-requests and --reasoning-parser.

Endpoints: /health, /health_generate, /server_info (/get_server_info), /model_info (/get_model_info), /v1/models,
/v1/completions and /v1/chat/completions (streaming SSE, usage, reasoning_content, logprobs when not streaming),
/generate, /v1/loads (sglang's JSON, core fields as for include=core: running and waiting requests exact, tokens from
the prompts and outputs, throughput from the pace), the legacy /get_load, and /metrics with --enable-metrics (sglang's
names, types and labels for its running and queued requests, token usage, generation throughput, token and request
counters, TTFT, inter-token and end-to-end latency histograms: class Metrics). Each request is let in or refused (401)
by sglang's own decide_request_auth (sglang/srt/utils/auth.py, loaded without importing sglang): with --api-key set,
every path but /health* and /metrics needs `Authorization: Bearer <api key>`, or the launcher's secondary key.

Processes: one child besides its own (sglang's scheduler and detokenizer are spawned processes), which ends when the
emulator does.

Pacing: a batch loop like sglang's scheduler: each step gives every running request one token; a step takes
step_seconds(batch), interpolated in log(batch) through points calibrated to the seeds' measured table (single
stream TPOT 121 ms; ~700 / 1,846 / 2,800 / 3,740 total tok/s at 64 / 256 / 512 / 1024 with the seeds' lengths);
at most --max-running-requests run, the rest wait. Steps are due on the clock, as a GPU's are: a step that comes late
because the process waited for the host's CPU is made up by the next ones (up to CATCH_UP seconds behind).
Answers: arithmetic such as "17 + 25" and the capital of France are answered correctly (the smoke test's probe);
otherwise deterministic filler text.

Starts: what sglang's parser made of an accepted argv is cached (GLM5_EMULATOR_CACHE, default
~/.cache/glm5-emulator; empty turns it off) under the hash of argv less the API key and the port, sglang's version
and its server_args.py: a restart with the same flags skips importing sglang (~12 s of CPU); new flags, a new sglang
or a refused argv go through the parser. The API key is never written there.

Fault switches, from the environment (the unit's EnvironmentFile in the lab), comma-separated in
GLM5_EMULATOR_FAULTS: nan (a repeated-token loop, what NaN logits produce, and NaN log-probabilities), garbage
(replacement characters), crash-after=N (the process dies after N completed requests), slow=F (steps F times
longer), slow-start=S (/health* answer 503 for S seconds after start); an unknown switch or a bad value stops it with
one line. The same switches in the file GLM5_EMULATOR_FAULTS_FILE (default /run/glm5-emulator-faults; read again at
most once a second) turn on and off while it runs (slow at the next step): a node that goes bad between deploys (NaN
after a driver update) without a restart; a bad one there is said once and left out.

Speed, for tests only: GLM5_EMULATOR_SPEED=F (default 1, the seeds' pace) makes every step F times shorter, so a
sweep takes 1/F of the time; the smoke test must then be told the same factor (sglang_smoke_speed_factor), which
scales its baseline up and its latency limits down by exactly F. The lab inventory sets both from one variable
(lab_emulator_speed); make deploy keeps 1.
"""
import argparse
import asyncio
import datetime
import json
import math
import os
import random
import re
import sys
import time
import uuid

# (batch size, seconds per step): from the seeds' table (TPOT 121 ms single stream; output tok/s = batch / step,
# output ~ 1/3 of total with 256 in / 128 out drawn uniformly from [1, L]), faster than steady state so that the smoke
# test's sweep (4 x concurrency prompts per level, ramp-up and drain included) lands on the table. Measured with the
# sweep (sglang.bench_serving, random-ids 256/128, range ratio 0.0) on the lab: see the README's benchmark section.
STEP_POINTS = [(1, 0.121), (64, 0.226), (256, 0.345), (512, 0.463), (1024, 0.720)]
# How far behind its pace the batch loop may fall and still make it up (seconds): the longest wait for the CPU the
# lab's shared cores give a process, not a GPU's (a GPU's steps do not wait for the host).
CATCH_UP = 2.0
ANSWERS = [(re.compile(r'capital of france', re.I), 'Paris')]
ARITH = re.compile(r'(-?\d+)\s*([-+*x×])\s*(-?\d+)')


def step_seconds(batch):
    if batch <= STEP_POINTS[0][0]:
        return STEP_POINTS[0][1]
    for (b0, s0), (b1, s1) in zip(STEP_POINTS, STEP_POINTS[1:], strict=False):
        if batch <= b1:
            f = (math.log(batch) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return s0 + f * (s1 - s0)
    (b0, s0), (b1, s1) = STEP_POINTS[-2:]
    return s1 + (s1 - s0) * (math.log(batch) - math.log(b1)) / (math.log(b1) - math.log(b0))


# Each fault switch and what its value must be: (kind, least); a switch without a value takes none.
SWITCHES = {'nan': None, 'garbage': None, 'crash-after': (int, 1), 'slow': (float, 0.0), 'slow-start': (float, 0.0)}


def faults(text, bad=None):
    """'nan,slow=2' -> {'nan': '', 'slow': 2.0}. A switch it does not know, or a value that is not one (crash-after a
    whole number >= 1, slow and slow-start numbers >= 0; nan and garbage none), is left out and said in bad (a list)
    when given, else stops the emulator with one line."""
    out = {}
    for item in filter(None, (x.strip() for x in (text or '').split(','))):
        key, eq, value = item.partition('=')
        problem = None
        if key not in SWITCHES:
            problem = 'unknown switch {0!r} (the switches: {1})'.format(key, ', '.join(SWITCHES))
        elif SWITCHES[key] is None:
            if eq:
                problem = '{0} takes no value, got {1!r}'.format(key, item)
            else:
                out[key] = ''
        else:
            kind, least = SWITCHES[key]
            try:
                number = kind(value)
                if not number >= least or math.isinf(number):
                    raise ValueError(value)
                out[key] = number
            except ValueError:
                problem = '{0} must be a {1} >= {2:g}, got {3!r}'.format(
                    key, 'whole number' if kind is int else 'number', least, value)
        if problem and bad is None:
            raise SystemExit('sglang-emulator: GLM5_EMULATOR_FAULTS: ' + problem)
        if problem:
            bad.append(problem)
    return out


def speed(text):
    """GLM5_EMULATOR_SPEED: a number > 0 (unset or empty: 1, the seeds' pace); anything else stops the emulator."""
    if text in (None, ''):
        return 1.0
    try:
        value = float(text)
    except ValueError:
        value = float('nan')
    if not value > 0 or math.isinf(value):
        raise SystemExit('sglang-emulator: GLM5_EMULATOR_SPEED must be a number > 0, got {0!r}'.format(text))
    return value


def answer_for(prompt):
    for pattern, answer in ANSWERS:
        if pattern.search(prompt):
            return answer
    m = ARITH.search(prompt)
    if m:
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        return str(a + b if op == '+' else a - b if op == '-' else a * b)
    return None


class Request(object):
    def __init__(self, prompt_ids, max_tokens, ignore_eos, answer, rng, engine):
        self.prompt_tokens = len(prompt_ids)
        self.max_tokens = max(1, int(max_tokens))
        self.out = []
        self.queue = asyncio.Queue()
        self.plan = []
        if answer is not None:
            self.plan = engine.encode(' ' + answer)
        self.ignore_eos = ignore_eos
        self.answered = answer is not None
        self.rng = rng
        self.engine = engine
        self.finish = None
        self.submitted = time.monotonic()
        self.last = None

    def next_token(self):
        e = self.engine
        if 'nan' in e.faults:
            return e.filler[0]
        if self.plan:
            return self.plan.pop(0)
        return self.rng.choice(e.filler)

    def step(self):
        """One decode step: one more token; True when the request is done (its answer given, or max tokens)."""
        self.out.append(self.next_token())
        now = time.monotonic()
        if self.engine.metrics:
            self.engine.metrics.token(self, now)
        self.last = now
        if len(self.out) >= self.max_tokens:
            self.finish = 'length'
        elif self.answered and not self.plan and not self.ignore_eos:
            self.finish = 'stop'
        self.queue.put_nowait(self.out[-1])
        if self.finish:
            self.queue.put_nowait(None)
        return self.finish is not None


# sglang's buckets (metrics_collector.py's TokenizerMetricsCollector defaults)
TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
E2E_BUCKETS = TTFT_BUCKETS + [600, 1200, 1800, 2400]
ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000]


class Metrics(object):
    """What sglang serves on /metrics with --enable-metrics: the same names, types and labels (its scheduler's gauges
    with model_name, engine_type, tp_rank, pp_rank, moe_ep_rank; its tokenizer's counters and histograms with
    model_name, engine_type), moving with the emulated load. tests/test_sglang_emulator.py holds the names and types
    against the pinned sglang's own metrics_collector.py."""

    GAUGES = {'num_running_reqs': 'The number of running requests.',
              'num_queue_reqs': 'The number of requests in the waiting queue.',
              'num_used_tokens': 'The number of used tokens.',
              'max_total_num_tokens': 'Maximum total number of tokens in the KV cache pool.',
              'token_usage': 'The token usage.',
              'gen_throughput': 'The generation throughput (token/s).',
              'cache_hit_rate': 'The prefix cache hit rate.'}

    def __init__(self, args, engine):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        self.engine = engine
        self.registry = CollectorRegistry()
        served = args.served_model_name or args.model_path
        sched = {'model_name': served, 'engine_type': 'unified', 'tp_rank': '0', 'pp_rank': '0', 'moe_ep_rank': '0'}
        self.labels = {'model_name': served, 'engine_type': 'unified'}
        self.gauges = dict((k, Gauge('sglang:' + k, doc, labelnames=list(sched), registry=self.registry).labels(
            **sched)) for k, doc in self.GAUGES.items())

        def counter(name, doc):
            return Counter('sglang:' + name, doc, labelnames=list(self.labels), registry=self.registry).labels(
                **self.labels)

        def histogram(name, doc, buckets):
            return Histogram('sglang:' + name, doc, labelnames=list(self.labels), buckets=buckets,
                             registry=self.registry).labels(**self.labels)
        self.prompt_tokens = counter('prompt_tokens_total', 'Number of prefill tokens processed.')
        self.generation_tokens = counter('generation_tokens_total', 'Number of generation tokens processed.')
        self.requests = counter('num_requests_total', 'Number of requests processed.')
        self.ttft = histogram('time_to_first_token_seconds', 'Histogram of time to first token in seconds.',
                              TTFT_BUCKETS)
        self.itl = histogram('inter_token_latency_seconds', 'Histogram of inter-token latency in seconds.',
                             ITL_BUCKETS)
        self.e2e = histogram('e2e_request_latency_seconds', 'Histogram of End-to-end request latency in seconds',
                             E2E_BUCKETS)

    def submitted(self, req):
        self.prompt_tokens.inc(req.prompt_tokens)

    def token(self, req, now):
        self.generation_tokens.inc()
        if req.last is None:
            self.ttft.observe(now - req.submitted)
        else:
            self.itl.observe(now - req.last)

    def finished(self, req):
        self.requests.inc()
        self.e2e.observe(time.monotonic() - req.submitted)

    def exposition(self, load):
        from prometheus_client import generate_latest
        values = dict(load, num_queue_reqs=load['num_waiting_reqs'])
        for name, gauge in self.gauges.items():
            gauge.set(values[name])
        return generate_latest(self.registry)


class Engine(object):
    def __init__(self, args, fault_text):
        from tokenizers import Tokenizer
        self.args = args
        self._faults, self._file_faults, self._checked, self._file_said = faults(fault_text), {}, 0.0, ''
        self.fault_file = os.environ.get('GLM5_EMULATOR_FAULTS_FILE', '/run/glm5-emulator-faults')
        self.speed = speed(os.environ.get('GLM5_EMULATOR_SPEED'))
        path = args.tokenizer_path or args.model_path
        self.tokenizer = Tokenizer.from_file(os.path.join(path, 'tokenizer.json'))
        special = set(self.tokenizer.get_added_tokens_decoder()) if hasattr(self.tokenizer,
                                                                            'get_added_tokens_decoder') else set()
        words = [i for t, i in sorted(self.tokenizer.get_vocab().items()) if i not in special and t.isalpha()]
        self.filler = words or list(range(self.tokenizer.get_vocab_size()))
        self.max_running = args.max_running_requests or 64
        self.waiting = []
        self.running = []
        self.wakeup = asyncio.Event()
        self.completed = 0
        self.started = time.monotonic()
        self.metrics = Metrics(args, self) if getattr(args, 'enable_metrics', False) else None

    @property
    def faults(self):
        """The environment's switches, and those in the fault file now (read at most once a second)."""
        now = time.monotonic()
        if self.fault_file and now - self._checked >= 1:
            self._checked = now
            try:
                with open(self.fault_file) as fh:
                    text = fh.read()
            except OSError:
                text = ''
            bad = []
            self._file_faults = faults(text, bad)
            said = '; '.join(bad)
            if said and said != self._file_said:     # a bad switch in the file is said once, and left out
                print('sglang-emulator: {0}: {1} (left out)'.format(self.fault_file, said), file=sys.stderr, flush=True)
            self._file_said = said
        return dict(self._faults, **self._file_faults)

    def encode(self, text):
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        if 'garbage' in self.faults:
            return '\ufffd' * len(ids)
        return self.tokenizer.decode(ids)

    def submit(self, prompt, max_tokens, ignore_eos):
        ids = prompt if isinstance(prompt, list) else self.encode(prompt)
        text = prompt if isinstance(prompt, str) else ''
        answer = answer_for(text) if text else None
        rng = random.Random(len(ids) * 7919 + int(max_tokens))
        req = Request(ids, max_tokens, ignore_eos, answer, rng, self)
        if self.metrics:
            self.metrics.submitted(req)
        self.waiting.append(req)
        self.wakeup.set()
        return req

    async def run(self):
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            if not self.running and not self.waiting:
                self.wakeup.clear()
                await self.wakeup.wait()
                due = loop.time()
            while self.waiting and len(self.running) < self.max_running:
                self.running.append(self.waiting.pop(0))
            # Steps keep a GPU's pace on a busy CPU: the time spent serving tokens is part of the step, not added to
            # it, and a step that came late because this process waited for the CPU (the lab's cores are shared by
            # everything a test runs) is made up by the next ones, up to CATCH_UP seconds behind. Past that the
            # engine is slower: a CPU that cannot serve the tokens at all.
            step = step_seconds(len(self.running)) * self.faults.get('slow', 1.0) / self.speed
            due = max(due + step, loop.time() - CATCH_UP)
            await asyncio.sleep(due - loop.time())
            for req in list(self.running):
                if req.step():
                    self.running.remove(req)
                    self.completed += 1
                    if self.metrics:
                        self.metrics.finished(req)
                    limit = self.faults.get('crash-after')
                    if limit and self.completed >= limit:
                        print('sglang-emulator: crash-after={0}: dying as a crashed engine would'.format(limit),
                              file=sys.stderr, flush=True)
                        os._exit(1)


# Values that play no part in what the parser accepts, beyond their type: kept out of the parse cache's key (the API
# key is never written down; a port differs at every start of a test's emulator) and put back from argv.
VOLATILE = {'--api-key': ('api_key', str), '--port': ('port', int)}


def volatile_of(argv):
    """({dest: value} of the VOLATILE flags in argv, argv without them)."""
    found, rest, i = {}, [], 0
    while i < len(argv):
        flag, eq, value = argv[i].partition('=')
        if flag in VOLATILE and (eq or i + 1 < len(argv)):
            if not eq:
                value, i = argv[i + 1], i + 1
            dest, kind = VOLATILE[flag]
            found[dest] = kind(value)
        else:
            rest.append(argv[i])
        i += 1
    return found, rest


def jsonable(args):
    """vars(args) with what JSON cannot hold as its str (as sglang's /server_info shows it)."""
    return dict((k, v if isinstance(v, (str, int, float, bool, type(None), list)) else str(v))
                for k, v in vars(args).items())


def parser_identity():
    """The installed sglang's version and the hash of its server_args.py, found without importing sglang."""
    import hashlib
    import importlib.metadata
    import importlib.util
    spec = importlib.util.find_spec('sglang')
    with open(os.path.join(spec.submodule_search_locations[0], 'srt', 'server_args.py'), 'rb') as fh:
        return importlib.metadata.version('sglang'), hashlib.sha256(fh.read()).hexdigest()


def sglang_auth():
    """sglang's own request decision (decide_request_auth in sglang/srt/utils/auth.py, a module without torch), loaded
    without importing sglang. Started by glm5-sglang-launch with a secondary key, the launcher has loaded it first and
    wrapped the function: the emulator then decides with the wrapper, as sglang's server would."""
    import importlib.util
    name = 'sglang.srt.utils.auth'
    if name not in sys.modules:
        spec = importlib.util.find_spec('sglang')
        path = os.path.join(spec.submodule_search_locations[0], 'srt', 'utils', 'auth.py')
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module          # before it runs: its dataclasses look their module up there
        module_spec.loader.exec_module(module)
    return sys.modules[name]


def parse_args(argv, cache_dir=None):
    """sglang's own parser (ServerArgs.add_cli_args) on argv, as sglang.launch_server would.

    Importing sglang costs ~12 s of CPU, and a restart with the same arguments would parse them again: what the
    parser made of an accepted argv is kept in cache_dir under the hash of argv (less the VOLATILE values: the API
    key is not kept), sglang's version and its server_args.py, and used at the next start. A refused argv is never
    kept; another sglang (or another server_args.py) is another key, so it is parsed again."""
    import hashlib
    path = None
    if cache_dir:
        try:
            found, rest = volatile_of(argv)
            digest = hashlib.sha256(json.dumps([rest, parser_identity()]).encode()).hexdigest()
            path = os.path.join(cache_dir, 'parsed-{0}.json'.format(digest))
            with open(path) as fh:
                kept = json.load(fh)
            return argparse.Namespace(**dict(kept, api_key=found.get('api_key'), port=found.get('port', kept['port'])))
        except (OSError, ValueError, KeyError):
            pass            # not parsed before (or a value of the wrong type): sglang's parser says
    from sglang.srt.server_args import ServerArgs
    parser = argparse.ArgumentParser(prog='sglang.launch_server')
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    if path:
        kept = dict((k, v) for k, v in jsonable(args).items() if k != 'api_key')
        try:
            import tempfile
            os.makedirs(cache_dir, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix='.parsed-')
            with os.fdopen(fd, 'w') as fh:
                json.dump(kept, fh)
            os.replace(tmp, path)
        except OSError as exc:
            print('sglang-emulator: parse cache not written ({0})'.format(exc), file=sys.stderr, flush=True)
    return args


def cache_dir():
    """GLM5_EMULATOR_CACHE, else the service user's ~/.cache/glm5-emulator; empty: no cache."""
    value = os.environ.get('GLM5_EMULATOR_CACHE')
    if value is not None:
        return value or None
    return os.path.join(os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache'), 'glm5-emulator')


def build_app(args, engine):
    import importlib.metadata

    from aiohttp import web
    served = args.served_model_name or args.model_path
    start = time.monotonic()
    slow_start = engine.faults.get('slow-start', 0.0)

    sglang_decides = sglang_auth()

    @web.middleware
    async def auth(request, handler):
        # sglang's decision for its normal endpoints (the emulator has no admin ones), looked up on each request
        decision = sglang_decides.decide_request_auth(
            method=request.method, path=request.path, authorization_header=request.headers.get('Authorization'),
            api_key=args.api_key, admin_api_key=None, auth_level=sglang_decides.AuthLevel.NORMAL)
        if not decision.allowed:
            return web.json_response({'error': 'Unauthorized' if decision.error_status_code == 401 else 'Forbidden'},
                                     status=decision.error_status_code)
        return await handler(request)

    def starting():
        return time.monotonic() - start < slow_start

    async def health(request):
        return web.Response(status=503 if starting() else 200)

    async def health_generate(request):
        if starting():
            return web.Response(status=503)
        req = engine.submit([1], 1, True)
        while await req.queue.get() is not None:
            pass
        return web.Response(status=200)

    async def server_info(request):
        info = jsonable(args)
        info.update(version=importlib.metadata.version('sglang'), emulator='glm5 lab sglang-emulator')
        return web.json_response(info)

    async def model_info(request):
        return web.json_response({'model_path': args.model_path, 'tokenizer_path': args.tokenizer_path or
                                  args.model_path, 'is_generation': True, 'served_model_name': served})

    async def models(request):
        return web.json_response({'object': 'list', 'data': [{'id': served, 'object': 'model',
                                                              'owned_by': 'sglang', 'root': served}]})

    def ended(req):
        return {'prompt_tokens': req.prompt_tokens, 'completion_tokens': len(req.out),
                'total_tokens': req.prompt_tokens + len(req.out)}

    async def stream(request, req, chunk, final):
        resp = web.StreamResponse(headers={'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache'})
        await resp.prepare(request)
        sent = ''
        while True:
            token = await req.queue.get()
            if token is None:
                break
            text = engine.decode(req.out)
            delta, sent = text[len(sent):], text
            await resp.write(('data: ' + json.dumps(chunk(delta, None)) + '\n\n').encode())
        for data in final():
            await resp.write(('data: ' + json.dumps(data) + '\n\n').encode())
        await resp.write(b'data: [DONE]\n\n')
        return resp

    async def body(request):
        try:
            return await request.json()
        except ValueError:
            raise web.HTTPBadRequest(text=json.dumps({'object': 'error', 'message': 'body is not JSON'}),
                                     content_type="application/json") from None

    async def completions(request):
        data = await body(request)
        req = engine.submit(data.get('prompt', ''), data.get('max_tokens') or 16, bool(data.get('ignore_eos')))
        rid = 'cmpl-' + uuid.uuid4().hex
        base = {'id': rid, 'object': 'text_completion', 'created': int(time.time()), 'model': served}
        if data.get('stream'):
            def chunk(delta, finish):
                return dict(base, choices=[{'index': 0, 'text': delta, 'finish_reason': finish, 'logprobs': None}])

            def final():
                last = chunk('', req.finish)
                if (data.get('stream_options') or {}).get('include_usage'):
                    return [last, dict(base, choices=[], usage=ended(req))]
                return [dict(last, usage=ended(req))]
            return await stream(request, req, chunk, final)
        while await req.queue.get() is not None:
            pass
        return web.json_response(dict(base, choices=[{'index': 0, 'text': engine.decode(req.out),
                                                      'finish_reason': req.finish, 'logprobs': None}],
                                      usage=ended(req)))

    async def chat(request):
        data = await body(request)
        prompt = ''.join('<|{0}|>{1}\n'.format(m.get('role', 'user'), m.get('content') if isinstance(
            m.get('content'), str) else json.dumps(m.get('content'))) for m in data.get('messages', []))
        req = engine.submit(prompt + '<|assistant|>', data.get('max_tokens') or data.get('max_completion_tokens')
                            or 128, bool(data.get('ignore_eos')))
        reasoning = 'The question asks for one value; working it out.' if args.reasoning_parser else None
        rid = 'chatcmpl-' + uuid.uuid4().hex
        base = {'id': rid, 'object': 'chat.completion.chunk', 'created': int(time.time()), 'model': served}
        if data.get('stream'):
            first = [True]

            def chunk(delta, finish):
                d = {'content': delta}
                if first[0]:
                    d['role'] = 'assistant'
                    if reasoning:
                        d['reasoning_content'] = reasoning
                    first[0] = False
                return dict(base, choices=[{'index': 0, 'delta': d, 'finish_reason': finish}])

            def final():
                return [dict(base, choices=[{'index': 0, 'delta': {}, 'finish_reason': req.finish}],
                             usage=ended(req))]
            return await stream(request, req, chunk, final)
        while await req.queue.get() is not None:
            pass
        message = {'role': 'assistant', 'content': engine.decode(req.out).strip()}
        if reasoning:
            message['reasoning_content'] = reasoning
        choice = {'index': 0, 'message': message, 'finish_reason': req.finish}
        if data.get('logprobs'):
            # NaN logits give NaN log-probabilities (json writes them as NaN, as Python's json does)
            value = float('nan') if 'nan' in engine.faults else -0.05
            choice['logprobs'] = {'content': [{'token': engine.decode([t]), 'logprob': value, 'top_logprobs': []}
                                              for t in req.out]}
        return web.json_response(dict(base, object='chat.completion', usage=ended(req), choices=[choice]))

    async def generate(request):
        data = await body(request)
        params = data.get('sampling_params') or {}
        prompt = data.get('input_ids') if data.get('input_ids') is not None else data.get('text', '')
        req = engine.submit(prompt, params.get('max_new_tokens') or 128, bool(params.get('ignore_eos')))
        rid = uuid.uuid4().hex

        def meta():
            return {'id': rid, 'prompt_tokens': req.prompt_tokens, 'completion_tokens': len(req.out),
                    'finish_reason': {'type': req.finish} if req.finish else None}
        if data.get('stream'):
            resp = web.StreamResponse(headers={'Content-Type': 'text/event-stream'})
            await resp.prepare(request)
            while await req.queue.get() is not None:
                out = {'text': engine.decode(req.out), 'meta_info': meta()}
                await resp.write(('data: ' + json.dumps(out) + '\n\n').encode())
            await resp.write(b'data: [DONE]\n\n')
            return resp
        while await req.queue.get() is not None:
            pass
        return web.json_response({'text': engine.decode(req.out), 'meta_info': meta()})

    def load():
        """One DP rank's core fields of sglang's GetLoadsReqOutput, as its scheduler's get_loads fills them."""
        running, waiting = len(engine.running), len(engine.waiting)
        used = sum(r.prompt_tokens + len(r.out) for r in engine.running)
        capacity = getattr(args, 'max_total_tokens', None) or 1048576      # sglang sizes its KV pool from free memory
        step = step_seconds(running) * engine.faults.get('slow', 1.0) / engine.speed
        return {'dp_rank': 0, 'num_running_reqs': running, 'num_waiting_reqs': waiting, 'num_used_tokens': used,
                'num_total_tokens': used + sum(r.prompt_tokens for r in engine.waiting), 'max_total_num_tokens': capacity,
                'token_usage': round(used / capacity, 4), 'gen_throughput': round(running / step, 2) if running else 0.0,
                'cache_hit_rate': 0.0, 'utilization': 0.0, 'max_running_requests': engine.max_running}

    async def v1_loads(request):
        # sglang's v1_loads.py: the per-rank timestamp is left out of the JSON; the aggregate as _compute_aggregate
        loads = [dict(d, num_total_reqs=d['num_running_reqs'] + d['num_waiting_reqs']) for d in [load()]]
        n = len(loads) or 1

        def total(key):
            return sum(d[key] for d in loads)
        aggregate = {'total_running_reqs': total('num_running_reqs'), 'total_waiting_reqs': total('num_waiting_reqs'),
                     'total_reqs': total('num_total_reqs'), 'total_used_tokens': total('num_used_tokens'),
                     'total_tokens': total('num_total_tokens'), 'avg_token_usage': round(total('token_usage') / n, 4),
                     'avg_throughput': round(total('gen_throughput') / n, 2),
                     'avg_utilization': round(total('utilization') / n, 4)}
        return web.json_response({'timestamp': datetime.datetime.now(datetime.UTC).isoformat(),
                                  'version': importlib.metadata.version('sglang'), 'dp_rank_count': len(loads),
                                  'loads': loads, 'aggregate': aggregate})

    async def get_load(request):
        d = load()
        return web.json_response([{'dp_rank': d['dp_rank'], 'num_reqs': d['num_running_reqs'] + d['num_waiting_reqs'],
                                   'num_waiting_reqs': d['num_waiting_reqs'], 'num_tokens': d['num_total_tokens'],
                                   'num_pending_tokens': d['num_total_tokens'] - d['num_used_tokens'],
                                   'ts_tic': time.perf_counter()}])

    app = web.Application(middlewares=[auth], client_max_size=64 * 1024 ** 2)
    app.router.add_get('/health', health)
    app.router.add_get('/health_generate', health_generate)
    for path in ('/server_info', '/get_server_info'):
        app.router.add_get(path, server_info)
    for path in ('/model_info', '/get_model_info'):
        app.router.add_get(path, model_info)
    app.router.add_get('/v1/models', models)
    app.router.add_post('/v1/completions', completions)
    app.router.add_post('/v1/chat/completions', chat)
    app.router.add_post('/generate', generate)
    app.router.add_get('/v1/loads', v1_loads)
    app.router.add_get('/get_load', get_load)
    if engine.metrics:
        async def metrics(request):
            from prometheus_client import CONTENT_TYPE_LATEST
            return web.Response(body=engine.metrics.exposition(load()), headers={'Content-Type': CONTENT_TYPE_LATEST})
        app.router.add_get('/metrics', metrics)
    return app


LISTEN_BACKLOG = 2048    # uvicorn.Config's default, what sglang.launch_server listens with
# sglang starts its scheduler and detokenizer as processes of their own (multiprocessing, spawned: a new Python with
# the environment the engine has then); the emulator starts one such child, which waits for the emulator's end (its
# standard input closing), so what a child of the engine inherits is there to look at (molecule/sglang/verify.yml)
CHILD = 'import sys; sys.stdin.buffer.read()'


def start_child():
    import subprocess
    return subprocess.Popen([sys.executable, '-c', CHILD], stdin=subprocess.PIPE, close_fds=True)


async def serve(args):
    from aiohttp import web
    engine = Engine(args, os.environ.get('GLM5_EMULATOR_FAULTS', ''))
    runner = web.AppRunner(build_app(args, engine), access_log=None)
    await runner.setup()
    # sglang serves through uvicorn, whose listen backlog is 2048 (sglang passes none); aiohttp's own is 128, and a
    # gateway that opens hundreds of connections to a node at once overflowed it: each refused SYN is sent again only
    # after a second, which the gateway's p99 TTFT then carried (scripts/bench_gateway.py counts ListenOverflows)
    try:
        await web.TCPSite(runner, args.host, args.port, backlog=LISTEN_BACKLOG).start()
    except OSError as exc:      # a port taken (another engine), an address it cannot bind: one line, as sglang's
        await runner.cleanup()
        raise SystemExit('sglang-emulator: cannot listen on {0}:{1}: {2}'.format(args.host, args.port,
                                                                             exc.strerror or exc)) from None
    print('sglang-emulator: serving {0} on http://{1}:{2} (faults: {3}, speed x{4:g})'.format(
        args.served_model_name or args.model_path, args.host, args.port, engine.faults or 'none', engine.speed),
        flush=True)
    child = start_child()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    import signal
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    task = asyncio.ensure_future(engine.run())

    def ended(t):       # the batch loop never ends by itself: one that fails is an engine that died, as sglang's would
        if not t.cancelled() and t.exception() is not None:
            print('sglang-emulator: the batch loop failed: {0!r}'.format(t.exception()), file=sys.stderr, flush=True)
            os._exit(1)
    task.add_done_callback(ended)
    await stop.wait()
    # drain as sglang does on SIGTERM: finish what runs, then exit
    while engine.running or engine.waiting:
        await asyncio.sleep(0.1)
    task.cancel()
    await runner.cleanup()
    child.stdin.close()
    child.wait(timeout=10)


def main(argv):
    args = parse_args(argv, cache_dir())
    asyncio.run(serve(args))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
