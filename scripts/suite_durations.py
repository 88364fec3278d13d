#!/usr/bin/env python3
"""Where make test's time goes: each step's wall time, and inside it each test (pytest's JUnit XML) or each
playbook task (Ansible's junit callback), as a table.

    suite_durations.py step NAME -- COMMAND...   run COMMAND, record its wall time and exit code (steps.jsonl),
                                                 its output also kept in logs/NAME.log
    suite_durations.py table [REPORTS]           the table of the last make test (build/test-reports): the last
                                                 run of each step
    suite_durations.py failed [REPORTS]          what failed: the end of each failed step's log, then each failed
                                                 step with its failed tests and tasks (make test prints it when it
                                                 fails)

make test records every step this way; `make durations` prints the table. Anything over --limit (300 s) is marked:
tests/README.md says why each such line is allowed.
"""
import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

REPORTS = 'build/test-reports'
LIMIT = 300.0
ANSI = re.compile(r'\x1b\[[0-9;]*[A-Za-z]')


def cpu_busy():
    """Seconds of CPU the whole machine has spent busy since boot (/proc/stat: all but idle and iowait)."""
    with open('/proc/stat') as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / float(os.sysconf('SC_CLK_TCK'))


def children_cpu():
    """CPU seconds (user + system) of this process's finished children and theirs: a step's own controller-side work
    (Ansible, pytest, ssh, the clients it ran), not the containers' (their processes are the lab's, not the step's)."""
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def log_path(reports, step):
    """Where a step's output is kept (the console shows it too)."""
    return os.path.join(reports, 'logs', step + '.log')


def step(name, argv, reports=REPORTS):
    """Run argv, its output passed through and kept in logs/<name>.log; record wall time, exit code and CPU."""
    os.makedirs(os.path.join(reports, 'logs'), exist_ok=True)
    start, busy, own = time.time(), cpu_busy(), children_cpu()
    with open(log_path(reports, name), 'wb') as log:
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as exc:      # recorded as the shell records a command it cannot run, so `failed` names it
            said = 'step {0}: cannot run {1}: {2}\n'.format(name, argv[0], exc.strerror or exc)
            sys.stderr.write(said)
            log.write(said.encode())
            proc, rc = None, 127
        if proc:
            out = sys.stdout.buffer
            try:
                for chunk in iter(lambda: os.read(proc.stdout.fileno(), 65536), b''):
                    out.write(chunk)
                    out.flush()
                    log.write(chunk)
                rc = proc.wait()
            except KeyboardInterrupt:       # Ctrl-C reached the step's command too: recorded as interrupted
                proc.wait()
                rc = 130
    with open(os.path.join(reports, 'steps.jsonl'), 'a') as fh:
        fh.write(json.dumps({'step': name, 'start': start, 'end': time.time(), 'rc': rc,
                             'machine_cpu_s': round(cpu_busy() - busy, 1), 'cores': os.cpu_count(),
                             'own_cpu_s': round(children_cpu() - own, 1)}) + '\n')
    return rc


def read_steps(reports):
    """The last record of each step (a step recorded again in the same folder counts once, as it last ran), in the
    order they started; a line that is not a whole record is left out."""
    path = os.path.join(reports, 'steps.jsonl')
    if not os.path.exists(path):
        return []
    last = {}
    with open(path) as fh:
        for line in fh:
            try:
                record = json.loads(line)
                if isinstance(record, dict) and isinstance(record['step'], str):
                    float(record['start']), float(record['end']), int(record['rc'])
                    last[record['step']] = record
            except (ValueError, KeyError, TypeError):
                continue
    return sorted(last.values(), key=lambda r: r['start'])


def junit_root(path):
    """A JUnit XML file's root, or None for one cut short (a run killed while writing it) - said, not a traceback."""
    try:
        return ET.parse(path).getroot()
    except (ET.ParseError, OSError) as exc:
        print('suite_durations: {0} left out: {1}'.format(path, exc), file=sys.stderr)
        return None


def seconds(text):
    try:
        return float(text or 0)
    except ValueError:
        return 0.0


def junit_cases(path):
    """(suite, case, seconds) of one JUnit XML file (pytest's or Ansible's junit callback)."""
    root = junit_root(path)
    if root is None:
        return
    suites = [root] if root.tag == 'testsuite' else root.findall('testsuite')
    for suite in suites:
        for case in suite.iter('testcase'):
            yield suite.get('name') or '', case.get('classname') or '', case.get('name') or '', \
                seconds(case.get('time'))


def playbook_name(path):
    """Ansible's junit callback names a file <playbook>-<epoch>.xml."""
    base = os.path.basename(path)[:-len('.xml')]
    return base.rsplit('-', 1)[0] if base.rsplit('-', 1)[-1].replace('.', '').isdigit() else base


def playbook_end(path):
    """When a playbook run ended: Ansible's junit callback names its file <playbook>-<epoch at the end>.xml."""
    try:
        return float(os.path.basename(path)[:-len('.xml')].rsplit('-', 1)[-1])
    except ValueError:
        return None


def collect(reports, walls=None):
    """{step: [(group, case, seconds)]}: pytest cases grouped by test file, playbook tasks by playbook run; walls
    (a dict, when given) gets {(step, playbook run): its wall time}, from the end of the step's run before it (or the
    step's start) to its own end. Its tasks' times do not add up to that: hosts run a task at once, and in a serial
    play Ansible's junit callback counts a later batch's task from the first batch's start (those are left out)."""
    out = collections.defaultdict(list)
    walls = {} if walls is None else walls
    starts = {st['step']: st['start'] for st in read_steps(reports)}
    for path in sorted(glob.glob(os.path.join(reports, '*.xml'))):
        name = os.path.basename(path)[:-len('.xml')]
        for _, classname, case, seconds in junit_cases(path):
            module = classname.split('.')[-1] if classname else '?'
            group = 'tests/{0}.py'.format(module) if module.startswith('test_') else classname
            out[name].append((group, case, seconds))
    for folder in sorted(glob.glob(os.path.join(reports, '*/'))):
        name = os.path.basename(folder.rstrip('/'))
        runs = collections.Counter()
        before = starts.get(name)
        for path in sorted(glob.glob(os.path.join(folder, '*.xml')), key=lambda p: (playbook_end(p) or 0, p)):
            play = playbook_name(path)
            runs[play] += 1
            label = play if runs[play] == 1 else '{0} (run {1})'.format(play, runs[play])
            end = playbook_end(path)
            wall = end - before if end is not None and before is not None and end >= before else None
            before = end if end is not None else before
            if wall is not None:
                walls[(name, label)] = wall
            for _, _classname, case, seconds in junit_cases(path):
                if wall is None or seconds <= wall:      # a serial play's later batches: not their own time
                    out[name].append((label, case, seconds))
    return out


def fmt(seconds):
    whole = int(round(seconds))
    return '{0:d}:{1:02d}'.format(whole // 60, whole % 60) if seconds >= 60 else '{0:.1f}s'.format(seconds)


def table(reports, limit=LIMIT, top=12):
    steps = read_steps(reports)
    walls = {}
    cases = collect(reports, walls)
    lines = []
    if steps:
        t0, t1 = min(s['start'] for s in steps), max(s['end'] for s in steps)
        lines.append('make test: {0} wall, {1} steps{2}'.format(
            fmt(t1 - t0), len(steps), '' if all(s['rc'] == 0 for s in steps) else ' (some FAILED)'))
        lines.append('')
        lines.append('The machine\'s CPU during a step counts every lane running beside it: a step at 100 % of {0} cores '
                     'waited for CPU, not for the lab. Its own CPU is this machine\'s side of the step (Ansible, pytest, '
                     'SSH, clients), not the containers\' (their engines and modules).'.format(steps[0].get('cores', '?')))
        lines.append('')
        lines.append('| step | starts at | wall | rc | machine CPU busy | its own CPU | inside (top groups) |')
        lines.append('|---|---:|---:|---:|---:|---:|---|')
        for s in steps:
            inside = collections.Counter()
            for group, _, seconds in cases.get(s['step'], []):
                inside[group] += seconds
            inside.update({group: wall - inside[group] for (step, group), wall in walls.items() if step == s['step']})
            top_groups = ', '.join('{0} {1}'.format(g, fmt(v)) for g, v in inside.most_common(3))
            mark = ' **over {0}**'.format(fmt(limit)) if s['end'] - s['start'] > limit else ''
            wall = max(s['end'] - s['start'], 0.001)
            busy = '{0:.0f} %'.format(100.0 * s['machine_cpu_s'] / wall / s['cores']) if 'machine_cpu_s' in s else '-'
            own = fmt(s['own_cpu_s']) if 'own_cpu_s' in s else '-'
            lines.append('| {0} | +{1} | {2}{3} | {4} | {5} | {6} | {7} |'.format(
                s['step'], fmt(s['start'] - t0), fmt(wall), mark, s['rc'], busy, own, top_groups))
        lines.append('')
    groups = collections.Counter()
    for name, items in cases.items():
        for group, _, seconds in items:
            groups[(name, group)] += seconds
    groups.update({key: wall - groups[key] for key, wall in walls.items()})        # a playbook run: its wall time
    if groups:
        lines.append('| step | test file / playbook run | time |')
        lines.append('|---|---|---:|')
        for (name, group), seconds in sorted(groups.items(), key=lambda kv: -kv[1]):
            mark = ' **over {0}**'.format(fmt(limit)) if seconds > limit else ''
            lines.append('| {0} | {1} | {2}{3} |'.format(name, group, fmt(seconds), mark))
        lines.append('')
        every = sorted(((seconds, name, group, case) for name, items in cases.items()
                        for group, case, seconds in items), reverse=True)
        lines.append('Slowest {0} tests / tasks:'.format(top))
        lines.append('')
        lines.append('| time | step | where | test / task |')
        lines.append('|---:|---|---|---|')
        for seconds, name, group, case in every[:top]:
            lines.append('| {0} | {1} | {2} | {3} |'.format(fmt(seconds), name, group, case.replace('|', '/')))
    lost = lost_reports(reports)
    if lost:
        lines.append('')
        lines.extend('JUnit report lost in {0} (its playbook\'s tasks are not above): Ansible\'s junit callback failed: '
                     '{1}'.format(step, why) for step, why in lost)
    if not lines:
        lines.append('no measurements in {0}: run make test'.format(reports))
    return '\n'.join(lines)


JUNIT_LOST = re.compile(r"Callback dispatch 'v2_playbook_on_stats' failed for plugin '[\w.]*junit': (.*?)"
                        r"(?= PLAYBOOK RECAP| PLAY RECAP| TASK \[| \S*(?:WARNING|ERROR)|$)")


def step_log(reports, step):
    """A step's log as text without its colours, '' where it left none."""
    path = log_path(reports, step)
    if not os.path.exists(path):
        return ''
    with open(path, 'rb') as fh:
        return ANSI.sub('', fh.read().decode('utf-8', 'replace'))


def lost_reports(reports, steps=None, texts=None):
    """(step, why) for each playbook whose JUnit report Ansible's junit callback could not write, from the steps' logs
    (Molecule boxes and wraps the warning: its lines joined first). Such a playbook's tasks are missing from the
    table and from what `failed` names: an escape character in a task's output made the XML not well-formed.
    texts: {step: its log's text} already read (`failed` reads each failed step's log once)."""
    found = []
    for log in sorted(glob.glob(os.path.join(reports, 'logs', '*.log'))):
        step = os.path.basename(log)[:-len('.log')]
        if steps is not None and step not in steps:
            continue
        text = (texts or {}).get(step)
        flat = re.sub(r'\s*\n[\s\u2502|]*', ' ', step_log(reports, step) if text is None else text)
        found.extend((step, why.strip()[:200]) for why in JUNIT_LOST.findall(flat))
    return found


def failures(path):
    """(case, the message's first lines, went on) of each failed or errored case of one JUnit XML file: a site.yml
    test's message is 'rc=N', then the task that failed and why (tests/siterun.py). `went on`: a playbook's task
    ('[host] play: task', Ansible's junit callback) after which that host ran more tasks - a failure a block rescued
    (a refusal a verify provokes on purpose, or the cleanup before its own fail), not the one that stopped the run."""
    root = junit_root(path)
    cases = list(root.iter('testcase')) if root is not None else []
    hosts = [re.match(r'\[([^\]]+)\] ', c.get('name') or '') for c in cases]
    for n, case in enumerate(cases):
        went_on = bool(hosts[n]) and any(h and h.group(1) == hosts[n].group(1) for h in hosts[n + 1:])
        for bad in list(case.findall('failure')) + list(case.findall('error')):
            text = (bad.get('message') or bad.text or '').strip()
            where = case.get('classname') or ''
            yield '{0}::{1}'.format(where, case.get('name')) if where else case.get('name'), \
                ' | '.join(line.strip() for line in text.splitlines()[:3] if line.strip())[:500], went_on


def failed(reports, tail=40):
    """What failed in the last make test: the end of each failed step's log, then (last, as CI shows the end of the
    output) each failed step with its failed tests / tasks."""
    steps = [s for s in read_steps(reports) if s['rc'] != 0]
    logs, summary, texts = [], [], {}
    for s in steps:
        log = log_path(reports, s['step'])
        summary.append('FAILED step {0} (exit {1}, after {2}); its log: {3}'.format(
            s['step'], s['rc'], fmt(s['end'] - s['start']), log))
        xmls = glob.glob(os.path.join(reports, s['step'] + '.xml')) + \
            sorted(glob.glob(os.path.join(reports, s['step'], '*.xml')), key=os.path.getmtime)
        for path in xmls:
            found = list(failures(path))
            rescued = [case for case, _, went_on in found if went_on]
            if rescued:
                summary.append('  {0} failed task(s) in {1} that its play went on from (rescued: refusals provoked on '
                               'purpose, cleanups), the last: {2}'.format(len(rescued), os.path.basename(path),
                                                                          rescued[-1]))
            summary.extend('  failed: {0}: {1}'.format(case, message) for case, message, went_on in found if not went_on)
        texts[s['step']] = step_log(reports, s['step'])
        if texts[s['step']]:
            end = texts[s['step']].splitlines()[-tail:]
            logs.append('The last {0} lines of {1}:'.format(len(end), log))
            logs.extend('  | ' + line for line in end)
            logs.append('')
    for step, why in lost_reports(reports, set(texts), texts):
        summary.append('  a playbook of {0} left no JUnit report, its failed task not named here (Ansible\'s junit '
                       'callback failed: {1}): read its log'.format(step, why))
    if not steps:
        summary.append('no failed step recorded in {0}'.format(reports))
    return '\n'.join(logs + summary)


def main(argv):
    if argv[:1] == ['step']:
        if '--' not in argv or argv.index('--') != 2 or len(argv) < 4 or not re.fullmatch(r'[\w.-]+', argv[1]) \
                or argv[1].startswith('.'):
            print('usage: suite_durations.py step NAME -- COMMAND... (NAME: letters, digits, ., _ and -)',
                  file=sys.stderr)
            return 2
        return step(argv[1], argv[3:], os.environ.get('GLM5_TEST_REPORTS', REPORTS))
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    sub = parser.add_subparsers(dest='cmd', required=True)
    t = sub.add_parser('table', help='the table of the last make test')
    t.add_argument('reports', nargs='?', default=REPORTS)
    t.add_argument('--limit', type=float, default=LIMIT, help='mark anything longer (seconds)')
    f = sub.add_parser('failed', help='what failed in the last make test')
    f.add_argument('reports', nargs='?', default=REPORTS)
    f.add_argument('--tail', type=int, default=40, help='lines of each failed step\'s log')
    args = parser.parse_args(argv)
    print(table(args.reports, args.limit) if args.cmd == 'table' else failed(args.reports, args.tail))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
