#!/usr/bin/env python3
"""The lab's Proxmox VE stand-in: fakepve serving the PVE API, plus a reconciler that makes every
container the API holds exist as a real LXC container on this machine, the way pve-container does.

    glm5-lab start      start the daemon in the background (idempotent), wait until the API answers
    glm5-lab stop       stop the lab containers and the daemon; the API state is kept for the next start
    glm5-lab status     print what runs, exit 1 when the daemon is down
    glm5-lab purge      stop, then destroy every lab container and forget the API state (host caches stay)
    glm5-lab serve      run in the foreground (what start runs)

Like pveproxy in front of pvedaemon, labd's own front answers on https://127.0.0.1:8006 and forwards
every request to fakepve on an internal loopback port. After a write (POST/PUT/DELETE) or a task read,
and before it answers, the front writes the API state to <state>/pve/lxc/<vmid>.json (like /etc/pve),
so whatever a client has seen finish survives a kill; a restart puts those containers back.

Environment (a second instance, e.g. a test's, sets all three):
    GLM5_LAB_STATE      state directory (default: lab_state_dir in inventories/lab/group_vars/all.yml)
    GLM5_LAB_PORT       the API port on 127.0.0.1 (default 8006)
    GLM5_LAB_POLL       seconds between reconcile passes when no client writes or waits (default 5; a write to the
                        API or a task read starts one at once)
    GLM5_LAB_FILES_PORT the lab's download site on 127.0.0.1 (default 8480; 0: none): <state>/www read-only,
                        plain HTTP, where the lab puts what real hosts download (NVIDIA's apt repository)
    GLM5_LAB_TEMPLATES  the template cache registered as local:vztmpl (default: lab_template_dir in the same file)

The lab's paths are set once, in the lab inventory (inventories/lab/group_vars/all.yml); labd reads them from there.

This file is the daemon's command line; the daemon itself is, in glm5_lab (scripts/lab/):
    paths.py        the settings above, the state paths, how state files are written
    credentials.py  the root@pam password and the lab CA, made once
    pveconf.py      a PVE container config -> its LXC config; when PVE's start would refuse it
    lxc.py          the LXC driver (LabLxc)
    front.py        fakepve and the front in this process, the persisted API state, the download site
    reconciler.py   the reconciler loop

Lab only: nothing here runs against a real PVE host.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from glm5.project import stdout_reader_gone
from glm5_lab.credentials import ensure_secrets
from glm5_lab.front import Serving, Shared
from glm5_lab.lxc import LabLxc
from glm5_lab.paths import FILES_PORT, HOST, NODE, PORT, paths, ssh_port
from glm5_lab.reconciler import Reconciler, register_templates

LOG = logging.getLogger('labd')


def serve(p):
    logging.basicConfig(level=logging.INFO, format='%(asctime)s %(levelname)s %(message)s')
    logging.getLogger('aiohttp.access').setLevel(logging.WARNING)
    ensure_secrets(p)
    shared = Shared()
    serving = Serving(p)
    register_templates(serving)
    rec = Reconciler(p, serving, shared)
    rec.load()
    # Clients only now: a write before the saved state is back would persist an API without it.
    serving.start_front(shared)
    if FILES_PORT:
        serving.start_files()
        LOG.info('download site http://%s:%s/ from %s', HOST, FILES_PORT, p['www'])
    stop_event = threading.Event()

    def stop(*_):
        stop_event.set()
        shared.wake.set()  # the reconciler waits on it between passes
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    LOG.info('PVE API on https://%s:%s (lab PVE node %s; fakepve on port %s; state %s)', HOST, PORT, NODE,
             serving.pve.port, p['state'])
    rec.run(stop_event)
    LOG.info('stopping: shutting down lab containers')
    for vmid in rec.lxc.vmids():
        rec.lxc.stop(vmid)
    serving.stop()


def read_pid(p):
    try:
        with open(p['pid']) as fh:
            pid = int(fh.read().strip())
        os.kill(pid, 0)
        with open('/proc/{0}/cmdline'.format(pid), 'rb') as fh:
            cmdline = fh.read()
            # the daemon as `python -m glm5_lab.labd serve`, or one started by an older checkout (labd.py serve)
            if b'glm5_lab.labd' not in cmdline and b'labd.py' not in cmdline:
                return None
        return pid
    except (OSError, ValueError):
        return None


def api_answers(p, timeout=1.0):
    import requests
    try:
        requests.get('https://{0}:{1}/api2/json/version'.format(HOST, PORT), verify=p['ca'], timeout=timeout)
        return True
    except requests.RequestException:
        return False


def start(p):
    if read_pid(p):
        print('labd already running (pid {0})'.format(read_pid(p)))
        return 0
    ensure_secrets(p)
    os.makedirs(p['state'], exist_ok=True)
    log = open(p['log'], 'ab')
    # The daemon gets this environment (GLM5_LAB_PORT, _POLL, _TEMPLATES) and the state p names.
    env = dict(os.environ, GLM5_LAB_STATE=p['state'], GLM5_LAB_PORT=str(PORT), GLM5_LAB_FILES_PORT=str(FILES_PORT))
    proc = subprocess.Popen([sys.executable, '-m', 'glm5_lab.labd', 'serve'], stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL, start_new_session=True, close_fds=True, env=env)
    with open(p['pid'], 'w') as out:
        out.write(str(proc.pid))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            print('labd exited with {0}; see {1}'.format(proc.returncode, p['log']), file=sys.stderr)
            return 1
        if api_answers(p):
            print('labd started (pid {0}): https://{1}:{2}'.format(proc.pid, HOST, PORT))
            return 0
        time.sleep(0.5)
    print('labd did not answer within 60 s; see {0}'.format(p['log']), file=sys.stderr)
    return 1


def stop(p):
    pid = read_pid(p)
    if not pid:
        print('labd not running')
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and read_pid(p):
        time.sleep(0.5)
    if read_pid(p):
        os.kill(pid, signal.SIGKILL)
    print('labd stopped')
    return 0


def purge(p):
    stop(p)
    lab = LabLxc(p)
    for vmid in lab.vmids():
        lab.destroy(vmid)
        print('destroyed lab CT {0}'.format(vmid))
    shutil.rmtree(p['confdir'], ignore_errors=True)
    return 0


def status(p):
    pid = read_pid(p)
    print('labd: {0}'.format('running (pid {0})'.format(pid) if pid else 'stopped'))
    if not os.path.isdir(p['state']):       # said, not made: status writes nothing
        print('no lab state at {0} (GLM5_LAB_STATE, or lab_state_dir in inventories/lab)'.format(p['state']))
        return 1
    lab = LabLxc(p)
    for vmid in sorted(lab.vmids()):
        print('CT {0}: {1} (sshd 127.0.0.1:{2})'.format(vmid, lab.state(vmid), ssh_port(vmid)))
    return 0 if pid and api_answers(p) else 1


def main(argv=None):
    commands = __doc__.split('\n\n')[1]       # the docstring's command lines, each with what it does
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], epilog='commands:\n' + commands,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('command', choices=['start', 'stop', 'status', 'purge', 'serve'],
                        help='see below (purge destroys every lab container)')
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error('the lab runs LXC containers and must run as root')
    p = paths()
    if args.command == 'serve':
        serve(p)
        return 0
    try:
        rc = {'start': start, 'stop': stop, 'status': status, 'purge': purge}[args.command](p)
        sys.stdout.flush()                  # a closed pipe found here, not as Python exits
        return rc
    except BrokenPipeError:                 # glm5-lab status | head
        return stdout_reader_gone()


if __name__ == '__main__':
    sys.exit(main())
