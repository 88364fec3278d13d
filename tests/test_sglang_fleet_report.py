"""The fleet smoke test's decisions and report (ansible/module_utils/glm5_fleet.py, the sglang_fleet_report module):
the plan, the gates against the nodes' summed baselines and their own sweeps on record, the report folder and the
fleet history's index. Result lines are bench_serving's own keys (as the golden runs of tests/fixtures/smoke have
them). No network, no lab."""
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


def entry(node, run, ttft, tok_s=710.0, passed=True, flags=None, level='64'):
    return {'node': node, 'run': run, 'passed': passed, 'flags_sha256': flags or 'f' + node,
            'levels': {level: {'p99_ttft_ms': ttft, 'total_tok_s': tok_s}}}


INDEXES = {'a': [entry('a', 'a1', 900.0), entry('a', 'a2', 560.0)], 'b': [entry('b', 'b1', 580.0)]}


def record(completed, tok_s, ttft):
    return {'completed': completed, 'total_throughput': tok_s, 'output_throughput': tok_s / 3, 'p99_ttft_ms': ttft,
            'p99_tpot_ms': 200.0, 'mean_ttft_ms': ttft / 2}


def sweep(prompts=512, line=0):
    return [{'concurrency': 128, 'prompts': prompts, 'line': line, 'error': None, 'engine': None}]


def gates(level):
    return {g['gate']: g for g in level['gates']}


# ---------------------------------------------------------------- settings and plan
def test_the_plan_drives_each_level_at_level_times_nodes_with_the_nodes_prompt_count():
    assert fleet.sweep_plan(settings(levels=[64, 1024])) == [
        {'per_node': 64, 'concurrency': 128, 'prompts': 512}, {'per_node': 1024, 'concurrency': 2048, 'prompts': 8192}]
    assert fleet.sweep_plan(settings(levels=[1], min_prompts=8)) == [{'per_node': 1, 'concurrency': 2, 'prompts': 8}]


@pytest.mark.parametrize('change, words', [
    ({'levels': []}, 'non-empty list'),
    ({'levels': [64, 0]}, 'non-empty list'),
    ({'levels': [64, 64]}, 'lists a level twice'),
    ({'tolerance': 0}, 'tolerance must be a number in (0, 1]'),
    ({'ttft_overhead_ms': -5}, 'sglang_smoke_fleet_ttft_overhead_ms must be a number of ms > 0'),
    ({'ttft_overhead_ms': 'fast'}, 'sglang_smoke_fleet_ttft_overhead_ms'),
    ({'nodes': []}, 'no nodes whose smoke test ran'),
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
    ok = run_module(sglang_fleet_report, capsys, action='validate', settings=settings())
    assert not ok.get('failed') and ok['plan'] == [{'per_node': 64, 'concurrency': 128, 'prompts': 512}]


# ---------------------------------------------------------------- gates
def test_a_fleet_at_the_summed_baseline_with_little_added_latency_passes():
    (lv,) = fleet.evaluate(sweep(), [record(512, 1400.0, 600.0)], settings(), INDEXES)
    g = gates(lv)
    assert lv['passed'] and set(g) == {'completed', 'total_tok_s', 'ttft_overhead_ms'}
    assert lv['expected_total_tok_s'] == 1400 and g['total_tok_s']['threshold'] == 1260
    # the reference is each node's LATEST passed sweep with its current flags; the slowest of them (b, 580 ms)
    assert lv['reference']['p99_ttft_ms'] == 580.0 and lv['ttft_overhead_ms'] == 20.0
    assert [r['run'] for r in lv['reference']['nodes']] == ['a2', 'b1']
    assert lv['reference']['total_tok_s'] == 1420.0


def test_throughput_below_the_summed_baseline_fails_and_says_the_sum():
    (lv,) = fleet.evaluate(sweep(), [record(512, 1200.0, 600.0)], settings(), INDEXES)
    g = gates(lv)['total_tok_s']
    assert not lv['passed'] and not g['passed']
    assert "total tok/s 1,200.0 < 1,260.0 (the 2 nodes' baselines at 64 each, 1,400.0 in all, x 0.9)" == g['text']


def test_latency_the_gateway_adds_over_the_limit_fails_naming_the_slowest_node():
    (lv,) = fleet.evaluate(sweep(), [record(512, 1400.0, 700.0)], settings(), INDEXES)
    g = gates(lv)['ttft_overhead_ms']
    assert not g['passed'] and g['value'] == 120.0
    assert g['text'].startswith('p99 TTFT added by the gateway +120.0 ms > 50') and 'b alone at 64: 580.0 ms, run b1' in g['text']


def test_failed_requests_fail_the_level():
    (lv,) = fleet.evaluate(sweep(), [record(500, 1400.0, 600.0)], settings(), INDEXES)
    assert not gates(lv)['completed']['passed'] and '500 of 512 requests completed (12 failed)' == gates(lv)['completed']['text']


def test_no_result_line_fails_with_the_benchmarks_error():
    item = dict(sweep()[0], line=None, error='bench_serving exited 1 and wrote no result: boom')
    (lv,) = fleet.evaluate([item], [], settings(), INDEXES)
    assert not lv['passed'] and 'no result from bench_serving through the gateway at concurrency 128: bench_serving exited 1' \
        in lv['gates'][0]['text']


def test_each_node_at_its_own_pace_and_a_node_without_a_baseline_leaves_throughput_ungated():
    s = settings()
    s['nodes'][1]['speed_factor'] = 4
    (lv,) = fleet.evaluate(sweep(), [record(512, 3500.0, 600.0)], s, INDEXES)
    assert lv['expected_total_tok_s'] == 700 + 2800
    s['nodes'][1]['baseline'] = {1024: {'total_tok_s': 3740}}
    (lv,) = fleet.evaluate(sweep(), [record(512, 10.0, 600.0)], s, INDEXES)
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
        (lv,) = fleet.evaluate(sweep(), [record(512, 1400.0, 600.0)], given, INDEXES)
        fleet.plot_fleet(fleet.build_summary('r', 's', {}, given, {'passed': True}, [lv]), str(tmp_path / 'f.png'))
    legends = [[t.get_text() for t in fig.axes[0].get_legend().get_texts()] for fig in figures]
    assert "the nodes' baselines, summed" in legends[0] and 'gate (baselines x 0.9)' in legends[0]
    assert legends[1] == ['through the gateway', 'the nodes alone, summed']
    assert [len(fig.axes[0].patches) for fig in figures] == [3, 2]


def test_a_node_without_a_passed_sweep_at_the_level_leaves_the_added_ttft_ungated_and_said():
    indexes = copy.deepcopy(INDEXES)
    indexes['b'] = [entry('b', 'b0', 580.0, passed=False), entry('b', 'b9', 500.0, level='1024')]
    (lv,) = fleet.evaluate(sweep(), [record(512, 1400.0, 5000.0)], settings(), indexes)
    assert lv['passed'] and 'ttft_overhead_ms' not in gates(lv) and lv['reference']['missing'] == ['b']
    summary = fleet.build_summary('r', 's', {}, settings(), {'passed': True}, [lv])
    assert summary['notes'] == ['Concurrency 128: b has no passed sweep at 64 on record: the TTFT the gateway adds '
                                'is not gated there.']


def test_a_sweep_with_other_flags_is_the_reference_only_when_none_has_the_current_ones():
    indexes = {'a': [entry('a', 'a-now', 560.0), entry('a', 'a-other', 300.0, flags='old')],
               'b': [entry('b', 'b-other', 590.0, flags='old')]}
    ref = fleet.reference(indexes, settings()['nodes'], 64)
    assert [(r['run'], r['same_flags']) for r in ref['nodes']] == [('a-now', True), ('b-other', False)]


def test_a_failed_probe_fails_the_run_and_no_level_is_no_pass():
    s = fleet.build_summary('r', 's', {}, settings(), {'passed': False, 'problems': ['no 42']}, [])
    assert not s['passed'] and s['reasons'] == ['probe through the gateway: no 42']
    s = fleet.build_summary('r', 's', {}, settings(), {'passed': True, 'results': []}, [])
    assert not s['passed'] and s['reasons'] == ['no sweep level ran']


# ---------------------------------------------------------------- the report folder and the index
def test_the_module_writes_the_report_the_plot_and_the_fleet_index(tmp_path, capsys):
    history = tmp_path / 'runs'
    run = history / 'r2'
    run.mkdir(parents=True)
    (run / 'bench.jsonl').write_text(json.dumps(record(512, 1400.0, 600.0)) + '\n')
    (history / 'index.jsonl').write_text(json.dumps({'run': 'r1', 'started': '2026-12-01T00:00:00Z', 'passed': False,
                                                     'levels': {'128': {'total_tok_s': 900.0}}}) + '\n')
    out = run_module(sglang_fleet_report, capsys, settings=settings(), run_id='r2', started='2026-12-01T01:00:00Z',
                     run_dir=str(run), history_dir=str(history), meta={'gateway': 'gw', 'url': 'http://gw:8000',
                                                                       'policy': 'power_of_two', 'drained': ['c']},
                     probe={'passed': True, 'problems': [], 'results': [{}, {}, {}]},
                     sweep=[{'concurrency': 128, 'prompts': 512, 'line': 0, 'error': None, 'seconds': 9.0}],
                     indexes={'a': '\n'.join(json.dumps(e) for e in INDEXES['a']), 'b': json.dumps(INDEXES['b'][0])})
    assert not out.get('failed'), out
    assert out['passed'] and out['files'] == ['summary.json', 'report.md', 'fleet.png']
    assert out['index_files'] == ['index.jsonl', 'index.md', 'trend.png']
    for name in out['files']:
        assert (run / name).stat().st_size > 0
    with open(run / 'fleet.png', 'rb') as fh:
        assert fh.read(8) == b'\x89PNG\r\n\x1a\n'
    md = (run / 'report.md').read_text()
    assert 'Fleet smoke test r2: PASSED' in md
    assert 'Drained by an operator, out of the gateway and not counted: c.' in md
    assert '| 128 (64) | 512 of 512 | 1,400.0 | 1,400.0 | 1,420.0 | 600.0 | 580.0 | +20.0 ms | pass |' in md
    assert md.rstrip().endswith('![fleet](fleet.png)') and '![fleet]' not in out['markdown']
    entries = [json.loads(x) for x in (history / 'index.jsonl').read_text().splitlines()]
    assert [e['run'] for e in entries] == ['r1', 'r2'] and entries[1]['nodes'] == ['a', 'b']
    assert entries[1]['levels']['128'] == {'total_tok_s': 1400.0, 'expected_total_tok_s': 1400, 'p99_ttft_ms': 600.0,
                                           'ttft_overhead_ms': 20.0, 'failed': 0}
    assert '| [r2](r2/report.md) | gw | a, b | pass | 1,400.0 @128 | +20.0 ms |' in (history / 'index.md').read_text()
    assert json.loads((run / 'summary.json').read_text())['meta']['policy'] == 'power_of_two'
    assert os.path.getsize(history / 'trend.png') > 0


def test_a_level_the_module_could_not_run_still_names_its_level(tmp_path, capsys):
    run = tmp_path / 'runs' / 'r'
    run.mkdir(parents=True)
    out = run_module(sglang_fleet_report, capsys, settings=settings(), run_id='r', started='2026-12-01T01:00:00Z',
                     run_dir=str(run), history_dir=str(tmp_path / 'runs'), probe={'passed': True, 'results': []},
                     sweep=[{'failed': True, 'msg': 'cannot start bench_serving with /x/python: No such file'}])
    assert not out['passed']
    assert out['reasons'] == ['concurrency 128 (64 a node): no result from bench_serving through the gateway at '
                              'concurrency 128: cannot start bench_serving with /x/python: No such file']
