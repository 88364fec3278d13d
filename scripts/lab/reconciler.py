"""The reconciler: makes every container the API holds exist as a real LXC container on this machine, the way
pve-container does (create from the template, config, start, stop, destroy), and tells fakepve when PVE's start
would refuse one; the lab's templates registered as local:vztmpl."""
from __future__ import annotations

import json
import logging
import os
import re

from glm5_lab.front import restore_ct
from glm5_lab.lxc import LabLxc
from glm5_lab.paths import HOST, NODE, POLL, PVE_START_SECS, TEMPLATES
from glm5_lab.pveconf import is_unprivileged, start_error

LOG = logging.getLogger('labd')


class Reconciler(object):
    def __init__(self, p, serving, shared):
        self.p = p
        self.serving = serving
        self.shared = shared
        self.lxc = LabLxc(p)
        self.connect()
        self.started_pid = {}     # vmid -> the PVE pid of the start the LXC side has carried out
        self.failed_start = {}    # vmid -> the PVE pid whose LXC start failed (not retried)
        os.makedirs(p['confdir'], exist_ok=True)

    def connect(self):
        """Log in to fakepve itself, not the front: the reconciler only reads, and fakepve's own state needs no
        persisting. Again after an hour: proxmoxer renews its ticket by sending it as the password, which
        fakepve 0.5.0 refuses (401), so the reconciler logs in anew instead of going blind."""
        from proxmoxer import ProxmoxAPI
        self.api = ProxmoxAPI(HOST, port=self.serving.pve.port, user='root@pam', password=self.serving.password,
                              verify_ssl=self.p['ca'], timeout=30)

    # state that PVE keeps in /etc/pve survives a lab restart here (the front writes it)
    def load(self):
        for name in sorted(os.listdir(self.p['confdir'])):
            if not re.fullmatch(r'\d+\.json', name):
                continue
            with open(os.path.join(self.p['confdir'], name)) as fh:
                saved = json.load(fh)
            vmid = saved['vmid']
            self.shared.restored(vmid, saved.get('create', {}))
            running = self.lxc.state(vmid) == 'running'
            onboot = str(saved['config'].get('onboot', '0')) == '1'
            ct = self.serving.do(restore_ct, self.serving.pve, saved, running or onboot)
            if running:
                self.started_pid[vmid] = self.serving.do(lambda c: c.pid, ct)
            LOG.info('CT %s: restored (%s)', vmid, 'running' if running else 'onboot' if onboot else 'stopped')

    def set_start_error(self, vmid, message):
        ct = self.serving.do(self.serving.pve.ct, vmid)
        if ct is not None and (ct.start_error != message or ct.start_secs != PVE_START_SECS):
            def apply():
                ct.start_error = message
                ct.start_secs = PVE_START_SECS
            self.serving.do(apply)

    def template_path(self, config_volid):
        name = config_volid.split('/', 1)[-1]
        return os.path.join(TEMPLATES, name)

    def once(self):
        api_cts = {int(c['vmid']): c for c in self.api.nodes(NODE).lxc.get()}
        for vmid in sorted(api_cts):
            try:
                self.reconcile(vmid)
            except Exception as exc:  # keep the lab serving; the log says what went wrong
                LOG.exception('CT %s: %s', vmid, exc)
        for vmid in self.lxc.vmids():
            if vmid not in api_cts:
                LOG.info('CT %s: destroyed in the API, removing the LXC container', vmid)
                self.lxc.destroy(vmid)
                self.started_pid.pop(vmid, None)
                self.failed_start.pop(vmid, None)

    def reconcile(self, vmid):
        ct = self.api.nodes(NODE).lxc(vmid)
        config = ct.config.get()
        self.set_start_error(vmid, start_error(config))
        if self.shared.take_fresh(vmid):
            if os.path.exists(self.lxc.ctdir(vmid)):
                LOG.info('CT %s: created again in the API, removing the old LXC container first', vmid)
                self.lxc.destroy(vmid)
            self.started_pid.pop(vmid, None)
            self.failed_start.pop(vmid, None)
        if config.get('lock') == 'create':
            return
        status = ct.status.current.get()
        if not self.lxc.exists(vmid):
            params = self.shared.params(vmid)
            tmpl = params.get('ostemplate') or default_template()
            self.lxc.create(vmid, self.template_path(tmpl), params.get('ssh-public-keys'),
                            unprivileged=is_unprivileged(config))
        written = self.lxc.write_config(vmid, config)
        lxc_state = self.lxc.state(vmid)
        if written and lxc_state == 'running':
            err = self.lxc.set_cpu_weight(vmid, config)
            if err:
                LOG.error('CT %s: CPU weight not applied: %s', vmid, err)
        pid = status.get('pid')
        if status['status'] == 'running':
            if lxc_state == 'running' and self.started_pid.get(vmid) not in (None, pid):
                LOG.info('CT %s: restarted through the API', vmid)
                self.lxc.stop(vmid)
                lxc_state = 'stopped'
            if lxc_state != 'running' and self.failed_start.get(vmid) != pid:
                LOG.info('CT %s: starting', vmid)
                err = self.lxc.start(vmid)
                if err:
                    LOG.error('CT %s: start failed: %s', vmid, err)
                    self.failed_start[vmid] = pid
                else:
                    self.started_pid[vmid] = pid
            elif lxc_state == 'running':
                self.started_pid[vmid] = pid
        elif lxc_state == 'running':
            LOG.info('CT %s: stopping', vmid)
            self.lxc.stop(vmid)
            self.started_pid.pop(vmid, None)

    def run(self, stop_event):
        """A pass at once, then one whenever the front wakes it (a write or a task read: a client changed something
        or waits for it to happen), and every POLL seconds (a container that stopped by itself). Passing only then,
        not every half second, leaves the lab's CPU to what it hosts: a pass asks fakepve about every container."""
        from proxmoxer import AuthenticationError
        while not stop_event.is_set():
            self.shared.wake.clear()
            try:
                self.once()
            except AuthenticationError as exc:
                LOG.warning('reconciler login refused (%s): logging in again', exc)
                self.connect()
                continue
            except Exception as exc:
                LOG.exception('reconcile pass failed: %s', exc)
            self.shared.wake.wait(POLL)


def default_template():
    names = sorted(n for n in os.listdir(TEMPLATES) if n.endswith('.tar.gz'))
    if not names:
        raise RuntimeError('no lab template in {0}: run make lab-up'.format(TEMPLATES))
    return names[-1]


def register_templates(serving):
    for name in sorted(os.listdir(TEMPLATES)) if os.path.isdir(TEMPLATES) else []:
        if name.endswith(('.tar.gz', '.tar.zst', '.tar.xz')):
            size = os.path.getsize(os.path.join(TEMPLATES, name))
            serving.do(serving.pve.store_file, 'local', name, size, 'vztmpl')
            LOG.info('template local:vztmpl/%s registered', name)
