"""nvidia_passthrough: from find results (real shapes, recorded H200 host + the lab's 8 stand-ins) to dev[n]."""
import pytest
from nvidia_devices import nvidia_passthrough


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
    (EIGHT, {'gpus': [8]}, 'GPU index(es) [8] not found'),
    (EIGHT, {'gpus': ['x']}, 'list of GPU indexes'),
    ([node('/dev/nvidia0'), node('/dev/nvidiactl')], {}, '/dev/nvidia-uvm missing'),
    (EIGHT, {'mode': 'rw'}, 'mode must be'),
])
def test_errors_say_what_is_wrong(files, kwargs, words):
    with pytest.raises(Exception) as err:
        nvidia_passthrough(files, **kwargs)
    assert words in str(err.value)
