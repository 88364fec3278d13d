"""The smoke test's correctness probe judged: one answer from the server's chat API -> what is wrong with it.

The only part of the smoke test the module sglang_probe needs, so the only one Ansible ships into the container with
it: standard library only, no imports from the other glm5_* module_utils.
"""
from __future__ import annotations

import json
import math
import re

PROBE_KEYS = ('prompt', 'expect')


def usable_probe(probe):
    """A probe is {prompt, expect}, both non-empty text (a number for expect is refused: quote it)."""
    return isinstance(probe, dict) and all(isinstance(probe.get(k), str) and probe[k].strip() for k in PROBE_KEYS)


_LOOP = re.compile(r'(.{1,24}?)(?:\s*\1){11,}', re.S)


def repeated_loop(text):
    """The repeated piece when text is (or ends in) one short piece over and over -- what NaN logits produce --
    else None."""
    words = text.split()
    if len(words) >= 12:
        run, longest, prev = 0, 0, None
        for w in words:
            run = run + 1 if w == prev else 1
            prev = w
            longest = max(longest, run)
        if longest >= 12:
            return max(set(words), key=words.count)
    m = _LOOP.search(text)
    if m and len(m.group(0)) >= 24:
        return m.group(1)
    return None


def _finite_logprobs(choice):
    lp = (choice or {}).get('logprobs') or {}
    bad = 0
    for item in lp.get('content') or []:
        value = item.get('logprob') if isinstance(item, dict) else None
        if value is None or (isinstance(value, (int, float)) and not math.isfinite(value)) or \
                (isinstance(value, str) and value.lower() in ('nan', 'inf', '-inf', 'infinity', '-infinity')):
            bad += 1
    return bad


def judge_answer(probe, status, body):
    """One probe's answer (HTTP status, the parsed chat completion) -> (answer text, problems). The answer may be in
    content or, from a reasoning model, in reasoning_content: both are read."""
    if status != 200:
        detail = body if isinstance(body, str) else json.dumps(body)[:300]
        return '', ['HTTP {0}: {1}'.format(status, (detail or '').strip()[:300])]
    try:
        choice = body['choices'][0]
        message = choice.get('message') or {}
    except (KeyError, IndexError, TypeError):
        return '', ['not a chat completion: {0}'.format(json.dumps(body)[:300])]
    content = message.get('content') or ''
    reasoning = message.get('reasoning_content') or ''
    text = (content + '\n' + reasoning).strip() if reasoning else content.strip()
    problems = []
    if not text:
        problems.append('empty answer (no content, no reasoning_content)')
        return text, problems
    if '\ufffd' in text:
        problems.append('replacement characters (U+FFFD) in the answer: {0} of {1} characters'.format(
            text.count('\ufffd'), len(text)))
    loop = repeated_loop(text)
    if loop is not None:
        problems.append('a repeated-token loop ({0!r} over and over), what NaN logits produce'.format(loop[:40]))
    bad = _finite_logprobs(choice)
    if bad:
        problems.append('{0} token log-probabilities are not finite (NaN/inf)'.format(bad))
    expect = probe['expect']
    if not re.search(r'(?<![\w.]){0}(?![\w]|\.\d)'.format(re.escape(expect)), text, re.I):
        problems.append('expected {0!r}, the answer does not say it'.format(expect))
    return text, problems
