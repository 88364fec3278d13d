#!/usr/bin/python
from __future__ import annotations

DOCUMENTATION = r'''
---
module: model_weights
short_description: Put model weights into the model cache, verified, and mark them complete only then
description:
  - Fills I(dest) from a staged directory I(src) (an air-gapped host's copy of the model): files hard-linked when
    I(link) and on the same filesystem, else copied through a temporary name; every file checked against the
    source by size and sha256.
  - The completeness marker C(dest/.glm5-complete) (JSON - source, file list, sizes, sha256) is removed before
    anything is written and written last, so a cut run is resumed, never served. A later run that finds the
    marker with the same file list and sizes on both sides changes nothing (no re-hashing of hundreds of GB).
  - Never deletes a file it did not write, and never touches I(src).
options:
  src: {description: The staged model directory (on the host this runs on)., type: path, required: true}
  dest: {description: The model's directory in the model cache., type: path, required: true}
  link: {description: Hard-link instead of copying when src and dest share a filesystem., type: bool, default: true}
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
marker: {description: The completeness marker's content., returned: success, type: dict}
'''

import hashlib
import json
import os
import shutil

from ansible.module_utils.basic import AnsibleModule

MARKER = '.glm5-complete'
CHUNK = 8 * 1024 * 1024


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


def run(module):
    p = module.params
    src, dest, exclude = p['src'], p['dest'], set(p['exclude'])
    if not os.path.isdir(src):
        module.fail_json(msg='the staged model directory {0} does not exist'.format(src))
    if not os.path.isfile(os.path.join(src, 'config.json')):
        module.fail_json(msg='{0} has no config.json: not a model directory'.format(src))
    want = listing(src, exclude)
    have = listing(dest, exclude) if os.path.isdir(dest) else {}
    marker = read_marker(dest)
    if marker and marker.get('source') == src and {k: v['size'] for k, v in marker.get('files', {}).items()} == want \
            and all(have.get(k) == v for k, v in want.items()):
        return dict(changed=False, files=len(want), bytes=sum(want.values()), written=[], marker=marker)
    todo = sorted(k for k, v in want.items() if have.get(k) != v)
    if module.check_mode:
        return dict(changed=True, files=len(want), bytes=sum(want.values()), written=todo, marker=marker or {})
    os.makedirs(dest, exist_ok=True)
    if os.path.exists(os.path.join(dest, MARKER)):
        os.unlink(os.path.join(dest, MARKER))    # not complete again until verified below
    files = {}
    for rel in sorted(want):
        s, d = os.path.join(src, rel), os.path.join(dest, rel)
        expected = sha256(s)
        if rel in todo or sha256(d) != expected:
            place(s, d, p['link'])
            if rel not in todo:
                todo.append(rel)
        got = sha256(d)
        if got != expected or os.path.getsize(d) != want[rel]:
            module.fail_json(msg='{0}: sha256 {1} after copying, the staged file has {2}; not marked complete'.format(
                d, got, expected))
        files[rel] = {'size': want[rel], 'sha256': expected}
    marker = {'source': src, 'files': files, 'bytes': sum(want.values())}
    tmp = os.path.join(dest, MARKER + '.tmp')
    with open(tmp, 'w') as fh:
        json.dump(marker, fh, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(dest, MARKER))
    return dict(changed=True, files=len(want), bytes=marker['bytes'], written=sorted(todo), marker=marker)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            src=dict(type='path', required=True),
            dest=dict(type='path', required=True),
            link=dict(type='bool', default=True),
            exclude=dict(type='list', elements='str', default=['.cache', '.git', MARKER]),
        ),
        supports_check_mode=True,
    )
    module.exit_json(**run(module))


if __name__ == '__main__':
    main()
