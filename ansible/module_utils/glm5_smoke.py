"""The smoke test's decisions and its report, as plain functions (no Ansible, no network).

Used by the modules sglang_probe (the correctness probe, in the container), sglang_bench (one level of
sglang.bench_serving with GPU sampling, in the container) and sglang_smoke_report (validation, gates, the report
folder and the history index, on the controller), and by the tests on golden files from a real bench_serving run.
matplotlib is imported only where plots are drawn (the controller).
"""
from __future__ import annotations

import datetime
import json
import math
import os
import re

# What a level reports (bench_serving's JSONL keys -> ours).
METRICS = {
    'completed': 'completed',
    'duration': 'duration_s',
    'total_input_tokens': 'input_tokens',
    'total_output_tokens': 'output_tokens',
    'request_throughput': 'requests_per_s',
    'input_throughput': 'input_tok_s',
    'output_throughput': 'output_tok_s',
    'total_throughput': 'total_tok_s',
    'mean_ttft_ms': 'mean_ttft_ms',
    'median_ttft_ms': 'median_ttft_ms',
    'p99_ttft_ms': 'p99_ttft_ms',
    'mean_tpot_ms': 'mean_tpot_ms',
    'median_tpot_ms': 'median_tpot_ms',
    'p99_tpot_ms': 'p99_tpot_ms',
    'mean_itl_ms': 'mean_itl_ms',
    'p99_itl_ms': 'p99_itl_ms',
    'mean_e2e_latency_ms': 'mean_e2e_ms',
    'p99_e2e_latency_ms': 'p99_e2e_ms',
    'max_output_tokens_per_s': 'peak_output_tok_s',
    'max_concurrent_requests': 'peak_concurrent_requests',
}
THROUGHPUT_GATES = (('total_tok_s', 'total tok/s'), ('output_tok_s', 'output tok/s'))
LATENCY_GATES = (('p99_ttft_ms', 'p99 TTFT ms'), ('p99_tpot_ms', 'p99 TPOT ms'))
BASELINE_KEYS = ('total_tok_s', 'output_tok_s')
LIMIT_KEYS = ('p99_ttft_ms', 'p99_tpot_ms')
PROBE_KEYS = ('prompt', 'expect')


# ---------------------------------------------------------------- validation
def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _level_key(key):
    """Inventory dict keys come as ints or as strings ('64')."""
    if isinstance(key, bool):
        return None
    if isinstance(key, int):
        return key
    if isinstance(key, str) and re.match(r'^\d+$', key.strip()):
        return int(key)
    return None


def by_level(table):
    """{64: {...}, '256': {...}} -> {64: {...}, 256: {...}} (keys that are not levels are left as they are)."""
    out = {}
    for key, value in (table or {}).items():
        level = _level_key(key)
        out[level if level is not None else key] = value
    return out


def config_problems(cfg):
    """Every problem with the smoke test's settings, one line each (empty: usable). cfg holds levels, input_len,
    output_len, range_ratio, prompts_per_concurrency, min_prompts, tolerance, baseline, limits, probes."""
    problems = []
    levels = cfg.get('levels')
    if not isinstance(levels, list) or not levels:
        problems.append('sglang_smoke_levels must be a non-empty list of concurrency levels, got {0!r}'.format(levels))
        levels = []
    else:
        bad = [x for x in levels if isinstance(x, bool) or not isinstance(x, int) or x < 1]
        if bad:
            problems.append('sglang_smoke_levels: {0} {1} not a whole number of concurrent requests >= 1'.format(
                ', '.join(repr(x) for x in bad), 'is' if len(bad) == 1 else 'are'))
        elif len(set(levels)) != len(levels):
            problems.append('sglang_smoke_levels: {0} lists a level twice'.format(levels))
        elif levels != sorted(levels):
            problems.append('sglang_smoke_levels: {0} must go up (the sweep runs them in order)'.format(levels))
    for key in ('input_len', 'output_len'):
        value = cfg.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append('sglang_smoke_{0} must be a whole number of tokens >= 1, got {1!r}'.format(key, value))
    ratio = cfg.get('range_ratio')
    if not _is_number(ratio) or not 0.0 <= ratio <= 1.0:
        problems.append('sglang_smoke_range_ratio must be a number from 0.0 (lengths uniform in [1, L], the seeds) '
                        'to 1.0 (fixed lengths), got {0!r}'.format(ratio))
    for key in ('prompts_per_concurrency', 'min_prompts'):
        value = cfg.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append('sglang_smoke_{0} must be a whole number >= 1, got {1!r}'.format(key, value))
    speed = cfg.get('speed_factor', 1)
    if not _is_number(speed) or not speed > 0 or speed == float('inf'):
        problems.append('sglang_smoke_speed_factor must be a number > 0 (1 on a real node; the lab\'s test speed '
                        'of its engine emulator otherwise), got {0!r}'.format(speed))
    tol = cfg.get('tolerance')
    if not _is_number(tol) or not 0.0 < tol <= 1.0:
        problems.append('sglang_smoke_tolerance must be a fraction of the baseline in (0, 1] (0.9: at least 90% of '
                        'it), got {0!r}'.format(tol))
    for name, table, keys in (('baseline', cfg.get('baseline'), BASELINE_KEYS), ('limits', cfg.get('limits'), LIMIT_KEYS)):
        if table is None:
            continue
        if not isinstance(table, dict):
            problems.append('sglang_smoke_{0} must map a concurrency level to its figures, got {1!r}'.format(name, table))
            continue
        for key, row in table.items():
            level = _level_key(key)
            if level is None or level < 1:
                problems.append('sglang_smoke_{0}: {1!r} is not a concurrency level'.format(name, key))
                continue
            if not isinstance(row, dict):
                problems.append('sglang_smoke_{0}[{1}] must be a mapping of {2}, got {3!r}'.format(
                    name, level, ' / '.join(keys), row))
                continue
            for k, v in row.items():
                if k not in keys:
                    problems.append('sglang_smoke_{0}[{1}]: unknown figure {2!r} (known: {3})'.format(
                        name, level, k, ', '.join(keys)))
                elif v is not None and (not _is_number(v) or v <= 0):
                    problems.append('sglang_smoke_{0}[{1}].{2} must be a positive number or null (not gated), '
                                    'got {3!r}'.format(name, level, k, v))
    probes = cfg.get('probes')
    if not isinstance(probes, list) or not probes:
        problems.append('sglang_smoke_probes must be a non-empty list of {prompt, expect}')
    else:
        for i, probe in enumerate(probes):
            if not isinstance(probe, dict) or any(not isinstance(probe.get(k), str) or not probe.get(k).strip()
                                                   for k in PROBE_KEYS):
                problems.append('sglang_smoke_probes[{0}] needs a non-empty prompt and expect, got {1!r}'.format(i, probe))
    return problems


def prompts_for(level, per_concurrency, minimum):
    """How many prompts a level sends: enough to fill it several times over (steady state), at least minimum."""
    return max(int(minimum), int(per_concurrency) * int(level))


# ---------------------------------------------------------------- the probe
_LOOP = re.compile(r'(.{1,24}?)(?:\s*\1){11,}', re.S)


def repeated_loop(text):
    """The repeated piece when text is (or ends in) one short piece over and over -- what NaN logits produce --
    else None."""
    words = text.split()
    if len(words) >= 12:
        run, longest, prev = 0, 0, None
        for w in words:
            run = run + 1 if w == prev else 1
            prev = w
            longest = max(longest, run)
        if longest >= 12:
            return max(set(words), key=words.count)
    m = _LOOP.search(text)
    if m and len(m.group(0)) >= 24:
        return m.group(1)
    return None


def _finite_logprobs(choice):
    lp = (choice or {}).get('logprobs') or {}
    bad = 0
    for item in lp.get('content') or []:
        value = item.get('logprob') if isinstance(item, dict) else None
        if value is None or (isinstance(value, (int, float)) and not math.isfinite(value)) or \
                (isinstance(value, str) and value.lower() in ('nan', 'inf', '-inf', 'infinity', '-infinity')):
            bad += 1
    return bad


def judge_answer(probe, status, body):
    """One probe's answer (HTTP status, the parsed chat completion) -> (answer text, problems). The answer may be in
    content or, from a reasoning model, in reasoning_content: both are read."""
    if status != 200:
        detail = body if isinstance(body, str) else json.dumps(body)[:300]
        return '', ['HTTP {0}: {1}'.format(status, (detail or '').strip()[:300])]
    try:
        choice = body['choices'][0]
        message = choice.get('message') or {}
    except (KeyError, IndexError, TypeError):
        return '', ['not a chat completion: {0}'.format(json.dumps(body)[:300])]
    content = message.get('content') or ''
    reasoning = message.get('reasoning_content') or ''
    text = (content + '\n' + reasoning).strip() if reasoning else content.strip()
    problems = []
    if not text:
        problems.append('empty answer (no content, no reasoning_content)')
        return text, problems
    if '\ufffd' in text:
        problems.append('replacement characters (U+FFFD) in the answer: {0} of {1} characters'.format(
            text.count('\ufffd'), len(text)))
    loop = repeated_loop(text)
    if loop is not None:
        problems.append('a repeated-token loop ({0!r} over and over), what NaN logits produce'.format(loop[:40]))
    bad = _finite_logprobs(choice)
    if bad:
        problems.append('{0} token log-probabilities are not finite (NaN/inf)'.format(bad))
    expect = probe['expect']
    if not re.search(r'(?<![\w.]){0}(?![\w]|\.\d)'.format(re.escape(expect)), text, re.I):
        problems.append('expected {0!r}, the answer does not say it'.format(expect))
    return text, problems


# ---------------------------------------------------------------- bench_serving results
def parse_jsonl(text):
    """JSON Lines (bench_serving's --output-file, the GPU samples, the history's index): one object per line."""
    out = []
    for n, line in enumerate((text or '').splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except ValueError as exc:
            raise ValueError('line {0} is not JSON: {1}'.format(n, exc)) from None
    return out


def level_metrics(record, concurrency, prompts):
    """One bench_serving result line -> our per-level figures. failed = prompts sent - completed (bench_serving has
    no failed key)."""
    out = {'concurrency': int(concurrency), 'prompts': int(prompts)}
    for src, dst in METRICS.items():
        value = (record or {}).get(src)
        out[dst] = value if _is_number(value) else None
    completed = out['completed'] or 0
    out['failed'] = int(prompts) - int(completed)
    return out


def scaled(cfg):
    """The settings with the baseline and the latency limits at the engine's speed: throughputs x speed_factor,
    latency limits / speed_factor (exactly; 1, a real node, leaves them as they are). Only a lab whose engine
    emulator runs F times faster than the seeds' pace (GLM5_EMULATOR_SPEED) sets it, so that its tests take 1/F of
    the time and still judge the run against the seeds' table."""
    speed = cfg.get('speed_factor', 1) or 1
    if speed == 1:
        return cfg
    out = dict(cfg)
    out['baseline'] = {level: {k: (v * speed if _is_number(v) else v) for k, v in (row or {}).items()}
                       for level, row in (cfg.get('baseline') or {}).items()}
    out['limits'] = {level: {k: (v / speed if _is_number(v) else v) for k, v in (row or {}).items()}
                     for level, row in (cfg.get('limits') or {}).items()}
    return out


def gate_level(metrics, baseline, limits, tolerance):
    """The gates of one level: [{gate, value, threshold, passed, text}]. Only figures the baseline / limits give
    are gated; a level that produced no result fails."""
    gates = []
    if metrics.get('completed') is None:
        gates.append({'gate': 'result', 'value': None, 'threshold': None, 'passed': False,
                      'text': 'no result from bench_serving at concurrency {0}'.format(metrics['concurrency'])})
        return gates
    failed = metrics['failed']
    gates.append({'gate': 'completed', 'value': metrics['completed'], 'threshold': metrics['prompts'],
                  'passed': failed == 0,
                  'text': '{0} of {1} requests completed{2}'.format(
                      metrics['completed'], metrics['prompts'], '' if failed == 0 else ' ({0} failed)'.format(failed))})
    for key, label in THROUGHPUT_GATES:
        base = (baseline or {}).get(key)
        if base is None:
            continue
        need = base * tolerance
        value = metrics.get(key)
        ok = value is not None and value >= need
        gates.append({'gate': key, 'value': value, 'threshold': round(need, 2), 'passed': ok,
                      'text': '{0} {1} {2} {3:.1f} (baseline {4:g} x {5:g})'.format(
                          label, _fmt(value), '>=' if ok else '<', need, base, tolerance)})
    for key, label in LATENCY_GATES:
        limit = (limits or {}).get(key)
        if limit is None:
            continue
        value = metrics.get(key)
        ok = value is not None and value <= limit
        gates.append({'gate': key, 'value': value, 'threshold': limit, 'passed': ok,
                      'text': '{0} {1} {2} {3:g}'.format(label, _fmt(value), '<=' if ok else '>', limit)})
    return gates


def _fmt(value, digits=1):
    if value is None:
        return 'n/a'
    if isinstance(value, int):
        return '{0:,}'.format(value)
    return '{0:,.{1}f}'.format(value, digits)


def evaluate(sweep, records, cfg):
    """sweep: [{concurrency, prompts, line (index into records, or None), rc, error}] as the sglang_bench module
    returned them, in order; records: the parsed JSONL. -> [{concurrency, metrics, gates, passed}]."""
    baseline = by_level(cfg.get('baseline'))
    limits = by_level(cfg.get('limits'))
    levels = []
    for item in sweep:
        line = item.get('line')
        record = records[line] if line is not None and 0 <= line < len(records) else None
        metrics = level_metrics(record, item['concurrency'], item.get('prompts') or 0)
        gates = gate_level(metrics, baseline.get(item['concurrency']), limits.get(item['concurrency']),
                           cfg['tolerance'])
        if item.get('error') and record is None:
            gates[0]['text'] += ': ' + item['error']
        elif item.get('engine'):        # a result, but the engine did not run through the level: not a pass
            gates.append({'gate': 'engine', 'value': None, 'threshold': None, 'passed': False, 'text': item['engine']})
        levels.append({'concurrency': item['concurrency'], 'metrics': metrics, 'gates': gates,
                       'passed': all(g['passed'] for g in gates)})
    return levels


# ---------------------------------------------------------------- GPU samples
def gpu_by_level(samples):
    """GPU samples [{t, level, gpus: [{index, power_draw_w, power_limit_w, utilization_gpu_pct, memory_used_mib,
    clocks_sm_mhz, temperature_c}]}] -> {level: {mean/max power per GPU, mean utilisation, ...}}."""
    out = {}
    for s in samples or []:
        row = out.setdefault(s['level'], {'n': 0, 'power': [], 'limit': [], 'util': [], 'mem': [], 'sm': []})
        row['n'] += 1
        for g in s.get('gpus') or []:
            for key, dst in (('power_draw_w', 'power'), ('power_limit_w', 'limit'), ('utilization_gpu_pct', 'util'),
                             ('memory_used_mib', 'mem'), ('clocks_sm_mhz', 'sm')):
                if _is_number(g.get(key)):
                    row[dst].append(g[key])

    def mean(xs):
        return round(sum(xs) / len(xs), 1) if xs else None
    return {level: {'samples': r['n'], 'mean_power_w': mean(r['power']), 'max_power_w': max(r['power'] or [None],
                    key=lambda x: -1 if x is None else x),
                    'power_limit_w': mean(r['limit']), 'mean_util_pct': mean(r['util']),
                    'max_memory_used_mib': max(r['mem']) if r['mem'] else None, 'mean_sm_mhz': mean(r['sm'])}
            for level, r in out.items()}


# ---------------------------------------------------------------- summary, markdown
def headline(levels):
    """The figure the trend follows: total tok/s at the highest level that has one."""
    for lv in sorted(levels, key=lambda x: -x['concurrency']):
        if lv['metrics'].get('total_tok_s') is not None:
            return {'concurrency': lv['concurrency'], 'total_tok_s': lv['metrics']['total_tok_s'],
                    'output_tok_s': lv['metrics']['output_tok_s']}
    return None


def build_summary(run_id, started, meta, cfg, probe, levels, gpu, phase_note=None):
    """The run's summary.json: what ran (versions, profile, flag-set hash, patches, driver, model revision), the
    probe, every level's figures and gate verdicts, the GPU figures, and the verdict with its reasons."""
    reasons = []
    if probe is not None and not probe.get('passed'):
        reasons.append('probe: ' + '; '.join(probe.get('problems') or ['failed']))
    for lv in levels:
        for g in lv['gates']:
            if not g['passed']:
                reasons.append('concurrency {0}: {1}'.format(lv['concurrency'], g['text']))
    passed = probe is not None and bool(probe.get('passed')) and bool(levels) and all(lv['passed'] for lv in levels)
    if probe is not None and probe.get('passed') and not levels:
        reasons.append('no sweep level ran')
    return {
        'run': run_id,
        'started': started,
        'finished': datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ'),
        'passed': passed,
        'reasons': reasons,
        'meta': meta,
        'settings': {k: cfg.get(k) for k in ('levels', 'input_len', 'output_len', 'range_ratio',
                                             'prompts_per_concurrency', 'min_prompts', 'tolerance', 'dataset',
                                             'speed_factor')},
        'baseline': {str(k): v for k, v in sorted(by_level(cfg.get('baseline')).items(), key=lambda kv: str(kv[0]))},
        'limits': {str(k): v for k, v in sorted(by_level(cfg.get('limits')).items(), key=lambda kv: str(kv[0]))},
        'probe': probe,
        'levels': levels,
        'gpu': {str(k): v for k, v in sorted((gpu or {}).items())},
        'headline': headline(levels),
        'rollback': None,
        'note': phase_note,
    }


def markdown(summary):
    """A table a person reads at a glance, then what ran and why it failed."""
    s = summary
    m = s.get('meta') or {}
    verdict = 'PASSED' if s['passed'] else 'FAILED'
    lines = ['# Smoke test {0}: {1}'.format(s['run'], verdict), '']
    lines.append('{0} · sglang {1} · profile {2} · flags {3} · driver {4} · model {5}'.format(
        m.get('node', '?'), m.get('sglang', '?'), m.get('profile', '?'), (m.get('flags_sha256') or '?')[:12],
        m.get('driver', '?'), m.get('model_revision', '?')))
    st = s['settings']
    lines.append('random-ids {0} in / {1} out, range ratio {2}, tolerance {3}'.format(
        st.get('input_len'), st.get('output_len'), st.get('range_ratio'), st.get('tolerance')))
    if (st.get('speed_factor') or 1) != 1:
        lines.append('Lab test speed: the engine emulator ran {0:g}x the seeds\' pace; the baseline and limits below '
                     'are scaled by the same factor (not a production figure)'.format(st['speed_factor']))
    lines.append('')
    probe = s.get('probe') or {}
    lines.append('Probe: {0} ({1} prompts)'.format('passed' if probe.get('passed') else 'FAILED',
                                                    len(probe.get('results') or [])))
    lines.append('')
    base = by_level(s.get('baseline'))
    gpu = by_level(s.get('gpu'))
    lines.append('| concurrency | prompts | failed | total tok/s | output tok/s | baseline | p99 TTFT ms | '
                 'p99 TPOT ms | GPU W (mean) | GPU util % | gates |')
    lines.append('|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---|')
    for lv in s['levels']:
        mt = lv['metrics']
        b = base.get(lv['concurrency']) or {}
        btext = ' / '.join('{0:g} {1}'.format(b[k], k.split('_')[0]) for k in BASELINE_KEYS if b.get(k)) or '-'
        g = gpu.get(lv['concurrency']) or {}
        lines.append('| {0} | {1} | {2} | {3} | {4} | {5} | {6} | {7} | {8} | {9} | {10} |'.format(
            lv['concurrency'], mt['prompts'], mt['failed'] if mt['completed'] is not None else 'all',
            _fmt(mt['total_tok_s']), _fmt(mt['output_tok_s']), btext, _fmt(mt['p99_ttft_ms']),
            _fmt(mt['p99_tpot_ms']), _fmt(g.get('mean_power_w')), _fmt(g.get('mean_util_pct')),
            'pass' if lv['passed'] else 'FAIL'))
    if not s['levels']:
        lines.append('| - | | | | | | | | | | sweep not run |')
    lines.append('')
    if m.get('gpu_source'):
        lines.append('GPU figures: {0}'.format(m['gpu_source']))
        lines.append('')
    note = power_note(gpu)
    if note:
        lines.append(note)
        lines.append('')
    if s['reasons']:
        lines.append('Failed because:')
        lines.extend('- ' + r for r in s['reasons'])
        lines.append('')
    rb = s.get('rollback')
    if rb:
        lines.append('Rollback: {0}'.format(rb.get('text')))
        if rb.get('probe') is not None:
            lines.append('Probe after rollback: {0}'.format(
                'passed' if rb['probe'].get('passed') else 'FAILED: ' + '; '.join(rb['probe'].get('problems') or [])))
        lines.append('')
    if s.get('note'):
        lines.append(s['note'])
        lines.append('')
    return '\n'.join(lines)


def power_note(gpu):
    """A line when the GPUs drew well under their power limit at the busiest level (the seeds' node sat at 250 W of
    600 W and nobody saw it): reported, not gated."""
    levels = [lv for lv in gpu if isinstance(lv, int) and (gpu[lv] or {}).get('mean_power_w') and
              (gpu[lv] or {}).get('power_limit_w')]
    if not levels:
        return None
    g = gpu[max(levels)]
    share = g['mean_power_w'] / g['power_limit_w']
    if share >= 0.6:
        return None
    return ('GPU power: at concurrency {0} the GPUs drew {1:.0f} W of a {2:.0f} W limit ({3:.0f} %) at {4} % '
            'utilisation: check the power limit and clocks (nvidia-smi -q -d POWER,CLOCK).').format(
                max(levels), g['mean_power_w'], g['power_limit_w'], 100 * share,
                _fmt(g.get('mean_util_pct'), 0))


# ---------------------------------------------------------------- index
def index_entry(summary):
    h = summary.get('headline') or {}
    m = summary.get('meta') or {}
    return {
        'run': summary['run'], 'started': summary['started'], 'passed': summary['passed'],
        'node': m.get('node'), 'sglang': m.get('sglang'), 'profile': m.get('profile'),
        'flags_sha256': m.get('flags_sha256'), 'driver': m.get('driver'),
        'headline_concurrency': h.get('concurrency'), 'headline_total_tok_s': h.get('total_tok_s'),
        'headline_output_tok_s': h.get('output_tok_s'),
        'rolled_back': bool((summary.get('rollback') or {}).get('restored')),
        'levels': {str(lv['concurrency']): {k: lv['metrics'].get(k) for k in
                                            ('total_tok_s', 'output_tok_s', 'p99_ttft_ms', 'p99_tpot_ms')}
                   for lv in summary['levels']},
        'reasons': summary['reasons'][:3],
    }


def merge_index(entries, entry):
    """The index with this run's entry (replacing an earlier entry of the same run), oldest first."""
    out = [e for e in entries if e.get('run') != entry['run']] + [entry]
    return sorted(out, key=lambda e: (e.get('started') or '', e.get('run') or ''))


def entry_note(entry, width):
    """An index entry's note: rolled back, and for a failed run its first reason (cut to width)."""
    note = 'rolled back' if entry.get('rolled_back') else ''
    if not entry.get('passed') and entry.get('reasons'):
        note = (note + ': ' if note else '') + entry['reasons'][0][:width]
    return note


def index_markdown(entries):
    lines = ['# Smoke-test runs', '', '![trend](trend.png)', '',
             '| run | node | verdict | sglang | profile | flags | headline total tok/s | output tok/s | note |',
             '|:---|:---|:---|:---|:---|:---|---:|---:|:---|']
    for e in reversed(entries):
        note = entry_note(e, 80)
        lines.append('| [{0}]({0}/report.md) | {1} | {2} | {3} | {4} | {5} | {6} | {7} | {8} |'.format(
            e['run'], e.get('node') or '', 'pass' if e.get('passed') else 'FAIL', e.get('sglang') or '',
            e.get('profile') or '', (e.get('flags_sha256') or '')[:12],
            '{0} @{1}'.format(_fmt(e.get('headline_total_tok_s')), e.get('headline_concurrency'))
            if e.get('headline_total_tok_s') is not None else '-',
            _fmt(e.get('headline_output_tok_s')), note.replace('|', '/')))
    return '\n'.join(lines) + '\n'


def previous_entry(entries, run_id, node=None):
    """The last run before this one (same node when known) with figures to overlay."""
    earlier = [e for e in entries if e.get('run') != run_id and e.get('levels') and (node is None or e.get('node') == node)]
    return earlier[-1] if earlier else None


# ---------------------------------------------------------------- two runs side by side (glm5 compare)
COMPARE_METRICS = (('total_tok_s', 'total tok/s', 1), ('output_tok_s', 'output tok/s', 1),
                   ('p99_ttft_ms', 'p99 TTFT ms', -1), ('p99_tpot_ms', 'p99 TPOT ms', -1))
COMPARE_META = ('node', 'sglang', 'profile', 'flags_sha256', 'lock_sha256', 'driver', 'model_revision')


def _workload(summary):
    st = summary.get('settings') or {}
    return '{0} {1}/{2} range ratio {3}'.format(st.get('dataset'), st.get('input_len'), st.get('output_len'),
                                                  st.get('range_ratio'))


def compare(a, b):
    """Two runs' summaries -> {runs, meta: [{key, a, b, same}], levels: [{concurrency, <metric>: {a, b, change_pct,
    better}}]}: what differs between them, and each level both (or either) ran, b against a (a is the older)."""
    ma, mb = dict(a.get('meta') or {}, workload=_workload(a)), dict(b.get('meta') or {}, workload=_workload(b))
    meta = [{'key': k, 'a': ma.get(k), 'b': mb.get(k), 'same': ma.get(k) == mb.get(k)}
            for k in COMPARE_META + ('workload',)]
    la = {lv['concurrency']: lv for lv in a.get('levels') or []}
    lb = {lv['concurrency']: lv for lv in b.get('levels') or []}
    levels = []
    for c in sorted(set(la) | set(lb)):
        row = {'concurrency': c}
        for key, _label, sign in COMPARE_METRICS:
            va = (la.get(c) or {}).get('metrics', {}).get(key)
            vb = (lb.get(c) or {}).get('metrics', {}).get(key)
            change = (100.0 * (vb - va) / va) if _is_number(va) and _is_number(vb) and va else None
            row[key] = {'a': va, 'b': vb, 'change_pct': change,
                        'better': None if change is None else (change * sign > 0)}
        row['passed'] = {'a': (la.get(c) or {}).get('passed'), 'b': (lb.get(c) or {}).get('passed')}
        levels.append(row)
    return {'runs': [{'run': x['run'], 'started': x.get('started'), 'passed': x.get('passed'),
                      'reasons': x.get('reasons') or []} for x in (a, b)],
            'meta': meta, 'levels': levels}


def compare_markdown(cmp):
    a, b = cmp['runs']
    lines = ['# {0} ({1}) vs {2} ({3})'.format(a['run'], 'pass' if a['passed'] else 'FAIL',
                                                b['run'], 'pass' if b['passed'] else 'FAIL'), '']
    differ = [m for m in cmp['meta'] if not m['same']]
    if differ:
        for m in differ:
            short = 12 if m['key'].endswith('sha256') else None
            lines.append('{0}: {1} -> {2}'.format(m['key'], str(m['a'])[:short], str(m['b'])[:short]))
    else:
        lines.append('Same sglang, profile, flags, lock, driver, model and workload.')
    lines.append('')
    lines.append('A is the older run, B the newer; each cell: A -> B (change)')
    lines.append('')
    lines.append('| concurrency | ' + ' | '.join(label for _k, label, _s in COMPARE_METRICS) + ' | gates A / B |')
    lines.append('|---:|' + '---:|' * len(COMPARE_METRICS) + ':---|')
    for row in cmp['levels']:
        cells = [str(row['concurrency'])]
        for key, _label, _sign in COMPARE_METRICS:
            r = row[key]
            change = '' if r['change_pct'] is None else ' ({0:+.1f} %{1})'.format(
                r['change_pct'], '' if r['better'] or abs(r['change_pct']) < 5 else ', worse')
            cells.append('{0} -> {1}{2}'.format(_fmt(r['a']).replace('n/a', '-'), _fmt(r['b']).replace('n/a', '-'),
                                                 change))
        cells.append(' / '.join({True: 'pass', False: 'FAIL', None: '-'}[row['passed'][w]] for w in ('a', 'b')))
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'


def plot_compare(a, b, path):
    """Throughput and p99 latencies by concurrency, the two runs overlaid (A older, B newer)."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for ax, (key, label, _sign) in zip(axes.flat, COMPARE_METRICS, strict=True):
        # A as large open squares under B's dots: where the runs agree both stay visible
        for run, style, color, extra in ((a, 's--', 'tab:gray', {'ms': 11, 'mfc': 'none', 'mew': 2}),
                                         (b, 'o-', 'tab:blue', {'ms': 6})):
            lv = [x for x in run.get('levels') or [] if x['metrics'].get(key) is not None]
            ax.plot([x['concurrency'] for x in lv], [x['metrics'][key] for x in lv], style, color=color, lw=2,
                    label='{0} {1} ({2})'.format('A' if run is a else 'B', run['run'], 'pass' if run.get('passed') else 'FAIL'),
                    **extra)
            for x in lv:
                if not x['passed']:
                    ax.plot(x['concurrency'], x['metrics'][key], 'x', color='tab:red', ms=12, mew=3)
        for row in compare(a, b)['levels']:
            r = row[key]
            if r['change_pct'] is not None:
                color = 'tab:gray' if abs(r['change_pct']) < 5 else 'tab:green' if r['better'] else 'tab:red'
                ax.annotate('{0:+.1f} %'.format(r['change_pct']), (row['concurrency'], r['b']), textcoords='offset points',
                            xytext=(6, 6), fontsize=8, color=color)
        ax.set_xscale('log', base=2)
        if key.endswith('_ms'):
            ax.set_yscale('log')
        ax.set_xlabel('concurrent requests')
        ax.set_ylabel(label)
        ax.set_title(label)
        ax.grid(True, which='both', alpha=.3)
        ax.legend(fontsize=7)
    fig.suptitle('{0} vs {1}'.format(a['run'], b['run']))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------- plots (controller only)
def _pyplot():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def _previous_and_axes(ax, previous, key, label):
    """The previous run's figure overlaid (from its index entry), and the axes of a by-concurrency plot."""
    if previous:
        pl = sorted((int(c), v.get(key)) for c, v in previous['levels'].items() if v.get(key) is not None)
        if pl:
            ax.plot([c for c, _ in pl], [v for _, v in pl], '^-', color='tab:green', alpha=.6,
                    label='previous run {0}'.format(previous['run']))
    ax.set_xscale('log', base=2)
    ax.set_xlabel('concurrent requests')
    ax.set_ylabel(label)
    ax.set_title(label + ' by concurrency')
    ax.grid(True, which='both', alpha=.3)
    ax.legend(fontsize=8)


def plot_throughput(summary, previous, path):
    plt = _pyplot()
    base = by_level(summary.get('baseline'))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, key, label in ((axes[0], 'total_tok_s', 'total tok/s'), (axes[1], 'output_tok_s', 'output tok/s')):
        lv = [x for x in summary['levels'] if x['metrics'].get(key) is not None]
        ax.plot([x['concurrency'] for x in lv], [x['metrics'][key] for x in lv], 'o-', color='tab:blue', lw=2,
                label='this run ({0})'.format('pass' if summary['passed'] else 'FAIL'))
        for x in lv:
            if not x['passed']:
                ax.plot(x['concurrency'], x['metrics'][key], 'x', color='tab:red', ms=12, mew=3)
        bl = sorted((c, b[key]) for c, b in base.items() if isinstance(c, int) and (b or {}).get(key))
        if bl:
            tol = summary['settings'].get('tolerance') or 1
            speed = (summary.get('settings') or {}).get('speed_factor') or 1
            ax.plot([c for c, _ in bl], [v for _, v in bl], 's--', color='tab:gray',
                    label='baseline (seeds)' if speed == 1 else 'baseline (seeds) x {0:g}, lab test speed'.format(speed))
            ax.plot([c for c, _ in bl], [v * tol for _, v in bl], ':', color='tab:orange',
                    label='gate (baseline x {0:g})'.format(tol))
        _previous_and_axes(ax, previous, key, label)
    fig.suptitle('{0} {1}'.format(summary['run'], 'PASSED' if summary['passed'] else 'FAILED'))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_latency(summary, previous, path):
    plt = _pyplot()
    limits = by_level(summary.get('limits'))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, key, label in ((axes[0], 'p99_ttft_ms', 'p99 TTFT (ms)'), (axes[1], 'p99_tpot_ms', 'p99 TPOT (ms)')):
        lv = [x for x in summary['levels'] if x['metrics'].get(key) is not None]
        ax.plot([x['concurrency'] for x in lv], [x['metrics'][key] for x in lv], 'o-', color='tab:blue', lw=2,
                label='this run')
        ll = sorted((c, b[key]) for c, b in limits.items() if isinstance(c, int) and (b or {}).get(key))
        if ll:
            ax.plot([c for c, _ in ll], [v for _, v in ll], 'v:', color='tab:red', label='limit')
        ax.set_yscale('log')
        _previous_and_axes(ax, previous, key, label)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_gpus(samples, path, source=None):
    """Power (with the limit) and utilisation per GPU over the sweep, the levels marked."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 1, figsize=(12, 6.5), sharex=True)
    if samples:
        t0 = samples[0]['t']
        per_gpu = {}
        for s in samples:
            for g in s.get('gpus') or []:
                per_gpu.setdefault(g['index'], []).append((s['t'] - t0, g))
        for idx, rows in sorted(per_gpu.items()):
            xs = [t for t, _ in rows]
            axes[0].plot(xs, [g.get('power_draw_w') for _, g in rows], lw=1, label='GPU {0}'.format(idx))
            axes[1].plot(xs, [g.get('utilization_gpu_pct') for _, g in rows], lw=1, label='GPU {0}'.format(idx))
        limits = [g.get('power_limit_w') for s in samples for g in s.get('gpus') or [] if g.get('power_limit_w')]
        draws = [g.get('power_draw_w') for s in samples for g in s.get('gpus') or [] if _is_number(g.get('power_draw_w'))]
        top = max(limits + draws + [1])
        if limits:
            axes[0].axhline(max(limits), color='tab:red', ls='--', label='power limit')
        if draws and limits:
            mean = sum(draws) / len(draws)
            axes[0].text(0.01, 0.04, 'mean draw {0:.0f} W of a {1:.0f} W limit ({2:.0f} %)'.format(
                mean, max(limits), 100.0 * mean / max(limits)), transform=axes[0].transAxes, fontsize=9,
                bbox={'facecolor': 'white', 'alpha': .8, 'edgecolor': 'none'})
        axes[0].set_ylim(0, top * 1.1)
        axes[1].set_ylim(0, 105)
        start = {}
        for s in samples:
            start.setdefault(s['level'], s['t'] - t0)
        for level, t in start.items():
            for ax in axes:
                ax.axvline(t, color='gray', ls=':', lw=.8)
            axes[0].text(t, 1.0, ' c={0}'.format(level), transform=axes[0].get_xaxis_transform(), va='bottom',
                         fontsize=8)
        axes[0].legend(fontsize=7, ncol=5, loc='center right')
    else:
        axes[0].text(.5, .5, 'no GPU samples (no nvidia-smi in the container)', ha='center', transform=axes[0].transAxes)
    axes[0].set_ylabel('power (W)')
    axes[1].set_ylabel('utilisation (%)')
    axes[1].set_xlabel('seconds into the sweep')
    fig.suptitle('GPUs during the sweep' + ('\n' + source if source else ''), fontsize=10)
    for ax in axes:
        ax.grid(True, alpha=.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_trend(entries, path):
    """Total tok/s at each concurrency level across runs (one line per level, so runs with other levels still
    compare), passes and failures marked; the headline (the top level) drawn thickest."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(12, 4.6))
    levels = sorted({int(c) for e in entries for c in (e.get('levels') or {})})
    top = max(levels) if levels else None
    for n, level in enumerate(levels):
        pts = [(i, e) for i, e in enumerate(entries)
               if ((e.get('levels') or {}).get(str(level)) or {}).get('total_tok_s') is not None]
        if not pts:
            continue
        color = 'C{0}'.format(n % 10)
        ys = [e['levels'][str(level)]['total_tok_s'] for _, e in pts]
        ax.plot([i for i, _ in pts], ys, '-', color=color, alpha=.6, lw=2.5 if level == top else 1,
                label='concurrency {0}'.format(level))
        for (i, e), y in zip(pts, ys, strict=True):
            ax.plot(i, y, 'o' if e.get('passed') else 'x', color=color if e.get('passed') else 'tab:red', ms=7, mew=2)
    ax.set_yscale('log')
    ax.set_xticks(range(len(entries)))
    ax.set_xticklabels(['{0}{1}'.format(e['run'][:15], ' (rb)' if e.get('rolled_back') else '') for e in entries],
                       rotation=45, ha='right', fontsize=7)
    ax.set_ylabel('total tok/s')
    ax.set_title('Total tok/s per concurrency level across runs (o passed, x failed, rb rolled back)')
    ax.grid(True, which='both', alpha=.3)
    if levels:
        ax.legend(fontsize=8, loc='upper left', bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(run_dir, summary, samples, previous):
    """summary.json, report.md and the PNGs into run_dir. -> the files written."""
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, 'summary.json'), 'w') as fh:
        json.dump(summary, fh, indent=1, sort_keys=True)
        fh.write('\n')
    plots = []
    if summary['levels']:
        plot_throughput(summary, previous, os.path.join(run_dir, 'throughput.png'))
        plot_latency(summary, previous, os.path.join(run_dir, 'latency.png'))
        plots += ['throughput.png', 'latency.png']
    plot_gpus(samples, os.path.join(run_dir, 'gpus.png'), (summary.get('meta') or {}).get('gpu_source'))
    plots.append('gpus.png')
    # the report links the plots that were drawn (a run whose sweep never ran has no throughput or latency plot)
    with open(os.path.join(run_dir, 'report.md'), 'w') as fh:
        fh.write(markdown(summary))
        fh.write('\n\n' + ''.join('![{0}]({1})\n'.format(name[:-len('.png')], name) for name in plots))
    return ['summary.json', 'report.md'] + plots
