"""The smoke test's plots and its run folder (summary.json, report.md, the PNGs), on the controller only:
matplotlib is imported where a plot is drawn.
"""
from __future__ import annotations

import json
import os

from ansible.module_utils.glm5_report import COMPARE_METRICS, compare, markdown
from ansible.module_utils.glm5_results import by_level, is_number


def _pyplot():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def _save(plt, fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _run_line(ax, levels, key, style, color, label, mark_failed=True, **extra):
    """One run's figure by concurrency (the levels that have it), its failed levels crossed out in red."""
    lv = [x for x in levels or [] if x['metrics'].get(key) is not None]
    ax.plot([x['concurrency'] for x in lv], [x['metrics'][key] for x in lv], style, color=color, lw=2, label=label,
            **extra)
    for x in lv:
        if mark_failed and not x['passed']:
            ax.plot(x['concurrency'], x['metrics'][key], 'x', color='tab:red', ms=12, mew=3)


def _table_line(table, key):
    """[(concurrency, figure)] of a by-level table (the baseline, the limits) that gives key, by concurrency."""
    return sorted((c, row[key]) for c, row in by_level(table).items() if isinstance(c, int) and (row or {}).get(key))


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


def _two_panels(previous, path, panels, draw, title=None):
    """Two by-concurrency plots side by side, one per (key, label): draw(ax, key) puts this run and its references
    in, the previous run is overlaid."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, (key, label) in zip(axes, panels, strict=True):
        draw(ax, key)
        _previous_and_axes(ax, previous, key, label)
    if title:
        fig.suptitle(title)
    _save(plt, fig, path)


def plot_throughput(summary, previous, path):
    """Total and output tok/s by concurrency, against the baseline and its gate."""
    settings = summary.get('settings') or {}
    tol, speed = settings.get('tolerance') or 1, settings.get('speed_factor') or 1

    def draw(ax, key):
        _run_line(ax, summary['levels'], key, 'o-', 'tab:blue', 'this run ({0})'.format(
            'pass' if summary['passed'] else 'FAIL'))
        # marks at the levels this run swept that the baseline gives, no line between them: a line across a level
        # that has no baseline (output tok/s has one at 1 and 1024 only) would draw a gate that is not there, and a
        # level not swept (the lab's tests sweep 1 and 64) has nothing to be gated
        swept = {x['concurrency'] for x in summary['levels'] or []}
        bl = [(c, v) for c, v in _table_line(summary.get('baseline'), key) if c in swept]
        if bl:
            ax.plot([c for c, _ in bl], [v for _, v in bl], 's', color='tab:gray', linestyle='none',
                    label='baseline (seeds)' if speed == 1 else 'baseline (seeds) x {0:g}, lab test speed'.format(speed))
            ax.plot([c for c, _ in bl], [v * tol for _, v in bl], '_', color='tab:orange', linestyle='none', ms=16,
                    mew=2, label='gate (baseline x {0:g})'.format(tol))
    _two_panels(previous, path, (('total_tok_s', 'total tok/s'), ('output_tok_s', 'output tok/s')), draw,
                '{0} {1}'.format(summary['run'], 'PASSED' if summary['passed'] else 'FAILED'))


def plot_latency(summary, previous, path):
    """p99 TTFT and TPOT by concurrency (log scale), against the limits."""
    def draw(ax, key):
        _run_line(ax, summary['levels'], key, 'o-', 'tab:blue', 'this run', mark_failed=False)
        ll = _table_line(summary.get('limits'), key)
        if ll:
            ax.plot([c for c, _ in ll], [v for _, v in ll], 'v:', color='tab:red', label='limit')
        ax.set_yscale('log')
    _two_panels(previous, path, (('p99_ttft_ms', 'p99 TTFT (ms)'), ('p99_tpot_ms', 'p99 TPOT (ms)')), draw)


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
        draws = [g.get('power_draw_w') for s in samples for g in s.get('gpus') or [] if is_number(g.get('power_draw_w'))]
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
    _save(plt, fig, path)


def trend_scale(values):
    """The trend's y scale: log where the levels' throughputs span a decade or more (the single stream's tens of tok/s
    beside the top level's thousands), linear otherwise (one level, or levels close together: a log axis then shows a
    flat band and labels its few ticks in powers of ten)."""
    positive = [v for v in values if v and v > 0]
    return 'log' if positive and max(positive) >= 10 * min(positive) else 'linear'


def plot_trend(entries, path):
    """Total tok/s at each concurrency level across runs (one line per level, so runs with other levels still
    compare), passes and failures marked; the headline (the top level) drawn thickest."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(12, 4.6))
    levels = sorted({int(c) for e in entries for c in (e.get('levels') or {})})
    top = max(levels) if levels else None
    drawn = False
    every = []
    for n, level in enumerate(levels):
        pts = [(i, e) for i, e in enumerate(entries)
               if ((e.get('levels') or {}).get(str(level)) or {}).get('total_tok_s') is not None]
        if not pts:
            continue
        color = 'C{0}'.format(n % 10)
        ys = [e['levels'][str(level)]['total_tok_s'] for _, e in pts]
        every += ys
        ax.plot([i for i, _ in pts], ys, '-', color=color, alpha=.6, lw=2.5 if level == top else 1,
                label='concurrency {0}'.format(level))
        drawn = True
        for (i, e), y in zip(pts, ys, strict=True):
            ax.plot(i, y, 'o' if e.get('passed') else 'x', color=color if e.get('passed') else 'tab:red', ms=7, mew=2)
    ax.set_yscale(trend_scale(every))
    if trend_scale(every) == 'linear' and every:
        ax.set_ylim(0, max(every) * 1.1)    # from zero: a 2 % difference between runs must not look like a cliff
    # plain numbers (1,405 rather than 1.405x10^3), the minor ticks unlabelled
    from matplotlib.ticker import FuncFormatter, NullFormatter
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: '{0:,.0f}'.format(v) if v >= 10 else '{0:g}'.format(v)))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(range(len(entries)))
    ax.set_xticklabels(['{0}{1}'.format(e['run'][:15], ' (rb)' if e.get('rolled_back') else '') for e in entries],
                       rotation=45, ha='right', fontsize=7)
    ax.set_ylabel('total tok/s')
    ax.set_title('Total tok/s per concurrency level across runs (o passed, x failed, rb rolled back)')
    ax.grid(True, which='both', alpha=.3)
    if drawn:
        ax.legend(fontsize=8, loc='upper left', bbox_to_anchor=(1.0, 1.0))
    _save(plt, fig, path)


def plot_compare(a, b, path):
    """Throughput and p99 latencies by concurrency, the two runs overlaid (A older, B newer)."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for ax, (key, label, _sign) in zip(axes.flat, COMPARE_METRICS, strict=True):
        # A as large open squares under B's dots: where the runs agree both stay visible
        for run, style, color, extra in ((a, 's--', 'tab:gray', {'ms': 11, 'mfc': 'none', 'mew': 2}),
                                         (b, 'o-', 'tab:blue', {'ms': 6})):
            _run_line(ax, run.get('levels'), key, style, color, '{0} {1} ({2})'.format(
                'A' if run is a else 'B', run['run'], 'pass' if run.get('passed') else 'FAIL'), **extra)
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
    _save(plt, fig, path)


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
