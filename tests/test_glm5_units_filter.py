"""glm5_written_since: the files a running unit does not run yet."""
from glm5_units import glm5_written_since


def stat(path, ctime, exists=True):
    return {'exists': exists, 'path': path, 'ctime': ctime} if exists else {'exists': False}


def test_files_written_after_the_start_in_whole_seconds():
    stats = [{'stat': stat('/unit', 1000.9)}, {'stat': stat('/env', 1001.2)}, stat('/launcher', 999.0),
             {'stat': stat('/gone', 0, exists=False)}, {'skipped': True}, {'stat': stat('/lib', 1002)}]
    # '/unit' was written in the second the unit started (1000): not newer
    assert glm5_written_since(stats, '@1000') == ['/env', '/lib']
    assert glm5_written_since(stats, '1001') == ['/lib']


def test_a_unit_that_is_not_running_has_nothing_newer():
    stats = [stat('/env', 5000)]
    assert glm5_written_since(stats, '') == glm5_written_since(stats, None) == glm5_written_since(stats, 'n/a') == []
    assert glm5_written_since(None, '@1') == []
