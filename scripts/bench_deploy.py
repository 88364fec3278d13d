#!/usr/bin/env python3
"""Deploy benchmark on the lab (by hand, not in CI): prints a table of wall times and changed counts.

    .venv/bin/python scripts/bench_deploy.py [--cold]

1. fresh deploy: the lab's containers are purged (labd purge; host caches stay), then `make deploy`
   (with --cold the cached container template is removed too, so debootstrap runs again)
2. no-op re-run: `ansible-playbook site.yml` again; its changed count must be 0
3. rebuild: `ansible-playbook ansible/playbooks/rebuild.yml -e rebuild_confirm=<each node>`

It destroys and recreates the lab containers of inventories/lab. Never point it at a real host.
"""
import argparse
import os
import re
import shutil
import sys
import time

from invoke import Context

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, '.venv', 'bin')
RECAP = re.compile(r'^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)', re.M)


def timed(c, cmd):
    env = {'PATH': VENV + os.pathsep + os.environ.get('PATH', ''), 'ANSIBLE_CONFIG': os.path.join(ROOT, 'ansible.cfg')}
    start = time.monotonic()
    result = c.run(cmd, hide=True, warn=True, env=env)
    elapsed = time.monotonic() - start
    if result.failed:
        sys.exit('{0} failed ({1}):\n{2}'.format(cmd, result.exited, (result.stdout + result.stderr)[-3000:]))
    recap = RECAP.findall(result.stdout)
    changed = sum(int(r[2]) for r in recap) if recap else None
    return elapsed, changed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--cold', action='store_true', help='also drop the cached container template')
    args = parser.parse_args()
    c = Context()
    with c.cd(ROOT):
        nodes = c.run(VENV + '/ansible-inventory -i inventories/lab --graph inference_nodes', hide=True).stdout
        names = ','.join(re.findall(r'--(\S+)$', nodes, re.M))
        c.run(VENV + '/python scripts/lab/labd.py purge', hide=True, warn=True)
        if args.cold:
            shutil.rmtree('/var/cache/glm5-lab/templates', ignore_errors=True)
        rows = [('fresh make deploy',) + timed(c, 'make deploy'),
                ('no-op re-run (site.yml)',) + timed(c, VENV + '/ansible-playbook site.yml'),
                ('rebuild',) + timed(c, VENV + '/ansible-playbook ansible/playbooks/rebuild.yml -e rebuild_confirm=' + names)]
    print('{0:<28} {1:>10} {2:>8}'.format('step', 'wall [s]', 'changed'))
    print('-' * 48)
    for name, secs, changed in rows:
        print('{0:<28} {1:>10.1f} {2:>8}'.format(name, secs, '-' if changed is None else changed))
    if rows[1][2] != 0:
        sys.exit('the no-op re-run changed {0} things; it must change none'.format(rows[1][2]))


if __name__ == '__main__':
    main()
