#!/usr/bin/python
from __future__ import annotations

DOCUMENTATION = r'''
---
module: model_weights
short_description: Put model weights into the model cache, verified, and mark them complete only then
description:
  - >-
    With I(source=path), fills I(dest) from a staged directory I(src) (an air-gapped host's copy of the model):
    files copied through a temporary name (hard-linked only with I(link), which makes damage to one damage to
    both); every staged file is checked against an independent list of sha256 sums, I(checksums) (sha256sum's
    format: made from the hub's listing, or by C(sha256sum) on a copy you trust), before it is placed, and every
    placed file against the same sum. A staged file that does not match its sum fails the run, naming it; nothing
    is marked complete.
  - >-
    With I(source=hub), downloads I(repo) at the pinned I(revision) from the Hugging Face hub (or I(endpoint)) with
    huggingface_hub's snapshot_download into I(dest) (resumable; only I(allow_patterns)), then checks every file's
    size against the hub's listing and, for LFS files (the weights), its sha256 against the one the hub publishes;
    other files against their git blob sha. Needs huggingface_hub in the Python that runs the module.
  - >-
    A downloaded file that fails those checks is removed, with huggingface_hub's record of its download (which would
    otherwise tell every later run that the file is there): the run fails naming each, and the next run fetches
    them again.
  - >-
    The completeness marker C(dest/.glm5-complete) (JSON - source, file list, sizes, sha256, mtimes) is removed
    before anything is written and written last, so a cut run is resumed, never served. A later run that finds the
    marker with the same file list and sizes changes nothing; a file whose mtime is not the marker's is hashed
    (all of them with I(verify=full)), and one that no longer matches its sha256 is placed or downloaded again,
    with a warning naming it.
  - >-
    Before anything is written (in check mode too), the files still to write must fit: their sizes, less the bytes
    of the files they replace and of huggingface_hub's resumable partial downloads of them, plus I(reserve_gb), must
    be free on the filesystem I(dest) is on (nothing with I(link) when I(src) is on it too); else the run fails
    naming the filesystem, what is needed and what is free, and nothing is changed - not a download or copy that
    stops half-way with the disk full.
  - >-
    Never deletes a file it did not write (a downloaded file that failed its check is one it wrote), and never
    touches I(src).
options:
  source: {description: Where the weights come from., type: str, choices: [path, hub], default: path}
  src: {description: The staged model directory (on the host this runs on; source path)., type: path}
  dest: {description: The model's directory in the model cache., type: path, required: true}
  repo: {description: The hub repository, org/name (source hub)., type: str}
  revision: {description: The commit sha to download (source hub)., type: str}
  allow_patterns:
    description: Files of the repository to download (fnmatch patterns; source hub).
    type: list
    elements: str
    default: ['*']
  token: {description: Hugging Face token (gated repositories)., type: str, no_log: true}
  endpoint: {description: The hub's address (HF_ENDPOINT); empty is huggingface.co., type: str}
  link:
    description: >-
      Hard-link instead of copying when src and dest share a filesystem (saves the space of a copy; damage to one
      is then damage to both, and only I(checksums) can tell).
    type: bool
    default: false
  checksums:
    description: >-
      The staged model's list of sha256 sums (source path), sha256sum's format, relative to I(src) or absolute;
      every staged file must be in it. Empty - the staged copy is trusted as it is (not recommended).
    type: str
    default: SHA256SUMS
  verify:
    description: "quick - hash only files whose size or mtime is not the marker's; full - hash every file."
    type: str
    choices: [quick, full]
    default: quick
  reserve_gb:
    description: >-
      GiB left free on I(dest)'s filesystem once the files are written (the wheel cache and the bench histories may
      share it); 0 - only what the files need.
    type: float
    default: 1
  exclude:
    description: Top-level names not taken from src.
    type: list
    elements: str
    default: [.cache, .git, .glm5-complete]
author: GLM-5 node maintainers
'''

EXAMPLES = r'''
- name: The staged model into the host-side model cache
  model_weights:
    src: /srv/staging/GLM-5-NVFP4
    dest: /srv/glm5/models/GLM-5-NVFP4
'''

RETURN = r'''
files: {description: Number of files in the model., returned: always, type: int}
bytes: {description: Their total size., returned: always, type: int}
written: {description: Files copied or linked in this run (would be, in check mode)., returned: always, type: list}
damaged:
  description: Files of a complete-marked model that no longer matched their recorded sha256 (placed again).
  returned: always
  type: list
marker: {description: The completeness marker's content., returned: success, type: dict}
'''

import fnmatch
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

MARKER = '.glm5-complete'
CHUNK = 8 * 1024 * 1024
GIB = 1024 ** 3


def sha256(path):
    h = hashlib.sha256()
    with open(path, 'rb') as fh:
        for block in iter(lambda: fh.read(CHUNK), b''):
            h.update(block)
    return h.hexdigest()


def listing(root, exclude):
    out = {}
    for top, dirs, files in os.walk(root):
        rel_top = os.path.relpath(top, root)
        if rel_top == '.':
            dirs[:] = sorted(d for d in dirs if d not in exclude)
        else:
            dirs.sort()
        for name in sorted(files):
            rel = name if rel_top == '.' else os.path.join(rel_top, name)
            if rel_top == '.' and name in exclude:
                continue
            out[rel] = os.path.getsize(os.path.join(top, name))
    return out


def read_marker(dest):
    try:
        with open(os.path.join(dest, MARKER)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def place(src, dst, link):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = dst + '.glm5-partial'
    if os.path.lexists(tmp):
        os.unlink(tmp)
    if link:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
    else:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def git_blob_sha(path):
    h = hashlib.sha1()
    h.update(b'blob %d\0' % os.path.getsize(path))
    with open(path, 'rb') as fh:
        for block in iter(lambda: fh.read(CHUNK), b''):
            h.update(block)
    return h.hexdigest()


def write_marker(dest, marker):
    tmp = os.path.join(dest, MARKER + '.tmp')
    with open(tmp, 'w') as fh:
        json.dump(marker, fh, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(dest, MARKER))


def mtime(path):
    return os.stat(path).st_mtime_ns


def damaged_files(module, dest, marker, full):
    """The marker's files whose mtime is not the one recorded (every file with full) and whose sha256 is no
    longer the marker's: damaged since they were verified."""
    out = []
    for rel, rec in sorted(marker.get('files', {}).items()):
        path = os.path.join(dest, rel)
        if (full or rec.get('mtime_ns') != mtime(path)) and sha256(path) != rec.get('sha256'):
            out.append(rel)
    if out:
        module.warn('{0}: {1} no longer match{2} the sha256 recorded when {3} verified: placed again'.format(
            dest, ', '.join(out), 'es' if len(out) == 1 else '', 'it was' if len(out) == 1 else 'they were'))
    return out


def human(n):
    return '{0:.1f} GiB'.format(n / GIB) if abs(n) >= GIB else '{0:.1f} MiB'.format(n / 1024.0 ** 2)


def nearest(path):
    """path, or its nearest parent directory that exists."""
    near = os.path.abspath(path)
    while not os.path.exists(near):
        near = os.path.dirname(near)
    return near


def filesystem(path):
    """(mount point, bytes free to a writer that is not root - f_bavail) of the filesystem path is on, or would be
    on once made (its nearest existing parent)."""
    near = nearest(path)
    st = os.statvfs(near)
    point = near
    while not os.path.ismount(point):
        point = os.path.dirname(point)
    return point, st.f_bavail * st.f_frsize


def room(module, dest, todo, sizes, have, partial, linked):
    """Fail, before anything is written, when the files to write do not fit on dest's filesystem with reserve_gb
    left: each file to write needs its size, less the bytes of the file it replaces at dest (a download removes it
    first; a copy replaces it by rename, so the largest of them is needed once more while it is copied) and of a
    partial download huggingface_hub resumes (partial: {file: bytes}). linked: hard links, no new bytes."""
    if linked or not todo:
        return
    replaced = [have.get(k, 0) for k in todo]
    need = sum(sizes[k] for k in todo) - sum(replaced)
    if module.params['source'] == 'path':
        need += max(replaced)
    else:
        need -= sum(min(partial.get(k, 0), sizes[k]) for k in todo)
    reserve = int(module.params['reserve_gb'] * GIB)
    point, free = filesystem(dest)
    if need + reserve > free:
        module.fail_json(
            msg='{0}: the {1} file{2} to write need {3} on {4}, which has {5} free ({6} kept free: reserve_gb): '
                'nothing was written. Free space there, or put the model cache on a larger filesystem '
                '(sglang_model_host_cache_dir)'.format(dest, len(todo), '' if len(todo) == 1 else 's', human(need),
                                                       point, human(free), human(reserve)),
            need=need, free=free, filesystem=point)


def start(module, dest, source, sizes, exclude, partial=None, linked=False):
    """What both sources do first: (result, None) when there is nothing to do (the marker names this source and
    these files and sizes, they are there, and those whose mtime moved still hash to the marker's sha256) or in
    check mode; else the marker is removed, since nothing is complete again until verified, and (None, the files
    to write) is returned."""
    marker = read_marker(dest)
    have = listing(dest, exclude) if os.path.isdir(dest) else {}
    damaged = []
    if marker and marker.get('source') == source and \
            {k: v['size'] for k, v in marker.get('files', {}).items()} == sizes and \
            all(have.get(k) == v for k, v in sizes.items()):
        damaged = damaged_files(module, dest, marker, module.params['verify'] == 'full')
        if not damaged:
            moved = [k for k, v in marker['files'].items() if v.get('mtime_ns') != mtime(os.path.join(dest, k))]
            if not moved or module.check_mode:
                return dict(changed=bool(moved), files=len(sizes), bytes=sum(sizes.values()), written=[],
                            damaged=[], marker=marker), None, []
            # hashed and sound, but not at the mtime recorded (a marker of an older version has none): recorded
            # now, so the next run does not hash them again
            for k in moved:
                marker['files'][k]['mtime_ns'] = mtime(os.path.join(dest, k))
            write_marker(dest, marker)
            return dict(changed=True, files=len(sizes), bytes=sum(sizes.values()), written=[], damaged=[],
                        marker=marker), None, []
    todo = sorted(set(k for k, v in sizes.items() if have.get(k) != v) | set(damaged))
    room(module, dest, todo, sizes, have, partial or {}, linked)
    if module.check_mode:
        return dict(changed=True, files=len(sizes), bytes=sum(sizes.values()), written=todo, damaged=damaged,
                    marker=marker or {}), None, damaged
    os.makedirs(dest, exist_ok=True)
    if os.path.exists(os.path.join(dest, MARKER)):
        os.unlink(os.path.join(dest, MARKER))
    return None, todo, damaged


def hub_error(exc, p):
    where = '{0} at {1}'.format(p['repo'], p['endpoint'] or 'huggingface.co')
    name = type(exc).__name__
    if name == 'RevisionNotFoundError':
        return 'revision {0} not found in {1}'.format(p['revision'], where)
    if name in ('RepositoryNotFoundError', 'GatedRepoError') or '401' in str(exc) or '403' in str(exc):
        return ('{0}: not found, or no access with this token (sglang_model_hf_token); the hub said: {1}'.format(
            where, str(exc).splitlines()[0]))
    return '{0}: {1}: {2}'.format(where, name, str(exc).splitlines()[0] if str(exc) else '')


def from_hub(module):
    p = module.params
    dest = p['dest']
    try:
        from huggingface_hub import HfApi, snapshot_download
    except ImportError:
        module.fail_json(msg='source hub needs huggingface_hub in the Python running this module '
                             '(the SGLang environment has it)')
    api = HfApi(endpoint=p['endpoint'] or None, token=p['token'] or None)
    try:
        info = api.model_info(p['repo'], revision=p['revision'], files_metadata=True)
    except Exception as exc:  # noqa: BLE001 (every hub/HTTP error becomes one line)
        module.fail_json(msg=hub_error(exc, p))
    if info.sha != p['revision']:
        module.fail_json(msg='the hub resolved revision {0} of {1} to {2}: pin a commit sha'.format(
            p['revision'], p['repo'], info.sha))
    wanted = dict((s.rfilename, s) for s in info.siblings
                  if any(fnmatch.fnmatch(s.rfilename, pat) for pat in p['allow_patterns']))
    if not wanted:
        module.fail_json(msg='no file of {0}@{1} matches allow_patterns {2}'.format(p['repo'], info.sha,
                                                                                    p['allow_patterns']))
    source = 'hub:{0}@{1}'.format(p['repo'], info.sha)
    sizes = dict((k, s.size) for k, s in wanted.items())
    result, todo, damaged = start(module, dest, source, sizes, set(p['exclude']), partial=partial_downloads(dest, wanted))
    if result:
        return result
    for rel in todo:        # a file there under its final name is taken for present by huggingface_hub's record
        if os.path.exists(os.path.join(dest, rel)):
            forget_download(dest, rel)
    try:
        snapshot_download(p['repo'], revision=info.sha, allow_patterns=sorted(wanted), local_dir=dest,
                          token=p['token'] or None, endpoint=p['endpoint'] or None)
    except Exception as exc:  # noqa: BLE001
        module.fail_json(msg='download cut short, not marked complete (run again to resume): ' + hub_error(exc, p))
    files, bad = {}, []
    for rel, sib in sorted(wanted.items()):
        path = os.path.join(dest, rel)
        size = os.path.getsize(path) if os.path.exists(path) else None
        digest = sha256(path) if size == sib.size else None
        if size != sib.size:
            bad.append('{0}: {1} bytes, the hub lists {2}'.format(path, size, sib.size))
        elif sib.lfs is not None and digest != sib.lfs.sha256:
            bad.append('{0}: sha256 {1}, the hub publishes {2}'.format(path, digest, sib.lfs.sha256))
        elif sib.lfs is None and sib.blob_id and git_blob_sha(path) != sib.blob_id:
            bad.append('{0}: not the file the hub has at {1} (git blob sha differs)'.format(path, info.sha))
        else:
            files[rel] = {'size': sib.size, 'sha256': digest, 'mtime_ns': mtime(path)}
            continue
        forget_download(dest, rel)
    if bad:
        module.fail_json(msg='{0}; removed (with its download record), not marked complete: the next run downloads '
                             '{1} again'.format('; '.join(bad), 'it' if len(bad) == 1 else 'them'))
    marker = {'source': source, 'files': files, 'bytes': sum(sizes.values())}
    write_marker(dest, marker)
    return dict(changed=True, files=len(files), bytes=marker['bytes'], written=todo, damaged=damaged, marker=marker)


def partial_downloads(dest, wanted):
    """{file: bytes} of huggingface_hub's partial downloads in dest that it resumes: the .incomplete files of
    .cache/huggingface/download/ named for the file's etag (the sha256 of an LFS file, else its git blob sha), the
    version wanted now (a partial of another revision is not resumed, and is not counted)."""
    out = {}
    for rel, sib in wanted.items():
        etag = sib.lfs.sha256 if sib.lfs is not None else sib.blob_id
        folder = os.path.join(dest, '.cache', 'huggingface', 'download', os.path.dirname(rel))
        if not etag or not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            if name.endswith('.{0}.incomplete'.format(etag)):
                out[rel] = out.get(rel, 0) + os.path.getsize(os.path.join(folder, name))
    return out


def forget_download(dest, rel):
    """Remove a downloaded file that failed its check, and huggingface_hub's record of it under
    dest/.cache/huggingface/download/ (with the record there, snapshot_download takes the file for present and
    never fetches it again)."""
    try:
        from huggingface_hub._local_folder import get_local_download_paths
        paths = get_local_download_paths(Path(dest), rel)
        doomed = [paths.file_path, paths.metadata_path, paths.lock_path]
    except ImportError:                     # the layout huggingface_hub documents for local_dir downloads
        record = Path(dest, '.cache', 'huggingface', 'download', rel + '.metadata')
        doomed = [Path(dest, rel), record, record.with_suffix('.lock')]
    for path in doomed:
        try:
            os.unlink(str(path))
        except FileNotFoundError:
            pass


def run(module):
    p = module.params
    if p['reserve_gb'] < 0:
        module.fail_json(msg='reserve_gb must be 0 or more (GiB left free), got {0}'.format(p['reserve_gb']))
    if p['source'] == 'hub':
        missing = [k for k in ('repo', 'revision') if not p[k]]
        if missing:
            module.fail_json(msg='source hub needs {0}'.format(' and '.join(missing)))
        return from_hub(module)
    if not p['src']:
        module.fail_json(msg='source path needs src (the staged model directory)')
    src, dest, exclude = p['src'], p['dest'], set(p['exclude'])
    if not os.path.isdir(src):
        module.fail_json(msg='the staged model directory {0} does not exist'.format(src))
    if not os.path.isfile(os.path.join(src, 'config.json')):
        module.fail_json(msg='{0} has no config.json: not a model directory'.format(src))
    sums, sums_name = None, None
    if p['checksums']:
        sums_path = p['checksums'] if os.path.isabs(p['checksums']) else os.path.join(src, p['checksums'])
        sums_name = os.path.relpath(sums_path, src)
        exclude.add(sums_name)
        sums = read_sums(module, sums_path, src)
    want = listing(src, exclude)
    if sums_name:
        want.pop(sums_name, None)       # the list itself, in a subfolder too (listing leaves out top-level names only)
    if sums is not None:
        unlisted = sorted(set(want) - set(sums))
        missing = sorted(set(sums) - set(want))
        if unlisted or missing:
            module.fail_json(msg='{0} and {1} disagree: {2}{3}; nothing was changed'.format(
                src, sums_name, ('not in the list: ' + ', '.join(unlisted[:5])) if unlisted else '',
                ('{0}listed but not staged: '.format('; ' if unlisted else '') + ', '.join(missing[:5])) if missing else ''))
    linked = p['link'] and filesystem(src)[0] == filesystem(dest)[0] and \
        os.stat(src).st_dev == os.stat(nearest(dest)).st_dev
    result, todo, damaged = start(module, dest, src, want, exclude, linked=linked)
    if result:
        return result
    files = {}
    for rel in sorted(want):
        s, d = os.path.join(src, rel), os.path.join(dest, rel)
        expected = sums[rel] if sums is not None else sha256(s)
        if rel in todo or sha256(d) != expected:
            if sums is not None and sha256(s) != expected:
                module.fail_json(msg='the staged file {0} is damaged: sha256 {1}, {2} says {3}; not placed, nothing is '
                                     'marked complete (stage a good copy of it)'.format(s, sha256(s), sums_name,
                                                                                        expected))
            place(s, d, p['link'])
            if rel not in todo:
                todo.append(rel)
        got = sha256(d)
        if got != expected or os.path.getsize(d) != want[rel]:
            module.fail_json(msg='{0}: sha256 {1} after copying, the staged file has {2}; not marked complete'.format(
                d, got, expected))
        files[rel] = {'size': want[rel], 'sha256': expected, 'mtime_ns': mtime(d)}
    marker = {'source': src, 'files': files, 'bytes': sum(want.values()),
              'verified_against': sums_name or 'the staged files themselves (no checksums)'}
    write_marker(dest, marker)
    return dict(changed=True, files=len(want), bytes=marker['bytes'], written=sorted(todo), damaged=damaged,
                marker=marker)


SUM_LINE = re.compile(r'^([0-9a-fA-F]{64}) [ *](.+)$')


def read_sums(module, path, src):
    """sha256sum's output -> {relative path: sha256}; a missing or unreadable list fails before anything changes."""
    try:
        with open(path) as fh:
            lines = [x.rstrip('\n') for x in fh if x.strip()]
    except OSError as exc:
        module.fail_json(msg=(
            'the staged model {0} has no list of sha256 sums to check it against ({1}: {2}): make one from the hub\'s '
            'listing, or on a copy you trust: cd {0} && find . -type f ! -name {3} -print0 | sort -z | xargs -0 '
            'sha256sum > {3}; nothing was changed (sglang_model_staged_checksums: "" trusts the staged copy as it '
            'is)').format(src, path, exc.strerror, os.path.basename(path)))
    sums = {}
    for n, line in enumerate(lines, 1):
        m = SUM_LINE.match(line)
        if not m:
            module.fail_json(msg='{0}, line {1}: not a sha256sum line: {2!r}'.format(path, n, line[:100]))
        sums[os.path.normpath(m.group(2))] = m.group(1).lower()
    return sums


def main():
    module = AnsibleModule(
        argument_spec=dict(
            source=dict(type='str', choices=['path', 'hub'], default='path'),
            src=dict(type='path'),
            dest=dict(type='path', required=True),
            repo=dict(type='str'),
            revision=dict(type='str'),
            allow_patterns=dict(type='list', elements='str', default=['*']),
            token=dict(type='str', no_log=True),
            endpoint=dict(type='str'),
            link=dict(type='bool', default=False),
            checksums=dict(type='str', default='SHA256SUMS'),
            verify=dict(type='str', choices=['quick', 'full'], default='quick'),
            reserve_gb=dict(type='float', default=1.0),
            exclude=dict(type='list', elements='str', default=['.cache', '.git', MARKER]),
        ),
        supports_check_mode=True,
    )
    module.exit_json(**run(module))


if __name__ == '__main__':
    main()
