#!/usr/bin/python
from __future__ import annotations

DOCUMENTATION = r'''
---
module: sglang_probe
short_description: Ask a running SGLang server questions with known answers and judge what it says
description:
  - >-
    Sends each probe's prompt to the server's OpenAI chat API (C(/v1/chat/completions), temperature 0, log-probabilities
    asked for) and judges the answer: it must contain the expected text, be non-empty, have no replacement characters
    (U+FFFD), not be a repeated-token loop, and carry only finite log-probabilities. A reasoning model may answer in
    C(reasoning_content): both C(content) and C(reasoning_content) are read.
  - >-
    Never fails on a wrong answer: it reports (C(passed), C(problems)) and the caller decides (the smoke test rolls
    back). It fails only on bad arguments.
  - >-
    Changes nothing.
options:
  url:
    description: The server's base URL (http://host:port).
    type: str
    required: true
  api_key:
    description: The server's API key (sent as a Bearer token).
    type: str
    default: ''
  model:
    description: The served model name.
    type: str
    required: true
  probes:
    description: The questions, each C({prompt, expect}).
    type: list
    elements: dict
    required: true
  max_tokens:
    description: At most this many tokens per answer (a reasoning model thinks first).
    type: int
    default: 512
  timeout:
    description: Seconds one answer may take.
    type: int
    default: 300
  logprobs:
    description: Ask for the answer's log-probabilities (NaN logits show there).
    type: bool
    default: true
author: GLM-5 node maintainers
'''

EXAMPLES = r'''
- name: The probe
  sglang_probe:
    url: http://127.0.0.1:30000
    api_key: "{{ key }}"
    model: glm-5
    probes:
      - {prompt: "What is 17 + 25? Answer with the number only.", expect: "42"}
  no_log: false
'''

RETURN = r'''
passed:
  description: Every probe was answered correctly.
  returned: always
  type: bool
problems:
  description: One line per probe that failed, naming it and what was wrong (separated by " / ").
  returned: always
  type: list
results:
  description: Per probe - prompt, expect, HTTP status, the answer (first 400 characters), problems, passed, seconds.
  returned: always
  type: list
'''

import json
import time
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.glm5_probe import judge_answer, usable_probe


def ask(url, key, model, prompt, max_tokens, timeout, logprobs):
    body = {'model': model, 'messages': [{'role': 'user', 'content': prompt}], 'max_tokens': max_tokens,
            'temperature': 0, 'stream': False}
    if logprobs:
        body['logprobs'] = True
    req = urllib.request.Request(url.rstrip('/') + '/v1/chat/completions', data=json.dumps(body).encode(),
                                 headers={'Content-Type': 'application/json'}, method='POST')
    if key:
        req.add_header('Authorization', 'Bearer ' + key)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        return None, 'no answer: {0}'.format(getattr(exc, 'reason', exc))
    text = raw.decode('utf-8', errors='replace')
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def run(p):
    results, problems = [], []
    for i, probe in enumerate(p['probes']):
        if not usable_probe(probe):
            # a number (expect: 42) was a TypeError after the request was sent, and expect: 0 'missing'
            raise ValueError('probes[{0}] needs a prompt and an expect, both text (quote a number: expect: "42"), '
                             'got {1!r}'.format(i, probe))
        t0 = time.monotonic()
        status, body = ask(p['url'], p['api_key'], p['model'], probe['prompt'], p['max_tokens'], p['timeout'],
                           p['logprobs'])
        if status is None:
            answer, found = '', [body]
        else:
            answer, found = judge_answer(probe, status, body)
        results.append({'prompt': probe['prompt'], 'expect': probe['expect'], 'status': status,
                        'answer': answer[:400], 'problems': found, 'passed': not found,
                        'seconds': round(time.monotonic() - t0, 2)})
        if found:
            problems.append('{0!r}: {1}'.format(probe['prompt'][:60], ' / '.join(found)))
    return {'passed': not problems, 'problems': problems, 'results': results}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type='str', required=True),
            api_key=dict(type='str', default='', no_log=True),
            model=dict(type='str', required=True),
            probes=dict(type='list', elements='dict', required=True),
            max_tokens=dict(type='int', default=512),
            timeout=dict(type='int', default=300),
            logprobs=dict(type='bool', default=True),
        ),
        supports_check_mode=True,
    )
    try:
        out = run(module.params)
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **out)


if __name__ == '__main__':
    main()
