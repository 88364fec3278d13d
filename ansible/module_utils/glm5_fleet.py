"""The fleet smoke test's figures: a sweep through the gateway judged against the nodes behind it.

Each level is a per-node concurrency c. First every node is driven directly at c, all at once (each from its own
SGLang environment at its own engine: the load the gateway gives each, without the gateway), then the gateway at
c x nodes. The gates: every request completed, directly and through the gateway; the fleet's total tok/s at least the
sum of the nodes' baselines at c (each at its own pace) x tolerance; the p99 TTFT the gateway adds (the fleet's p99
less the slowest node's p99 when driven directly at the same moment's load) at most a limit. The reference is
measured in the same run under the same load, not taken from each node's own sweep minutes earlier, when the other
nodes were idle: on hosts that share CPUs (the lab's two) that difference alone was +558 ms, blamed on the gateway.
"""
from __future__ import annotations

import datetime
import json
import os

from ansible.module_utils.glm5_plots import _pyplot, _save, plot_trend
from ansible.module_utils.glm5_report import merge_index
from ansible.module_utils.glm5_results import by_level, fmt, is_number, level_metrics, prompts_for, read_jsonl, scaled

SETTING_KEYS = ('levels', 'input_len', 'output_len', 'range_ratio', 'prompts_per_concurrency', 'min_prompts',
                'tolerance', 'ttft_overhead_ms')


def _positive_int(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def problems(s):
    """What is wrong with the fleet smoke test's settings, one line each."""
    out = []
    levels = s.get('levels')
    if not isinstance(levels, list) or not levels or not all(_positive_int(x) for x in levels):
        out.append('sglang_smoke_fleet_levels must be a non-empty list of per-node concurrencies >= 1, got {0}'.format(
            json.dumps(levels)))
    elif len(set(levels)) != len(levels):
        out.append('sglang_smoke_fleet_levels lists a level twice: {0}'.format(levels))
    tol = s.get('tolerance')
    if not is_number(tol) or not 0 < tol <= 1:
        out.append('the tolerance must be a number in (0, 1], got {0}'.format(json.dumps(tol)))
    limit = s.get('ttft_overhead_ms')
    if limit is not None and (not is_number(limit) or limit <= 0):
        out.append('sglang_smoke_fleet_ttft_overhead_ms must be a number of ms > 0 (or null: not gated), got '
                   '{0}'.format(json.dumps(limit)))
    nodes = s.get('nodes')
    if not isinstance(nodes, list) or not nodes:
        out.append('the gateway has no nodes whose smoke test ran in this play: nothing to judge the fleet against')
        return out
    for n in nodes:
        speed = n.get('speed_factor', 1)
        if not is_number(speed) or speed <= 0:
            out.append('{0}: its sglang_smoke_speed_factor must be a number > 0, got {1}'.format(
                n.get('name'), json.dumps(speed)))
    return out


def node_baselines(nodes):
    """{node: {level: row}}: each node's baseline at its own pace (its speed factor)."""
    return {n['name']: by_level(scaled({'baseline': n.get('baseline') or {}, 'limits': {},
                                        'speed_factor': n.get('speed_factor', 1)})['baseline'])
            for n in nodes}


def expected_total(nodes, level):
    """The sum of the nodes' baseline total tok/s at a per-node level, or None when a node has none there."""
    rows = [b.get(level) or {} for b in node_baselines(nodes).values()]
    values = [r.get('total_tok_s') for r in rows]
    return round(float(sum(values)), 2) if values and all(is_number(v) for v in values) else None


def reference(item, direct_records, nodes):
    """The nodes driven directly at the level's per-node concurrency, all at once, in this run (item['direct']: one
    sglang_bench result a node, its line in that node's direct_records). -> {p99_ttft_ms (the slowest node's),
    total_tok_s (their sum), nodes: [{node, p99_ttft_ms, total_tok_s, completed, failed}], missing: [{node, why}]}:
    a node without a result, or with failed requests, is missing (and fails the level)."""
    found, missing = [], []
    by_node = {d.get('node'): d for d in item.get('direct') or []}
    for n in nodes:
        d = by_node.get(n['name'])
        records = direct_records.get(n['name']) or []
        line = (d or {}).get('line')
        record = records[line] if line is not None and 0 <= line < len(records) else None
        if d is None or record is None:
            why = 'not run' if d is None else ((d.get('engine') or d.get('error') or 'no result line').rstrip('.'))
            missing.append({'node': n['name'], 'why': why})
            continue
        m = level_metrics(record, d.get('concurrency') or item.get('per_node') or 0, d.get('prompts') or 0)
        row = {'node': n['name'], 'p99_ttft_ms': m['p99_ttft_ms'], 'total_tok_s': m['total_tok_s'],
               'completed': m['completed'], 'failed': m['failed']}
        found.append(row)
        if m['failed'] or not is_number(m['p99_ttft_ms']):
            missing.append({'node': n['name'], 'why': '{0} of {1} requests completed'.format(
                fmt(m['completed']), m['prompts'])})
    ok = found and not missing
    totals = [f['total_tok_s'] for f in found]
    return {'p99_ttft_ms': max(f['p99_ttft_ms'] for f in found) if ok else None,
            'total_tok_s': round(sum(totals), 2) if ok and all(is_number(t) for t in totals) else None,
            'nodes': found, 'missing': missing}


def evaluate(sweep, records, settings, direct_records):
    """sweep: the sglang_bench results through the gateway (concurrency c x nodes), in settings['levels'] order, each
    with its level's direct runs (direct: [{node, line, ...}]); records: the gateway's result lines; direct_records:
    {node: its direct result lines}."""
    nodes = settings['nodes']
    tol = settings['tolerance']
    limit = settings.get('ttft_overhead_ms')
    levels = []
    for per_node, item in zip(settings['levels'], sweep, strict=False):
        line = item.get('line')
        record = records[line] if line is not None and 0 <= line < len(records) else None
        metrics = level_metrics(record, item['concurrency'], item.get('prompts') or 0)
        expected = expected_total(nodes, per_node)
        ref = reference(dict(item, per_node=per_node), direct_records, nodes)
        gates = []
        if ref['missing']:
            gates.append({'gate': 'direct', 'passed': False, 'value': len(ref['missing']), 'threshold': 0,
                          'text': 'driven directly at {0} each, without the gateway: {1}'.format(
                              per_node, '; '.join('{0}: {1}'.format(m['node'], m['why']) for m in ref['missing']))})
        if metrics.get('completed') is None:
            gates.append({'gate': 'result', 'passed': False, 'value': None, 'threshold': None,
                          'text': 'no result from bench_serving through the gateway at concurrency {0}{1}'.format(
                              item['concurrency'], ': ' + item['error'] if item.get('error') else '')})
        else:
            failed = metrics['failed']
            gates.append({'gate': 'completed', 'passed': failed == 0, 'value': metrics['completed'],
                          'threshold': metrics['prompts'], 'text': '{0} of {1} requests completed{2}'.format(
                              metrics['completed'], metrics['prompts'],
                              '' if failed == 0 else ' ({0} failed)'.format(failed))})
            if expected is not None:
                need = expected * tol
                value = metrics.get('total_tok_s')
                ok = value is not None and value >= need
                gates.append({'gate': 'total_tok_s', 'passed': ok, 'value': value, 'threshold': round(need, 2),
                              'text': 'total tok/s {0} {1} {2:,.1f} (the {3} nodes\' baselines at {4} each, '
                                      '{5:,.1f} in all, x {6:g})'.format(fmt(value), '>=' if ok else '<', need,
                                                                          len(nodes), per_node, expected, tol)})
            overhead = None
            if ref['p99_ttft_ms'] is not None and metrics.get('p99_ttft_ms') is not None:
                overhead = metrics['p99_ttft_ms'] - ref['p99_ttft_ms']
            if limit is not None and overhead is not None:
                ok = overhead <= limit
                slow = max(ref['nodes'], key=lambda r: r['p99_ttft_ms'])
                gates.append({'gate': 'ttft_overhead_ms', 'passed': ok, 'value': round(overhead, 1),
                              'threshold': limit,
                              'text': 'p99 TTFT added by the gateway {0:+,.1f} ms {1} {2:g} (through it {3} ms; the '
                                      'nodes driven directly at {4} each at once: the slowest, {5}, {6} ms)'.format(
                                          overhead, '<=' if ok else '>', limit, fmt(metrics['p99_ttft_ms']),
                                          per_node, slow['node'], fmt(slow['p99_ttft_ms']))})
            if item.get('engine'):
                gates.append({'gate': 'engine', 'passed': False, 'value': None, 'threshold': None,
                              'text': item['engine']})
        levels.append({'concurrency': item['concurrency'], 'per_node': per_node, 'metrics': metrics,
                       'expected_total_tok_s': expected, 'reference': ref,
                       'ttft_overhead_ms': None if metrics.get('completed') is None or ref['p99_ttft_ms'] is None
                       or metrics.get('p99_ttft_ms') is None else round(metrics['p99_ttft_ms'] - ref['p99_ttft_ms'], 1),
                       'gates': gates, 'passed': all(g['passed'] for g in gates)})
    return levels


def build_summary(run_id, started, meta, settings, probe, levels):
    reasons = []
    if probe is not None and not probe.get('passed'):
        reasons.append('probe through the gateway: ' + '; '.join(probe.get('problems') or ['failed']))
    for lv in levels:
        for g in lv['gates']:
            if not g['passed']:
                reasons.append('concurrency {0} ({1} a node): {2}'.format(lv['concurrency'], lv['per_node'], g['text']))
    if probe is not None and probe.get('passed') and not levels:
        reasons.append('no sweep level ran')
    notes = []
    top = max(levels, key=lambda x: x['concurrency']) if levels else None
    return {
        'run': run_id, 'started': started,
        'finished': datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ'),
        'passed': probe is not None and bool(probe.get('passed')) and bool(levels) and all(x['passed'] for x in levels),
        'reasons': reasons, 'notes': notes, 'meta': meta,
        'settings': {k: settings.get(k) for k in SETTING_KEYS},
        'nodes': [{'name': n['name'], 'url': n.get('url'), 'flags_sha256': n.get('flags_sha256'),
                   'speed_factor': n.get('speed_factor', 1)} for n in settings['nodes']],
        'probe': probe, 'levels': levels,
        'headline': None if top is None or top['metrics'].get('total_tok_s') is None else {
            'concurrency': top['concurrency'], 'total_tok_s': top['metrics']['total_tok_s'],
            'output_tok_s': top['metrics'].get('output_tok_s')},
    }


def markdown(s):
    m = s.get('meta') or {}
    lines = ['# Fleet smoke test {0}: {1}'.format(s['run'], 'PASSED' if s['passed'] else 'FAILED'), '',
             'Gateway {0} ({1}), policy {2}; nodes: {3}. Started {4}, finished {5}.'.format(
                 m.get('gateway'), m.get('url'), m.get('policy'),
                 ', '.join('{0} (flags {1})'.format(n['name'], (n.get('flags_sha256') or '')[:12]) for n in s['nodes']),
                 s['started'], s['finished']), '']
    if m.get('drained'):
        lines += ['Drained by an operator, out of the gateway and not counted: {0}.'.format(', '.join(m['drained'])), '']
    if s.get('probe') is not None:
        p = s['probe']
        lines += ['Probe through the gateway: {0}'.format('passed ({0} answers)'.format(len(p.get('results') or []))
                                                          if p.get('passed') else 'FAILED: ' +
                                                          '; '.join(p.get('problems') or [])), '']
    if s['levels']:
        lines += ['| concurrency (a node) | completed | total tok/s | nodes\' baselines (sum) | nodes directly (sum) '
                  '| p99 TTFT ms | slowest node directly | added by the gateway | verdict |',
                  '|---:|---:|---:|---:|---:|---:|---:|---:|:---|']
        for lv in s['levels']:
            x, ref = lv['metrics'], lv['reference']
            lines.append('| {0} ({1}) | {2} of {3} | {4} | {5} | {6} | {7} | {8} | {9} | {10} |'.format(
                lv['concurrency'], lv['per_node'], fmt(x.get('completed')), fmt(x.get('prompts')),
                fmt(x.get('total_tok_s')), fmt(lv['expected_total_tok_s']), fmt(ref['total_tok_s']),
                fmt(x.get('p99_ttft_ms')), fmt(ref['p99_ttft_ms']),
                'n/a' if lv['ttft_overhead_ms'] is None else '{0:+,.1f} ms'.format(lv['ttft_overhead_ms']),
                'pass' if lv['passed'] else 'FAIL'))
        lines.append('')
    if s['reasons']:
        lines += ['Why it failed:', ''] + ['- ' + r for r in s['reasons']] + ['']
    lines += s.get('notes') or []
    return '\n'.join(lines).rstrip('\n') + '\n'


def plot_fleet(summary, path):
    """Per level, bars: the fleet's total tok/s through the gateway, the nodes driven directly at once (summed), the
    summed baseline and its gate; the fleet's p99 TTFT, the slowest node's directly, and that plus the gateway's
    allowance."""
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    levels = summary['levels']
    names = ['{0}\n({1} a node)'.format(lv['concurrency'], lv['per_node']) for lv in levels]
    xs = list(range(len(levels)))
    limit = (summary.get('settings') or {}).get('ttft_overhead_ms')
    tol = (summary.get('settings') or {}).get('tolerance') or 1

    def bars(ax, offset, values, color, label):
        pts = [(x + offset, v) for x, v in zip(xs, values, strict=True) if v is not None]
        if pts:     # a figure no level has (no baseline at 1 a node) gets no bar and no legend entry
            ax.bar([p[0] for p in pts], [p[1] for p in pts], width=0.26, color=color, label=label)
    bars(ax1, -0.28, [lv['metrics'].get('total_tok_s') for lv in levels], 'tab:blue', 'through the gateway')
    bars(ax1, 0, [lv['reference']['total_tok_s'] for lv in levels], 'tab:green', 'the nodes directly at once, summed')
    bars(ax1, 0.28, [lv['expected_total_tok_s'] for lv in levels], 'tab:gray', 'the nodes\' baselines, summed')
    for x, lv in zip(xs, levels, strict=True):
        if lv['expected_total_tok_s'] is not None:
            ax1.hlines(lv['expected_total_tok_s'] * tol, x - 0.45, x + 0.45, colors='tab:red', linestyles='--',
                       label='gate (baselines x {0:g})'.format(tol) if x == 0 else None)
        if not lv['passed'] and lv['metrics'].get('total_tok_s') is not None:
            ax1.plot(x - 0.28, lv['metrics']['total_tok_s'], 'x', color='tab:red', ms=12, mew=3)
    ax1.set_ylabel('total tok/s')
    ax1.set_title('Fleet throughput by concurrency')
    bars(ax2, -0.14, [lv['metrics'].get('p99_ttft_ms') for lv in levels], 'tab:blue', 'p99 TTFT through the gateway')
    bars(ax2, 0.14, [lv['reference']['p99_ttft_ms'] for lv in levels], 'tab:green', 'p99 TTFT, slowest node directly')
    if limit is not None:
        for x, lv in zip(xs, levels, strict=True):
            if lv['reference']['p99_ttft_ms'] is not None:
                ax2.hlines(lv['reference']['p99_ttft_ms'] + limit, x - 0.45, x + 0.45, colors='tab:red',
                           linestyles='--', label='directly + {0:g} ms (gate)'.format(limit) if x == 0 else None)
            if lv['ttft_overhead_ms'] is not None:
                ax2.annotate('{0:+,.0f} ms'.format(lv['ttft_overhead_ms']), (x - 0.14, lv['metrics']['p99_ttft_ms']),
                             textcoords='offset points', xytext=(0, 4), ha='center', fontsize=8)
    ax2.set_ylabel('ms')
    ax2.set_title('p99 time to first token')
    for ax in (ax1, ax2):
        ax.set_xticks(xs)
        ax.set_xticklabels(names)
        ax.set_xlim(-0.6, len(xs) - 0.4)                 # each level's group centred on its tick
        ax.set_xlabel('concurrent requests through the gateway')
        ax.grid(True, axis='y', alpha=.3)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.35)         # room above the bars for the legend
        if ax.get_legend_handles_labels()[0]:          # a level that ran nothing draws nothing to name
            ax.legend(fontsize=8, loc='upper right', ncol=2)
    fig.suptitle('Fleet smoke test {0}: {1}'.format(summary['run'], 'passed' if summary['passed'] else 'FAILED'))
    _save(plt, fig, path)


def index_entry(s):
    h = s.get('headline') or {}
    return {'run': s['run'], 'started': s['started'], 'passed': s['passed'], 'node': (s.get('meta') or {}).get('gateway'),
            'gateway': (s.get('meta') or {}).get('gateway'), 'nodes': [n['name'] for n in s['nodes']],
            'flags_sha256': [n.get('flags_sha256') for n in s['nodes']],
            'headline_concurrency': h.get('concurrency'), 'headline_total_tok_s': h.get('total_tok_s'),
            'levels': {str(lv['concurrency']): {'total_tok_s': lv['metrics'].get('total_tok_s'),
                                                'expected_total_tok_s': lv['expected_total_tok_s'],
                                                'p99_ttft_ms': lv['metrics'].get('p99_ttft_ms'),
                                                'ttft_overhead_ms': lv['ttft_overhead_ms'],
                                                'failed': lv['metrics'].get('failed')}
                       for lv in s['levels']},
            'reasons': s['reasons'][:3]}


def index_markdown(entries):
    lines = ['# Fleet smoke-test runs', '', '![trend](trend.png)', '',
             '| run | gateway | nodes | verdict | headline total tok/s | added p99 TTFT | note |',
             '|:---|:---|:---|:---|---:|---:|:---|']
    for e in reversed(entries):
        top = (e.get('levels') or {}).get(str(e.get('headline_concurrency'))) or {}
        lines.append('| [{0}]({0}/report.md) | {1} | {2} | {3} | {4} | {5} | {6} |'.format(
            e['run'], e.get('gateway') or '', ', '.join(e.get('nodes') or []), 'pass' if e.get('passed') else 'FAIL',
            '{0} @{1}'.format(fmt(e.get('headline_total_tok_s')), e.get('headline_concurrency'))
            if e.get('headline_total_tok_s') is not None else '-',
            '-' if top.get('ttft_overhead_ms') is None else '{0:+,.1f} ms'.format(top['ttft_overhead_ms']),
            ((e.get('reasons') or [''])[0] if not e.get('passed') else '')[:80].replace('|', '/')))
    return '\n'.join(lines) + '\n'


def sweep_plan(settings):
    """[{per_node, direct_prompts, concurrency, prompts}]: at each level, what each node is sent directly (per_node
    concurrent, direct_prompts in all), then what the sweep sends through the gateway."""
    n = len(settings['nodes'])
    ppc, least = settings['prompts_per_concurrency'], settings['min_prompts']
    return [{'per_node': c, 'direct_prompts': prompts_for(c, ppc, least), 'concurrency': c * n,
             'prompts': prompts_for(c * n, ppc, least)} for c in settings['levels']]


def direct_file(node):
    """The run folder's file of a node's direct result lines (bench.jsonl is the gateway's)."""
    return 'direct-{0}.jsonl'.format(node)


def write(run_dir, history_dir, run_id, started, meta, settings, probe, sweep):
    """Judge the run, write its folder (summary.json, report.md, fleet.png) and the history's index, index.md and
    trend.png. -> (summary, files in run_dir, files in history_dir)."""
    records = read_jsonl(os.path.join(run_dir, 'bench.jsonl'))
    direct = {n['name']: read_jsonl(os.path.join(run_dir, direct_file(n['name']))) for n in settings['nodes']}
    levels = evaluate(sweep, records, settings, direct)
    summary = build_summary(run_id, started, meta, settings, probe, levels)
    summary['sweep'] = sweep
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, 'summary.json'), 'w') as fh:
        json.dump(summary, fh, indent=1, sort_keys=True)
        fh.write('\n')
    files = ['summary.json', 'report.md']
    plots = []
    if levels:
        plot_fleet(summary, os.path.join(run_dir, 'fleet.png'))
        plots.append('fleet.png')
    with open(os.path.join(run_dir, 'report.md'), 'w') as fh:
        fh.write(markdown(summary))
        fh.write(''.join('\n![{0}]({1})\n'.format(p[:-4], p) for p in plots))
    index_path = os.path.join(history_dir, 'index.jsonl')
    entries = merge_index(read_jsonl(index_path), index_entry(summary))
    os.makedirs(history_dir, exist_ok=True)
    with open(index_path, 'w') as fh:
        for e in entries:
            fh.write(json.dumps(e, sort_keys=True) + '\n')
    with open(os.path.join(history_dir, 'index.md'), 'w') as fh:
        fh.write(index_markdown(entries))
    plot_trend(entries, os.path.join(history_dir, 'trend.png'))
    return summary, files + plots, ['index.jsonl', 'index.md', 'trend.png']
