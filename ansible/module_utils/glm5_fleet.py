"""The fleet smoke test's figures: a sweep through the gateway judged against the nodes behind it.

Each level is a per-node concurrency c. First every node is driven directly at c, all at once (a bench_serving on
each node at its own engine), then the same clients through the gateway (a bench_serving on each node at c against
the gateway: c x nodes in all). The only difference between the two is the gateway in the path. The gates: every
request completed, directly and through the gateway; the fleet's total tok/s at least the sum of the nodes' baselines
at c (each at its own pace) x tolerance - or, where the engines served other clients as the level's clients started
(a deploy under live traffic, where the test gets only its share of them), at least the nodes' own total driven
directly at once in the same run x tolerance; the p99 TTFT the gateway adds (the slowest client's p99 through it less
the slowest node's directly) at most a limit. Measured so, not against each node's own sweep minutes earlier with the
other nodes idle (on the lab's two shared CPUs that alone was +558 ms), nor with one client at c x nodes (one Python
process holding twice the streams: +286 ms more there).
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


def gateway_problems(s, levels_given=True):
    """What is wrong with the fleet smoke test's settings that are set on the gateway (levels, ttft_overhead_ms, poll:
    sglang_smoke_fleet_*), one line each. levels_given=False: before the nodes' smoke tests (site.yml's first play),
    where empty levels are the nodes' common top level, known only after them."""
    out = []
    levels = s.get('levels')
    if levels_given or levels:
        if not isinstance(levels, list) or not levels or not all(_positive_int(x) for x in levels):
            out.append('sglang_smoke_fleet_levels must be a non-empty list of per-node concurrencies >= 1, got '
                       '{0}'.format(json.dumps(levels)))
        elif len(set(levels)) != len(levels):
            out.append('sglang_smoke_fleet_levels lists a level twice: {0}'.format(levels))
    limit = s.get('ttft_overhead_ms')
    if limit is not None and (not is_number(limit) or limit <= 0):
        out.append('sglang_smoke_fleet_ttft_overhead_ms must be a number of ms > 0 (or null: not gated), got '
                   '{0}'.format(json.dumps(limit)))
    if 'poll' in s and not _positive_int(s['poll']):
        out.append('sglang_smoke_fleet_poll must be a whole number of seconds >= 1, got {0}'.format(json.dumps(s['poll'])))
    return out


def problems(s):
    """What is wrong with the fleet smoke test's settings, one line each: the gateway's (gateway_problems), the
    nodes' tolerance, and the nodes themselves."""
    out = gateway_problems(s)
    tol = s.get('tolerance')
    if not is_number(tol) or not 0 < tol <= 1:
        out.append('the tolerance must be a number in (0, 1], got {0}'.format(json.dumps(tol)))
    for key in ('prompts_per_concurrency', 'min_prompts'):      # the sweep's plan counts its prompts from them
        if not _positive_int(s.get(key)):
            out.append('{0} must be a whole number >= 1 (the nodes\' sglang_smoke_{0}), got {1}'.format(
                key, json.dumps(s.get(key))))
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


SUMMED = ('completed', 'input_tokens', 'output_tokens', 'requests_per_s', 'input_tok_s', 'output_tok_s', 'total_tok_s',
          'peak_output_tok_s', 'peak_concurrent_requests')


def combined(parts, concurrency, prompts):
    """Several clients' level_metrics, run at the same time, as one: counts and throughputs summed, means weighted by
    the requests completed, every other figure (p99s, medians, duration) the slowest client's."""
    out = {'concurrency': int(concurrency), 'prompts': int(prompts)}
    done = sum(p.get('completed') or 0 for p in parts)
    for key in parts[0] if parts else []:
        if key in ('concurrency', 'prompts', 'failed', 'node'):
            continue
        values = [p.get(key) for p in parts]
        if not all(is_number(v) for v in values):
            out[key] = None
        elif key in SUMMED:
            out[key] = round(sum(values), 2)
        elif key.startswith('mean_') and done:
            out[key] = round(sum(v * (p.get('completed') or 0) for v, p in zip(values, parts, strict=True)) / done, 2)
        else:
            out[key] = max(values)
    out['failed'] = int(prompts) - int(out.get('completed') or 0)
    return out


def percentile(values, q):
    """numpy's default (linear) percentile, as bench_serving computes its p99s."""
    xs = sorted(values)
    if not xs:
        return None
    rank = (len(xs) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(xs) - 1)
    return xs[low] + (xs[high] - xs[low]) * (rank - low)


def after_first_wave(record, per_node):
    """The p99 TTFT (ms) of a client's requests after its first wave (the first per_node requests, sent at once, each
    opening its connection: TLS handshakes through the gateway, all at the same moment), from the line's ttfts
    (sglang_bench's ttfts); None without them or without a request after the first wave."""
    ttfts = record.get('ttfts') if isinstance(record, dict) else None
    rest = [t for t in (ttfts or [])[per_node:] if is_number(t)]
    return round(percentile(rest, 99) * 1000, 2) if rest else None


def clients(runs, records, names, per_node, prompts_each):
    """One bench_serving a node, all at the same time (runs: the sglang_bench results, each with node and its line in
    records[node]). -> (their figures combined, or None when one has no result; [each client's figures, with node];
    [(node, why) for each without a result])."""
    parts, missing = [], []
    by_node = {r.get('node'): r for r in runs or []}
    for name in names:
        run = by_node.get(name)
        lines = records.get(name) or []
        line = (run or {}).get('line')
        record = lines[line] if line is not None and 0 <= line < len(lines) else None
        if run is None or record is None:
            missing.append((name, 'not run' if run is None
                            else (run.get('engine') or run.get('error') or 'no result line').rstrip('.')))
            continue
        parts.append(dict(level_metrics(record, per_node, run.get('prompts') or prompts_each), node=name,
                          steady_p99_ttft_ms=after_first_wave(record, per_node)))
    together = combined(parts, per_node * len(names), prompts_each * len(names)) if parts and not missing else None
    return together, parts, missing


def ttft_figures(through, direct):
    """The p99 TTFTs the gateway is judged on: after the first wave when both sides have them (each client's first
    requests open their connections all at once: on a host short of CPUs their TLS handshakes through the gateway
    are the whole tail), else over every request; both kept. -> {steady, through, direct, through_all, direct_all}."""
    t, d = through or {}, direct or {}
    steady = is_number(t.get('steady_p99_ttft_ms')) and is_number(d.get('steady_p99_ttft_ms'))
    key = 'steady_p99_ttft_ms' if steady else 'p99_ttft_ms'
    return {'steady': steady, 'through': t.get(key), 'direct': d.get(key),
            'through_all': t.get('p99_ttft_ms'), 'direct_all': d.get('p99_ttft_ms')}


def others_served(others, names):
    """What the engines served for other clients as a level's clients started ({how: {node: count or None}}, how =
    direct or gateway) -> {direct, gateway (each {node: count or None}), most (the larger of the two starts' sums over
    the nodes that answered), unknown ([node] whose load report could not be read at either start)}."""
    out = {how: {n: ((others or {}).get(how) or {}).get(n) for n in names} for how in ('direct', 'gateway')}
    sums = [sum(v for v in out[how].values() if is_number(v)) for how in ('direct', 'gateway')]
    out['most'] = int(max(sums))
    out['unknown'] = [n for n in names if any(not is_number(out[how][n]) for how in ('direct', 'gateway'))]
    return out


def evaluate(sweep, settings, records):
    """sweep: one item a level, in settings['levels'] order: {concurrency, prompts, prompts_each, direct: [the nodes'
    sglang_bench results, each at its own engine], gateway: [the same nodes' through the gateway]}; records:
    {'direct': {node: result lines}, 'gateway': {node: result lines}}."""
    nodes = settings['nodes']
    names = [n['name'] for n in nodes]
    tol = settings['tolerance']
    limit = settings.get('ttft_overhead_ms')
    levels = []
    for per_node, item in zip(settings['levels'], sweep, strict=False):
        each = item['prompts_each']
        direct, direct_parts, direct_missing = clients(item.get('direct'), records.get('direct') or {}, names,
                                                       per_node, each)
        through, parts, missing = clients(item.get('gateway'), records.get('gateway') or {}, names, per_node, each)
        metrics = through or dict(level_metrics(None, per_node * len(names), each * len(names)), failed=None)
        expected = expected_total(nodes, per_node)
        others = others_served(item.get('others'), names)
        ttft = ttft_figures(through, direct)
        ref = {'p99_ttft_ms': None if direct is None or direct['failed'] else ttft['direct'],
               'total_tok_s': None if direct is None or direct['failed'] else direct.get('total_tok_s'),
               'metrics': direct, 'nodes': direct_parts,
               'missing': [{'node': name, 'why': why} for name, why in direct_missing]
               + [{'node': p['node'], 'why': '{0} of {1} requests completed'.format(fmt(p['completed']), p['prompts'])}
                  for p in direct_parts if p['failed']]}
        overhead = None if through is None or ref['p99_ttft_ms'] is None or ttft['through'] is None \
            else ttft['through'] - ref['p99_ttft_ms']
        gates = []
        if ref['missing']:
            gates.append({'gate': 'direct', 'passed': False, 'value': len(ref['missing']), 'threshold': 0,
                          'text': 'driven directly at {0} each, without the gateway: {1}'.format(
                              per_node, '; '.join('{0}: {1}'.format(m['node'], m['why']) for m in ref['missing']))})
        if through is None:
            gates.append({'gate': 'result', 'passed': False, 'value': None, 'threshold': None,
                          'text': 'no result from bench_serving through the gateway at {0} a client ({1})'.format(
                              per_node, '; '.join('from {0}: {1}'.format(name, why) for name, why in missing))})
        else:
            failed = metrics['failed']
            gates.append({'gate': 'completed', 'passed': failed == 0, 'value': metrics['completed'],
                          'threshold': metrics['prompts'], 'text': '{0} of {1} requests completed{2}'.format(
                              metrics['completed'], metrics['prompts'],
                              '' if failed == 0 else ' ({0} failed)'.format(failed))})
            value = metrics.get('total_tok_s')
            # the engines served other clients too (a deploy under live traffic): the test had only its share of them,
            # both ways - the nodes driven at once in this run are the reference, not their idle baselines (a node
            # without a direct result already fails the level: no reference then)
            busy = others['most'] > 0
            total = ref['total_tok_s'] if busy else expected
            if total is not None:
                need = total * tol
                ok = value is not None and value >= need
                basis = ('the {0} nodes driven directly at {1} each at once in this run, {2:,.1f} in all, x {3:g}: '
                         'their engines were serving {4} requests of other clients as the clients started, so their '
                         'baselines, an idle fleet\'s, are not the reference' if busy
                         else 'the {0} nodes\' baselines at {1} each, {2:,.1f} in all, x {3:g}').format(
                             len(nodes), per_node, total, tol, others['most'])
                gates.append({'gate': 'total_tok_s', 'reference': 'direct' if busy else 'baselines', 'passed': ok,
                              'value': value, 'threshold': round(need, 2),
                              'text': 'total tok/s {0} {1} {2:,.1f} ({3})'.format(fmt(value), '>=' if ok else '<',
                                                                                  need, basis)})
            if limit is not None and overhead is not None:
                ok = overhead <= limit
                key = 'steady_p99_ttft_ms' if ttft['steady'] else 'p99_ttft_ms'
                slow = max(direct_parts, key=lambda r: r[key])
                gates.append({'gate': 'ttft_overhead_ms', 'passed': ok, 'value': round(overhead, 1),
                              'threshold': limit,
                              'text': 'p99 TTFT{0} added by the gateway {1:+,.1f} ms {2} {3:g} (through it {4} ms, the '
                                      'slowest of {5} clients at {6}; the nodes driven directly at {6} each at once: '
                                      'the slowest, {7}, {8} ms)'.format(
                                          ' after the first wave' if ttft['steady'] else '', overhead,
                                          '<=' if ok else '>', limit, fmt(ttft['through']), len(names), per_node,
                                          slow['node'], fmt(slow[key]))})
            engines = [r.get('engine') for r in (item.get('gateway') or []) + (item.get('direct') or [])
                       if r.get('engine')]
            for text in dict.fromkeys(engines):
                gates.append({'gate': 'engine', 'passed': False, 'value': None, 'threshold': None, 'text': text})
        levels.append({'concurrency': per_node * len(names), 'per_node': per_node, 'metrics': metrics,
                       'clients': parts, 'expected_total_tok_s': expected, 'reference': ref, 'ttft': ttft,
                       'others': others,
                       'ttft_overhead_ms': None if overhead is None else round(overhead, 1),
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


def others_lines(lv):
    """The report's word on what else the engines served as a level's clients started (evaluate's others), if
    anything: a level judged against the nodes driven directly, or a load report that could not be read."""
    o = lv.get('others') or {}
    out = []
    if o.get('most'):
        out.append('Concurrency {0}: the engines were serving requests of other clients as the clients started '
                   '(directly: {1}; through the gateway: {2}): its total tok/s is judged against the nodes driven '
                   'directly at once in this run, not their baselines (an idle fleet\'s).'.format(
                       lv['concurrency'], *(', '.join('{0} {1}'.format(n, fmt(v)) for n, v in o[how].items())
                                            for how in ('direct', 'gateway'))))
    if o.get('unknown'):
        out.append('Concurrency {0}: what else {1} served could not be read (sglang\'s load report, /v1/loads): taken '
                   'as nothing.'.format(lv['concurrency'], ', '.join(o['unknown'])))
    return out


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
            x, ref, t = lv['metrics'], lv['reference'], lv.get('ttft') or {}
            lines.append('| {0} ({1}) | {2} of {3} | {4} | {5} | {6} | {7} | {8} | {9} | {10} |'.format(
                lv['concurrency'], lv['per_node'], fmt(x.get('completed')), fmt(x.get('prompts')),
                fmt(x.get('total_tok_s')), fmt(lv['expected_total_tok_s']), fmt(ref['total_tok_s']),
                fmt(t.get('through')), fmt(ref['p99_ttft_ms']),
                'n/a' if lv['ttft_overhead_ms'] is None else '{0:+,.1f} ms'.format(lv['ttft_overhead_ms']),
                'pass' if lv['passed'] else 'FAIL'))
        lines.append('')
        for lv in s['levels']:
            t = lv.get('ttft') or {}
            if t.get('steady'):
                lines.append('Concurrency {0}: p99 TTFT after each client\'s first wave ({1} requests sent at once, '
                             'each opening its connection); over every request {2} ms through the gateway, {3} '
                             'directly ({4}; not gated).'.format(
                                 lv['concurrency'], lv['per_node'], fmt(t.get('through_all')), fmt(t.get('direct_all')),
                                 'n/a' if not (is_number(t.get('through_all')) and is_number(t.get('direct_all')))
                                 else '{0:+,.1f} ms'.format(t['through_all'] - t['direct_all'])))
        for lv in s['levels']:
            lines += others_lines(lv)
        lines += ['', 'Each node\'s client, directly at its engine and then through the gateway, the clients of a level '
                  'all at once (p99 TTFT over every request / after the first wave):', '',
                  '| concurrency (a node) | client | directly: completed | tok/s | p99 TTFT ms | through the gateway: '
                  'completed | tok/s | p99 TTFT ms |', '|---:|:---|---:|---:|---:|---:|---:|---:|']
        for lv in s['levels']:
            direct = {p['node']: p for p in lv['reference'].get('nodes') or []}
            through = {p['node']: p for p in lv.get('clients') or []}
            for node in [n['name'] for n in s['nodes']]:
                d, g = direct.get(node) or {}, through.get(node) or {}
                lines.append('| {0} ({1}) | {2} | {3} | {4} | {5} / {6} | {7} | {8} | {9} / {10} |'.format(
                    lv['concurrency'], lv['per_node'], node, fmt(d.get('completed')), fmt(d.get('total_tok_s')),
                    fmt(d.get('p99_ttft_ms')), fmt(d.get('steady_p99_ttft_ms')), fmt(g.get('completed')),
                    fmt(g.get('total_tok_s')), fmt(g.get('p99_ttft_ms')), fmt(g.get('steady_p99_ttft_ms'))))
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
    said = set()
    for x, lv in zip(xs, levels, strict=True):
        gate = next((g for g in lv['gates'] if g['gate'] == 'total_tok_s'), None)
        if gate is not None:
            label = 'gate (baselines x {0:g})'.format(tol) if gate['reference'] == 'baselines' \
                else 'gate (the nodes directly x {0:g})'.format(tol)
            ax1.hlines(gate['threshold'], x - 0.45, x + 0.45, colors='tab:red', linestyles='--',
                       label=None if label in said else label)
            said.add(label)
        if not lv['passed'] and lv['metrics'].get('total_tok_s') is not None:
            ax1.plot(x - 0.28, lv['metrics']['total_tok_s'], 'x', color='tab:red', ms=12, mew=3)
    ax1.set_ylabel('total tok/s')
    ax1.set_title('Fleet throughput by concurrency')
    bars(ax2, -0.14, [(lv.get('ttft') or {}).get('through') for lv in levels], 'tab:blue', 'p99 TTFT through the gateway')
    bars(ax2, 0.14, [lv['reference']['p99_ttft_ms'] for lv in levels], 'tab:green', 'p99 TTFT, slowest node directly')
    if limit is not None:
        for x, lv in zip(xs, levels, strict=True):
            if lv['reference']['p99_ttft_ms'] is not None:
                ax2.hlines(lv['reference']['p99_ttft_ms'] + limit, x - 0.45, x + 0.45, colors='tab:red',
                           linestyles='--', label='directly + {0:g} ms (gate)'.format(limit) if x == 0 else None)
            if lv['ttft_overhead_ms'] is not None:
                ax2.annotate('{0:+,.0f} ms'.format(lv['ttft_overhead_ms']), (x - 0.14, lv['ttft']['through']),
                             textcoords='offset points', xytext=(0, 4), ha='center', fontsize=8)
    ax2.set_ylabel('ms')
    steady = levels and all((lv.get('ttft') or {}).get('steady') for lv in levels)
    ax2.set_title('p99 time to first token' + (' (after the first wave)' if steady else ''))
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
                                                'p99_ttft_ms': (lv.get('ttft') or {}).get('through'),
                                                'ttft_overhead_ms': lv['ttft_overhead_ms'],
                                                'failed': lv['metrics'].get('failed'),
                                                'others': (lv.get('others') or {}).get('most', 0)}
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
    """[{per_node, concurrency, prompts, prompts_each}]: at each level every node is driven directly at per_node,
    all at once, then through the gateway from each node at per_node (concurrency: per_node x nodes in all); each of
    these clients sends prompts_each (prompts: in all through the gateway)."""
    n = len(settings['nodes'])
    each = [prompts_for(c, settings['prompts_per_concurrency'], settings['min_prompts']) for c in settings['levels']]
    return [{'per_node': c, 'concurrency': c * n, 'prompts': e * n, 'prompts_each': e}
            for c, e in zip(settings['levels'], each, strict=True)]


def result_file(how, node):
    """The run folder's file of one client's result lines: how = direct (at its own engine) or gateway (through it,
    from that node)."""
    return '{0}-{1}.jsonl'.format(how, node)


def write(run_dir, history_dir, run_id, started, meta, settings, probe, sweep):
    """Judge the run, write its folder (summary.json, report.md, fleet.png) and the history's index, index.md and
    trend.png. -> (summary, files in run_dir, files in history_dir)."""
    records = {how: {n['name']: read_jsonl(os.path.join(run_dir, result_file(how, n['name'])))
                     for n in settings['nodes']} for how in ('direct', 'gateway')}
    levels = evaluate(sweep, settings, records)
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
