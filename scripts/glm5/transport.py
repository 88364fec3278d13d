"""Where commands run: a host over SSH (Fabric), or this machine (ansible_connection: local)."""
from __future__ import annotations

import getpass
import os
import re
import subprocess
import time

from glm5.errors import OpsError


class Result(object):
    def __init__(self, stdout, stderr, exited):
        self.stdout, self.stderr, self.exited = stdout, stderr, exited

    @property
    def ok(self):
        return self.exited == 0


class Local(object):
    """A host with ansible_connection: local (the lab's PVE host is this machine)."""
    def __init__(self, hv):
        self.hv, self.name, self.where = hv, hv.name, 'local'

    def run(self, cmd, timeout=60, stdin=None):
        # subprocess, not invoke's run: invoke forwards a Ctrl-C to the command and waits for it, where glm5 bench's
        # wait (its progress reads the PVE host) must end on it
        try:
            p = subprocess.run(['/bin/sh', '-c', cmd], capture_output=True, encoding='utf-8', errors='replace',
                               timeout=timeout, input=stdin)
        except subprocess.TimeoutExpired:
            return Result('', 'timed out after {0} s'.format(timeout), 124)
        return Result(p.stdout, p.stderr, p.returncode)

    def close(self):
        pass


class Ssh(object):
    """A host over SSH with Fabric, with the inventory's user, port, key and known-hosts file. Unknown host keys are
    refused (the deploy records them), as OpenSSH's StrictHostKeyChecking does."""
    def __init__(self, hv):
        import paramiko
        from fabric import Connection
        self.hv, self.name = hv, hv.name
        host = hv.get('ansible_host', hv.name)
        port = hv.number('ansible_port', 22, 1, 65535)
        user = hv.get('ansible_user') or hv.get('ansible_ssh_user') or getpass.getuser()
        self.where = '{0}@{1}:{2}'.format(user, host, port)
        kwargs = {'look_for_keys': True, 'allow_agent': True, 'banner_timeout': 10, 'auth_timeout': 10}
        key = hv.get('ansible_ssh_private_key_file') or hv.get('ansible_private_key_file')
        if key:
            kwargs.update(key_filename=os.path.expanduser(key), look_for_keys=False)
        password = hv.get('ansible_password') or hv.get('ansible_ssh_pass')
        if password:
            kwargs['password'] = password
        self.known_hosts = []
        for args in (hv.get('ansible_ssh_common_args', ''), hv.get('ansible_ssh_extra_args', '')):
            self.known_hosts += re.findall(r'UserKnownHostsFile=(\S+)', args or '')
        self.known_hosts += [hv.get('pve_container_known_hosts_file', ''), '~/.ssh/known_hosts']
        self.known_hosts = [os.path.expanduser(p) for p in dict.fromkeys(self.known_hosts) if p]
        self.conn = Connection(host, user=user, port=port, connect_kwargs=kwargs, connect_timeout=10)
        self.conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        for path in self.known_hosts:
            if os.path.exists(path):
                self.conn.client.load_host_keys(path)
        self._opened = False

    def open(self):
        if self._opened:
            return
        import paramiko
        try:
            self.conn.open()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            why = str(exc) or type(exc).__name__
            if 'not found in known_hosts' in why:
                why += ' (site.yml records a node\'s key when it deploys it; looked in {0})'.format(
                    ', '.join(self.known_hosts))
            raise OpsError('{0}: cannot reach {1} over SSH: {2}'.format(self.name, self.where, why)) from None
        self._opened = True

    def run(self, cmd, timeout=60, stream=False, pty=False, stdin=None):
        """pty: a terminal on the far side, so that Ctrl-C here reaches the command there (journalctl -f). stdin: text
        for the command's standard input (a secret goes there, never into cmd: the far side's ps shows cmd)."""
        self.open()
        if stdin is not None:
            return self._run_stdin(cmd, stdin, timeout)
        try:
            # stream: True shows stdout and stderr as they come, 'out' only stdout (stderr is kept for the error line)
            hide = 'err' if stream == 'out' else not stream
            r = self.conn.run(cmd, hide=hide, warn=True, in_stream=False, timeout=timeout, pty=pty)
        except Exception as exc:  # invoke's CommandTimedOut, paramiko's errors: the node, not bad input
            if type(exc).__name__ == 'CommandTimedOut':
                return Result('', 'timed out after {0} s'.format(timeout), 124)
            raise OpsError('{0}: SSH to {1} failed: {2}'.format(self.name, self.where, exc)) from None
        return Result(r.stdout, r.stderr, r.exited)

    def _run_stdin(self, cmd, stdin, timeout):
        """cmd with stdin on its standard input, on a channel of paramiko's own (invoke copies a stream to the far
        side a byte every 10 ms)."""
        out, err, chan = [], [], None
        deadline = time.monotonic() + (timeout or float('inf'))
        try:
            chan = self.conn.client.get_transport().open_session(timeout=10)
            chan.exec_command(cmd)
            chan.sendall(stdin.encode())
            chan.shutdown_write()
            while not chan.exit_status_ready() or chan.recv_ready() or chan.recv_stderr_ready():
                if time.monotonic() > deadline:
                    return Result('', 'timed out after {0} s'.format(timeout), 124)
                if chan.recv_ready():
                    out.append(chan.recv(65536))
                elif chan.recv_stderr_ready():
                    err.append(chan.recv_stderr(65536))
                else:
                    time.sleep(0.005)
            code = chan.recv_exit_status()
        except Exception as exc:  # paramiko's errors: the node, not bad input
            raise OpsError('{0}: SSH to {1} failed: {2}'.format(self.name, self.where, exc)) from None
        finally:
            if chan is not None:
                chan.close()
        return Result(b''.join(out).decode('utf-8', 'replace'), b''.join(err).decode('utf-8', 'replace'), code)

    def close(self):
        self.conn.close()


def connect(hv):
    return Local(hv) if hv.get('ansible_connection') == 'local' else Ssh(hv)
