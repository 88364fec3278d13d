"""The engine emulator's fault switches (scripts/lab/sglang_emulator.py) are read as they are meant: a bad one in the
environment stops it with one line; a bad one in the fault file, written while it runs, is said once and left out
(crash-after=x killed its batch loop while /health still answered, and slow=abc at start wedged every request);
slow written to the file while it runs takes effect (it was read once, at start). No sglang needed: make check."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'scripts', 'lab'))
import sglang_emulator  # noqa: E402


def test_the_switches_and_their_values():
    assert sglang_emulator.faults('nan, slow=2,crash-after=3,slow-start=0.5') == {
        'nan': '', 'slow': 2.0, 'crash-after': 3, 'slow-start': 0.5}
    assert sglang_emulator.faults('slow=0') == {'slow': 0.0}       # bench_harness: every step immediate
    assert sglang_emulator.faults('') == {} and sglang_emulator.faults(None) == {}


@pytest.mark.parametrize('text, words', [
    ('nann', "unknown switch 'nann'"), ('slow=abc', "slow must be a number >= 0, got 'abc'"),
    ('crash-after=x', "crash-after must be a whole number >= 1, got 'x'"), ('crash-after=0', 'crash-after must be'),
    ('slow-start=-1', 'slow-start must be a number >= 0'), ('nan=1', "nan takes no value, got 'nan=1'"),
    ('slow=inf', 'slow must be a number >= 0')])
def test_a_bad_switch_in_the_environment_stops_it_with_one_line(text, words):
    with pytest.raises(SystemExit) as e:
        sglang_emulator.faults(text)
    assert str(e.value).startswith('sglang-emulator: GLM5_EMULATOR_FAULTS: ') and words in str(e.value)
    assert '\n' not in str(e.value)


def file_engine(tmp_path, text):
    """An Engine reduced to its fault switches: the environment's none, the file's text."""
    engine = object.__new__(sglang_emulator.Engine)
    path = tmp_path / 'faults'
    path.write_text(text)
    engine._faults, engine._file_faults, engine._checked, engine._file_said = {}, {}, 0.0, ''
    engine.fault_file = str(path)
    return engine, path


def test_a_bad_switch_in_the_file_is_said_once_and_left_out(tmp_path, capsys):
    engine, path = file_engine(tmp_path, 'nan,crash-after=x\n')
    assert engine.faults == {'nan': ''}
    err = capsys.readouterr().err
    assert err.count("crash-after must be a whole number >= 1, got 'x' (left out)") == 1, err
    engine._checked = 0.0
    assert engine.faults == {'nan': ''} and capsys.readouterr().err == ''      # said once, not at every read
    path.write_text('slow=3\n')
    engine._checked = 0.0
    assert engine.faults == {'slow': 3.0}       # slow from the file, as the batch loop reads it at every step
