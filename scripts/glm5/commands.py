"""The subcommands: one function each, (args, inventory) -> exit status; COMMANDS maps their names."""
from __future__ import annotations

import json
import os
import secrets
import shlex
import sys
import time

from glm5 import fleet, monitoring
from glm5.errors import Interrupted, OpsError, UsageError
from glm5.node import Node
from glm5.progress import Progress
from glm5.render import gpu_table, iso, num, status_text, table
from glm5.runner import playbook_error, run_bench
from glm5.status import node_status


def cmd_status(args, inv):
    # the gateway's section first, when the inventory has one (-g: that one; else every gateway)
    gws = fleet.gateways(inv, args.gateway, every=True) if inv.gateways() or args.gateway else []
    sections = []
    for gw in gws:
        try:
            sections.append(fleet.gateway_status(gw))
        finally:
            gw.close()
    results = []
    for name in inv.select(args.node):
        node = Node(inv, name)
        try:
            results.append(node_status(node))
        finally:
            node.close()
    # Prometheus last (every monitoring host): what fires now, the fleet's page, the queries that matter
    watch = [monitoring.monitoring_status(inv, m) for m in inv.nodes(monitoring.MONITORING)]
    bad = any(r['problems'] for r in results + sections + watch)
    if args.json:
        doc = {'healthy': not bad}
        if sections:
            doc['gateway'] = sections[0] if len(sections) == 1 else sections
        doc['nodes'] = results
        if watch:
            doc['monitoring'] = watch
        print(json.dumps(doc, indent=1))
    else:
        print('\n\n'.join([fleet.gateway_text(s) for s in sections] + [status_text(r) for r in results]
                           + [monitoring.monitoring_text(w) for w in watch]))
    return 1 if bad else 0


def cmd_fleet(args, inv):
    gw = fleet.gateways(inv, args.gateway)[0]
    try:
        view = gw.view()
    finally:
        gw.close()
    print(json.dumps(view, indent=1) if args.json else fleet.fleet_text(view))
    return 1 if view['problems'] else 0


def _fleet_node(args, inv, what):
    if args.target and args.node and args.target != args.node:
        raise UsageError('{0} takes one node: {1} and -n {2} name two'.format(what, args.target, args.node))
    name = args.target or args.node
    if not name:
        raise UsageError('{0} needs the node: glm5 {0} NODE (one of {1})'.format(what, ', '.join(inv.nodes())))
    gws = fleet.in_front(inv, name)             # an inference node (else exit 2) behind a gateway
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if args.json else (lambda text: print(text, flush=True))
    return Node(inv, name), gws, say


def _gateway_timeout(args, gws, var):
    """--timeout, else the longest of the gateways' own bound (the variable, its default the role's: one place)."""
    return args.timeout or max(g.hv.number(var) for g in gws)


def _membership(args, inv, what, timeout_var, act, done_key, error, lock=False):
    """glm5 drain / undrain: act(gateways, node, timeout, say) on the node behind its gateways, then the result as
    --json asks, exit 1 with error(result, node, timeout) unless result[done_key]. lock: under the engine's lock
    (refused, naming its holder, while another run drives the engine)."""
    node, gws, say = _fleet_node(args, inv, what)
    timeout = _gateway_timeout(args, gws, timeout_var)
    try:
        if lock:
            node.lock('glm5 ' + what)
        res = act(gws, node, timeout, say)
    finally:
        node.unlock()
        node.close()
        for gw in gws:
            gw.close()
    if args.json:
        print(json.dumps(res, indent=1))
    if not res[done_key]:
        raise OpsError(error(res, node, timeout))
    return 0


def cmd_drain(args, inv):
    return _membership(args, inv, 'drain', 'sglang_gateway_drain_timeout',
                       lambda *a: fleet.drain(*a, force=args.force), 'drained', fleet.drain_error)


def cmd_undrain(args, inv):
    # Under the engine's lock: a deploy holds it from the node's leave through its smoke test's end (site.yml keeps the
    # restart's hold for the test) - a node a deploy has out is not put back under it (the deploy puts it back itself
    # once its test passed).
    # A drain takes no lock: taking a node out may not wait; a deploy that rejoins it reads the drained file again.
    return _membership(args, inv, 'undrain', 'sglang_gateway_join_timeout', fleet.undrain, 'healthy', fleet.undrain_error,
                       lock=True)


def cmd_gpus(args, inv):
    names = inv.select(args.node)
    nodes = [Node(inv, n) for n in names]
    n = 0
    try:
        while True:
            shown = []
            for node in nodes:
                g = node.gpus()
                if g.get('error'):
                    raise OpsError('{0}: {1}'.format(node.name, g['error']))
                shown.append({'node': node.name, 'time': iso(time.time()), 'driver': g['driver'], 'cuda': g['cuda'],
                              'gpus': g['gpus']})
            if args.json:
                print(json.dumps(shown if args.watch else {'nodes': shown}), flush=True)
            else:
                if args.watch and sys.stdout.isatty():
                    sys.stdout.write('\x1b[H\x1b[2J')
                for s in shown:
                    print('{0}  {1}  driver {2}, CUDA {3}\n{4}\n'.format(s['node'], s['time'], s['driver'], s['cuda'],
                                                                        gpu_table(s['gpus'])), flush=True)
            n += 1
            if not args.watch or (args.count and n >= args.count):
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
    finally:
        for node in nodes:
            node.close()


def cmd_logs(args, inv):
    node = Node(inv, inv.one(args.node))
    cmd = ['journalctl', '-u', node.service, '--no-pager', '-o', 'json' if args.json else 'short-iso']
    if args.since:
        cmd += ['--since', args.since]
    if args.follow:
        cmd += ['-n', str(args.lines), '-f']
    # journalctl's -n with --since gives the window's oldest lines: the newest are the last lines of the whole window
    line = ' '.join(map(shlex.quote, cmd))
    if args.since and not args.follow:
        line = 'set -o pipefail; {0} | tail -n {1}'.format(line, args.lines)
    elif not args.follow:
        line += ' -n {0}'.format(args.lines)
    try:
        r = node.ssh.run('bash -c {0}'.format(shlex.quote(line)), timeout=None if args.follow else 120,
                         stream='out', pty=args.follow)
    except KeyboardInterrupt:
        return 0
    finally:
        node.close()
    if args.follow and r.exited in (-1, 130):  # Ctrl-C: the far side's journalctl ended by it
        return 0
    if not r.ok:
        said = (r.stderr.strip().splitlines() or ['exit {0}'.format(r.exited)])[-1]
        # a --since journalctl cannot read is bad input (exit 2), as the README says
        error = UsageError if 'Failed to parse' in said else OpsError
        raise error('{0}: journalctl: {1}'.format(node.name, said))
    return 0


def cmd_bench(args, inv):
    name = inv.one(args.node)
    node = Node(inv, name)
    hv = node.hv
    levels = args.levels or hv.get('sglang_smoke_levels')
    # its own run id: another run beside it (a deploy, a second operator) makes a folder of its own
    run_id = '{0}-{1}-{2}'.format(time.strftime('%Y%m%dT%H%M%SZ', time.gmtime()), secrets.token_hex(4), name)
    extra = {'sglang_smoke_levels': levels, 'sglang_smoke_run_id': run_id}
    note = None
    if args.lengths:
        extra['sglang_smoke_input_len'], extra['sglang_smoke_output_len'] = args.lengths
        if list(args.lengths) != [hv.get('sglang_smoke_input_len'), hv.get('sglang_smoke_output_len')]:
            # the baseline and limits are for the deployment's lengths: other lengths are measured, not gated
            extra.update(sglang_smoke_baseline={}, sglang_smoke_limits={})
            note = ('lengths {0}/{1} are not the baseline\'s ({2}/{3}): gated on failed requests and the probe '
                    'only'.format(args.lengths[0], args.lengths[1], hv.get('sglang_smoke_input_len'),
                                  hv.get('sglang_smoke_output_len')))
    launch = node.launch()
    if launch is None:
        raise OpsError('{0}: no unit {1} in the container: deploy it first (site.yml)'.format(name, node.unit))
    health = node.health(launch['base_url'])
    if not health['ok']:
        raise OpsError('{0}: {1} is not ready ({2}{3}: {4}): glm5 status says more'.format(
            name, node.service, launch['base_url'], node.contract['ready_path'], health.get('status') or health.get('detail')))
    per, least = int(hv.get('sglang_smoke_prompts_per_concurrency')), int(hv.get('sglang_smoke_min_prompts'))
    prompts = {lv: max(least, per * lv) for lv in levels}
    progress = Progress(node, levels, prompts, sys.stderr if args.json else sys.stdout, run_id)
    if not args.json:
        print('{0}: the smoke test on demand, concurrency {1}{2}'.format(name, ', '.join(map(str, levels)),
                                                                        ' (' + note + ')' if note else ''), flush=True)
    returncode, output = run_bench(inv, name, extra, progress)
    run = progress.run
    summary = node.summary(run)
    node.close()
    if summary is None:
        raise OpsError('{0}: the bench playbook ended (exit {1}) without a report: {2}'.format(
            name, returncode, playbook_error(output)))
    folder = '{0}:{1}'.format(node.pve_host_name, node.history_path(run))
    if args.json:
        print(json.dumps({'run': run, 'folder': folder, 'passed': summary['passed'], 'reasons': summary['reasons'],
                          'note': note, 'summary': summary}, indent=1))
    else:
        from ansible.module_utils.glm5_report import markdown
        print('\n' + markdown(summary).rstrip() + '\nReport: {0}/report.md'.format(folder))
    return 0 if summary['passed'] else 1


def cmd_history(args, inv):
    from ansible.module_utils.glm5_report import entry_note
    node = Node(inv, inv.one(args.node))
    try:
        entries = node.history()
    finally:
        node.close()
    if args.json:
        print(json.dumps({'node': node.name, 'folder': '{0}:{1}'.format(node.pve_host_name, node.history_dir),
                          'runs': entries}, indent=1))
        return 0
    if not entries:
        print('{0}: no runs in {1}:{2}'.format(node.name, node.pve_host_name, node.history_dir))
        return 0
    rows = [('run', 'verdict', 'sglang', 'profile', 'flags', 'levels', 'headline total tok/s', 'output tok/s', 'note')]
    for e in entries:
        note = entry_note(e, 70)
        rows.append((e['run'], 'pass' if e.get('passed') else 'FAIL', e.get('sglang') or '', e.get('profile') or '',
                     (e.get('flags_sha256') or '')[:12], ','.join(sorted(e.get('levels') or {}, key=int)),
                     '{0} @{1}'.format(num(e.get('headline_total_tok_s')), e.get('headline_concurrency'))
                     if e.get('headline_total_tok_s') is not None else '-', num(e.get('headline_output_tok_s')), note))
    print('{0}: {1} runs in {2}:{3}\n{4}'.format(node.name, len(entries), node.pve_host_name, node.history_dir,
                                                 table(rows, right={6, 7})))
    return 0


def cmd_compare(args, inv):
    from ansible.module_utils.glm5_plots import plot_compare
    from ansible.module_utils.glm5_report import compare, compare_markdown
    if args.out:        # before the node is asked anything: where the plot goes must be a folder that is there
        folder = os.path.dirname(os.path.abspath(args.out))
        if not os.path.isdir(folder):
            raise UsageError('--out: {0} is not a folder that exists (the plot goes into it)'.format(folder))
        if os.path.isdir(args.out):
            raise UsageError('--out: {0} is a folder; give the plot\'s file name'.format(args.out))
    node = Node(inv, inv.one(args.node))
    try:
        runs = [e['run'] for e in node.history()]
        if len(args.runs) > 2:
            raise UsageError('compare takes at most two runs, got {0}'.format(len(args.runs)))
        if len(args.runs) == 2:
            wanted = list(args.runs)
        elif len(args.runs) == 1:
            if len(runs) < 1:
                raise UsageError('{0}: no runs in the bench history'.format(node.name))
            wanted = [args.runs[0], runs[-1]]
        else:
            if len(runs) < 2:
                raise UsageError('{0}: {1} run(s) in the bench history, compare needs two (glm5 bench makes one)'.format(
                    node.name, len(runs)))
            wanted = runs[-2:]
        resolved = [_resolve(r, runs, node) for r in wanted]
        if resolved[0] == resolved[1]:
            raise UsageError('{0}: both runs are {1}: name two runs'.format(node.name, resolved[0]))
        a, b = (node.summary(r) for r in resolved)
    finally:
        node.close()
    for r, s in zip(resolved, (a, b), strict=True):
        if s is None:
            raise OpsError('{0}: run {1} has no summary.json in {2}'.format(node.name, r, node.history_path(r)))
    a, b = sorted((a, b), key=lambda s: (s.get('started') or '', s['run']))
    cmp = compare(a, b)
    out = args.out or os.path.abspath('glm5-compare-{0}-vs-{1}.png'.format(a['run'], b['run']))
    plot_compare(a, b, out)
    cmp['plot'] = out
    if args.json:
        print(json.dumps(cmp, indent=1))
    else:
        print(compare_markdown(cmp).rstrip() + '\nPlot: {0}'.format(out))
    return 0


def _resolve(wanted, runs, node):
    """A run by its full name or a unique prefix (e.g. the timestamp)."""
    if wanted in runs:
        return wanted
    found = [r for r in runs if r.startswith(wanted)]
    if len(found) == 1:
        return found[0]
    if found:
        raise UsageError('{0}: {1!r} matches {2} runs ({3}): give more of it'.format(
            node.name, wanted, len(found), ', '.join(found[:4])))
    raise UsageError('{0}: no run {1!r} in {2}:{3} (glm5 history lists them)'.format(
        node.name, wanted, node.pve_host_name, node.history_dir))


def cmd_restart(args, inv):
    name = inv.one(args.node)
    # behind a gateway: out of it first (its in-flight requests finished), back in once ready - as a deploy does,
    # without recording an operator's drain (a node an operator drained stays out)
    gws = fleet.in_front(inv, name, required=False)
    node = Node(inv, name)
    say = (lambda text: None) if args.json else (lambda text: print(text, flush=True))
    left, doing = None, None        # doing: stopping or starting, once the node is out of its gateways (for Ctrl-C)
    try:
        launch = node.launch()
        if launch is None:
            raise OpsError('{0}: no unit {1} in the container'.format(node.name, node.unit))
        timeout = args.timeout or node.hv.number('sglang_service_ready_timeout')
        stop_timeout = node.hv.number('sglang_service_stop_timeout') + 60
        node.lock('glm5 restart')
        if gws:
            drain_timeout = _gateway_timeout(args, gws, 'sglang_gateway_drain_timeout')
            left = fleet.drain(gws, node, drain_timeout, say, record=False, force=args.force)
            if not left['drained']:
                back = fleet.undrain(gws, node, _gateway_timeout(args, gws, 'sglang_gateway_join_timeout'), say,
                                     record=False)
                raise OpsError('{0}: {1} requests still in flight after {2} s out of {3}: not restarted, {4}'.format(
                    node.name, left['in_flight'], drain_timeout, ', '.join(g.name for g in gws),
                    'back in' if back['healthy'] else 'put back (not healthy yet: glm5 fleet)'))
        say('{0}: stopping {1} (running requests drain first, up to {2} s)'.format(node.name, node.service,
                                                                                   stop_timeout - 60))
        doing = 'stopping'
        t0 = time.monotonic()
        r = node.ssh.run('systemctl stop {0}'.format(shlex.quote(node.service)), timeout=stop_timeout)
        stopped = round(time.monotonic() - t0, 1)
        if not r.ok:
            raise OpsError('{0}: systemctl stop {1}: {2}'.format(node.name, node.service, r.stderr.strip() or r.exited))
        say('{0}: stopped after {1} s; starting'.format(node.name, stopped))
        # an operator's restart is not a crash loop: the unit's start limit (StartLimitBurst) is reset first
        doing = 'starting'
        r = node.ssh.run('systemctl reset-failed {0}; systemctl start {0}'.format(shlex.quote(node.service)),
                         timeout=120)
        if not r.ok:
            raise OpsError('{0}: systemctl start {1}: {2}'.format(node.name, node.service, r.stderr.strip() or r.exited))
        t1 = time.monotonic()
        health = None
        while time.monotonic() - t1 < timeout:
            health = node.health(launch['base_url'])
            if health['ok']:
                break
            if node.unit_state()['active'] in ('failed', 'inactive'):
                break
            time.sleep(2)
        ready = round(time.monotonic() - t1, 1)
        unit = node.unit_state()
        ok = bool(health and health['ok'])
        if ok:
            say('{0}: {1} ready after {2} s ({3}{4} 200)'.format(node.name, node.service, ready, launch['base_url'],
                                                               node.contract['ready_path']))
        joined = None
        if gws and ok:
            joined = fleet.undrain(gws, node, _gateway_timeout(args, gws, 'sglang_gateway_join_timeout'), say,
                                   record=False)
            if not joined['healthy']:
                raise OpsError(fleet.undrain_error(joined, node, _gateway_timeout(
                    args, gws, 'sglang_gateway_join_timeout')))
    except KeyboardInterrupt:
        raise Interrupted(_restart_interrupted(node, gws, doing)) from None
    finally:
        node.unlock()
        node.close()
        for gw in gws:
            gw.close()
    if gws and not ok:
        say('{0}: left out of {1} (not ready)'.format(node.name, ', '.join(g.name for g in gws)))
    if args.json:
        print(json.dumps({'node': node.name, 'service': node.service, 'stopped_after_s': stopped, 'ready': ok,
                          'ready_after_s': ready if ok else None, 'unit': unit, 'health': health,
                          'gateways': {'left': left, 'joined': joined} if gws else None}, indent=1))
    if not ok:
        raise OpsError('{0}: {1} is not ready after {2} s: unit {3} ({4}), {5} {6} (glm5 logs -n {0})'.format(
            node.name, node.service, ready, unit['active'], unit['sub'], node.contract['ready_path'],
            (health or {}).get('status') or (health or {}).get('detail')))
    return 0


def _restart_interrupted(node, gws, doing):
    """Where a restart interrupted (Ctrl-C) left the node, in one line. Before the stop nothing changed, or
    glm5.fleet.drain put it back and said so (as glm5.fleet.undrain says where its put-back was cut short); from the
    stop on the node stays out of its gateways, its engine not known ready."""
    if doing is None:
        return '{0}: interrupted before the restart: nothing changed'.format(node.name)
    then = 'while {0} {1}'.format(node.service, {'stopping': 'stopped', 'starting': 'started'}[doing])
    if not gws:
        return '{0}: interrupted {1}: glm5 status -n {0} says where it stands, glm5 restart -n {0} again'.format(
            node.name, then)
    return ('{0}: interrupted {1}: it stays out of {2}; glm5 restart -n {0} again, or glm5 undrain {0} once glm5 '
            'status -n {0} says it is ready'.format(node.name, then, ', '.join(g.name for g in gws)))


COMMANDS = {'status': cmd_status, 'gpus': cmd_gpus, 'logs': cmd_logs, 'bench': cmd_bench, 'history': cmd_history,
            'compare': cmd_compare, 'restart': cmd_restart, 'fleet': cmd_fleet, 'drain': cmd_drain, 'undrain': cmd_undrain}
