"""nvidia_passthrough: from find results (real shapes, recorded H200 host + the lab's 8 stand-ins) to dev[n];
the checks the role asserts on (selection, expected count, the driver's own list) and nvidia-smi's minors."""
import os
import re

import pytest
from nvidia_devices import gpu_selection_problems, nvidia_passthrough, nvidia_passthrough_problems

from ansible.module_utils.nvidia_facts import parse_smi_xml

H200 = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fixtures', 'nvidia-smi', 'h200-1gpu-firecracker')


def recorded(name):
    with open(os.path.join(H200, name)) as fh:
        return fh.read()


def h200_files():
    """find-like entries for the device nodes in the recorded `ls -l /dev/nvidia* /dev/nvidia-caps` of the H200."""
    out, folder = [], '/dev'
    for line in recorded('dev-nodes.txt').splitlines():
        if line.endswith(':'):
            folder = line[:-1]
            continue
        m = re.match(r'^c([rwx-]{9}) .* (\S+)$', line)
        if m:
            bits = ''.join('1' if c != '-' else '0' for c in m.group(1))
            mode = '0{0}{1}{2}'.format(*(int(bits[i:i + 3], 2) for i in (0, 3, 6)))
            path = m.group(2) if m.group(2).startswith('/') else folder + '/' + m.group(2)
            out.append({'path': path, 'mode': mode, 'isdir': False})
    return out


def node(path, mode='0666'):
    return {'path': path, 'mode': mode, 'isdir': False}


EIGHT = [node('/dev/nvidia%d' % i) for i in range(8)] + [
    node('/dev/nvidiactl'), node('/dev/nvidia-uvm'), node('/dev/nvidia-uvm-tools'), node('/dev/nvidia-modeset'),
    {'path': '/dev/nvidia-caps', 'mode': '0755', 'isdir': True},
    node('/dev/nvidia-caps/nvidia-cap2', '0444'), node('/dev/nvidia-caps/nvidia-cap1', '0400')]


def test_all_gpus_in_order_then_ctl_uvm_caps():
    out = nvidia_passthrough(EIGHT)
    assert [d['path'] for d in out] == ['/dev/nvidia%d' % i for i in range(8)] + [
        '/dev/nvidiactl', '/dev/nvidia-uvm', '/dev/nvidia-uvm-tools',
        '/dev/nvidia-caps/nvidia-cap1', '/dev/nvidia-caps/nvidia-cap2']
    assert out[-2]['mode'] == '0400' and out[0]['mode'] == '0666'


def test_gpu_subset_and_forced_mode():
    out = nvidia_passthrough(EIGHT, gpus=[3, 1], mode='0660')
    assert [d['path'] for d in out][:2] == ['/dev/nvidia1', '/dev/nvidia3']
    assert '/dev/nvidia0' not in [d['path'] for d in out]
    assert {d['mode'] for d in out} == {'0660'}


def test_gpu_numbering_is_numeric_not_lexical():
    files = [node('/dev/nvidia%d' % i) for i in (10, 2, 1)] + [node('/dev/nvidiactl'), node('/dev/nvidia-uvm')]
    assert [d['path'] for d in nvidia_passthrough(files)][:3] == ['/dev/nvidia1', '/dev/nvidia2', '/dev/nvidia10']


@pytest.mark.parametrize('files, kwargs, words', [
    ([], {}, 'no /dev/nvidiaN'),
    (EIGHT, {'gpus': [8]}, 'pve_container_gpus selects /dev/nvidia8, not on the PVE host (it has /dev/nvidia0, '),
    (EIGHT, {'gpus': ['x']}, 'entries must be GPU minors'),
    (EIGHT, {'gpus': []}, 'pve_container_gpus is an empty list'),
    (EIGHT, {'gpus': [0, 0]}, 'lists GPU 0 more than once'),
    ([node('/dev/nvidia0'), node('/dev/nvidiactl')], {}, '/dev/nvidia-uvm missing'),
    (EIGHT, {'mode': 'rw'}, 'mode must be'),
    # pve_container_gpu_mode: 0644 unquoted reaches the filter as 420, and became mode 0420
    (EIGHT, {'mode': 0o644}, 'pve_container_gpu_mode must be quoted, e.g. "0660" (unquoted, YAML reads 0660 as the number '
                             '432), got the number 420'),
    (EIGHT, {'mode': 660}, 'got the number 660'),
])
def test_errors_say_what_is_wrong(files, kwargs, words):
    with pytest.raises(Exception) as err:
        nvidia_passthrough(files, **kwargs)
    assert words in str(err.value)


@pytest.mark.parametrize('gpus, count, words', [
    ([], None, 'pve_container_gpus is an empty list: the node needs its GPUs (to remove the container use '
               'pve_container_state: absent)'),
    ([0, 0], None, 'pve_container_gpus lists GPU 0 more than once: [0, 0]'),
    ([1, 1, 2, 2], None, 'lists GPU 1, 2 more than once'),
    (['0'], None, 'entries must be GPU minors (whole numbers >= 0)'),
    ([-1], None, 'entries must be GPU minors'),
    ([True], None, 'entries must be GPU minors'),
    ('0,1', None, 'pve_container_gpus must be "all" or a list of GPU minors like [0, 1], got \'0,1\''),
    ('ALL', None, 'must be "all" or a list'),
    ({'0': 1}, None, 'must be "all" or a list'),
    (None, None, 'must be "all" or a list'),
    ([0, 1], 8, 'pve_container_gpus lists 2 GPU(s) but pve_container_gpu_count is 8'),
    ('all', 0, 'pve_container_gpu_count must be a whole number >= 1, got 0'),
    ('all', '8', 'pve_container_gpu_count must be a whole number'),
])
def test_gpu_selection_problems_one_line_each(gpus, count, words):
    problems = gpu_selection_problems(gpus, count)
    assert len(problems) == 1 and words in problems[0], problems
    assert '\n' not in problems[0]


@pytest.mark.parametrize('gpus, count', [('all', 8), ('all', None), ([3, 1], 2), ([0], None), (list(range(8)), 8)])
def test_good_selections_have_no_problems(gpus, count):
    assert gpu_selection_problems(gpus, count) == []
    assert nvidia_passthrough_problems(EIGHT, gpus=gpus, count=count) == []


def test_a_missing_gpu_node_fails_the_expected_count():
    """The observed outage: /dev/nvidia3 gone, gpus=all; the old code passed the other seven through."""
    seven = [f for f in EIGHT if f['path'] != '/dev/nvidia3']
    problems = nvidia_passthrough_problems(seven, gpus='all', count=8)
    assert len(problems) == 1
    assert problems[0].startswith('found 7 GPU device node(s) on the PVE host (/dev/nvidia0, /dev/nvidia1, '
                                  '/dev/nvidia2, /dev/nvidia4, ')
    assert 'pve_container_gpu_count is 8 (missing /dev/nvidia3)' in problems[0]
    assert nvidia_passthrough_problems(EIGHT + [node('/dev/nvidia8')], gpus='all', count=8)[0].startswith(
        'found 9 GPU device node(s)')


def driver_minors(xml):
    """The minors nvidia_gpu_facts reports (its XML parser), as the role passes them."""
    return [g['minor'] for g in parse_smi_xml(xml)['gpus']]


def test_a_gpu_without_a_minor_number_is_a_problem():
    minors = driver_minors('<nvidia_smi_log><gpu id="00000000:01:00.0"><minor_number>N/A</minor_number></gpu>'
                           '</nvidia_smi_log>')
    assert minors == [None]
    assert 'the driver reports a GPU without a minor number' in nvidia_passthrough_problems(
        EIGHT, driver_minors=minors)[0]


def test_recorded_h200_host_passes_through_its_one_gpu_matching_the_driver():
    files = h200_files()
    assert {f['path'] for f in files} == {'/dev/nvidia0', '/dev/nvidiactl', '/dev/nvidia-uvm', '/dev/nvidia-uvm-tools',
                                          '/dev/nvidia-caps/nvidia-cap1', '/dev/nvidia-caps/nvidia-cap2'}
    minors = driver_minors(recorded('nvidia-smi-q.xml'))
    assert minors == [0]
    assert nvidia_passthrough_problems(files, gpus='all', count=1, driver_minors=minors) == []
    out = nvidia_passthrough(files)
    assert out[0] == {'path': '/dev/nvidia0', 'mode': '0666'}
    assert {'path': '/dev/nvidia-caps/nvidia-cap1', 'mode': '0400'} in out


def test_device_nodes_that_disagree_with_the_driver_are_a_problem():
    minors = driver_minors(recorded('nvidia-smi-q.xml'))      # the driver knows one GPU, minor 0
    problems = nvidia_passthrough_problems(EIGHT, gpus='all', count=8, driver_minors=minors)
    assert any(p.startswith('the driver reports GPUs with minors [0] (nvidia-smi -q) but /dev has /dev/nvidia0, ')
               and '/dev/nvidia7 belong to no GPU the driver knows' in p for p in problems), problems
    assert 'the driver reports 1 GPU(s) but pve_container_gpu_count is 8' in problems
    no_node = nvidia_passthrough_problems(EIGHT, gpus='all', driver_minors=list(range(9)))
    assert 'no device node for /dev/nvidia8' in no_node[0]
