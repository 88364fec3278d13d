"""The smoke test's decisions (ansible/module_utils/glm5_results.py, glm5_probe.py, glm5_report.py, glm5_plots.py,
ansible/filter_plugins/sglang_smoke.py) and its report, on golden run folders that real sglang.bench_serving runs against
the lab's engine emulator produced (tests/fixtures/smoke/README.md says which). No network, no lab."""
import copy
import json
import os
import re
import struct

import pytest
import sglang_smoke_report
import yaml
from ansible.errors import AnsibleFilterError
from modrun import run_module
from sglang_smoke import env_file_value, sglang_unit_launch

from ansible.module_utils import glm5_plots as plots
from ansible.module_utils import glm5_probe as probe
from ansible.module_utils import glm5_report as report
from ansible.module_utils import glm5_results as results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, 'tests', 'fixtures', 'smoke')
CASES = sorted(d for d in (os.listdir(GOLDEN) if os.path.isdir(GOLDEN) else []) if os.path.isdir(os.path.join(GOLDEN, d)))


def defaults():
    with open(os.path.join(ROOT, 'roles', 'sglang_smoke', 'defaults', 'main.yml')) as fh:
        d = yaml.safe_load(fh)
    return {'levels': d['sglang_smoke_levels'], 'input_len': d['sglang_smoke_input_len'],
            'output_len': d['sglang_smoke_output_len'], 'range_ratio': d['sglang_smoke_range_ratio'],
            'prompts_per_concurrency': d['sglang_smoke_prompts_per_concurrency'],
            'min_prompts': d['sglang_smoke_min_prompts'], 'tolerance': d['sglang_smoke_tolerance'],
            'baseline': d['sglang_smoke_baseline'], 'limits': d['sglang_smoke_limits'],
            'probes': d['sglang_smoke_probes'], 'dataset': 'random-ids'}


# ---------------------------------------------------------------- settings
def test_the_defaults_are_usable_and_are_the_seeds_table():
    cfg = defaults()
    assert results.config_problems(cfg) == []
    assert cfg['levels'] == [1, 64, 256, 512, 1024]
    assert cfg['range_ratio'] == 0.0 and (cfg['input_len'], cfg['output_len']) == (256, 128)
    base = results.by_level(cfg['baseline'])
    assert base[1] == {'output_tok_s': 8.2}
    assert [base[c]['total_tok_s'] for c in (64, 256, 512, 1024)] == [700, 1846, 2800, 3740]
    assert base[1024]['output_tok_s'] == 1240


@pytest.mark.parametrize('change, words', [
    ({'levels': []}, 'non-empty list'),
    ({'levels': [1, 0]}, '0 is not a whole number'),
    ({'levels': [1, 'x']}, "'x' is not"),
    ({'levels': [64, 1]}, 'must go up'),
    ({'levels': [1, 1]}, 'lists a level twice'),
    ({'input_len': 0}, 'sglang_smoke_input_len must be a whole number'),
    ({'range_ratio': 1.5}, 'sglang_smoke_range_ratio must be a number from 0.0'),
    ({'range_ratio': 'half'}, 'sglang_smoke_range_ratio'),
    ({'tolerance': 0}, 'sglang_smoke_tolerance must be a fraction'),
    ({'tolerance': 1.2}, 'sglang_smoke_tolerance must be a fraction'),
    ({'min_prompts': 0}, 'sglang_smoke_min_prompts must be a whole number'),
    ({'baseline': {64: {'total_tok_s': -1}}}, 'sglang_smoke_baseline[64].total_tok_s must be a positive number'),
    ({'baseline': {64: {'totl_tok_s': 700}}}, "unknown figure 'totl_tok_s'"),
    ({'baseline': {'many': {'total_tok_s': 700}}}, "'many' is not a concurrency level"),
    ({'limits': {1: {'p99_tpot_ms': 'fast'}}}, 'sglang_smoke_limits[1].p99_tpot_ms'),
    ({'limits': [1, 2]}, 'sglang_smoke_limits must map'),
    ({'probes': [{'prompt': 'hi'}]}, 'needs a non-empty prompt and expect'),
    ({'probes': [{'prompt': 'What is 17 + 25?', 'expect': 42}]}, 'both text (quote a number: expect: "42")'),
    ({'speed_factor': 0}, 'sglang_smoke_speed_factor must be a number > 0'),
    ({'speed_factor': 'fast'}, "sglang_smoke_speed_factor must be a number > 0 (1 on a real node"),
])
def test_bad_settings_are_named(change, words):
    cfg = dict(defaults(), **change)
    problems = results.config_problems(cfg)
    assert any(words in p for p in problems), problems


@pytest.mark.parametrize('expect', [42, 0, '', ' '])
def test_the_probe_module_refuses_an_expect_that_is_not_text_before_asking(capsys, expect):
    """sglang_probe with expect: 42 sent its request and then failed with a TypeError; expect: 0 was 'missing'. Nothing
    listens at its URL here: a refusal before asking is the only way this passes."""
    import sglang_probe
    out = run_module(sglang_probe, capsys, url='http://127.0.0.1:9', model='m',
                     probes=[{'prompt': 'What is 17 + 25?', 'expect': expect}])
    assert out['failed'] and out['msg'].startswith('probes[0] needs a prompt and an expect, both text'), out


def test_the_lab_test_speed_scales_baseline_and_limits_by_exactly_its_factor():
    cfg = defaults()
    assert results.scaled(cfg) is cfg and results.scaled(dict(cfg, speed_factor=1)) == dict(cfg, speed_factor=1)
    fast = results.scaled(dict(cfg, speed_factor=8))
    base, limits = results.by_level(cfg['baseline']), results.by_level(cfg['limits'])
    for level, row in results.by_level(fast['baseline']).items():
        assert row == {k: v * 8 for k, v in base[level].items()}
    for level, row in results.by_level(fast['limits']).items():
        assert row == {k: v / 8 for k, v in limits[level].items()}
    assert cfg['baseline'] == defaults()['baseline']                  # the role's own settings are left as they are


def test_a_run_at_the_test_speed_is_judged_at_that_speed_and_says_so():
    """The healthy golden run's records, as if the emulator had run 8x faster: 8x the figures pass the 8x gates;
    the same figures at production pace fail them (what slow=8 at test speed would give)."""
    summary, records, _ = load('healthy')
    cfg = dict(settings_of(summary), speed_factor=8)
    fast = [dict(r, total_throughput=r['total_throughput'] * 8, output_throughput=r['output_throughput'] * 8,
                 p99_ttft_ms=r['p99_ttft_ms'] / 8, p99_tpot_ms=r['p99_tpot_ms'] / 8) for r in records]
    assert all(lv['passed'] for lv in results.evaluate(summary['sweep'], fast, results.scaled(cfg)))
    slow = results.evaluate(summary['sweep'], records, results.scaled(cfg))
    assert not any(lv['passed'] for lv in slow)
    built = results.build_summary('r', 't', {}, results.scaled(cfg), {'passed': True}, slow, {})
    assert built['settings']['speed_factor'] == 8 and built['baseline']['64'] == {'total_tok_s': 5600}
    assert 'the engine emulator ran 8x the seeds\' pace' in report.markdown(built)


def test_the_report_says_where_to_watch_the_node_between_deploys():
    summary, _, _ = load('healthy')
    assert 'Between deploys' not in report.markdown(summary)
    watch = {'host': 'prom', 'page': 'http://p:9090/consoles/glm5.html', 'alerts': 'http://p:9090/alerts',
             'throughput': 'http://p:9090/graph?g0.expr=x'}
    text = report.markdown(dict(summary, meta=dict(summary.get('meta') or {}, watch=[watch])))
    assert ('Between deploys (prom): the fleet page http://p:9090/consoles/glm5.html, this node\'s output tok/s '
            'http://p:9090/graph?g0.expr=x, its alerts http://p:9090/alerts') in text


def test_string_level_keys_from_json_are_levels():
    cfg = defaults()
    cfg['baseline'] = {'64': {'total_tok_s': 700}}
    assert results.config_problems(cfg) == []
    assert results.by_level(cfg['baseline']) == {64: {'total_tok_s': 700}}


def test_the_report_module_refuses_bad_settings_before_anything(capsys):
    cfg = dict(defaults(), tolerance=2, levels=[64, 1])
    out = run_module(sglang_smoke_report, capsys, action='validate', settings=cfg)
    assert out['failed'] and 'Nothing was run' in out['msg']
    assert len(out['problems']) == 2


def test_prompt_counts():
    assert results.prompts_for(1, 4, 8) == 8
    assert results.prompts_for(64, 4, 8) == 256
    assert results.prompts_for(1024, 4, 8) == 4096


# ---------------------------------------------------------------- probe decisions
def chat(content=None, reasoning=None, logprobs=None):
    message = {'role': 'assistant', 'content': content}
    if reasoning is not None:
        message['reasoning_content'] = reasoning
    choice = {'index': 0, 'message': message, 'finish_reason': 'stop'}
    if logprobs is not None:
        choice['logprobs'] = {'content': [{'token': 't', 'logprob': v} for v in logprobs]}
    return {'choices': [choice]}


PROBE = {'prompt': 'What is 17 + 25?', 'expect': '42'}


def test_a_right_answer_passes():
    assert probe.judge_answer(PROBE, 200, chat('42', logprobs=[-0.1, -0.2]))[1] == []
    assert probe.judge_answer(PROBE, 200, chat('The answer is 42.'))[1] == []


def test_a_reasoning_model_may_answer_in_reasoning_content():
    assert probe.judge_answer(PROBE, 200, chat(None, reasoning='17 + 25 = 42'))[1] == []


@pytest.mark.parametrize('body, words', [
    (chat('43'), "expected '42'"),
    (chat('420'), "expected '42'"),
    (chat('4.2'), "expected '42'"),
    (chat(''), 'empty answer'),
    (chat('42 \ufffd\ufffd'), 'replacement characters'),
    (chat(' '.join(['the'] * 40)), 'repeated-token loop'),
    (chat('42' + 'ab' * 30), 'repeated-token loop'),
    (chat('42', logprobs=[float('nan'), -0.1]), 'not finite'),
    (chat('42', logprobs=[None]), 'not finite'),
    ({'error': 'x'}, 'not a chat completion'),
])
def test_wrong_answers_are_named(body, words):
    problems = probe.judge_answer(PROBE, 200, body)[1]
    assert any(words in p for p in problems), problems


def test_an_http_error_is_a_failed_probe():
    problems = probe.judge_answer(PROBE, 401, {'error': 'Unauthorized'})[1]
    assert problems and problems[0].startswith('HTTP 401')


def test_ordinary_text_is_not_a_loop():
    assert probe.repeated_loop('Paris is the capital of France, and it has been for a very long time indeed.') is None
    assert probe.repeated_loop('1 2 3 4 5 6 7 8 9 10 11 12 13 14') is None


# ---------------------------------------------------------------- the unit
UNIT = ('[Service]\nEnvironmentFile=/etc/glm5/glm5-sglang.env\n'
        'ExecStart=/opt/glm5/sglang/bin/python -m sglang.launch_server --model-path /models/GLM-5-NVFP4 '
        '--served-model-name glm-5 --host 0.0.0.0 --port 8000 --tp 8 --disable-radix-cache --api-key ${SGLANG_API_KEY}\n')


def test_the_unit_says_what_to_test():
    u = sglang_unit_launch(UNIT)
    assert u['python'] == '/opt/glm5/sglang/bin/python'
    assert u['base_url'] == 'http://127.0.0.1:8000'
    assert (u['model_path'], u['tokenizer'], u['served_model_name']) == ('/models/GLM-5-NVFP4',) * 2 + ('glm-5',)
    assert '--api-key' not in u['argv'] and '--disable-radix-cache' in u['argv']
    other = sglang_unit_launch(UNIT.replace('--tp 8', '--tp 4'))
    assert other['flags_sha256'] != u['flags_sha256'] and len(u['flags_sha256']) == 64
    # older units (--api-key=: a key may begin with '-') and the unit as sglang_service writes it now (the key from the
    # environment through the launcher, on no command line): the same flag set, the same identity in the history
    eq = sglang_unit_launch(UNIT.replace('--api-key ${SGLANG_API_KEY}', '--api-key=${SGLANG_API_KEY}'))
    assert eq['argv'] == u['argv'] and eq['flags_sha256'] == u['flags_sha256']
    now = sglang_unit_launch(UNIT.replace(' --api-key ${SGLANG_API_KEY}', '').replace(
        'python -m', 'python /usr/local/libexec/glm5-sglang-launch -m'))
    assert now['argv'] == u['argv'] and now['flags_sha256'] == u['flags_sha256'] and now['python'] == u['python']
    # the lab's unit: the emulator as a script after the launcher
    lab = sglang_unit_launch(UNIT.replace(' --api-key ${SGLANG_API_KEY}', '').replace(
        'python -m sglang.launch_server', 'python /usr/local/libexec/glm5-sglang-launch /opt/glm5/lab/sglang-emulator'))
    assert lab['argv'][:2] == ['/opt/glm5/sglang/bin/python', '/opt/glm5/lab/sglang-emulator'] and lab['port'] == 8000


def test_a_unit_without_a_launch_line_is_refused():
    with pytest.raises(AnsibleFilterError, match='ExecStart'):
        sglang_unit_launch('[Service]\n')
    with pytest.raises(AnsibleFilterError, match='--port'):
        sglang_unit_launch('ExecStart=/py -m sglang.launch_server --model-path /m\n')


def test_the_key_from_the_environment_file():
    text = '# comment\nSGLANG_CACHE_DIR="/var/cache/sglang"\nSGLANG_API_KEY="k-\\"1"\n'
    assert env_file_value(text, 'SGLANG_API_KEY') == 'k-"1'
    assert env_file_value(text, 'MISSING') == ''


# ---------------------------------------------------------------- golden runs
def load(case):
    d = os.path.join(GOLDEN, case)
    with open(os.path.join(d, 'summary.json')) as fh:
        summary = json.load(fh)
    with open(os.path.join(d, 'bench.jsonl')) as fh:
        records = results.parse_jsonl(fh.read())
    samples = []
    if os.path.exists(os.path.join(d, 'gpu.jsonl')):
        with open(os.path.join(d, 'gpu.jsonl')) as fh:
            samples = results.parse_jsonl(fh.read())
    return summary, records, samples


def settings_of(summary):
    cfg = dict(summary['settings'], baseline=summary['baseline'], limits=summary['limits'])
    return cfg


def test_there_are_golden_runs():
    assert {'healthy', 'slow', 'crash'} <= set(CASES), CASES


@pytest.mark.parametrize('case', CASES)
def test_golden_runs_are_decided_as_they_were(case):
    """The decisions taken on the real run reproduce from its raw JSONL."""
    summary, records, _ = load(case)
    levels = results.evaluate(summary['sweep'], records, settings_of(summary))
    assert levels == summary['levels']


@pytest.mark.parametrize('case', CASES)
def test_the_figures_are_bench_servings_own(case):
    summary, records, _ = load(case)
    for item, lv in zip(summary['sweep'], summary['levels'], strict=True):
        if item['line'] is None:
            continue
        rec = records[item['line']]
        assert rec['max_concurrency'] == lv['concurrency']
        assert lv['metrics']['total_tok_s'] == rec['total_throughput']
        assert lv['metrics']['output_tok_s'] == rec['output_throughput']
        assert lv['metrics']['p99_tpot_ms'] == rec['p99_tpot_ms']
        assert lv['metrics']['failed'] == item['prompts'] - rec['completed']


def test_the_healthy_run_passes_every_gate():
    summary, _, _ = load('healthy')
    assert summary['passed'] and summary['reasons'] == []
    assert all(g['passed'] for lv in summary['levels'] for g in lv['gates'])
    assert all(lv['metrics']['failed'] == 0 for lv in summary['levels'])


def test_the_slow_run_fails_on_throughput():
    summary, _, _ = load('slow')
    assert not summary['passed']
    failed = [g for lv in summary['levels'] for g in lv['gates'] if not g['passed']]
    assert failed and all(g['gate'] in ('total_tok_s', 'output_tok_s', 'p99_tpot_ms') for g in failed)
    assert all(g['value'] < g['threshold'] for g in failed if g['gate'].endswith('tok_s'))


def test_the_crashed_run_fails_on_lost_requests():
    summary, _, _ = load('crash')
    assert not summary['passed']
    lost = [lv for lv in summary['levels'] if lv['metrics']['failed'] != 0 or lv['metrics']['completed'] is None]
    assert lost, summary['levels']
    assert any('failed' in r or 'no result' in r for r in summary['reasons'])


def test_a_level_that_fell_short_by_a_little_fails_its_gate():
    summary, records, _ = load('healthy')
    cfg = settings_of(summary)
    top = summary['sweep'][-1]['concurrency']
    got = records[summary['sweep'][-1]['line']]['total_throughput']
    cfg['baseline'] = dict(cfg['baseline'], **{str(top): {'total_tok_s': got / cfg['tolerance'] * 1.01}})
    levels = results.evaluate(summary['sweep'], records, cfg)
    assert not levels[-1]['passed']
    assert [g['gate'] for g in levels[-1]['gates'] if not g['passed']] == ['total_tok_s']


def png_size(path):
    with open(path, 'rb') as fh:
        head = fh.read(24)
    assert head[:8] == b'\x89PNG\r\n\x1a\n'
    return struct.unpack('>II', head[16:24])


def test_the_report_folder_and_the_index(tmp_path, capsys):
    """The module writes the report of a golden run, then of a second run; the index lists both, the second
    overlays the first, and a rollback re-report of the same run replaces its entry."""
    history = tmp_path / 'history'
    runs = []
    for case in ('healthy', 'slow'):
        summary, _, _ = load(case)
        run_dir = history / summary['run']
        run_dir.mkdir(parents=True)
        for name in ('bench.jsonl', 'gpu.jsonl'):
            src = os.path.join(GOLDEN, case, name)
            if os.path.exists(src):
                (run_dir / name).write_bytes(open(src, 'rb').read())
        args = dict(settings=dict(settings_of(summary), probes=defaults()['probes']), run_id=summary['run'],
                    started=summary['started'], run_dir=str(run_dir), history_dir=str(history), meta=summary['meta'],
                    probe=summary['probe'], sweep=summary['sweep'])
        out = run_module(sglang_smoke_report, capsys, **args)
        assert out['passed'] == summary['passed'], out.get('msg')
        runs.append((summary, args, out))
    summary, args, out = runs[1]
    for name in ('summary.json', 'report.md', 'throughput.png', 'latency.png', 'gpus.png'):
        assert name in out['files']
    for name in ('throughput.png', 'latency.png', 'gpus.png'):
        w, h = png_size(history / summary['run'] / name)
        assert w >= 800 and h >= 300
    md = (history / summary['run'] / 'report.md').read_text()
    assert 'FAILED' in md and '| concurrency |' in md and 'Failed because:' in md
    assert md.endswith('![throughput](throughput.png)\n![latency](latency.png)\n![gpus](gpus.png)\n'), md[-200:]
    written = json.loads((history / summary['run'] / 'summary.json').read_text())
    assert written['meta']['flags_sha256'] == summary['meta']['flags_sha256']
    assert written['levels'] == summary['levels']
    index = [json.loads(x) for x in (history / 'index.jsonl').read_text().splitlines()]
    assert [e['run'] for e in index] == sorted(r[0]['run'] for r in runs)
    assert '[{0}]({0}/report.md)'.format(summary['run']) in (history / 'index.md').read_text()
    png_size(history / 'trend.png')
    # a rollback re-report of the second run replaces its entry
    args = copy.deepcopy(args)
    args['rollback'] = {'restored': True, 'text': 'Rolled back to run X', 'probe': {'passed': True, 'problems': []}}
    out = run_module(sglang_smoke_report, capsys, **args)
    index = [json.loads(x) for x in (history / 'index.jsonl').read_text().splitlines()]
    assert len(index) == 2 and {e['run']: e['rolled_back'] for e in index}[summary['run']] is True
    assert 'Rollback: Rolled back to run X' in out['markdown']
    assert 'Probe after rollback: passed' in out['markdown']


def test_gpus_far_under_their_power_limit_are_pointed_out():
    summary, _, _ = load('healthy')
    note = results.power_note(results.by_level(summary['gpu']))
    assert note.startswith('GPU power: at concurrency 1024 the GPUs drew 250 W of a 600 W limit (42 %)')
    busy = {1024: {'mean_power_w': 560.0, 'power_limit_w': 600.0, 'mean_util_pct': 97.0}}
    assert results.power_note(busy) is None and results.power_note({}) is None
    assert 'GPU power:' in report.markdown(summary)


def test_two_golden_runs_side_by_side(tmp_path):
    """glm5 compare's table and plot: the slow run against the healthy one."""
    healthy, slow = load('healthy')[0], load('slow')[0]
    cmp = report.compare(healthy, slow)
    assert [r['run'] for r in cmp['runs']] == [healthy['run'], slow['run']]
    assert [row['concurrency'] for row in cmp['levels']] == [1, 64, 256, 512, 1024]
    one = cmp['levels'][1]['total_tok_s']
    assert (one['a'], one['b']) == (healthy['levels'][1]['metrics']['total_tok_s'],
                                    slow['levels'][1]['metrics']['total_tok_s'])
    assert one['change_pct'] == pytest.approx(100 * (one['b'] - one['a']) / one['a']) and one['change_pct'] < -40
    assert one['better'] is False
    tpot = cmp['levels'][0]['p99_tpot_ms']
    assert tpot['change_pct'] > 0 and tpot['better'] is False          # slower tokens: a higher latency is worse
    assert cmp['levels'][2]['total_tok_s'] == {'a': healthy['levels'][2]['metrics']['total_tok_s'], 'b': None,
                                               'change_pct': None, 'better': None}
    assert cmp['levels'][1]['passed'] == {'a': True, 'b': False}
    same = {m['key']: m['same'] for m in cmp['meta']}
    assert same['sglang'] and same['profile'] and same['flags_sha256'], cmp['meta']   # the slow one: an env fault
    assert same['workload'] and cmp['meta'][-1]['a'] == 'random-ids 256/128 range ratio 0.0', cmp['meta']
    text = report.compare_markdown(cmp)
    assert text.startswith('# {0} (pass) vs {1} (FAIL)'.format(healthy['run'], slow['run']))
    assert '| 64 | 705.2 -> 354.0 (-49.8 %, worse) |' in text, text
    assert '| 256 | 1,856.3 -> - |' in text and '| pass / FAIL |' in text
    changed = dict(slow, meta=dict(slow['meta'], sglang='0.5.13', flags_sha256='f' * 64),
                   settings=dict(slow['settings'], input_len=512))
    text = report.compare_markdown(report.compare(healthy, changed))
    assert 'sglang: 0.5.12.post1 -> 0.5.13' in text and 'flags_sha256: 14925827183e -> ffffffffffff' in text
    assert 'workload: random-ids 256/128 range ratio 0.0 -> random-ids 512/128 range ratio 0.0' in text, text
    plots.plot_compare(healthy, slow, str(tmp_path / 'cmp.png'))
    assert png_size(str(tmp_path / 'cmp.png')) == (1200, 800)


def test_the_throughput_plot_marks_the_baseline_and_gate_only_at_the_levels_that_have_them(monkeypatch, tmp_path):
    """Output tok/s has a baseline at 1 and 1024 only: a line between the two drew a gate at 64..512 that the smoke
    test does not apply, and a healthy run looked below it there. Levels the run did not sweep are not drawn."""
    figures = []
    monkeypatch.setattr(plots, '_save', lambda plt, fig, path: figures.append(fig))
    summary, _, _ = load('healthy')
    plots.plot_throughput(summary, None, str(tmp_path / 'throughput.png'))
    (fig,) = figures
    total, output = fig.axes
    for ax, levels in ((total, [64, 256, 512, 1024]), (output, [1, 1024])):
        marks = {line.get_label().split(' (')[0]: line for line in ax.get_lines()}
        for name in ('baseline', 'gate'):
            assert list(marks[name].get_xdata()) == levels, (name, marks[name].get_xdata())
            assert marks[name].get_linestyle() == 'None', (name, marks[name].get_linestyle())
    gate = {line.get_label().split(' (')[0]: line for line in output.get_lines()}['gate']
    assert list(gate.get_ydata()) == pytest.approx([8.2 * 0.9, 1240 * 0.9])
    # a run that swept 1 and 64 only (the lab's tests): the baseline's other levels are not drawn
    figures.clear()
    plots.plot_throughput(dict(summary, levels=summary['levels'][:2]), None, str(tmp_path / 'throughput.png'))
    total, output = figures[0].axes
    for ax, levels in ((total, [64]), (output, [1])):
        marks = {line.get_label().split(' (')[0]: line for line in ax.get_lines()}
        assert list(marks['baseline'].get_xdata()) == levels and list(marks['gate'].get_xdata()) == levels


def test_the_trend_is_linear_with_plain_ticks_unless_its_throughputs_span_a_decade(monkeypatch, tmp_path):
    """The fleet's history has one level (1,400-1,414 tok/s): on the log axis it was a flat band with its ticks
    labelled 1.405x10^3. Linear then; log where the single stream's tens of tok/s sit beside the thousands."""
    figures = []
    monkeypatch.setattr(plots, '_save', lambda plt, fig, path: figures.append(fig))

    def entry(run, **tok_s):
        return {'run': run, 'passed': True, 'levels': {k[1:]: {'total_tok_s': v} for k, v in tok_s.items()}}
    narrow = [entry('20261203T0{0}0000Z'.format(i), c128=v) for i, v in enumerate([1400.0, 1405.9, 1414.0])]
    plots.plot_trend(narrow, str(tmp_path / 'trend.png'))
    (ax,) = figures[-1].axes
    assert ax.get_yscale() == 'linear' and ax.get_ylim()[0] == 0
    figures[-1].canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert labels and all(re.fullmatch(r'[0-9,]+', t) for t in labels), labels
    wide = [entry('20261203T0{0}0000Z'.format(i), c1=8.2, c1024=3740.0) for i in range(2)]
    plots.plot_trend(wide, str(tmp_path / 'trend.png'))
    assert figures[-1].axes[0].get_yscale() == 'log'
    assert plots.trend_scale([]) == 'linear' and plots.trend_scale([0.0, 5.0]) == 'linear'


@pytest.mark.parametrize('previous', [False, True])
def test_a_failed_run_with_nothing_to_go_back_to_says_so(tmp_path, previous):
    """The rollback step when it must not roll back: no previous unit and environment file, or a previous pair that
    never passed. Ansible 2.19 templates a loop's labels for skipped items too, and the labels read item.stat.path
    (absent when the .previous files are): the rollback failed with a templating error instead of saying why it did
    not roll back (a failed smoke test on a node's first or unchanged deploy)."""
    import subprocess
    import sys
    unit, env = tmp_path / 'x.service', tmp_path / 'x.env'
    unit.write_text('[Service]\n')
    env.write_text('K=v\n')
    if previous:
        (tmp_path / 'x.service.previous').write_text('[Service]\nold\n')
        (tmp_path / 'x.env.previous').write_text('K=old\n')
    out = tmp_path / 'rollback.json'
    play = [{'hosts': 'localhost', 'connection': 'local', 'gather_facts': False,
             'vars': {'ansible_python_interpreter': sys.executable},
             'tasks': [{'ansible.builtin.include_role': {'name': 'sglang_smoke', 'tasks_from': 'rollback.yml'}},
                       {'ansible.builtin.copy': {'content': '{{ __sglang_smoke_rollback | to_json }}', 'dest': str(out),
                                                 'mode': '0600'}}]}]
    (tmp_path / 'play.yml').write_text(yaml.safe_dump(play))
    # the node's contract (sglang_service_node), its unit and environment file here
    contract = {'service': 'x', 'unit': str(unit), 'env_file': str(env), 'previous_suffix': '.previous',
                'failed_suffix': '.failed', 'passed_file': str(tmp_path / 'passed.json')}   # none passed here
    extra = {'sglang_service_node': contract,
             '__sglang_smoke_files': {'results': []}, '__sglang_smoke_meta': {'unit_sha256': '', 'env_sha256': ''}}
    r = subprocess.run([os.path.join(os.path.dirname(sys.executable), 'ansible-playbook'), '-i', 'localhost,',
                        str(tmp_path / 'play.yml'), '-e', json.dumps(extra)], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg')), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    done = json.loads(out.read_text())
    assert not done['restored'], done
    assert done['text'].startswith('Not rolled back: the previous configuration never passed a smoke test' if previous
                                   else 'Not rolled back: there is no previous unit and environment file'), done
    assert unit.read_text() == '[Service]\n' and env.read_text() == 'K=v\n'


def test_only_the_ttfts_of_bench_servings_details_are_kept_and_a_failed_requests_is_none():
    import sglang_bench
    line = {'completed': 2, 'ttfts': [0.5, 0.0, 0.7], 'errors': ['', 'HTTP 503', ''], 'itls': [[0.1], [], [0.2]],
            'generated_texts': ['a', '', 'b'], 'input_lens': [3, 3, 3], 'output_lens': [1, 0, 1]}
    assert sglang_bench.only_ttfts(line) == {'completed': 2, 'ttfts': [0.5, None, 0.7]}


def test_a_bench_serving_line_leaves_sglang_bench_without_a_secret():
    """bench_serving copies /server_info, the API key among sglang's args, into its result line (this golden run's
    line holds a lab key): sglang_bench scrubs the line before it reaches the history."""
    import sglang_bench
    with open(os.path.join(GOLDEN, 'healthy', 'bench.jsonl')) as fh:
        line = json.loads(fh.readline())
    key = line['server_info']['api_key']
    line['server_info']['admin_api_key'] = 'admin-secret'
    line['note'] = 'Bearer ' + key
    clean = sglang_bench.scrub(line, [key])
    assert key not in json.dumps(clean) and 'admin-secret' not in json.dumps(clean)
    assert clean['server_info']['api_key'] == clean['server_info']['admin_api_key'] == '(redacted)'
    assert clean['note'] == 'Bearer (redacted)'
    assert clean['server_info']['ssl_keyfile_password'] is None                 # unset stays unset
    assert dict(clean, server_info=None, note=None) == dict(line, server_info=None, note=None)  # the figures as they were


def test_a_report_whose_sweep_never_ran_links_only_the_plots_it_has(tmp_path):
    """A probe that failed skips the sweep: no throughput or latency plot is drawn, and report.md linked them anyway."""
    summary, _, samples = load('healthy')
    summary = dict(copy.deepcopy(summary), levels=[], sweep=[], passed=False)
    files = plots.write_report(str(tmp_path), summary, samples, None)
    assert files == ['summary.json', 'report.md', 'gpus.png'], files
    md = (tmp_path / 'report.md').read_text()
    assert '![gpus](gpus.png)' in md and 'throughput.png' not in md and 'latency.png' not in md, md[-300:]
    assert sorted(os.listdir(str(tmp_path))) == ['gpus.png', 'report.md', 'summary.json']


def test_an_engine_that_restarted_during_a_level_is_said_so_and_fails_it():
    """The engine dying mid-sweep was reported as the client's ConnectionError on /server_info; sglang_bench reads
    the unit before and after the level and says what happened to the engine, and the level fails on it even when
    bench_serving still wrote a line."""
    import sglang_bench
    before = {'ActiveState': 'active', 'SubState': 'running', 'MainPID': '4242', 'NRestarts': '0'}
    assert sglang_bench.engine_change('glm5-sglang', before, dict(before)) is None
    assert sglang_bench.engine_change('glm5-sglang', None, before) is None                       # not watched
    text = sglang_bench.engine_change('glm5-sglang', before, {'ActiveState': 'activating', 'SubState': 'auto-restart',
                                                              'MainPID': '0', 'NRestarts': '1'})
    assert text == ('the engine stopped or restarted during this level: glm5-sglang was active (running) with main '
                    'PID 4242; it is now activating (auto-restart), main PID none, restarted 1 time(s) by systemd '
                    'meanwhile (journalctl -u glm5-sglang)')
    summary, records, _ = load('healthy')
    cfg = settings_of(summary)
    sweep = [{'concurrency': 1, 'prompts': 8, 'line': 0, 'error': None, 'engine': text}]
    (level,) = results.evaluate(sweep, records, cfg)
    assert not level['passed'] and [g for g in level['gates'] if not g['passed']] == [
        {'gate': 'engine', 'value': None, 'threshold': None, 'passed': False, 'text': text}]
    sweep = [{'concurrency': 1, 'prompts': 8, 'line': None, 'error': text + '; bench_serving exited 1', 'engine': text}]
    (level,) = results.evaluate(sweep, records, cfg)
    assert level['gates'][0]['text'].startswith('no result from bench_serving at concurrency 1: the engine stopped')


def test_the_bench_module_refuses_relative_files_before_running(capsys, tmp_path, monkeypatch):
    """output_file: bench.jsonl was a FileNotFoundError traceback from os.makedirs('')."""
    import sglang_bench
    monkeypatch.chdir(tmp_path)
    out = run_module(sglang_bench, capsys, python='/bin/false', base_url='http://127.0.0.1:9', model='m',
                     tokenizer=str(tmp_path), concurrency=1, prompts=1, output_file='bench.jsonl',
                     log_file=str(tmp_path / 'bench.log'), samples_file='gpu.jsonl', nvidia_smi='')
    assert out['failed'] and out['msg'] == ("output_file, samples_file must be absolute paths, got 'bench.jsonl', "
                                            "'gpu.jsonl'"), out
    assert os.listdir(tmp_path) == []


def test_the_report_in_check_mode_writes_nothing_and_says_it_would(tmp_path, capsys):
    """Check mode reported changed=False where the real run writes a report (changed=True): a recap that hid it."""
    summary, _, _ = load('healthy')
    history = tmp_path / 'history'
    args = dict(settings=dict(settings_of(summary), probes=defaults()['probes']), run_id=summary['run'],
                started=summary['started'], run_dir=str(history / summary['run']), history_dir=str(history),
                meta=summary['meta'], probe=summary['probe'], sweep=summary['sweep'])
    out = run_module(sglang_smoke_report, capsys, check_mode=True, **args)
    assert not out.get('failed') and out['changed'] is True, out
    assert not history.exists()
    out = run_module(sglang_smoke_report, capsys, check_mode=True, action='validate', settings=args['settings'])
    assert not out.get('failed') and out['changed'] is False, out
