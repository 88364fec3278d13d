"""Bad input to site.yml fails with one clear line before anything changes (on the running lab).

Each case runs the real ansible-playbook against the lab inventory and then checks, through the PVE
API, that no container was created or changed.
"""
import os

import certifi
import pytest
from siterun import ROOT, site, snapshot

VMID = {'pve_container_vmid': 194, 'ansible_port': 20194}
# the containers these runs could create or change (the lab inventory's own node, and the two here)
WATCHED = (120, 194, 195)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.mark.parametrize('extra, words', [
    ({'pve_container_vmid': 42}, 'pve_container_vmid must be 100..999999999, got 42'),
    ({'pve_container_state': 'running'}, 'pve_container_state'),
    ({'pve_container_memory': 'lots'}, 'pve_container_memory'),
    # GPU selection: all, or a non-empty list of distinct minors, as many as pve_container_gpu_count
    ({'pve_container_gpus': []}, 'pve_container_gpus is an empty list: the node needs its GPUs (to remove the '
                                 'container use pve_container_state: absent)'),
    # (gpu_preflight_gpu_count: 8 keeps the host preflight, which follows pve_container_gpu_count, content)
    ({'pve_container_gpus': [0, 0], 'pve_container_gpu_count': 2, 'gpu_preflight_gpu_count': 8},
     'pve_container_gpus lists GPU 0 more than once: [0, 0]'),
    ({'pve_container_gpus': '0,1'}, 'pve_container_gpus must be "all" or a list of GPU minors like [0, 1]'),
    ({'pve_container_gpus': [0, 1]}, 'pve_container_gpus lists 2 GPU(s) but pve_container_gpu_count is 8'),
    ({'pve_container_gpus': [9], 'pve_container_gpu_count': 1, 'gpu_preflight_gpu_count': 8},
     'GPUs on pve-lab: pve_container_gpus selects /dev/nvidia9, not on the PVE host (it has /dev/nvidia0, '),
    ({'pve_container_gpu_count': 4, 'gpu_preflight_gpu_count': 4},   # the host preflight says it first
     '8 GPU(s) found, the inventory expects 4'),
    ({'pve_container_gpu_count': 4, 'gpu_preflight_gpu_count': 8},   # and the container play on its own
     'GPUs on pve-lab: found 8 GPU device node(s) on the PVE host'),
    ({'pve_container_api_token_id': 'root@pam!ci', 'pve_container_api_token_secret': 'x'},
     'pve_container_api_token_id/_secret are set, but this role passes GPUs (dev[n]) and bind mounts through'),
    ({'pve_container_extra_mounts': [{'host_path': 'relative/dir', 'path': '/x'}]}, 'needs absolute host_path'),
    # the PVE API: down, another CA, a wrong password; one line each naming the address and what to check
    ({'pve_container_api_port': 'FREE'}, 'cannot reach the PVE API at https://127.0.0.1:FREE (connection refused): '
                                         'check pve_container_api_host / pve_container_api_port'),
    ({'pve_container_api_ca_file': certifi.where()}, 'TLS check of the PVE API at https://127.0.0.1:8006 failed '
                                                     '(certificate verify failed'),
    ({'pve_container_api_password': 'not-the-password'},
     'the PVE API at https://127.0.0.1:8006 refused the login (user or password not accepted): check '
     'pve_container_api_user / pve_container_api_password'),
])
def test_bad_input_fails_before_any_change(lab_api, tmp_path, extra, words):
    if extra.get('pve_container_api_port') == 'FREE':
        port = free_port()
        extra, words = dict(extra, pve_container_api_port=port), words.replace('FREE', str(port))
    before = snapshot(lab_api, WATCHED)
    run = site(dict(VMID, **extra), inventory=one_node(tmp_path))
    assert run.rc != 0, run
    assert words in run.out, run
    assert 'Finalization of task args' not in run.out and 'HTTPSConnectionPool' not in run.out, run
    assert snapshot(lab_api, WATCHED) == before


def test_a_bad_smoke_setting_fails_before_any_change(lab_api, tmp_path):
    """The node's smoke-test settings are checked in site.yml's first plays (with the SGLang plays on: the smoke test
    runs in them): a bad one used to be said only when the test started, after the node's container, environment and
    engine had been touched and its restart had taken it out of its gateway."""
    before = snapshot(lab_api, WATCHED)
    run = site(dict(VMID, sglang_smoke_levels=[64, 1]), inventory=one_node(tmp_path), sglang=True)
    assert run.rc != 0, run
    assert 'fatal: [glm5-a -> localhost' in run.out and ('The smoke test settings are not usable: sglang_smoke_levels: '
                                                         '[64, 1] must go up (the sweep runs them in order).') in run.out, run
    assert 'PLAY [GPU preflight' not in run.out, 'the run went past the first plays'
    assert snapshot(lab_api, WATCHED) == before


def one_node(tmp_path):
    """One node (glm5-a, vmid 194) on the lab's host (extra variables apply to every host: with the lab's two nodes and
    gateway they would share the vmid and port under test, which the fleet's checks refuse first)."""
    import yaml
    hosts = {'all': {'children': {'pve_hosts': {'hosts': {'pve-lab': None}},
                                  'inference_nodes': {'hosts': {'glm5-a': {'pve_container_vmid': 194}}}}}}
    (tmp_path / 'hosts.yml').write_text(yaml.safe_dump(hosts))
    os.symlink(os.path.join(ROOT, 'inventories', 'lab', 'group_vars'), str(tmp_path / 'group_vars'))
    return str(tmp_path)


def two_nodes(tmp_path, b):
    """A lab inventory with glm5-a (vmid 194) and glm5-b (its host variables b)."""
    import yaml
    hosts = {'all': {'children': {
        'pve_hosts': {'hosts': {'pve-lab': None}},
        'inference_nodes': {'hosts': {'glm5-a': {'pve_container_vmid': 194}, 'glm5-b': b}}}}}
    (tmp_path / 'hosts.yml').write_text(yaml.safe_dump(hosts))
    os.symlink(os.path.join(ROOT, 'inventories', 'lab', 'group_vars'), str(tmp_path / 'group_vars'))
    return str(tmp_path)


@pytest.mark.parametrize('b, words', [
    ({'pve_container_vmid': 194, 'ansible_port': 20195},
     'both use pve_container_vmid 194 on the PVE API 127.0.0.1:8006'),
    ({'pve_container_vmid': 195, 'ansible_port': 20194},
     'both reach their container at 127.0.0.1:20194'),
    ({'pve_container_vmid': 195, 'ansible_port': 20195, 'pve_container_model_cache_dir': '/srv/glm5-lab/other',
      'pve_container_sglang_cache_dir': '/srv/glm5-lab/other-cache'},
     'both bind-mount /srv/glm5-lab/bench-history from pve-lab'),
    # each node's GPUs are its own: glm5-a takes all of them (the lab's group default)
    ({'pve_container_vmid': 195, 'ansible_port': 20195, 'pve_container_model_cache_dir': '/srv/glm5-lab/other',
      'pve_container_sglang_cache_dir': '/srv/glm5-lab/other-cache',
      'pve_container_bench_history_dir': '/srv/glm5-lab/other-history', 'pve_container_gpus': [7],
      'pve_container_gpu_count': 1},
     'would share every GPU (pve_container_gpus: all) of pve-lab'),
])
def test_two_nodes_sharing_a_container_id_port_or_directory_are_refused(lab_api, tmp_path, b, words):
    before = snapshot(lab_api, WATCHED)
    inventory = two_nodes(tmp_path, b)
    for args in ((), ('--check', '--diff'), ('--limit', 'glm5-b')):   # --limit: the other node still counts
        run = site(None, *args, inventory=inventory)
        assert run.rc != 0, run
        assert words in run.out and ('glm5-a and glm5-b ' + words in run.out or 'glm5-b and glm5-a ' + words in run.out), run
        assert 'fatal: [glm5-b]' in run.raw, run
        if '--limit' not in args:
            assert 'fatal: [glm5-a]' in run.raw, run
    assert snapshot(lab_api, WATCHED) == before


def test_a_limit_that_leaves_out_the_nodes_gateway_is_refused_before_any_change(lab_api, tmp_path):
    """--limit NODE where a gateway fronts NODE (tried on make deploy's lab): the node cannot leave or rejoin a gateway
    whose settings the run does not know. It was refused at the serving play, after the container play had made or
    changed the container and the environment play its SGLang build; now by site.yml's second play, first."""
    import yaml
    hosts = {'all': {'children': {
        'pve_hosts': {'hosts': {'pve-lab': None}},
        'inference_nodes': {'hosts': {'glm5-a': {'pve_container_vmid': 194, 'ansible_port': 20194}}},
        'gateways': {'hosts': {'gw-a': {'pve_container_vmid': 195, 'ansible_port': 20195}}}}}}
    (tmp_path / 'hosts.yml').write_text(yaml.safe_dump(hosts))
    os.symlink(os.path.join(ROOT, 'inventories', 'lab', 'group_vars'), str(tmp_path / 'group_vars'))
    before = snapshot(lab_api, WATCHED)
    for args in ((), ('--check',), ('--tags', 'smoke', '--check')):
        run = site(None, '--limit', 'glm5-a', *args, inventory=str(tmp_path), sglang=True)
        assert run.rc != 0, run
        assert ("gw-a: this run does not know the gateway's settings (site.yml's first play did not run for it, e.g. "
                "--limit left it out), so glm5-a cannot leave or rejoin it safely; add the gateways to --limit "
                "(--limit 'glm5-a,gateways')") in run.out, run
        assert 'PLAY [Containers on the Proxmox VE host' not in run.raw, run
    # a run that never reaches the serving play leaves no gateway: not refused (its removal, the container stages)
    for extra, args in (({'pve_container_state': 'absent'}, ()), (None, ('--skip-tags', 'sglang'))):
        run = site(extra, '--limit', 'glm5-a', '--check', *args, inventory=str(tmp_path), sglang=True)
        assert run.rc == 0 and 'does not know the gateway' not in run.out, run
    assert snapshot(lab_api, WATCHED) == before


def test_an_unprivileged_node_on_a_privileged_nodes_cache_is_refused_naming_a_file(lab_api, tmp_path):
    """A writable host directory holding files of the host's own ids (a privileged node's SGLang cache) is read-only to
    an unprivileged container's root: refused before anything changes, naming a file and the one-time shift; the
    directory keeps its owner, and the container is not created."""
    top = tmp_path / 'srv'
    caches = {name: top / name for name in ('models', 'sglang-cache', 'bench-history')}
    for path in caches.values():
        path.mkdir(parents=True)
    (caches['sglang-cache'] / 'flashinfer').mkdir()           # root's (uid 0): what a privileged node leaves
    (caches['models'] / 'weights.safetensors').write_text('')   # the model cache is only read: not a reason
    extra = dict(VMID, pve_container_unprivileged=True, pve_container_model_cache_dir=str(caches['models']),
                 pve_container_sglang_cache_dir=str(caches['sglang-cache']),
                 pve_container_bench_history_dir=str(caches['bench-history']))
    before, inventory = snapshot(lab_api, WATCHED), one_node(tmp_path)
    for args in ((), ('--check',)):
        run = site(extra, *args, inventory=inventory)
        assert run.rc != 0, run
        assert ('glm5-a is unprivileged (its root is 100000 on pve-lab), but {0} is owned by host ids outside '
                '100000..165535, so read-only inside. Nothing was changed.'.format(caches['sglang-cache'] / 'flashinfer')
                in run.out), run
    assert snapshot(lab_api, WATCHED) == before
    assert {os.stat(str(p)).st_uid for p in caches.values()} == {0}
