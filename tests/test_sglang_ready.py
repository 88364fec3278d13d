"""sglang_ready's wait, on a scripted unit and server (the lab run is tests/test_glm5_ops.py's start-limit test): it
ends as soon as the unit has failed or crash-loops, not at the timeout, and says what answered and the unit's words."""
import sglang_ready
from sglang_ready import wait

ARGS = dict(url='http://127.0.0.1:30192/health_generate', unit='glm5-sglang',
            timeout=3600, poll=10, max_restarts=3, journal_lines=10)


def scripted(monkeypatch, states, answers, words=('OSError: [Errno 98] address already in use',)):
    """Each poll takes the next unit state and /health_generate answer (the last ones repeat); time passes by poll."""
    clock = {'t': 0.0, 'n': 0}

    def unit_state(unit):
        s = dict(states[min(clock['n'], len(states) - 1)])
        s.setdefault('NRestarts', 0)
        return s

    def health(url):
        answer = answers[min(clock['n'], len(answers) - 1)]
        clock['n'] += 1
        return answer

    def sleep(s):
        clock['t'] += s
    monkeypatch.setattr(sglang_ready, 'unit_state', unit_state)
    monkeypatch.setattr(sglang_ready, 'health', health)
    monkeypatch.setattr(sglang_ready, 'journal', lambda unit, lines: list(words))
    return dict(clock=lambda: clock['t'], sleep=sleep), clock


def test_ready_when_health_answers_200(monkeypatch):
    kw, clock = scripted(monkeypatch, [{'ActiveState': 'activating', 'SubState': 'start'}, {'ActiveState': 'active'}],
                         [(503, 'HTTP 503'), (503, 'HTTP 503'), (200, 'HTTP 200')])
    ok, out = wait(ARGS, **kw)
    assert ok and out['status'] == 200 and out['seconds'] == 20 and 'journal' not in out


def test_a_failed_unit_ends_the_wait_at_once_naming_the_squatter_and_the_units_words(monkeypatch):
    failed = {'ActiveState': 'failed', 'SubState': 'failed', 'Result': 'start-limit-hit', 'NRestarts': 2}
    kw, clock = scripted(monkeypatch, [{'ActiveState': 'activating', 'SubState': 'auto-restart'}, failed],
                         [(404, 'HTTP 404')])
    ok, out = wait(ARGS, **kw)
    assert not ok and out['seconds'] == 0, out                            # the first poll that sees it, not an hour
    assert out['msg'] == (
        'glm5-sglang is not ready: it failed. The unit: glm5-sglang is failed (failed, result start-limit-hit), '
        '2 restarts. http://127.0.0.1:30192/health_generate: HTTP 404 (not the service: the unit does not run, so '
        'another process holds the port). Its last words: OSError: [Errno 98] address already in use'), out['msg']


def test_a_crash_loop_ends_the_wait_after_max_restarts(monkeypatch):
    states = [{'ActiveState': 'activating', 'SubState': 'auto-restart', 'NRestarts': n} for n in (5, 6, 7, 8, 9)]
    kw, clock = scripted(monkeypatch, states, [(None, 'Connection refused')])
    ok, out = wait(ARGS, **kw)
    assert not ok and out['restarts'] == 3 and 'it restarted 3 times while it was awaited' in out['msg'], out
    assert 'health_generate: Connection refused. Its last words' in out['msg'], out['msg']


def test_the_timeout_names_the_time_and_what_answered(monkeypatch):
    kw, clock = scripted(monkeypatch, [{'ActiveState': 'active', 'SubState': 'running'}], [(503, 'HTTP 503')], ())
    ok, out = wait(dict(ARGS, timeout=25), **kw)
    assert not ok and 'not ready after 25 s' in out['msg'] and 'HTTP 503.' in out['msg'], out['msg']
    assert 'another process' not in out['msg'] and out['msg'].endswith('(no journal lines)'), out['msg']


def test_a_url_without_its_scheme_is_refused_at_once_in_check_mode_too(capsys, monkeypatch):
    """'127.0.0.1:30000/health_generate' is a URL of the scheme '127.0.0.1' to urllib: every poll failed until the
    timeout (an hour by default; 2 s here, the unit scripted as starting), then 'unknown url type'."""
    import modrun
    monkeypatch.setattr(sglang_ready, 'unit_state', lambda unit: {'ActiveState': 'activating', 'NRestarts': 0})
    monkeypatch.setattr(sglang_ready, 'journal', lambda unit, lines: [])
    for check_mode in (False, True):
        out = modrun.run_module(sglang_ready, capsys, check_mode=check_mode, url='127.0.0.1:30000/health_generate',
                                unit='glm5-sglang', timeout=2, poll=1)
        assert out['failed'] and out['msg'] == ("url must be http(s)://host:port/path, got "
                                                "'127.0.0.1:30000/health_generate'"), out
