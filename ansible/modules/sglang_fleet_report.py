#!/usr/bin/python
from __future__ import annotations

DOCUMENTATION = r'''
---
module: sglang_fleet_report
short_description: The fleet smoke test's settings check, sweep plan, gates and report folder (run on the controller)
description:
  - C(action=validate) checks the fleet smoke test's settings (per-node levels, tolerance, the TTFT the gateway may
    add, the nodes and their baselines) and fails with every problem, one line each, before any load; it returns the
    sweep's plan (C(plan)) - at each per-node level c every node is driven directly at c, all at once, then the same
    clients (one on each node) through the gateway at c each (c x nodes in all); each client sends
    C(prompts_each), as many prompts as the node's smoke test sends per concurrency.
  - C(action=validate_gateway) checks only the settings set on the gateway (C(levels), C(ttft_overhead_ms),
    C(poll)) before any node's smoke test - in site.yml's first play, so that a bad value is said before anything
    changes. It changes nothing.
  - C(action=report) reads a run folder (the result lines the sglang_bench module wrote, one file a client -
    C(direct-NODE.jsonl) at the node's own engine, C(gateway-NODE.jsonl) through the gateway from that node), applies
    the gates (every request completed, directly and through the gateway; total tok/s through it, the clients
    summed, at least the sum of the nodes' baselines at c, each at its own pace, x tolerance - or, where the engines
    were serving other clients as the level's clients started (a deploy under live traffic, where the test gets only
    its share of them), at least the nodes' total driven directly at once in this run x tolerance; the p99 TTFT the
    gateway adds - the slowest client's through it less the slowest node's directly, in this run - at most
    C(ttft_overhead_ms)), and writes C(summary.json), C(report.md) and C(fleet.png) into the folder, then the fleet
    history's C(index.jsonl), C(index.md) and C(trend.png).
  - Needs matplotlib (requirements.txt) where it runs.
options:
  action:
    description: validate_gateway, validate or report.
    type: str
    choices: [validate_gateway, validate, report]
    default: report
  settings:
    description: >-
      levels (per node), input_len, output_len, range_ratio, prompts_per_concurrency, min_prompts, tolerance,
      ttft_overhead_ms, poll, nodes ([{name, url, flags_sha256, baseline, speed_factor}]). With C(action=validate_gateway)
      only levels (empty - the nodes' common top level), ttft_overhead_ms and poll.
    type: dict
    required: true
  run_id: {description: The run's name (its folder's)., type: str}
  started: {description: When the run started (UTC, ISO 8601)., type: str}
  run_dir: {description: The run folder on this machine., type: path}
  history_dir: {description: The fleet's history (its runs' folders and its index) on this machine., type: path}
  meta: {description: What ran (gateway, url, policy, version)., type: dict, default: {}}
  probe: {description: The sglang_probe result through the gateway (passed, problems, results)., type: dict}
  sweep:
    description: >-
      One item a level, in the plan's order: C(direct) and C(gateway), the level's sglang_bench results of each node's
      client (each with C(node), where it ran) at its own engine and through the gateway; C(others), for each of
      C(direct) and C(gateway) the requests each node's engine was serving for other clients as those clients started
      (a count a node, null where its load report could not be read).
    type: list
    elements: dict
    default: []
author: GLM-5 node maintainers
'''

EXAMPLES = r'''
- name: The fleet report
  sglang_fleet_report:
    settings: "{{ fleet_settings }}"
    run_id: 20261201T120000Z-0a1b2c3d-glm5-gw
    started: "2026-12-01T12:00:00Z"
    run_dir: /tmp/fleet/runs/20261201T120000Z-0a1b2c3d-glm5-gw
    history_dir: /tmp/fleet/runs
    probe: "{{ probe }}"
    sweep: "{{ bench_results }}"
  delegate_to: localhost
'''

RETURN = r'''
plan: {description: "The sweep: [{per_node, concurrency, prompts, prompts_each}].", returned: always, type: list}
passed: {description: The verdict., returned: action=report, type: bool}
reasons: {description: Why it failed, one line each., returned: action=report, type: list}
markdown: {description: The report (report.md) less its plots., returned: action=report, type: str}
files: {description: The files written into run_dir., returned: action=report, type: list}
index_files: {description: The files written into history_dir., returned: action=report, type: list}
summary: {description: summary.json's content., returned: action=report, type: dict}
'''

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.glm5_fleet import gateway_problems, problems, sweep_plan, write

RUN_KEYS = ('concurrency', 'prompts', 'line', 'exit_code', 'error', 'engine', 'seconds')


def run_item(run, planned):
    """What the report keeps of one client's sglang_bench result (with node: where it ran); one that failed outright
    still names its level and says why."""
    out = {k: run.get(k) for k in RUN_KEYS}
    out['node'] = run.get('node')
    if out['concurrency'] is None:
        out['concurrency'] = planned['per_node']
    if out['prompts'] is None:
        out['prompts'] = planned['prompts_each']
    if out['error'] is None and run.get('failed'):
        out['error'] = run.get('msg') or 'the sglang_bench module failed'
    return out


def sweep_item(item, planned):
    """One level: the plan's figures, each client's run, directly and through the gateway, and the requests each
    engine served for other clients as those clients started ({how: {node: count or None}})."""
    out = dict(planned)
    for how in ('direct', 'gateway'):
        out[how] = [run_item(r, planned) for r in item.get(how) or []]
    out['others'] = {how: dict((item.get('others') or {}).get(how) or {}) for how in ('direct', 'gateway')}
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(type='str', choices=['validate_gateway', 'validate', 'report'], default='report'),
            settings=dict(type='dict', required=True),
            run_id=dict(type='str'),
            started=dict(type='str'),
            run_dir=dict(type='path'),
            history_dir=dict(type='path'),
            meta=dict(type='dict', default={}),
            probe=dict(type='dict'),
            sweep=dict(type='list', elements='dict', default=[]),
        ),
        required_if=[('action', 'report', ('run_id', 'started', 'run_dir', 'history_dir'))],
        supports_check_mode=True,
    )
    p = module.params
    gateway_only = p['action'] == 'validate_gateway'
    found = gateway_problems(p['settings'], levels_given=False) if gateway_only else problems(p['settings'])
    if found:
        module.fail_json(msg='The fleet smoke test settings are not usable: ' + '; '.join(found)
                         + ('. Nothing was changed.' if gateway_only else '. Nothing was run.'), problems=found)
    if gateway_only:
        module.exit_json(changed=False)
    plan = sweep_plan(p['settings'])
    if p['action'] == 'validate' or module.check_mode:
        # check mode: a report would be written, a change as the real run's is
        module.exit_json(changed=p['action'] == 'report', plan=plan)
    try:
        sweep = [sweep_item(item, planned) for item, planned in zip(p['sweep'] or [], plan, strict=False)]
        summary, files, index_files = write(p['run_dir'], p['history_dir'], p['run_id'], p['started'], p['meta'] or {},
                                            p['settings'], p['probe'], sweep)
    except (ValueError, OSError) as exc:
        module.fail_json(msg='The fleet smoke-test report could not be written: {0}'.format(exc), plan=plan)
    with open('{0}/report.md'.format(p['run_dir'])) as fh:
        md = fh.read().split('\n![fleet]')[0]
    module.exit_json(changed=True, plan=plan, passed=summary['passed'], reasons=summary['reasons'], markdown=md,
                     files=files, index_files=index_files, summary=summary)


if __name__ == '__main__':
    main()
