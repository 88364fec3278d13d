"""The two errors glm5 ends on: one line on stderr, and its exit status."""
from __future__ import annotations


class OpsError(Exception):
    """One line for the user; exit 1."""
    code = 1


class UsageError(OpsError):
    """Bad input; exit 2."""
    code = 2


class Interrupted(OpsError):
    """Ctrl-C (SIGINT) in the middle of a change: one line saying where it was left; exit 130, as a shell's."""
    code = 130
