#!/usr/bin/env python3
"""Deploy benchmark on the lab (by hand, not in CI): prints a table of wall times and changed counts.

    .venv/bin/python scripts/bench_deploy.py [--cold] [--cold-wheels]

1. fresh deploy: the lab's containers are purged (labd purge; host caches stay), then `make deploy`
   (with --cold the cached container template is removed too, so debootstrap runs again; with --cold-wheels the
   host-side wheel cache is set aside first, so the SGLang environment is downloaded as on a new host)
2. no-op re-run: `ansible-playbook site.yml` again; its changed count must be 0
3. rebuild: `ansible-playbook ansible/playbooks/rebuild.yml -e rebuild_confirm=<each node>`: the container is new,
   the host-side caches (wheels, model) are reused, so it downloads next to nothing

Besides wall time and changed count, each row shows the bytes this machine received meanwhile (the lab containers
share its network namespace, so that is what the step downloaded: packages, wheels) and the growth of the host-side
wheel cache. With --cold-wheels the set-aside cache is removed at the end (the new one holds the same wheels).

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


def received():
    """Bytes received on every interface but loopback (/proc/net/dev)."""
    total = 0
    with open('/proc/net/dev') as fh:
        for line in fh.readlines()[2:]:
            name, data = line.split(':', 1)
            if name.strip() != 'lo':
                total += int(data.split()[0])
    return total


def du(path):
    total = 0
    for top, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
            except OSError:
                pass
    return total


def lab_template_dir():
    from glm5_lab.paths import lab_paths_from_inventory
    return lab_paths_from_inventory()['lab_template_dir']


def wheel_cache():
    import yaml
    with open(os.path.join(ROOT, 'inventories', 'lab', 'group_vars', 'inference_nodes.yml')) as fh:
        return os.path.join(yaml.safe_load(fh)['pve_container_sglang_cache_dir'], 'uv')


def timed(c, cmd):
    rx, cache = received(), du(wheel_cache())
    env = {'PATH': VENV + os.pathsep + os.environ.get('PATH', ''), 'ANSIBLE_CONFIG': os.path.join(ROOT, 'ansible.cfg')}
    start = time.monotonic()
    result = c.run(cmd, hide=True, warn=True, env=env)
    elapsed = time.monotonic() - start
    if result.failed:
        sys.exit('{0} failed ({1}):\n{2}'.format(cmd, result.exited, (result.stdout + result.stderr)[-3000:]))
    recap = RECAP.findall(result.stdout)
    changed = sum(int(r[2]) for r in recap) if recap else None
    return elapsed, changed, received() - rx, du(wheel_cache()) - cache


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0] + ' It purges the lab first (glm5-lab purge: every lab container '
        'destroyed), without asking: the lab only, never a real host.')
    parser.add_argument('--cold', action='store_true', help='also drop the cached container template')
    parser.add_argument('--cold-wheels', action='store_true', help='set the host-side wheel cache aside first')
    args = parser.parse_args()
    aside = wheel_cache() + '.set-aside-by-bench'
    if args.cold_wheels and os.path.lexists(aside):     # checked before the purge: nothing is destroyed for nothing
        sys.exit('{0} is left from an earlier --cold-wheels run that did not end: move it back to {1} (or remove it) '
                 'first; nothing was changed'.format(aside, wheel_cache()))
    set_aside = False
    c = Context()
    with c.cd(ROOT):
        nodes = c.run(VENV + '/ansible-inventory -i inventories/lab --graph inference_nodes', hide=True).stdout
        names = ','.join(re.findall(r'--(\S+)$', nodes, re.M))
        c.run(VENV + '/glm5-lab purge', hide=True, warn=True)
        if args.cold:
            shutil.rmtree(lab_template_dir(), ignore_errors=True)
        if args.cold_wheels and os.path.isdir(wheel_cache()):
            os.rename(wheel_cache(), aside)
            set_aside = True
        try:
            rows = [('fresh make deploy',) + timed(c, 'make deploy'),
                    ('no-op re-run (site.yml)',) + timed(c, VENV + '/ansible-playbook site.yml'),
                    ('rebuild',) + timed(c, VENV + '/ansible-playbook ansible/playbooks/rebuild.yml -e rebuild_confirm='
                                         + names)]
        except SystemExit:
            if set_aside:
                print('the wheel cache set aside is still at {0} (the new one at {1}): keep one of them'.format(
                    aside, wheel_cache()), file=sys.stderr)
            raise
    if set_aside:
        shutil.rmtree(aside, ignore_errors=True)
    print('{0:<28} {1:>10} {2:>8} {3:>14} {4:>18}'.format('step', 'wall [s]', 'changed', 'received [MB]',
                                                          'wheel cache + [MB]'))
    print('-' * 82)
    for name, secs, changed, rx, cache in rows:
        print('{0:<28} {1:>10.1f} {2:>8} {3:>14.0f} {4:>18.0f}'.format(
            name, secs, '-' if changed is None else changed, rx / 1e6, cache / 1e6))
    if rows[1][2] != 0:
        sys.exit('the no-op re-run changed {0} things; it must change none'.format(rows[1][2]))


if __name__ == '__main__':
    main()
