"""The fleet smoke test's decisions and report (ansible/module_utils/glm5_fleet.py, the sglang_fleet_report module):
the plan, the gates against the nodes' summed baselines and the same clients driven directly at once in the same run,
the report folder and the fleet history's index. Result lines are bench_serving's own keys (as the golden runs of
tests/fixtures/smoke have them). No network, no lab."""
import copy
import json
import os

import pytest
import sglang_fleet_report
from modrun import run_module

from ansible.module_utils import glm5_fleet as fleet

BASE = {64: {'total_tok_s': 700}, 1024: {'total_tok_s': 3740, 'output_tok_s': 1240}}


def settings(**change):
    s = {'levels': [64], 'input_len': 256, 'output_len': 128, 'range_ratio': 0.0, 'prompts_per_concurrency': 4,
         'min_prompts': 8, 'tolerance': 0.9, 'ttft_overhead_ms': 50,
         'nodes': [{'name': 'a', 'url': 'http://10.0.0.1:30000', 'flags_sha256': 'fa', 'baseline': BASE, 'speed_factor': 1},
                   {'name': 'b', 'url': 'http://10.0.0.2:30000', 'flags_sha256': 'fb', 'baseline': BASE,
                    'speed_factor': 1}]}
    s.update(change)
    return s


def record(completed, tok_s, ttft):
    return {'completed': completed, 'total_throughput': tok_s, 'output_throughput': tok_s / 3, 'p99_ttft_ms': ttft,
            'p99_tpot_ms': 200.0, 'mean_ttft_ms': ttft / 2}


def run(node, line=0, **change):
    """One client's sglang_bench result at 64 (256 prompts): its line in that client's result file."""
    return dict({'node': node, 'concurrency': 64, 'prompts': 256, 'line': line, 'error': None, 'engine': None}, **change)


def sweep(direct=None, gateway=None):
    """One level, 64 a node (128 through the gateway): each node's client directly, then through the gateway."""
    return [{'per_node': 64, 'concurrency': 128, 'prompts': 512, 'prompts_each': 256,
             'direct': [run('a'), run('b')] if direct is None else direct,
             'gateway': [run('a'), run('b')] if gateway is None else gateway}]


# each node driven directly at 64, both at once: b the slower
DIRECT = {'a': [record(256, 705.0, 560.0)], 'b': [record(256, 715.0, 580.0)]}


def lines(a=(256, 700.0, 600.0), b=(256, 700.0, 590.0), direct=None):
    """The result lines: DIRECT (or direct) at the engines, a's and b's clients through the gateway."""
    return {'direct': DIRECT if direct is None else direct, 'gateway': {'a': [record(*a)], 'b': [record(*b)]}}


def gates(level):
    return {g['gate']: g for g in level['gates']}


# ---------------------------------------------------------------- settings and plan
def test_the_plan_drives_each_level_at_level_times_nodes_with_the_nodes_prompt_count():
    assert fleet.sweep_plan(settings(levels=[64, 1024])) == [
        {'per_node': 64, 'concurrency': 128, 'prompts': 512, 'prompts_each': 256},
        {'per_node': 1024, 'concurrency': 2048, 'prompts': 8192, 'prompts_each': 4096}]
    assert fleet.sweep_plan(settings(levels=[1], min_prompts=8)) == [
        {'per_node': 1, 'concurrency': 2, 'prompts': 16, 'prompts_each': 8}]


@pytest.mark.parametrize('change, words', [
    ({'levels': []}, 'non-empty list'),
    ({'levels': [64, 0]}, 'non-empty list'),
    ({'levels': [64, 64]}, 'lists a level twice'),
    ({'tolerance': 0}, 'tolerance must be a number in (0, 1]'),
    ({'ttft_overhead_ms': -5}, 'sglang_smoke_fleet_ttft_overhead_ms must be a number of ms > 0'),
    ({'ttft_overhead_ms': 'fast'}, 'sglang_smoke_fleet_ttft_overhead_ms'),
    ({'nodes': []}, 'no nodes whose smoke test ran'),
    ({'poll': 0}, 'sglang_smoke_fleet_poll must be a whole number of seconds >= 1, got 0'),
    ({'poll': '2'}, 'sglang_smoke_fleet_poll'),
    ({'min_prompts': 0}, "min_prompts must be a whole number >= 1 (the nodes' sglang_smoke_min_prompts), got 0"),
    ({'prompts_per_concurrency': None}, 'prompts_per_concurrency must be a whole number >= 1'),
])
def test_bad_settings_are_each_one_line(change, words):
    found = fleet.problems(settings(**change))
    assert len(found) == 1 and words in found[0], found


def test_null_overhead_limit_is_allowed_and_the_defaults_are_usable():
    assert fleet.problems(settings(ttft_overhead_ms=None)) == []
    assert fleet.problems(settings()) == []


def test_the_module_refuses_bad_settings_before_anything_runs(capsys):
    out = run_module(sglang_fleet_report, capsys, action='validate', settings=settings(levels=[]))
    assert out['failed'] and 'Nothing was run' in out['msg'] and 'non-empty list' in out['msg']
    # settings without the prompt counts (a KeyError from the sweep's plan before they were checked)
    bare = {k: v for k, v in settings().items() if k not in ('min_prompts', 'prompts_per_concurrency')}
    out = run_module(sglang_fleet_report, capsys, action='validate', settings=bare)
    assert out['failed'] and 'prompts_per_concurrency must be' in out['msg'] and 'min_prompts must be' in out['msg'], out
    ok = run_module(sglang_fleet_report, capsys, action='validate', settings=settings())
    assert not ok.get('failed') and ok['plan'] == [{'per_node': 64, 'concurrency': 128, 'prompts': 512,
                                                     'prompts_each': 256}]


# ---------------------------------------------------------------- gates
def test_a_fleet_at_the_summed_baseline_with_little_added_latency_passes():
    (lv,) = fleet.evaluate(sweep(), settings(), lines())
    g = gates(lv)
    assert lv['passed'] and set(g) == {'completed', 'total_tok_s', 'ttft_overhead_ms'}
    # the clients through the gateway summed (700 + 700), the slowest one's p99 (a, 600 ms)
    assert lv['metrics']['total_tok_s'] == 1400.0 and lv['metrics']['p99_ttft_ms'] == 600.0
    assert lv['metrics']['completed'] == 512 and lv['metrics']['failed'] == 0
    assert lv['expected_total_tok_s'] == 1400 and g['total_tok_s']['threshold'] == 1260
    # the reference is the same clients at the engines directly, in this run; the slowest of them (b, 580 ms)
    assert lv['reference']['p99_ttft_ms'] == 580.0 and lv['ttft_overhead_ms'] == 20.0
    assert [r['node'] for r in lv['reference']['nodes']] == ['a', 'b'] and lv['reference']['missing'] == []
    assert lv['reference']['total_tok_s'] == 1420.0
    assert [(c['node'], c['p99_ttft_ms']) for c in lv['clients']] == [('a', 600.0), ('b', 590.0)]


def test_the_reference_is_the_same_moments_load_not_the_nodes_idle_sweeps():
    """What made make deploy fail on two shared CPUs: each node alone had 898 ms, both driven at once (the gateway's
    load, without it) 1,430 ms; through the gateway 1,455 ms is +25 ms, not +557."""
    direct = {'a': [record(256, 690.0, 1400.0)], 'b': [record(256, 700.0, 1430.0)]}
    (lv,) = fleet.evaluate(sweep(), settings(), lines(a=(256, 695.0, 1455.0), b=(256, 695.0, 1440.0), direct=direct))
    assert lv['passed'] and lv['ttft_overhead_ms'] == 25.0, lv['gates']


def waves(first, rest, n=256, wave=64):
    """A result line with each request's TTFT (sglang_bench's ttfts, seconds): the first wave at first, the rest
    below rest but for their slowest four (rest: their p99); its p99 over every request is the first wave's."""
    ttfts = [first] * wave + [rest * 0.8] * (n - wave - 4) + [rest] * 4
    return dict(record(n, 700.0, round(first * 1000, 1)), ttfts=ttfts)


def test_the_first_wave_is_left_out_when_both_sides_have_each_requests_ttft():
    """Through the gateway every client's first 64 requests open their TLS connections at once: on the lab's two CPUs
    they were the whole p99 (1,091 ms against 735 directly; after them 428 against 496). With each request's TTFT
    on both sides the gate takes the p99 after the first wave, and the report keeps the other."""
    direct = {'a': [waves(0.735, 0.496)], 'b': [waves(0.730, 0.490)]}
    gateway = {'a': [waves(1.091, 0.428)], 'b': [waves(1.050, 0.420)]}
    (lv,) = fleet.evaluate(sweep(), settings(), {'direct': direct, 'gateway': gateway})
    t = lv['ttft']
    assert t['steady'] and t['through_all'] == 1091.0 and t['direct_all'] == 735.0
    assert t['through'] == round(0.428 * 1000, 2) and t['direct'] == round(0.496 * 1000, 2)
    assert lv['passed'] and lv['ttft_overhead_ms'] == -68.0, lv['gates']
    assert gates(lv)['ttft_overhead_ms']['text'].startswith('p99 TTFT after the first wave added by the gateway -68.0')
    md = fleet.markdown(fleet.build_summary('r', 's', {}, settings(), {'passed': True}, [lv]))
    assert ('Concurrency 128: p99 TTFT after each client\'s first wave (64 requests sent at once, each opening its '
            'connection); over every request 1,091.0 ms through the gateway, 735.0 directly (+356.0 ms; not gated).') in md
    assert '| 128 (64) | a | 256 | 700.0 | 735.0 / 496.0 | 256 | 700.0 | 1,091.0 / 428.0 |' in md
    # one side without them (an older line, a level of one wave): every request, both sides
    (lv,) = fleet.evaluate(sweep(), settings(), {'direct': DIRECT, 'gateway': gateway})
    assert not lv['ttft']['steady'] and lv['ttft_overhead_ms'] == 1091.0 - 580.0 and not lv['passed']


def test_a_failed_request_has_no_ttft_and_a_level_of_one_wave_has_none_after_it():
    line = dict(record(7, 10.0, 900.0), ttfts=[0.9, None, 0.2, 0.3])
    assert fleet.after_first_wave(line, 1) == round(fleet.percentile([0.2, 0.3], 99) * 1000, 2)
    assert fleet.after_first_wave(line, 4) is None and fleet.after_first_wave(record(4, 1.0, 1.0), 1) is None
    assert fleet.percentile([1, 2, 3, 4], 50) == 2.5 and fleet.percentile([5], 99) == 5


def test_clients_at_once_are_summed_their_means_weighted_and_the_rest_the_slowest():
    a = dict(fleet.level_metrics(dict(record(100, 300.0, 500.0), duration=10.0), 64, 100), node='a')
    b = dict(fleet.level_metrics(dict(record(300, 900.0, 700.0), duration=12.0), 64, 300), node='b')
    both = fleet.combined([a, b], 128, 400)
    assert both['completed'] == 400 and both['failed'] == 0 and both['total_tok_s'] == 1200.0
    assert both['p99_ttft_ms'] == 700.0 and both['duration_s'] == 12.0
    assert both['mean_ttft_ms'] == (100 * 250.0 + 300 * 350.0) / 400
    assert fleet.combined([a], 128, 400)['failed'] == 300


def test_throughput_below_the_summed_baseline_fails_and_says_the_sum():
    (lv,) = fleet.evaluate(sweep(), settings(), lines(a=(256, 600.0, 600.0), b=(256, 600.0, 590.0)))
    g = gates(lv)['total_tok_s']
    assert not lv['passed'] and not g['passed']
    assert "total tok/s 1,200.0 < 1,260.0 (the 2 nodes' baselines at 64 each, 1,400.0 in all, x 0.9)" == g['text']


def busy(direct=(31, 33), gateway=(30, 34)):
    """One level whose engines a and b served other clients' requests as its clients started, directly and through
    the gateway (a rolling deploy under live traffic); a count of None: a load report that could not be read."""
    (lv,) = sweep()
    lv['others'] = {'direct': dict(zip('ab', direct, strict=True)), 'gateway': dict(zip('ab', gateway, strict=True))}
    return [lv]


def test_a_fleet_serving_other_clients_is_judged_against_the_nodes_driven_directly_not_their_baselines():
    """make deploy's lab fleet on 2026-12-07, a flag change rolled out under 64 steady clients through the gateway
    (scripts/bench_fleet.py): the fleet test at 64 a node shared the engines with them, both ways - 1,220.7 tok/s
    directly, 1,217.4 through the gateway - and failed its gate of the nodes' idle baselines (1,400 x 0.9), which no
    fleet serving others meets: a rollout under load, the issue's own case, always failed. The nodes driven directly in
    the same run, under the same others' load, are the reference then."""
    direct = {'a': [record(256, 608.1, 560.0)], 'b': [record(256, 612.6, 573.6)]}
    measured = lines(a=(256, 608.1, 600.0), b=(256, 609.3, 590.0), direct=direct)
    (idle,) = fleet.evaluate(sweep(), settings(), measured)
    assert not gates(idle)['total_tok_s']['passed'] and gates(idle)['total_tok_s']['reference'] == 'baselines'
    (lv,) = fleet.evaluate(busy(), settings(), measured)
    g = gates(lv)['total_tok_s']
    assert lv['passed'] and g['passed'] and g['reference'] == 'direct' and g['threshold'] == round(1220.7 * 0.9, 2)
    assert g['text'] == ('total tok/s 1,217.4 >= 1,098.6 (the 2 nodes driven directly at 64 each at once in this run, '
                         '1,220.7 in all, x 0.9: their engines were serving 64 requests of other clients as the clients '
                         'started, so their baselines, an idle fleet\'s, are not the reference)')
    assert lv['others']['most'] == 64 and lv['others']['unknown'] == []
    md = fleet.markdown(fleet.build_summary('r', 's', {}, settings(), {'passed': True}, [lv]))
    assert ('Concurrency 128: the engines were serving requests of other clients as the clients started (directly: a '
            '31, b 33; through the gateway: a 30, b 34): its total tok/s is judged against the nodes driven directly at '
            'once in this run, not their baselines (an idle fleet\'s).') in md
    # a gateway that loses throughput still fails, against the nodes directly
    (lv,) = fleet.evaluate(busy(), settings(), lines(a=(256, 500.0, 600.0), b=(256, 500.0, 590.0), direct=direct))
    assert not lv['passed'] and gates(lv)['total_tok_s']['text'].startswith('total tok/s 1,000.0 < 1,098.6 (the 2 '
                                                                            'nodes driven directly')


def test_what_the_engines_served_unread_or_nothing_leaves_the_baselines_the_reference():
    low = lines(a=(256, 600.0, 600.0), b=(256, 600.0, 590.0))
    for others in (busy(direct=(0, 0), gateway=(0, 0)), busy(direct=(None, 0), gateway=(0, None)), sweep()):
        (lv,) = fleet.evaluate(others, settings(), low)
        assert gates(lv)['total_tok_s']['reference'] == 'baselines' and not lv['passed'], lv['gates']
    assert lv['others'] == {'direct': {'a': None, 'b': None}, 'gateway': {'a': None, 'b': None}, 'most': 0,
                            'unknown': ['a', 'b']}
    (lv,) = fleet.evaluate(busy(direct=(None, 0), gateway=(0, 0)), settings(), low)
    assert lv['others']['unknown'] == ['a']
    md = fleet.markdown(fleet.build_summary('r', 's', {}, settings(), {'passed': True}, [lv]))
    assert ('Concurrency 128: what else a served could not be read (sglang\'s load report, /v1/loads): taken as '
            'nothing.') in md and 'were serving requests of other clients' not in md


def test_latency_the_gateway_adds_over_the_limit_fails_naming_the_slowest_node():
    (lv,) = fleet.evaluate(sweep(), settings(), lines(a=(256, 700.0, 700.0)))
    g = gates(lv)['ttft_overhead_ms']
    assert not g['passed'] and g['value'] == 120.0
    assert g['text'] == ('p99 TTFT added by the gateway +120.0 ms > 50 (through it 700.0 ms, the slowest of 2 clients '
                         'at 64; the nodes driven directly at 64 each at once: the slowest, b, 580.0 ms)')


def test_failed_requests_fail_the_level():
    (lv,) = fleet.evaluate(sweep(), settings(), lines(a=(244, 700.0, 600.0)))
    assert not gates(lv)['completed']['passed'] and '500 of 512 requests completed (12 failed)' == gates(lv)['completed']['text']


def test_no_result_line_fails_with_the_benchmarks_error():
    gateway = [run('a'), run('b', line=None, error='bench_serving exited 1 and wrote no result: boom')]
    (lv,) = fleet.evaluate(sweep(gateway=gateway), settings(), lines())
    assert not lv['passed'] and lv['gates'] == [{
        'gate': 'result', 'passed': False, 'value': None, 'threshold': None,
        'text': 'no result from bench_serving through the gateway at 64 a client (from b: bench_serving exited 1 and '
                'wrote no result: boom)'}]
    assert lv['ttft_overhead_ms'] is None and lv['metrics']['completed'] is None


def test_an_engine_that_restarted_meanwhile_fails_the_level_once():
    said = 'glm5-sglang restarted during the level (NRestarts 0 -> 1)'
    (lv,) = fleet.evaluate(sweep(gateway=[run('a', engine=said), run('b')], direct=[run('a', engine=said), run('b')]),
                           settings(), lines())
    assert [g['text'] for g in lv['gates'] if g['gate'] == 'engine'] == [said] and not lv['passed']


def test_each_node_at_its_own_pace_and_a_node_without_a_baseline_leaves_throughput_ungated():
    s = settings()
    s['nodes'][1]['speed_factor'] = 4
    (lv,) = fleet.evaluate(sweep(), s, lines(a=(256, 700.0, 600.0), b=(256, 2800.0, 590.0)))
    assert lv['expected_total_tok_s'] == 700 + 2800 and gates(lv)['total_tok_s']['passed']
    s['nodes'][1]['baseline'] = {1024: {'total_tok_s': 3740}}
    (lv,) = fleet.evaluate(sweep(), s, lines(a=(256, 5.0, 600.0), b=(256, 5.0, 590.0)))
    assert lv['expected_total_tok_s'] is None and 'total_tok_s' not in gates(lv)


def test_the_plot_shows_no_baseline_where_the_nodes_have_none(monkeypatch, tmp_path):
    """At a level the baseline table lacks (1 a node), no baseline bar and no legend entry for one (it was listed,
    in the gateway's colour, with nothing drawn); with a baseline, its bar, its entry and the gate's line."""
    figures = []
    monkeypatch.setattr(fleet, '_save', lambda plt, fig, path: figures.append(fig))
    s = settings()
    without = copy.deepcopy(s)
    for n in without['nodes']:
        n['baseline'] = {1024: {'total_tok_s': 3740}}
    for given in (s, without):
        (lv,) = fleet.evaluate(sweep(), given, lines())
        fleet.plot_fleet(fleet.build_summary('r', 's', {}, given, {'passed': True}, [lv]), str(tmp_path / 'f.png'))
    legends = [[t.get_text() for t in fig.axes[0].get_legend().get_texts()] for fig in figures]
    assert "the nodes' baselines, summed" in legends[0] and 'gate (baselines x 0.9)' in legends[0]
    assert legends[1] == ['through the gateway', 'the nodes directly at once, summed']
    assert [len(fig.axes[0].patches) for fig in figures] == [3, 2]
    # engines serving other clients: the gate's line is the nodes driven directly, named so
    (lv,) = fleet.evaluate(busy(), s, lines())
    fleet.plot_fleet(fleet.build_summary('r', 's', {}, s, {'passed': True}, [lv]), str(tmp_path / 'f.png'))
    legend = [t.get_text() for t in figures[-1].axes[0].get_legend().get_texts()]
    assert 'gate (the nodes directly x 0.9)' in legend and 'gate (baselines x 0.9)' not in legend
    (line,) = figures[-1].axes[0].collections
    assert line.get_segments()[0][0][1] == round(1420.0 * 0.9, 2)


def test_a_node_that_fails_requests_directly_fails_the_level_and_leaves_the_added_ttft_ungated():
    direct = dict(DIRECT, b=[record(250, 700.0, 580.0)])
    (lv,) = fleet.evaluate(sweep(), settings(), lines(a=(256, 700.0, 5000.0), direct=direct))
    g = gates(lv)
    assert not lv['passed'] and 'ttft_overhead_ms' not in g and lv['ttft_overhead_ms'] is None
    assert g['direct']['text'] == 'driven directly at 64 each, without the gateway: b: 250 of 256 requests completed'
    summary = fleet.build_summary('r', 's', {}, settings(), {'passed': True}, [lv])
    assert summary['reasons'] == ['concurrency 128 (64 a node): driven directly at 64 each, without the gateway: b: 250 '
                                  'of 256 requests completed']


def test_a_node_without_a_direct_result_names_why_and_one_not_run_says_so():
    direct = [run('a'), run('b', line=None, error='bench_serving exited 1 and wrote no result: boom.')]
    (lv,) = fleet.evaluate(sweep(direct=direct), settings(), lines())
    assert gates(lv)['direct']['text'].endswith('b: bench_serving exited 1 and wrote no result: boom')
    (lv,) = fleet.evaluate(sweep(direct=[]), settings(), lines())
    assert gates(lv)['direct']['text'].endswith('a: not run; b: not run')


def test_a_failed_probe_fails_the_run_and_no_level_is_no_pass():
    s = fleet.build_summary('r', 's', {}, settings(), {'passed': False, 'problems': ['no 42']}, [])
    assert not s['passed'] and s['reasons'] == ['probe through the gateway: no 42']
    s = fleet.build_summary('r', 's', {}, settings(), {'passed': True, 'results': []}, [])
    assert not s['passed'] and s['reasons'] == ['no sweep level ran']


# ---------------------------------------------------------------- the report folder and the index
def test_the_module_writes_the_report_the_plot_and_the_fleet_index(tmp_path, capsys):
    history = tmp_path / 'runs'
    run_dir = history / 'r2'
    run_dir.mkdir(parents=True)
    for how, by_node in lines().items():
        for node, recs in by_node.items():
            (run_dir / fleet.result_file(how, node)).write_text(''.join(json.dumps(x) + '\n' for x in recs))
    (history / 'index.jsonl').write_text(json.dumps({'run': 'r1', 'started': '2026-12-01T00:00:00Z', 'passed': False,
                                                     'levels': {'128': {'total_tok_s': 900.0}}}) + '\n')
    out = run_module(sglang_fleet_report, capsys, settings=settings(), run_id='r2', started='2026-12-01T01:00:00Z',
                     run_dir=str(run_dir), history_dir=str(history), meta={'gateway': 'gw', 'url': 'http://gw:8000',
                                                                           'policy': 'power_of_two', 'drained': ['c']},
                     probe={'passed': True, 'problems': [], 'results': [{}, {}, {}]},
                     sweep=[{'direct': [{'node': 'a', 'line': 0, 'seconds': 8.0, 'ansible_job_id': 'j1'},
                                        {'node': 'b', 'line': 0, 'seconds': 8.5, 'finished': 1}],
                             'gateway': [{'node': 'a', 'line': 0, 'seconds': 9.0}, {'node': 'b', 'line': 0}]}])
    assert not out.get('failed'), out
    assert out['passed'] and out['files'] == ['summary.json', 'report.md', 'fleet.png']
    assert out['index_files'] == ['index.jsonl', 'index.md', 'trend.png']
    for name in out['files']:
        assert (run_dir / name).stat().st_size > 0
    with open(run_dir / 'fleet.png', 'rb') as fh:
        assert fh.read(8) == b'\x89PNG\r\n\x1a\n'
    md = (run_dir / 'report.md').read_text()
    assert 'Fleet smoke test r2: PASSED' in md
    assert 'Drained by an operator, out of the gateway and not counted: c.' in md
    assert '| 128 (64) | 512 of 512 | 1,400.0 | 1,400.0 | 1,420.0 | 600.0 | 580.0 | +20.0 ms | pass |' in md
    assert '| 128 (64) | b | 256 | 715.0 | 580.0 / n/a | 256 | 700.0 | 590.0 / n/a |' in md
    assert md.rstrip().endswith('![fleet](fleet.png)') and '![fleet]' not in out['markdown']
    entries = [json.loads(x) for x in (history / 'index.jsonl').read_text().splitlines()]
    assert [e['run'] for e in entries] == ['r1', 'r2'] and entries[1]['nodes'] == ['a', 'b']
    assert entries[1]['levels']['128'] == {'total_tok_s': 1400.0, 'expected_total_tok_s': 1400, 'p99_ttft_ms': 600.0,
                                           'ttft_overhead_ms': 20.0, 'failed': 0, 'others': 0}
    assert '| [r2](r2/report.md) | gw | a, b | pass | 1,400.0 @128 | +20.0 ms |' in (history / 'index.md').read_text()
    summary = json.loads((run_dir / 'summary.json').read_text())
    assert summary['meta']['policy'] == 'power_of_two'
    # each client's run kept with its level's planned figures, and nothing else of Ansible's result
    assert summary['sweep'][0]['direct'] == [
        {'node': 'a', 'concurrency': 64, 'prompts': 256, 'line': 0, 'exit_code': None, 'error': None, 'engine': None,
         'seconds': 8.0},
        {'node': 'b', 'concurrency': 64, 'prompts': 256, 'line': 0, 'exit_code': None, 'error': None, 'engine': None,
         'seconds': 8.5}]
    assert os.path.getsize(history / 'trend.png') > 0


def test_a_level_the_module_could_not_run_still_names_its_level_and_why(tmp_path, capsys):
    run_dir = tmp_path / 'runs' / 'r'
    run_dir.mkdir(parents=True)
    out = run_module(sglang_fleet_report, capsys, settings=settings(), run_id='r', started='2026-12-01T01:00:00Z',
                     run_dir=str(run_dir), history_dir=str(tmp_path / 'runs'), probe={'passed': True, 'results': []},
                     sweep=[{'gateway': [{'node': 'a', 'failed': True,
                                          'msg': 'cannot start bench_serving with /x/python: No such file'}],
                             'direct': [{'node': 'b', 'failed': True, 'msg': 'cannot start bench_serving on b'}]}])
    assert not out['passed']
    assert out['reasons'] == [
        'concurrency 128 (64 a node): driven directly at 64 each, without the gateway: a: not run; b: cannot start '
        'bench_serving on b',
        'concurrency 128 (64 a node): no result from bench_serving through the gateway at 64 a client (from a: cannot '
        'start bench_serving with /x/python: No such file; from b: not run)']


def test_the_report_in_check_mode_writes_nothing_and_says_it_would(tmp_path, capsys):
    """Check mode reported changed=False where the real run writes the fleet report (changed=True)."""
    history = tmp_path / 'runs'
    out = run_module(sglang_fleet_report, capsys, check_mode=True, settings=settings(), run_id='r2',
                     started='2026-12-01T01:00:00Z', run_dir=str(history / 'r2'), history_dir=str(history))
    assert not out.get('failed') and out['changed'] is True and out['plan'], out
    assert not history.exists()
    out = run_module(sglang_fleet_report, capsys, check_mode=True, action='validate', settings=settings())
    assert not out.get('failed') and out['changed'] is False, out
