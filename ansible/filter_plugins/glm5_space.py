"""Free space where something is about to be written: the mounted filesystem a path is on, from the setup module's
mount facts (ansible.builtin.setup, gather_subset mounts: each mount with its size_available, f_bavail * f_frsize)."""
import posixpath

from ansible.errors import AnsibleFilterError


def glm5_mount_of(mounts, path):
    """The mount fact (a dict: mount, device, size_available, ...) of the filesystem PATH is on, or would be on once
    created: the longest mount point that is PATH or one of its parent directories. Symlinks are not followed (the
    facts name mount points as the kernel lists them)."""
    if not isinstance(path, str) or not path.startswith('/'):
        raise AnsibleFilterError('glm5_mount_of: an absolute path is needed, got {0!r}'.format(path))
    path = posixpath.normpath(path)
    best = None
    for m in mounts or []:
        point = posixpath.normpath(str(m.get('mount', '')))
        if not point.startswith('/'):
            continue
        if path == point or path.startswith(point.rstrip('/') + '/'):
            if best is None or len(point) > len(posixpath.normpath(best['mount'])):
                best = m
    if best is None:
        raise AnsibleFilterError('glm5_mount_of: no mounted filesystem holds {0} in the facts given (gather_subset '
                                 'mounts: {1} mounts)'.format(path, len(mounts or [])))
    return best


class FilterModule(object):
    def filters(self):
        return {'glm5_mount_of': glm5_mount_of}
