"""Exit codes shared by every `kooi` command (documented in docs/cli.md), and the one
way commands report a failure."""

from __future__ import annotations

import sys

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_NOT_RUNNING = 3


def fail(where: str, message: object, code: int = EXIT_FAIL) -> int:
    """Print `WHERE: MESSAGE` on standard error and return CODE."""
    print(f"{where}: {message}", file=sys.stderr)
    return code
