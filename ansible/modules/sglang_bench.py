#!/usr/bin/python
from __future__ import annotations

DOCUMENTATION = r'''
---
module: sglang_bench
short_description: One concurrency level of sglang.bench_serving against a running server, the GPUs sampled meanwhile
description:
  - >-
    Runs the real C(python -m sglang.bench_serving) of the given Python (the node's SGLang environment) once:
    C(--backend sglang-oai) (or C(backend)) C(--dataset-name random-ids) (offline, no dataset download), the given lengths and
    C(--random-range-ratio), C(--num-prompts), C(--max-concurrency), C(--request-rate inf); its result line is
    appended to C(output_file) (JSONL). The API key goes in through C(OPENAI_API_KEY), never on the command line.
  - >-
    No secret reaches C(output_file) or C(log_file): bench_serving copies the server's C(/server_info) (sglang's server
    args, C(api_key) among them) into its result line, so it writes into a private (0700) temporary folder, and the
    line is appended to C(output_file) with the values of sglang's secret arguments (C(api_key), C(admin_api_key),
    C(ssl_keyfile_password), C(hf_token)) and every occurrence of C(api_key) replaced by C((redacted)); the log is
    cleaned of the key the same way.
  - >-
    While it runs, samples every GPU with C(nvidia-smi --query-gpu) (utilisation, power draw and limit, memory, SM
    clock, temperature) every C(sample_interval) seconds and appends the samples to C(samples_file) (JSONL, one line
    per sample with the level). No nvidia-smi -> no samples, said in C(gpu_note).
  - >-
    bench_serving's output, its progress bar included (at most one update a second), goes to C(log_file) as it runs:
    C(glm5 bench) follows the level's progress there.
  - >-
    Raises the open-files limit for bench_serving (one file per connection; it asks for 65535 itself but cannot go
    past a low hard limit, and then requests beyond it fail).
  - >-
    Never fails because the server did badly: a level that produced no result line (bench_serving crashed, the
    server went away) is reported with C(line=null) and the error; the caller's gates decide. It fails only when
    bench_serving cannot be started.
options:
  python: {description: The SGLang environment's Python., type: path, required: true}
  base_url: {description: The server (http://host:port)., type: str, required: true}
  model: {description: The served model name., type: str, required: true}
  tokenizer: {description: The tokenizer directory (the model's)., type: path, required: true}
  api_key: {description: The server's API key., type: str, default: ''}
  concurrency: {description: C(--max-concurrency)., type: int, required: true}
  prompts: {description: C(--num-prompts)., type: int, required: true}
  input_len: {description: C(--random-input-len)., type: int, default: 256}
  output_len: {description: C(--random-output-len)., type: int, default: 128}
  range_ratio: {description: "C(--random-range-ratio) (0.0 lengths uniform in [1, L], 1.0 fixed).", type: float, default: 0.0}
  seed: {description: C(--seed)., type: int, default: 1}
  output_file: {description: "The JSONL the level's result is appended to, secrets removed.", type: path, required: true}
  log_file: {description: bench_serving's stdout and stderr., type: path, required: true}
  log_file_shown:
    description: >-
      How messages name the log (the smoke test gives the PVE host's path, host:/path, as its report is named);
      empty - C(log_file).
    type: str
    default: ''
  samples_file: {description: The GPU samples (JSONL, appended)., type: path, required: true}
  nvidia_smi:
    description: >-
      The nvidia-smi to sample with (a name on PATH or a path); empty - no GPU samples (a client that is not beside
      the GPUs).
    type: str
    default: nvidia-smi
  backend:
    description: >-
      bench_serving's C(--backend): C(sglang-oai) (the OpenAI API, the node's smoke test) or C(sglang) (sglang's native
      C(/generate): SGLang's model gateway 1.13 refuses the OpenAI backend's C(best_of) with C(stream)).
    type: str
    choices: [sglang-oai, sglang]
    default: sglang-oai
  sample_interval: {description: Seconds between GPU samples., type: float, default: 2.0}
  timeout: {description: Seconds the level may take before bench_serving is stopped., type: int, default: 3600}
  extra_args: {description: More bench_serving arguments., type: list, elements: str, default: []}
  unit:
    description: >-
      The systemd unit that runs the server (glm5-sglang). Its main PID and restart count are read before and after
      the level: an engine that stopped or restarted meanwhile is said as such (C(engine)), not as the client's
      connection errors. Empty - not watched.
    type: str
    default: ''
  ca_file:
    description: >-
      A CA file (PEM) to trust for an HTTPS base_url (the gateway's TLS), for bench_serving's HTTP clients
      (SSL_CERT_FILE, REQUESTS_CA_BUNDLE). Empty - the system's trust.
    type: path
    default: ''
  ttfts:
    description: >-
      Each request's TTFT too: bench_serving's C(--output-details), of which only C(ttfts) is kept in the line appended
      to C(output_file) (seconds, in the order the requests were sent; null for a request that failed). The fleet
      smoke test leaves out the first wave of requests, whose connections every client opens at once.
    type: bool
    default: false
author: GLM-5 node maintainers
'''

EXAMPLES = r'''
- name: Concurrency 64
  sglang_bench:
    python: /opt/glm5/sglang/bin/python
    base_url: http://127.0.0.1:30000
    model: glm-5
    tokenizer: /models/GLM-5-NVFP4
    api_key: "{{ key }}"
    concurrency: 64
    prompts: 256
    output_file: /var/lib/glm5/bench-history/run/bench.jsonl
    log_file: /var/lib/glm5/bench-history/run/bench-c64.log
    samples_file: /var/lib/glm5/bench-history/run/gpu.jsonl
'''

RETURN = r'''
concurrency: {description: The level., returned: always, type: int}
prompts: {description: Prompts sent., returned: always, type: int}
line:
  description: The 0-based line of output_file with this level's result, or null when none was written.
  returned: always
  type: int
result: {description: That line, parsed., returned: always, type: dict}
exit_code: {description: bench_serving's exit status (null when stopped at the timeout)., returned: always, type: int}
error: {description: Why there is no result (the log's last lines)., returned: always, type: str}
engine:
  description: "How the engine stopped or restarted during the level (null: it did not, or no unit)."
  returned: always
  type: str
seconds: {description: Wall time of the level., returned: always, type: float}
samples: {description: GPU samples taken., returned: always, type: int}
gpu_note: {description: Where the GPU figures come from, or why there are none., returned: always, type: str}
cmd: {description: The bench_serving command line (no key in it)., returned: always, type: list}
open_files_limit: {description: The open-files limit bench_serving ran with (one per connection)., returned: always, type: int}
'''

import json
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.glm5_systemd import unit_state
from ansible.module_utils.nvidia_facts import SAMPLE_ARGS, NvidiaParseError, parse_sample_csv


def count_lines(path):
    try:
        with open(path) as fh:
            return sum(1 for line in fh if line.strip())
    except OSError:
        return 0


def sample(smi, level, fh):
    try:
        out = subprocess.run([smi] + SAMPLE_ARGS, capture_output=True, text=True, timeout=20)
        gpus = parse_sample_csv(out.stdout) if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, NvidiaParseError):
        gpus = None
    if gpus is None:
        return False
    fh.write(json.dumps({'t': round(time.time(), 3), 'level': level, 'gpus': gpus}, sort_keys=True) + '\n')
    fh.flush()
    return True


# sglang's server arguments that hold secrets (bench_serving copies them all from /server_info into its result)
SECRET_ARGS = ('api_key', 'admin_api_key', 'ssl_keyfile_password', 'hf_token')
REDACTED = '(redacted)'


def scrub(value, secrets):
    """value (bench_serving's result, parsed) with no secret in it: a set value of one of SECRET_ARGS, and every
    occurrence of a string in secrets (the API key), anywhere, become REDACTED."""
    if isinstance(value, dict):
        return dict((k, REDACTED if k in SECRET_ARGS and v not in (None, '') else scrub(v, secrets))
                    for k, v in value.items())
    if isinstance(value, list):
        return [scrub(v, secrets) for v in value]
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, REDACTED)
    return value


# what --output-details adds to the result line, one entry a request in the order they were sent
DETAILS = ('input_lens', 'output_lens', 'ttfts', 'itls', 'generated_texts', 'errors')


def only_ttfts(record):
    """A result line written with --output-details, of its details only each request's TTFT (seconds; None for a
    request that failed): the generated texts and inter-token latencies would make the history heavy for nothing."""
    details = {k: record.pop(k) for k in DETAILS if k in record}
    ttfts, errors = details.get('ttfts') or [], details.get('errors') or []
    if ttfts:
        record['ttfts'] = [None if (errors[i] if i < len(errors) else '') else t for i, t in enumerate(ttfts)]
    return record


def append_scrubbed(raw, output_file, secrets, ttfts=False):
    """bench_serving's lines from raw (its private output file), secrets removed (with ttfts: the details cut to
    each request's TTFT), appended to output_file. -> those lines, parsed and scrubbed (none when bench_serving
    wrote nothing)."""
    try:
        with open(raw) as fh:
            records = [scrub(json.loads(line), secrets) for line in fh if line.strip()]
    except OSError:
        return []
    if ttfts:
        records = [only_ttfts(r) for r in records]
    with open(output_file, 'a') as out:
        for record in records:
            out.write(json.dumps(record) + '\n')
    return records


def scrub_file(path, secrets):
    """Rewrite a text file with every occurrence of a secret replaced (only when there is one)."""
    with open(path, errors='replace') as fh:
        text = fh.read()
    clean = scrub(text, secrets)
    if clean != text:
        with open(path, 'w') as fh:
            fh.write(clean)


# a tqdm progress line: ' 40%|####      | 103/256 [00:02<00:03, 41.2it/s]'
PROGRESS = re.compile(r'\d+%\|.*\|\s*\d+/\d+')


def last_error(path):
    """The log's last exception line (a traceback's last word), else its last line; at most 300 characters."""
    with open(path, errors='replace') as fh:
        lines = [x.strip() for x in fh if x.strip()]
    found = [x for x in lines if re.match(r'^[\w.]*(Error|Exception|Interrupt)\b', x)]
    lines = [x for x in lines if not PROGRESS.search(x)] or lines
    text = (found or lines or ['(empty log)'])[-1]
    return text if len(text) <= 300 else text[:297] + '...'


def watched(unit):
    """The unit's state, main PID and restarts (None: not watched, or systemctl cannot tell)."""
    if not unit:
        return None
    try:
        state = unit_state(unit)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return state if state.get('MainPID') is not None else None


def engine_change(unit, before, after):
    """None when the engine ran through the level, else what happened to it, in words."""
    if not before or not after:
        return None
    restarts = int(after.get('NRestarts') or 0) - int(before.get('NRestarts') or 0)
    if after.get('MainPID') == before.get('MainPID') and restarts == 0 and after.get('ActiveState') == 'active':
        return None
    pid = after.get('MainPID') if after.get('MainPID') not in (None, '', '0') else 'none'
    return ('the engine stopped or restarted during this level: {0} was {1} ({2}) with main PID {3}; it is now {4} '
            '({5}), main PID {6}, restarted {7} time(s) by systemd meanwhile (journalctl -u {0})'.format(
                unit, before.get('ActiveState'), before.get('SubState'), before.get('MainPID'), after.get('ActiveState'),
                after.get('SubState'), pid, restarts))


def open_files_limit(want=65535):
    """bench_serving raises its soft open-files limit to 65535 itself, but only up to the hard limit: a shell's hard
    limit (20000, or 4096 on some hosts) makes connections fail beyond it. Root raises the hard limit first; else the
    soft limit goes up to the hard one. -> the limit bench_serving gets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), max(hard, want)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def command(p, output_file):
    return [p['python'], '-m', 'sglang.bench_serving', '--backend', p['backend'], '--base-url', p['base_url'],
            '--model', p['model'], '--tokenizer', p['tokenizer'], '--dataset-name', 'random-ids',
            '--random-input-len', str(p['input_len']), '--random-output-len', str(p['output_len']),
            '--random-range-ratio', repr(float(p['range_ratio'])), '--num-prompts', str(p['prompts']),
            '--max-concurrency', str(p['concurrency']), '--request-rate', 'inf', '--seed', str(p['seed']),
            '--output-file', output_file] + (['--output-details'] if p['ttfts'] else []) + list(p['extra_args'])


def run(module):
    p = module.params
    private = tempfile.mkdtemp(prefix='glm5-bench-')       # 0700: bench_serving's own line holds the key
    try:
        return level(module, p, os.path.join(private, 'bench.jsonl'))
    finally:
        shutil.rmtree(private, ignore_errors=True)


def level(module, p, raw_output):
    cmd = command(p, raw_output)
    secrets = [p['api_key']] if p['api_key'] else []
    smi = None
    if p['nvidia_smi']:
        smi = p['nvidia_smi'] if os.path.isabs(p['nvidia_smi']) else module.get_bin_path(p['nvidia_smi'])
        if smi and not os.access(smi, os.X_OK):
            smi = None
    gpu_note = ('nvidia-smi ({0})'.format(smi) if smi else 'not sampled (no nvidia-smi given)' if not p['nvidia_smi']
                else 'no nvidia-smi in the container: no GPU samples')
    for path in (p['output_file'], p['log_file'], p['samples_file']):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    nofile = open_files_limit()
    if nofile < p['concurrency'] + 256:
        module.warn('the open-files limit is {0}: {1} concurrent requests need more; some will fail'.format(
            nofile, p['concurrency']))
    before = count_lines(p['output_file'])
    engine_before = watched(p['unit'])
    # bench_serving's progress bar (tqdm) goes to the log at most once a second: glm5 bench follows it there
    env = dict(os.environ, OPENAI_API_KEY=p['api_key'] or 'none', PYTHONUNBUFFERED='1', HF_HUB_OFFLINE='1',
               TQDM_MININTERVAL='1')
    if p['ca_file']:
        # an HTTPS base_url (the gateway's TLS): its CA, for aiohttp (OpenSSL's SSL_CERT_FILE) and requests alike
        env.update(SSL_CERT_FILE=p['ca_file'], REQUESTS_CA_BUNDLE=p['ca_file'])
    samples, code = 0, None
    t0 = time.monotonic()
    with open(p['log_file'], 'w') as log, open(p['samples_file'], 'a') as sfh:
        log.write('$ ' + ' '.join(cmd) + '\n')
        log.flush()
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd='/tmp')
        except OSError as exc:
            module.fail_json(msg='cannot start bench_serving with {0}: {1}'.format(p['python'], exc), cmd=cmd)
        while True:
            if smi and sample(smi, p['concurrency'], sfh):
                samples += 1
            deadline = time.monotonic() + p['sample_interval']
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.1)
            if proc.poll() is not None:
                code = proc.returncode
                break
            if time.monotonic() - t0 > p['timeout']:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                log.write('\nstopped after {0} s (timeout)\n'.format(p['timeout']))
                break
    seconds = round(time.monotonic() - t0, 1)
    engine = engine_change(p['unit'], engine_before, watched(p['unit']))
    records = append_scrubbed(raw_output, p['output_file'], secrets, p['ttfts'])
    scrub_file(p['log_file'], secrets)
    line = before + len(records) - 1 if records else None
    # the line as written, less each request's TTFT (in the file, not in Ansible's result)
    result = dict((k, v) for k, v in records[-1].items() if k != 'ttfts') if records else None
    error = None
    if result is None:
        error = 'bench_serving {0} and wrote no result: {1} (whole log: {2})'.format(
            'was stopped at the timeout' if code is None else 'exited {0}'.format(code), last_error(p['log_file']),
            p['log_file_shown'] or p['log_file'])
        if engine:
            error = engine + '; ' + error
    # exit_code, not rc: Ansible takes a non-zero rc for a failed task, and a level that went wrong is the gates' call
    return dict(changed=True, concurrency=p['concurrency'], prompts=p['prompts'], line=line, result=result, exit_code=code,
                error=error, engine=engine, seconds=seconds, samples=samples, gpu_note=gpu_note, cmd=cmd, open_files_limit=nofile)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type='path', required=True),
            base_url=dict(type='str', required=True),
            model=dict(type='str', required=True),
            tokenizer=dict(type='path', required=True),
            api_key=dict(type='str', default='', no_log=True),
            concurrency=dict(type='int', required=True),
            prompts=dict(type='int', required=True),
            input_len=dict(type='int', default=256),
            output_len=dict(type='int', default=128),
            range_ratio=dict(type='float', default=0.0),
            seed=dict(type='int', default=1),
            output_file=dict(type='path', required=True),
            log_file=dict(type='path', required=True),
            log_file_shown=dict(type='str', default=''),
            samples_file=dict(type='path', required=True),
            nvidia_smi=dict(type='str', default='nvidia-smi'),
            backend=dict(type='str', choices=['sglang-oai', 'sglang'], default='sglang-oai'),
            sample_interval=dict(type='float', default=2.0),
            timeout=dict(type='int', default=3600),
            extra_args=dict(type='list', elements='str', default=[]),
            unit=dict(type='str', default=''),
            ca_file=dict(type='path', default=''),
            ttfts=dict(type='bool', default=False),
        ),
        supports_check_mode=False,
    )
    if module.params['concurrency'] < 1 or module.params['prompts'] < 1:
        module.fail_json(msg='concurrency and prompts must be >= 1')
    relative = [k for k in ('output_file', 'log_file', 'samples_file') if not os.path.isabs(module.params[k])]
    if relative:
        # a relative path is relative to wherever the module happens to run (os.makedirs('') failed on it)
        module.fail_json(msg='{0} must be absolute paths, got {1}'.format(
            ', '.join(relative), ', '.join(repr(module.params[k]) for k in relative)))
    module.exit_json(**run(module))


if __name__ == '__main__':
    main()
