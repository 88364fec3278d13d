#!/usr/bin/python3
"""The gateway's start (its unit's ExecStart): smg launch with the nodes an operator drained left out of its
--worker-urls, so that a gateway that starts again - a deploy's restart or systemd's after a crash - never routes to
them. The drained file (glm5 drain writes it, atomically): a JSON list of {node, worker, since, by}.

    gateway-launch DRAINED_FILE -- SMG LAUNCH ARGV...

Only removes worker URLs (the launch line is the one the gateway's parser checked); with none left, no --worker-urls
(the gateway starts empty, nodes join through its control plane). smg 1.13 refuses to start power_of_two with fewer
than two workers: then it starts with round_robin (one worker or none: the same routing), said in the journal; its
next start with two or more is power_of_two again. A missing file: none drained. An unreadable one: every node, said
in the journal (a wrong list must not keep the front door shut).

The keys: each ${NAME} in the arguments is the environment's NAME (the environment file's SMG_API_KEY and
SMG_ADMIN_KEY), put in here, and smg runs in this process (the gateway environment's Python runs this file): the keys
are on no command line - `ps` shows this file's line with ${SMG_API_KEY} as text, then smg's title - and the variables
are gone from the environment before smg starts. A name the environment lacks (or has empty) stops the start."""
import json
import os
import re
import runpy
import sys

# ${NAME}: a secret the unit names and the environment file holds; the unit writes it $${NAME}, which systemd leaves
# as text (it would put the value on the command line)
SECRET = re.compile(r'\$\{([A-Za-z_][A-Za-z0-9_]*)\}')


def drained_workers(path):
    try:
        with open(path) as fh:
            items = json.load(fh)
    except FileNotFoundError:
        return set()
    except (OSError, ValueError) as exc:
        print('gateway-launch: {0} cannot be read ({1}): no node left out'.format(path, exc), file=sys.stderr)
        return set()
    if not isinstance(items, list):
        print('gateway-launch: {0} is not a JSON list: no node left out'.format(path), file=sys.stderr)
        return set()
    return {str(d.get('worker') or '').rstrip('/') for d in items if isinstance(d, dict) and d.get('worker')}


def without(argv, drained):
    """argv less the drained URLs of --worker-urls (and the flag itself when none is left)."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] != '--worker-urls':
            out.append(argv[i])
            i += 1
            continue
        j = i + 1
        while j < len(argv) and not argv[j].startswith('--'):
            j += 1
        kept = []
        for url in argv[i + 1:j]:
            if url.rstrip('/') in drained:
                print('gateway-launch: {0} left out (drained)'.format(url), file=sys.stderr)
            else:
                kept.append(url)
        if kept:
            out += ['--worker-urls'] + kept
        i = j
    return out


def policy_for(argv):
    """power_of_two needs two workers at start (smg 1.13): with fewer, round_robin."""
    if '--policy' not in argv:
        return argv
    i = argv.index('--policy')
    urls = 0
    if '--worker-urls' in argv:
        j = argv.index('--worker-urls') + 1
        while j < len(argv) and not argv[j].startswith('--'):
            urls, j = urls + 1, j + 1
    if i + 1 < len(argv) and argv[i + 1] == 'power_of_two' and urls < 2:
        print('gateway-launch: {0} worker(s) to start with: round_robin until a start with two or more (smg starts '
              'power_of_two with two workers at least)'.format(urls), file=sys.stderr)
        return argv[:i + 1] + ['round_robin'] + argv[i + 2:]
    return argv


def with_secrets(argv, environ):
    """(argv with each ${NAME} replaced by environ's NAME, the names used); a name missing or empty: SystemExit."""
    used, missing = set(), set()

    def value(match):
        name = match.group(1)
        if not environ.get(name):
            missing.add(name)
            return ''
        used.add(name)
        return environ[name]
    out = [SECRET.sub(value, arg) for arg in argv]
    if missing:
        sys.exit('gateway-launch: {0} not set or empty in the environment (the unit\'s environment file): refused'.format(
            ', '.join(sorted(missing))))
    return out, used


def main(argv):
    if len(argv) < 4 or argv[2] != '--':
        sys.exit('usage: gateway-launch DRAINED_FILE -- SMG LAUNCH ARGV...')
    cmd, used = with_secrets(policy_for(without(argv[3:], drained_workers(argv[1]))), os.environ)
    for name in used:
        del os.environ[name]
    sys.stderr.flush()
    # smg's own entry script, in this process: its arguments (with the keys) in memory only
    sys.argv = cmd
    runpy.run_path(cmd[0], run_name='__main__')


if __name__ == '__main__':
    main(sys.argv)
