"""pve_container against fakepve (the PVE API stand-in): what the module sends, and what it refuses."""
import json
import urllib.parse

import pve_container
import pytest
from ansible.module_utils.testing import patch_module_args

TEMPLATE = 'debian-12-glm5_12.0-1_amd64.tar.gz'
GPUS = [{'path': '/dev/nvidia{0}'.format(i), 'mode': '0666'} for i in range(8)] + [
    {'path': '/dev/nvidiactl', 'mode': '0666'},
    {'path': '/dev/nvidia-uvm', 'mode': '0666'},
    {'path': '/dev/nvidia-uvm-tools', 'mode': '0666'},
    {'path': '/dev/nvidia-caps/nvidia-cap1', 'mode': '0400'},
    {'path': '/dev/nvidia-caps/nvidia-cap2', 'mode': '0444'},
]
MOUNTS = [
    {'host_path': '/srv/glm5/models', 'path': '/models'},
    {'host_path': '/srv/glm5/sglang-cache', 'path': '/var/cache/sglang'},
]


class Result(dict):
    failed = property(lambda self: bool(self.get('failed')))


def run(pve, cafile, check=False, diff=False, **args):
    """Run the module's main() in-process with these arguments; returns its JSON result."""
    host, port = pve.url[len('https://'):].rsplit(':', 1)
    params = dict(api_host=host, api_port=int(port), ca_file=cafile, node='pve1', vmid=120, hostname='glm5',
                  ostemplate='local:vztmpl/' + TEMPLATE, storage='local-lvm', memory=8192, cores=8,
                  devices=GPUS, mounts=MOUNTS, ssh_public_keys='ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG test@lab',
                  _ansible_check_mode=check, _ansible_diff=diff)
    if 'api_token_id' not in args:
        params['api_password'] = 'secret'
    params.update(args)
    params = {k: v for k, v in params.items() if v is not None}
    with patch_module_args(params), pytest.raises(SystemExit):
        pve_container.main()
    return Result(json.loads(LAST_OUTPUT[-1]))


LAST_OUTPUT = []
WARNINGS = []


@pytest.fixture(autouse=True)
def _capture(monkeypatch, capsys):
    LAST_OUTPUT.clear()
    WARNINGS.clear()
    # what the module warns (Ansible's own list is the process's, shared by every test here)
    monkeypatch.setattr(pve_container.AnsibleModule, 'warn', lambda self, text: WARNINGS.append(text))
    orig = pve_container.AnsibleModule._return_formatted

    def grab(self, kwargs):
        orig(self, kwargs)
        LAST_OUTPUT.append(capsys.readouterr().out)
    monkeypatch.setattr(pve_container.AnsibleModule, '_return_formatted', grab)


@pytest.fixture
def pve(fakepve):
    fakepve.store_file('local', TEMPLATE, 150 * 1024 ** 2, content='vztmpl')
    return fakepve


def writes(pve):
    """(method, path, form) of every write the fake recorded, logins left out."""
    out = []
    for method, path, body in pve.requests:
        if method in ('POST', 'PUT', 'DELETE') and not path.endswith('/access/ticket'):
            form = {k: v[0] for k, v in urllib.parse.parse_qs(body.decode(), keep_blank_values=True).items()}
            out.append((method, path.replace('/api2/json', ''), form))
    return out


def test_create_sends_devices_mounts_and_tag(pve, fakepve_cafile):
    res = run(pve, fakepve_cafile)
    assert not res.failed, res
    assert res['changed'] and res['created'] and res['status'] == 'running'
    posts = writes(pve)
    assert [(m, p) for m, p, _ in posts] == [('POST', '/nodes/pve1/lxc'), ('POST', '/nodes/pve1/lxc/120/status/start')]
    form = posts[0][2]
    assert form['dev0'] == '/dev/nvidia0,mode=0666'
    assert form['dev12'] == '/dev/nvidia-caps/nvidia-cap2,mode=0444'
    assert 'dev13' not in form
    assert form['mp0'] == '/srv/glm5/models,backup=0,mp=/models'
    assert form['mp1'] == '/srv/glm5/sglang-cache,backup=0,mp=/var/cache/sglang'
    assert form['tags'] == 'glm5-managed'
    assert form['rootfs'] == 'local-lvm:32'
    assert form['ssh-public-keys'].startswith('ssh-ed25519 ')
    assert pve.ct(120).status == 'running'


def test_second_run_changes_nothing_and_sends_nothing(pve, fakepve_cafile):
    assert run(pve, fakepve_cafile)['changed']
    before = len(writes(pve))
    res = run(pve, fakepve_cafile)
    assert not res.failed, res
    assert res['changed'] is False
    assert res['changed_keys'] == [] and res['deleted_keys'] == []
    assert len(writes(pve)) == before  # no second create, no PUT


def test_an_empty_description_is_none_and_settles(pve, fakepve_cafile):
    """PVE keeps no empty description: description '' was sent again on every run, each one changed."""
    assert run(pve, fakepve_cafile, state='stopped', description='notes')['changed']
    assert pve.ct(120).config.get('description') == 'notes'
    res = run(pve, fakepve_cafile, state='stopped', description='')
    assert res['changed'] and res['deleted_keys'] == ['description'] and res['changed_keys'] == [], res
    assert 'description' not in pve.ct(120).config
    before = len(writes(pve))
    for check in (True, False):
        res = run(pve, fakepve_cafile, state='stopped', description='', check=check)
        assert not res['changed'] and res['changed_keys'] == [] == res['deleted_keys'], res
    assert len(writes(pve)) == before


def test_change_puts_only_changed_keys_and_deletes_dropped_devices(pve, fakepve_cafile):
    run(pve, fakepve_cafile, state='stopped')
    pve.requests.clear()
    res = run(pve, fakepve_cafile, state='stopped', memory=16384, devices=GPUS[:2], allow_device_removal=True)
    assert not res.failed, res
    assert res['changed_keys'] == ['memory']
    assert res['deleted_keys'] == ['dev2', 'dev3', 'dev4', 'dev5', 'dev6', 'dev7', 'dev8', 'dev9', 'dev10',
                                   'dev11', 'dev12']
    (method, path, form), = writes(pve)
    assert (method, path) == ('PUT', '/nodes/pve1/lxc/120/config')
    assert form == {'memory': '16384', 'delete': ','.join(res['deleted_keys'])}
    assert 'dev2' not in pve.ct(120).config and pve.ct(120).config['memory'] in (16384, '16384')


def test_cpu_weight_is_managed_only_when_set_and_changes_a_running_container_at_once(pve, fakepve_cafile):
    assert not run(pve, fakepve_cafile).failed
    assert 'cpuunits' not in pve.ct(120).config                # unset: PVE's default, not managed
    pve.requests.clear()
    # check mode predicts it from what PVE applies hot: no restart
    res = run(pve, fakepve_cafile, check=True, cpuunits=10)
    assert res['changed_keys'] == ['cpuunits'] and not res['restart_required'] and not res['restarted'], res
    assert writes(pve) == []
    res = run(pve, fakepve_cafile, cpuunits=10)
    assert not res.failed, res
    assert res['changed_keys'] == ['cpuunits'] and not res['restart_required'] and not res['restarted']
    (method, path, form), = writes(pve)
    assert (method, path, form) == ('PUT', '/nodes/pve1/lxc/120/config', {'cpuunits': '10'})
    assert str(pve.ct(120).config['cpuunits']) == '10' and not pve.ct(120).pending    # applied, nothing pending
    assert run(pve, fakepve_cafile, cpuunits=10)['changed'] is False
    assert run(pve, fakepve_cafile)['changed'] is False        # unset again: left as it is


def test_running_device_change_needs_restart_and_restarts_only_when_allowed(pve, fakepve_cafile):
    run(pve, fakepve_cafile)
    pve.requests.clear()
    res = run(pve, fakepve_cafile, devices=GPUS[:9], allow_device_removal=True)
    assert res['restart_required'] is True and res['restarted'] is False
    assert [p for m, p, _ in writes(pve)] == ['/nodes/pve1/lxc/120/config']
    pve.requests.clear()
    res = run(pve, fakepve_cafile, devices=GPUS[:8], allow_restart=True, allow_device_removal=True)
    assert res['restarted'] is True
    assert [p for m, p, _ in writes(pve)] == ['/nodes/pve1/lxc/120/config', '/nodes/pve1/lxc/120/status/shutdown',
                                              '/nodes/pve1/lxc/120/status/start']


def test_check_mode_predicts_and_writes_nothing(pve, fakepve_cafile):
    res = run(pve, fakepve_cafile, check=True, diff=True)
    assert res['changed'] and res['created'] and res['status'] == 'running'
    assert res['diff']['after']['dev0'] == '/dev/nvidia0,mode=0666'
    assert writes(pve) == [] and pve.ct(120) is None
    run(pve, fakepve_cafile)
    pve.requests.clear()
    res = run(pve, fakepve_cafile, check=True, diff=True, cores=16)
    assert res['changed'] and res['changed_keys'] == ['cores']
    assert res['diff']['before']['cores'] in ('8', 8) and res['diff']['after']['cores'] == '16'
    assert writes(pve) == []


def test_normalises_reordered_property_strings(pve, fakepve_cafile):
    """PVE hands property strings back re-ordered; that is no change."""
    run(pve, fakepve_cafile, state='stopped', mounts=[{'host_path': '/srv/m', 'path': '/models', 'backup': True,
                                                        'read_only': True}])
    pve.ct(120).config['mp0'] = '/srv/m,ro=1,mp=/models,backup=1'
    pve.requests.clear()
    res = run(pve, fakepve_cafile, state='stopped', mounts=[{'host_path': '/srv/m', 'path': '/models', 'backup': True,
                                                              'read_only': True}])
    assert res['changed'] is False, res
    assert writes(pve) == []


def test_token_with_devices_is_refused_before_any_call(pve, fakepve_cafile):
    res = run(pve, fakepve_cafile, api_token_id='root@pam!ci', api_token_secret='x')
    assert res.failed
    assert 'root@pam' in res['msg'] and 'device passthrough' in res['msg'] and 'bind mounts' in res['msg']
    assert pve.requests == []


def test_token_without_rights_gets_pve_403(pve, fakepve_cafile):
    pve.apitokens['ci@pve!deploy'] = 'tok'
    pve.grant('ci@pve!deploy', '/storage', 'Datastore.Audit', 'Datastore.AllocateSpace', 'Datastore.AllocateTemplate')
    pve.grant('ci@pve!deploy', '/vms/999', 'VM.Audit')  # rights on another guest only
    res = run(pve, fakepve_cafile, api_token_id='ci@pve!deploy', api_token_secret='tok', devices=[], mounts=[])
    assert res.failed
    assert '403' in res['msg'] and 'Permission check failed' in res['msg']
    assert pve.ct(120) is None


def test_task_failure_surfaces_pve_text(pve, fakepve_cafile):
    run(pve, fakepve_cafile, state='stopped')
    pve.ct(120).start_error = 'Device /dev/nvidia3 does not exist'
    res = run(pve, fakepve_cafile)
    assert res.failed
    assert 'Device /dev/nvidia3 does not exist' in res['msg'] and 'start CT 120' in res['msg']


def test_failed_create_task_surfaces_pve_text(pve, fakepve_cafile):
    """An error PVE raises inside its worker: the POST answers a UPID, the task ends with PVE's message."""
    pve.fail('POST', '/nodes/pve1/lxc', error='found_lock_trying_remove_lock')
    res = run(pve, fakepve_cafile)
    assert res.failed
    assert res['msg'].startswith('create CT 120 failed: ')
    assert "found lock 'backup' trying to remove 'backup' lock" in res['msg']
    assert [p for m, p, _ in writes(pve)] == ['/nodes/pve1/lxc']  # no start after a failed create


def test_http_500_surfaces_pve_text(pve, fakepve_cafile):
    pve.fail('POST', '/nodes/pve1/lxc', 500, 'unable to create CT 120 - storage is full')
    res = run(pve, fakepve_cafile)
    assert res.failed
    assert '500' in res['msg'] and 'storage is full' in res['msg']


def test_refuses_container_it_did_not_create(pve, fakepve_cafile):
    pve.add_ct(120, 'someone-elses', status='running', config={'tags': 'prod'})
    for state in ('started', 'absent'):
        res = run(pve, fakepve_cafile, state=state)
        assert res.failed and 'not created by this package' in res['msg'], res
        assert 'set pve_container_adopt: true' in res['msg']    # the role variable a role user sets
        assert res['status'] == res['status_before'] == 'running'   # what was seen, not 'absent'
    assert pve.ct(120) is not None and pve.ct(120).status == 'running'
    assert writes(pve) == []
    res = run(pve, fakepve_cafile, state='absent', adopt=True)
    assert res['destroyed'] and pve.ct(120) is None


@pytest.mark.parametrize('was, now', [(False, True), (True, False)])
def test_a_privileged_unprivileged_switch_is_refused_with_what_to_do(pve, fakepve_cafile, was, now):
    """PVE cannot change `unprivileged` after creation: the run stops before any write, saying how to switch."""
    assert not run(pve, fakepve_cafile, unprivileged=was).failed
    before, config = len(writes(pve)), dict(pve.ct(120).config)
    res = run(pve, fakepve_cafile, unprivileged=now, memory=16384)
    assert res.failed and len(writes(pve)) == before and dict(pve.ct(120).config) == config
    assert 'container 120 is {0}privileged and pve_container_unprivileged is {1}: PVE cannot convert a container in ' \
           'place; nothing was changed'.format('un' if was else '', str(now).lower()) in res['msg'], res['msg']
    assert 'pct restore 120 <the backup> --unprivileged {0} --force'.format(int(now)) in res['msg']
    assert 'pve_container_state: absent' in res['msg']


def test_absent_destroys_own_container(pve, fakepve_cafile):
    run(pve, fakepve_cafile)
    res = run(pve, fakepve_cafile, state='absent')
    assert res['changed'] and res['destroyed'] and pve.ct(120) is None
    assert run(pve, fakepve_cafile, state='absent')['changed'] is False


def test_vmid_used_by_vm_is_refused(pve, fakepve_cafile):
    pve.add_vm(120, 'a-vm')
    res = run(pve, fakepve_cafile)
    assert res.failed and 'already used by a qemu guest' in res['msg']


@pytest.mark.parametrize('args, words', [
    (dict(vmid=42), 'vmid 42 is out of range'),
    (dict(vmid=1000000000), 'out of range'),
    (dict(mounts=[{'host_path': 'srv/models', 'path': '/models'}]), 'mounts[0].host_path'),
    (dict(mounts=[{'host_path': '/srv/a,b', 'path': '/models'}]), 'mounts[0].host_path'),
    (dict(mounts=[{'host_path': '/srv/a', 'path': '/'}]), 'mounts[0].path'),
    (dict(devices=[{'path': '/etc/passwd'}]), 'devices[0].path'),
    (dict(devices=[{'path': '/dev/nvidia0', 'mode': '999'}]), 'devices[0].mode'),
    (dict(tags=['Bad Tag']), "tag 'Bad Tag'"),
    (dict(cpuunits=-1), 'cpuunits must be 0..500000'),
    (dict(cpuunits=500001), "cpuunits must be 0..500000 (PVE's CPU weight), got 500001"),
])
def test_bad_input_is_rejected_before_any_call(pve, fakepve_cafile, args, words):
    res = run(pve, fakepve_cafile, **args)
    assert res.failed and words in res['msg'], res
    assert pve.requests == []


def test_unknown_storage_is_rejected_with_the_list(pve, fakepve_cafile):
    res = run(pve, fakepve_cafile, storage='fast-nvme')
    assert res.failed
    assert "storage 'fast-nvme' does not exist on node pve1 or root@pam may not see it" in res['msg']
    assert 'local-lvm' in res['msg']
    assert pve.ct(120) is None


def test_missing_template_is_rejected(pve, fakepve_cafile):
    res = run(pve, fakepve_cafile, ostemplate='local:vztmpl/nope.tar.gz')
    assert res.failed and 'is not on storage' in res['msg'] and TEMPLATE in res['msg']


@pytest.mark.parametrize('exitstatus, ok', [('OK', True), ('WARNINGS: 2', True), ('unable to mount rootfs', False)])
def test_task_exit_status_rules(monkeypatch, exitstatus, ok):
    """PVE ends a task with OK, 'WARNINGS: n' (still a success) or its error text. fakepve has no way to end a
    task with warnings, so the finished task's status is handed to wait_task directly here."""
    from ansible.module_utils import pve_api

    class NoLog:
        def nodes(self, node):
            raise RuntimeError('no log in this test')

    monkeypatch.setattr(pve_api.Tasks, 'blocking_status',
                        staticmethod(lambda api, upid, **kw: {'status': 'stopped', 'exitstatus': exitstatus}))
    api = pve_api.PveApi.__new__(pve_api.PveApi)
    api.api = NoLog()
    upid = 'UPID:pve1:00001234:00005678:65000000:vzstart:120:root@pam:'
    if ok:
        assert api.wait_task(upid, 'start CT 120', 5)['exitstatus'] == exitstatus
    else:
        with pytest.raises(pve_api.PveTaskFailed, match='start CT 120 failed: unable to mount rootfs'):
            api.wait_task(upid, 'start CT 120', 5)


def test_container_restored_after_a_lab_restart_is_unchanged(pve, fakepve_cafile, tmp_path):
    """The lab persists GET /config and puts it back on restart; a re-run must then change nothing."""
    from glm5_lab.front import restore_ct
    assert run(pve, fakepve_cafile, state='stopped')['created']
    saved = {'vmid': 120, 'config': {k: v for k, v in pve.ct(120).config.items() if k not in ('digest', 'lock')}}
    assert run(pve, fakepve_cafile, state='absent')['destroyed']   # the restarted fake knows nothing yet
    restore_ct(pve, saved, running=False)
    pve.requests.clear()
    res = run(pve, fakepve_cafile, state='stopped')
    assert not res.failed, res['msg']
    assert res['changed'] is False and writes(pve) == []


def test_removing_a_passed_through_gpu_is_refused_unless_allowed(pve, fakepve_cafile):
    """A GPU missing from the device list (fell off the bus, or a shorter list) is never dropped silently."""
    run(pve, fakepve_cafile)
    pve.requests.clear()
    without_gpu3 = [d for d in GPUS if d['path'] != '/dev/nvidia3']
    for check in (True, False):
        res = run(pve, fakepve_cafile, check=check, devices=without_gpu3, allow_restart=True)
        assert res.failed, res
        assert res['msg'].startswith('refusing to remove /dev/nvidia3 from CT 120')
        assert 'pve_container_allow_gpu_removal: true' in res['msg']
        assert res['removed_devices'] == ['/dev/nvidia3'] and res['status'] == 'running'
    assert writes(pve) == []
    assert '/dev/nvidia3' in pve.ct(120).config['dev3']
    res = run(pve, fakepve_cafile, devices=without_gpu3, allow_restart=True, allow_device_removal=True)
    assert not res.failed, res['msg']
    assert res['removed_devices'] == ['/dev/nvidia3'] and res['restarted']
    assert not any('/dev/nvidia3,' in str(v) for v in pve.ct(120).config.values())


def test_adding_a_gpu_is_no_removal(pve, fakepve_cafile):
    run(pve, fakepve_cafile, state='stopped', devices=GPUS[:1] + GPUS[8:])
    res = run(pve, fakepve_cafile, state='stopped', devices=GPUS[:2] + GPUS[8:])
    assert not res.failed, res['msg']
    assert res['removed_devices'] == [] and 'dev1' in res['changed_keys']


@pytest.mark.parametrize('start, state, before, after', [
    (None, 'started', 'absent', 'running'),        # would be created and started
    ('stopped', 'started', 'stopped', 'running'),  # would be started
    ('running', 'started', 'running', 'running'),
    ('running', 'stopped', 'running', 'stopped'),  # would be stopped
    ('stopped', 'present', 'stopped', 'stopped'),
])
def test_check_mode_reports_the_status_seen_and_the_status_predicted(pve, fakepve_cafile, start, state, before,
                                                                      after):
    if start:
        run(pve, fakepve_cafile, state='started' if start == 'running' else 'stopped')
    pve.requests.clear()
    res = run(pve, fakepve_cafile, check=True, diff=True, state=state)
    assert not res.failed, res['msg']
    assert (res['status_before'], res['status']) == (before, after)
    assert res['changed'] is (before != after or start is None)
    assert writes(pve) == []


def test_check_mode_destroy_shows_what_would_go_and_keeps_it(pve, fakepve_cafile):
    run(pve, fakepve_cafile)
    pve.requests.clear()
    res = run(pve, fakepve_cafile, check=True, diff=True, state='absent')
    assert res['changed'] and res['destroyed'] and res['status'] == 'absent' and res['status_before'] == 'running'
    assert res['diff']['after'] == {}
    assert res['diff']['before']['dev0'] == '/dev/nvidia0,mode=0666'
    assert res['diff']['before']['mp0'] == '/srv/glm5/models,backup=0,mp=/models'
    assert writes(pve) == [] and pve.ct(120).status == 'running'


def one_line(msg):
    assert '\n' not in msg and len(msg) < 400, msg
    assert 'HTTPSConnectionPool' not in msg and 'Max retries' not in msg and 'object at 0x' not in msg, msg
    return msg


def test_api_refusing_connections_is_one_clear_line(pve, fakepve_cafile):
    import socket
    with socket.socket() as s:       # a loopback port nobody listens on
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    res = run(pve, fakepve_cafile, api_host='127.0.0.1', api_port=port)
    msg = one_line(res['msg'])
    assert msg.startswith('cannot reach the PVE API at https://127.0.0.1:{0} (connection refused)'.format(port))
    assert 'pve_container_api_host / pve_container_api_port' in msg and 'pveproxy' in msg


def test_api_certificate_from_another_ca_is_one_clear_line(pve, tmp_path):
    import certifi
    other = tmp_path / 'public-cas.pem'     # trusted roots, none of which signed the API's certificate
    other.write_text(open(certifi.where()).read())
    res = run(pve, str(other))
    msg = one_line(res['msg'])
    assert msg.startswith('TLS check of the PVE API at ' + pve.url + ' failed (certificate verify failed')
    assert 'pve_container_api_ca_file' in msg and '/etc/pve/pve-root-ca.pem' in msg


def test_api_wrong_password_is_one_clear_line(pve, fakepve_cafile):
    res = run(pve, fakepve_cafile, api_password='not-the-password')
    msg = one_line(res['msg'])
    assert msg.startswith('the PVE API at ' + pve.url + ' refused the login (user or password not accepted)')
    assert 'pve_container_api_user / pve_container_api_password' in msg
    assert pve.ct(120) is None


def test_api_that_does_not_answer_is_one_clear_line(pve, fakepve_cafile):
    pve.flaky_network(hang_rate=1.0, hang_secs=5)
    res = run(pve, fakepve_cafile, api_timeout=1)
    msg = one_line(res['msg'])
    assert msg.startswith('the PVE API at ' + pve.url + ' did not answer within 1 s')
    assert 'pve_container_api_host / pve_container_api_port' in msg


# ---- The container's firewall: the module's rules first, in order; the user's kept; check mode writes nothing ----
ENGINE_RULES = {'rules': [
    {'action': 'ACCEPT', 'source': '10.0.0.5', 'dport': '30000', 'comment': 'engine port from glm5-gw'},
    {'action': 'DROP', 'dport': '30000', 'comment': 'engine port: no one else'}]}


def fw_rules(pve, vmid=120):
    """The container's rules as PVE keeps them, first to last: (action, source, dport, comment, enable)."""
    return [(r['action'], r.get('source'), r.get('dport'), r['comment'], int(r.get('enable', 0)))
            for r in pve.firewall_config('ct', 'pve1', vmid)['rules']]


def test_firewall_rules_go_first_in_order_and_the_firewall_on_without_closing_anything_else(pve, fakepve_cafile):
    netif = {'net0': 'name=eth0,bridge=vmbr0,ip=dhcp,firewall=1'}
    res = run(pve, fakepve_cafile, firewall=ENGINE_RULES, netif=netif)
    assert not res.failed, res
    assert fw_rules(pve) == [('ACCEPT', '10.0.0.5', '30000', 'glm5-managed: engine port from glm5-gw', 1),
                             ('DROP', None, '30000', 'glm5-managed: engine port: no one else', 1)]
    options = pve.firewall_config('ct', 'pve1', 120)['options']
    # on, and PVE's guest default (DROP) not left to cut SSH and everything else the rules do not name
    assert int(options['enable']) == 1 and options['policy_in'] == 'ACCEPT'
    # the datacenter firewall is off in a fresh PVE: said, not hidden
    assert res['firewall']['enforced'] is False
    assert res['firewall']['not_enforced'] == [res['firewall']['not_enforced'][0]]
    assert 'datacenter firewall is off' in res['firewall']['not_enforced'][0]
    assert WARNINGS == ['CT 120: PVE filters nothing with its firewall rules: ' + res['firewall']['not_enforced'][0]]
    pve.requests.clear()
    again = run(pve, fakepve_cafile, firewall=ENGINE_RULES, netif=netif)
    assert again['changed'] is False and writes(pve) == [], again


def test_firewall_keeps_the_users_rules_and_policy_and_moves_its_own_back_on_top(pve, fakepve_cafile):
    run(pve, fakepve_cafile, firewall=ENGINE_RULES)
    conf = pve.firewall_config('ct', 'pve1', 120)
    conf['options']['policy_in'] = 'DROP'
    # the user's rule put above ours, and one of ours edited by hand
    conf['rules'].insert(0, {'type': 'in', 'action': 'ACCEPT', 'macro': 'SSH', 'enable': 1, 'comment': 'admins'})
    conf['rules'][1]['source'] = '10.9.9.9'
    res = run(pve, fakepve_cafile, check=True, diff=True, firewall=ENGINE_RULES)
    assert res['changed'] and res['firewall']['changed']
    assert res['diff']['before']['firewall'][0]['source'] == '10.9.9.9'
    assert res['diff']['after']['firewall'][0]['source'] == '10.0.0.5'
    assert conf['rules'][1]['source'] == '10.9.9.9'          # check mode: nothing written
    res = run(pve, fakepve_cafile, firewall=ENGINE_RULES)
    assert not res.failed and res['changed'], res
    assert [r[3] for r in fw_rules(pve)] == ['glm5-managed: engine port from glm5-gw',
                                             'glm5-managed: engine port: no one else', 'admins']
    assert fw_rules(pve)[0][1] == '10.0.0.5'
    assert pve.firewall_config('ct', 'pve1', 120)['options']['policy_in'] == 'DROP'   # the user's policy stays


def test_firewall_off_removes_only_its_rules_and_unset_leaves_it_alone(pve, fakepve_cafile):
    run(pve, fakepve_cafile, firewall=ENGINE_RULES)
    conf = pve.firewall_config('ct', 'pve1', 120)
    conf['rules'].append({'type': 'in', 'action': 'ACCEPT', 'macro': 'SSH', 'enable': 1, 'comment': 'admins'})
    pve.requests.clear()
    assert run(pve, fakepve_cafile)['changed'] is False and writes(pve) == []      # not managed: not touched
    res = run(pve, fakepve_cafile, firewall={'enabled': False})
    assert not res.failed and res['changed'], res
    assert [r[3] for r in fw_rules(pve)] == ['admins']
    assert int(conf['options']['enable']) == 1        # the switch stays as it was
    assert run(pve, fakepve_cafile, firewall={'enabled': False})['changed'] is False


def test_firewall_on_a_new_container_in_check_mode_plans_its_rules(pve, fakepve_cafile):
    res = run(pve, fakepve_cafile, check=True, firewall=ENGINE_RULES)
    assert res['changed'] and res['firewall']['changed'] and len(res['firewall']['rules']) == 2
    assert writes(pve) == [] and pve.ct(120) is None


@pytest.mark.parametrize('rule, words', [
    ({'action': 'ACCEPT', 'source': 'gw.example.com', 'dport': '30000', 'comment': 'x'}, 'not an IP address'),
    ({'action': 'ACCEPT', 'dport': '70000', 'comment': 'x'}, 'not a port'),
    ({'action': 'ACCEPT', 'dport': '30000,30001', 'comment': 'x'}, 'not a port'),
    ({'action': 'ACCEPT', 'dport': '30000', 'comment': 'a\nb'}, 'one non-empty line'),
])
def test_bad_firewall_rule_is_refused_before_any_call(pve, fakepve_cafile, rule, words):
    res = run(pve, fakepve_cafile, firewall={'rules': [rule]})
    assert res.failed and words in res['msg'], res
    assert pve.requests == []
