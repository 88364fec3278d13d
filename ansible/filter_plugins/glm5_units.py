"""What a running systemd unit does not run yet: the files written after it started (sglang_service's engine and
sglang_gateway's smg restart for them - a run that wrote them and stopped before its restart, or a file replaced
underneath the running process)."""


def glm5_written_since(stats, started):
    """The paths, in order, of the files written after the unit started.

    stats: ansible.builtin.stat results - registered results (with 'stat') or their 'stat' dicts; a file that is not
    there, or a result without one (a skipped task), is left out. started: `systemctl show -p ActiveEnterTimestamp
    --timestamp=unix --value` ('@<seconds>'; empty for a unit that is not running: then nothing is newer). ctime, not
    mtime (a copy that keeps the times still gets a new ctime), in whole seconds as systemd gives the start: a file
    written in the second the unit started is not newer."""
    since = str(started or '').strip().lstrip('@')
    if not since.isdigit():
        return []
    out = []
    for item in stats or []:
        st = item.get('stat', item) if isinstance(item, dict) else None
        if isinstance(st, dict) and st.get('exists') and st.get('ctime') is not None and int(st['ctime']) > int(since):
            out.append(st['path'])
    return out


class FilterModule(object):
    def filters(self):
        return {'glm5_written_since': glm5_written_since}
