"""What systemd says of a unit (systemctl show): for the modules that watch the engine's unit (sglang_ready while it
starts, sglang_bench across a level)."""
from __future__ import annotations

import subprocess

PROPS = ('ActiveState', 'SubState', 'Result', 'NRestarts', 'MainPID')


def unit_state(unit):
    """{ActiveState, SubState, Result, NRestarts (an int), MainPID} as systemctl shows them."""
    out = subprocess.run(['systemctl', 'show', '-p', ','.join(PROPS), unit], capture_output=True, text=True,
                         timeout=60).stdout
    state = dict(line.split('=', 1) for line in out.splitlines() if '=' in line)
    state['NRestarts'] = int(state.get('NRestarts') or 0)
    return state
