"""Files that a kooi command writes its result to (`kooi run --json`, `kooi verify
--output`, `kooi image lock --out`).

A destination is opened before any work starts, as the caller (before `kooi run` drops
to the runner user), so a path that cannot be written is refused up front, exit 2, with
its name, instead of after a long run whose result then goes nowhere. An existing file
keeps its content until the result is written over it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO


class OutputError(Exception):
    """The destination cannot be written; the message names it and says why."""


class Output:
    """An output file opened now and written once, later."""

    def __init__(self, path: Path | str, option: str, binary: bool = False):
        self.path = Path(path)
        self.option = option
        try:
            # No O_TRUNC: a refused or failed run must not empty a previous result early.
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise OutputError(f"{option} {self.path}: cannot write there ({exc.strerror}); "
                              f"name a file in a directory you can write") from None
        self._f = os.fdopen(fd, "wb" if binary else "w")

    def write(self, text: str) -> None:
        """Replace the file's content with TEXT and close it."""
        try:
            self.replace().write(text)
            self._f.flush()
        except OSError as exc:
            raise OutputError(f"{self.option} {self.path}: writing failed ({exc.strerror})") from None
        finally:
            self.close()

    def replace(self) -> IO:
        """The file, emptied, to write the result to in parts; close() when done."""
        self._f.seek(0)
        self._f.truncate()
        return self._f

    def close(self) -> None:
        if not self._f.closed:
            try:
                self._f.close()
            except OSError:
                pass
