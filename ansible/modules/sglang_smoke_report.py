#!/usr/bin/python
from __future__ import annotations

DOCUMENTATION = r'''
---
module: sglang_smoke_report
short_description: The smoke test's settings check, gates and report folder (run on the controller)
description:
  - C(action=validate) checks the smoke test's settings (levels, lengths, range ratio, prompt counts, tolerance,
    baseline, latency limits, probes) and fails with every problem, one line each, before anything runs.
  - C(action=report) reads a run folder (C(bench.jsonl) written by sglang.bench_serving, C(gpu.jsonl) by the
    sglang_bench module), applies the gates to every level (all requests completed; total and output tok/s at least
    baseline x tolerance; p99 TTFT and TPOT at most their limits), and writes into the folder C(summary.json),
    C(report.md), C(throughput.png), C(latency.png) (with the baseline and the previous run overlaid) and
    C(gpus.png); then adds the run to C(history_dir)'s C(index.jsonl) and writes C(index.md) and C(trend.png).
    Calling it again for the same run (after a rollback) replaces that run's files and index entry.
  - Needs matplotlib (requirements.txt) where it runs.
options:
  action: {description: validate or report., type: str, choices: [validate, report], default: report}
  settings:
    description: levels, input_len, output_len, range_ratio, prompts_per_concurrency, min_prompts, tolerance,
      baseline, limits, probes, dataset.
    type: dict
    required: true
  run_id: {description: The run's name (its folder's)., type: str}
  started: {description: When the run started (UTC, ISO 8601)., type: str}
  run_dir: {description: The run folder on this machine., type: path}
  history_dir: {description: The folder holding every run's folder and the index., type: path}
  meta:
    description: What ran (node, sglang, profile, flags_sha256, patches, driver, model_revision, ...).
    type: dict
    default: {}
  probe: {description: The sglang_probe result (passed, problems, results)., type: dict}
  sweep: {description: The sglang_bench results, in order., type: list, elements: dict, default: []}
  rollback: {description: What the rollback did (restored, text, probe)., type: dict}
  note: {description: A line for the end of the report., type: str}
author: GLM-5 node maintainers
'''

EXAMPLES = r'''
- name: The report
  sglang_smoke_report:
    settings: "{{ settings }}"
    run_id: 20261130T120000Z-glm5
    started: "2026-11-30T12:00:00Z"
    run_dir: /tmp/smoke/runs/20261130T120000Z-glm5
    history_dir: /tmp/smoke/runs
    probe: "{{ probe }}"
    sweep: "{{ sweep.results }}"
  delegate_to: localhost
'''

RETURN = r'''
passed: {description: The verdict., returned: action=report, type: bool}
reasons: {description: Why it failed, one line each., returned: action=report, type: list}
markdown: {description: The report's table (report.md)., returned: action=report, type: str}
files: {description: The files written into run_dir., returned: action=report, type: list}
index_files: {description: The files written into history_dir., returned: action=report, type: list}
summary: {description: summary.json's content., returned: action=report, type: dict}
problems: {description: The settings' problems (action=validate fails with them)., returned: always, type: list}
'''

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.glm5_plots import plot_trend, write_report
from ansible.module_utils.glm5_report import index_entry, index_markdown, merge_index, previous_entry
from ansible.module_utils.glm5_results import build_summary, config_problems, evaluate, gpu_by_level, read_jsonl, scaled


SWEEP_KEYS = ('concurrency', 'prompts', 'line', 'exit_code', 'error', 'engine', 'seconds', 'samples',
              'open_files_limit', 'gpu_note')


def sweep_item(item):
    """What the report keeps of one sglang_bench result (a module that failed outright still names its level)."""
    out = {k: item.get(k) for k in SWEEP_KEYS}
    if out['concurrency'] is None:
        out['concurrency'] = item.get('item')
    if out['error'] is None and item.get('failed'):
        out['error'] = item.get('msg') or 'the sglang_bench module failed'
    return out


def report(p):
    settings = scaled(p['settings'])
    p['sweep'] = [sweep_item(item) for item in p['sweep'] or []]
    run_dir, history = p['run_dir'], p['history_dir']
    records = read_jsonl(os.path.join(run_dir, 'bench.jsonl'))
    samples = read_jsonl(os.path.join(run_dir, 'gpu.jsonl'))
    levels = evaluate(p['sweep'] or [], records, settings)
    summary = build_summary(p['run_id'], p['started'], p['meta'] or {}, settings, p['probe'], levels,
                            gpu_by_level(samples), p['note'])
    summary['sweep'] = p['sweep'] or []
    if p['rollback']:
        summary['rollback'] = p['rollback']
        rb_probe = p['rollback'].get('probe')
        if p['rollback'].get('restored') and rb_probe is not None and not rb_probe.get('passed'):
            summary['reasons'].append('after the rollback the probe failed too: ' +
                                      '; '.join(rb_probe.get('problems') or []))
    index_path = os.path.join(history, 'index.jsonl')
    entries = read_jsonl(index_path)
    previous = previous_entry(entries, p['run_id'], (p['meta'] or {}).get('node'))
    files = write_report(run_dir, summary, samples, previous)
    entries = merge_index(entries, index_entry(summary))
    os.makedirs(history, exist_ok=True)
    with open(index_path, 'w') as fh:
        for e in entries:
            fh.write(json.dumps(e, sort_keys=True) + '\n')
    with open(os.path.join(history, 'index.md'), 'w') as fh:
        fh.write(index_markdown(entries))
    plot_trend(entries, os.path.join(history, 'trend.png'))
    with open(os.path.join(run_dir, 'report.md')) as fh:
        md = fh.read().split('\n\n![throughput]')[0]
    return dict(changed=True, passed=summary['passed'], reasons=summary['reasons'], markdown=md, files=files,
                index_files=['index.jsonl', 'index.md', 'trend.png'], summary=summary, problems=[])


def main():
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(type='str', choices=['validate', 'report'], default='report'),
            settings=dict(type='dict', required=True),
            run_id=dict(type='str'),
            started=dict(type='str'),
            run_dir=dict(type='path'),
            history_dir=dict(type='path'),
            meta=dict(type='dict', default={}),
            probe=dict(type='dict'),
            sweep=dict(type='list', elements='dict', default=[]),
            rollback=dict(type='dict'),
            note=dict(type='str'),
        ),
        required_if=[('action', 'report', ('run_id', 'started', 'run_dir', 'history_dir'))],
        supports_check_mode=True,
    )
    problems = config_problems(module.params['settings'])
    if problems:
        module.fail_json(msg='The smoke test settings are not usable: ' + '; '.join(problems) +
                             '. Nothing was run.', problems=problems)
    if module.params['action'] == 'validate' or module.check_mode:
        # check mode: a report would be written, a change as the real run's is
        module.exit_json(changed=module.params['action'] == 'report', problems=[])
    try:
        module.exit_json(**report(module.params))
    except (ValueError, OSError) as exc:
        module.fail_json(msg='The smoke-test report could not be written: {0}'.format(exc))


if __name__ == '__main__':
    main()
