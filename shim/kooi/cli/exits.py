"""Exit codes shared by every `kooi` command (documented in docs/cli.md), and the one
way commands report a failure."""

from __future__ import annotations

import sys

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_NOT_RUNNING = 3


def fail(where: str, message: object, code: int = EXIT_FAIL) -> int:
    """Print `WHERE: MESSAGE` on standard error and return CODE. A message may name what
    a workload made (a path in the project): its control characters are shown, never
    sent to the caller's terminal (a person's file name retitled root's terminal)."""
    from ..run.errors import neutral

    print(neutral(f"{where}: {message}"), file=sys.stderr)
    return code
