"""The smoke test's settings, its bench_serving results and their gates, the GPU figures and the run's summary, as
plain functions (no Ansible, no network, standard library only).

Used by sglang_smoke_report (validation, gates and the summary, on the controller), by the report's other parts
(glm5_report: Markdown, index, compare; glm5_plots: the plots) and by the tests on golden files from a real
bench_serving run. The probe's judging is in glm5_probe (what the container gets).
"""
from __future__ import annotations

import datetime
import json
import math
import os
import re

from ansible.module_utils.glm5_probe import usable_probe

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


# ---------------------------------------------------------------- validation
def is_number(value):
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
    if not is_number(ratio) or not 0.0 <= ratio <= 1.0:
        problems.append('sglang_smoke_range_ratio must be a number from 0.0 (lengths uniform in [1, L], the seeds) '
                        'to 1.0 (fixed lengths), got {0!r}'.format(ratio))
    for key in ('prompts_per_concurrency', 'min_prompts'):
        value = cfg.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append('sglang_smoke_{0} must be a whole number >= 1, got {1!r}'.format(key, value))
    speed = cfg.get('speed_factor', 1)
    if not is_number(speed) or not speed > 0 or speed == float('inf'):
        problems.append('sglang_smoke_speed_factor must be a number > 0 (1 on a real node; the lab\'s test speed '
                        'of its engine emulator otherwise), got {0!r}'.format(speed))
    tol = cfg.get('tolerance')
    if not is_number(tol) or not 0.0 < tol <= 1.0:
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
                elif v is not None and (not is_number(v) or v <= 0):
                    problems.append('sglang_smoke_{0}[{1}].{2} must be a positive number or null (not gated), '
                                    'got {3!r}'.format(name, level, k, v))
    probes = cfg.get('probes')
    if not isinstance(probes, list) or not probes:
        problems.append('sglang_smoke_probes must be a non-empty list of {prompt, expect}')
    else:
        for i, probe in enumerate(probes):
            if not usable_probe(probe):
                problems.append('sglang_smoke_probes[{0}] needs a non-empty prompt and expect, both text (quote a '
                                'number: expect: "42"), got {1!r}'.format(i, probe))
    return problems


def prompts_for(level, per_concurrency, minimum):
    """How many prompts a level sends: enough to fill it several times over (steady state), at least minimum."""
    return max(int(minimum), int(per_concurrency) * int(level))


# ---------------------------------------------------------------- bench_serving results
def parse_jsonl(text):
    """JSON Lines (bench_serving's --output-file, the GPU samples, the history's index): one object per line."""
    out = []
    for n, line in enumerate((text or '').splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise ValueError('line {0} is not JSON: {1}'.format(n, exc)) from None
        if not isinstance(item, dict):
            raise ValueError('line {0} is not a JSON object: {1}'.format(n, line[:80]))
        out.append(item)
    return out


def read_jsonl(path):
    """A JSON Lines file parsed ([] when there is none); a bad line names the file."""
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        try:
            return parse_jsonl(fh.read())
        except ValueError as exc:
            raise ValueError('{0}: {1}'.format(path, exc)) from None


def level_metrics(record, concurrency, prompts):
    """One bench_serving result line -> our per-level figures. failed = prompts sent - completed (bench_serving has
    no failed key)."""
    out = {'concurrency': int(concurrency), 'prompts': int(prompts)}
    for src, dst in METRICS.items():
        value = (record or {}).get(src)
        out[dst] = value if is_number(value) else None
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
    out['baseline'] = {level: {k: (v * speed if is_number(v) else v) for k, v in (row or {}).items()}
                       for level, row in (cfg.get('baseline') or {}).items()}
    out['limits'] = {level: {k: (v / speed if is_number(v) else v) for k, v in (row or {}).items()}
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
                          label, fmt(value), '>=' if ok else '<', need, base, tolerance)})
    for key, label in LATENCY_GATES:
        limit = (limits or {}).get(key)
        if limit is None:
            continue
        value = metrics.get(key)
        ok = value is not None and value <= limit
        gates.append({'gate': key, 'value': value, 'threshold': limit, 'passed': ok,
                      'text': '{0} {1} {2} {3:g}'.format(label, fmt(value), '<=' if ok else '>', limit)})
    return gates


def fmt(value, digits=1):
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
                if is_number(g.get(key)):
                    row[dst].append(g[key])

    def mean(xs):
        return round(sum(xs) / len(xs), 1) if xs else None
    return {level: {'samples': r['n'], 'mean_power_w': mean(r['power']), 'max_power_w': max(r['power'] or [None],
                    key=lambda x: -1 if x is None else x),
                    'power_limit_w': mean(r['limit']), 'mean_util_pct': mean(r['util']),
                    'max_memory_used_mib': max(r['mem']) if r['mem'] else None, 'mean_sm_mhz': mean(r['sm'])}
            for level, r in out.items()}


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
                fmt(g.get('mean_util_pct'), 0))


# ---------------------------------------------------------------- summary
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
