"""Exit codes shared by every `kooi` command (documented in docs/cli.md), and the one
way commands report a failure."""

from __future__ import annotations

import io
import sys
from typing import TextIO

from ..neutral import neutral

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_NOT_RUNNING = 3


def fail(where: str, message: object, code: int = EXIT_FAIL) -> int:
    """Print `WHERE: MESSAGE` on standard error and return CODE. A message may name what
    a workload made (a path in the project): its control characters are shown, never
    sent to the caller's terminal (a person's file name retitled root's terminal)."""
    print(neutral(f"{where}: {message}"), file=sys.stderr)
    return code


class Neutral(io.TextIOBase):
    """A text stream that shows the control characters written to it (run.errors.neutral;
    DEL as \\u007f, which JSON reads too) and passes the rest to INNER: every line a
    `kooi` command prints (review 25: `kooi engine status` as root printed the engine's
    version string, which a runner-made socket answers, with the escapes in it)."""

    def __init__(self, inner: TextIO) -> None:
        super().__init__()
        self.inner = inner

    def write(self, s: str) -> int:
        self.inner.write(neutral(s.replace("\x7f", "\\u007f")))
        return len(s)

    def flush(self) -> None:
        self.inner.flush()

    def isatty(self) -> bool:
        return self.inner.isatty()

    def fileno(self) -> int:
        return self.inner.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.inner, "encoding", "utf-8")
