"""The smoke test's report as text: a run's Markdown, the history index and two runs compared (no Ansible, no
network, standard library only). The plots are in glm5_plots; the figures these read come from glm5_results.
"""
from __future__ import annotations

from ansible.module_utils.glm5_results import BASELINE_KEYS, by_level, fmt, is_number, power_note


# ---------------------------------------------------------------- a run's report.md
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
            fmt(mt['total_tok_s']), fmt(mt['output_tok_s']), btext, fmt(mt['p99_ttft_ms']),
            fmt(mt['p99_tpot_ms']), fmt(g.get('mean_power_w')), fmt(g.get('mean_util_pct')),
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
    for w in m.get('watch') or []:
        lines.append('Between deploys ({0}): the fleet page {1}, this node\'s output tok/s {2}, its alerts {3}'.format(
            w['host'], w['page'], w['throughput'], w['alerts']))
        lines.append('')
    return '\n'.join(lines)


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
            '{0} @{1}'.format(fmt(e.get('headline_total_tok_s')), e.get('headline_concurrency'))
            if e.get('headline_total_tok_s') is not None else '-',
            fmt(e.get('headline_output_tok_s')), note.replace('|', '/')))
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
            change = (100.0 * (vb - va) / va) if is_number(va) and is_number(vb) and va else None
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
            cells.append('{0} -> {1}{2}'.format(fmt(r['a']).replace('n/a', '-'), fmt(r['b']).replace('n/a', '-'),
                                                 change))
        cells.append(' / '.join({True: 'pass', False: 'FAIL', None: '-'}[row['passed'][w]] for w in ('a', 'b')))
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'
