"""Files that a kooi command writes its result to (`kooi run --json`, `kooi verify
--output`, `kooi image lock --out`, `kooi image save --out`).

A destination is checked before any work starts, as the caller (before `kooi run` drops
to the runner user): a path that cannot be written is refused up front, exit 2, with its
name, instead of after a long run whose result then goes nowhere. The result is written
to a temporary file beside the destination, created at that check, and renamed into
place when it is complete: the destination appears (or changes) only then, all at once,
and a run that ends early leaves an existing file as it was. (The one exception: an
existing file the caller may write in a directory it may not is written in place.)
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO, Any


class OutputError(Exception):
    """The destination cannot be written; the message names it and says why."""


class Output:
    """A result file: staged now, put in place once, later."""

    def __init__(self, path: Path | str, option: str, binary: bool = False):
        self.path = Path(path)
        self.option = option
        self._helper: tuple[int, int] | None = None
        if self.path.is_dir():
            raise OutputError(f"{option} {self.path}: is a directory; name a file")
        self._tmp: str | None = None
        try:
            fd, self._tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
            os.fchmod(fd, 0o644)
        except OSError as exc:
            # A file the caller may write in a directory it may not (created for it by
            # someone else): written in place at the end, the one case that is not atomic.
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
            except OSError:
                raise OutputError(f"{option} {self.path}: cannot write there ({exc.strerror}); "
                                  f"name a file in a directory you can write") from None
        self._f: IO[Any] = os.fdopen(fd, "wb" if binary else "w")

    def __enter__(self) -> Output:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abandon()  # a no-op once committed

    def keep_rights(self) -> None:
        """Call before dropping privileges: a forked helper keeps the caller's rights to put
        the finished file in place, since the user the process drops to may not write the
        destination's directory. It does nothing else and ends with the write (or the
        process: a killed run leaves no half-written result)."""
        if self._tmp is None:
            return  # written in place through the descriptor opened now
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the helper
            try:
                os.close(w)
                go = os.read(r, 1)  # blocks until the result is complete (b"1"), or abandoned
                if go == b"1":
                    os.replace(self._tmp, self.path)
                else:
                    os.unlink(self._tmp)
                os._exit(0)
            except BaseException:  # noqa: BLE001 - a helper only reports through its status
                os._exit(1)
        os.close(r)
        self._helper = (pid, w)

    def stream(self) -> IO[Any]:
        """The staged file, to write the result to in parts; then commit()."""
        if self._tmp is None:
            self._f.truncate(0)
        return self._f

    def write(self, data: str | bytes) -> None:
        """Write the whole result and put it in place."""
        try:
            self.stream().write(data)
        except OSError as exc:
            self.abandon()
            raise OutputError(f"{self.option} {self.path}: writing failed ({exc.strerror})") from None
        self.commit()

    def commit(self) -> None:
        try:
            self._f.close()
        except OSError as exc:
            self.abandon()
            raise OutputError(f"{self.option} {self.path}: writing failed ({exc.strerror})") from None
        if self._finish(b"1") != 0:
            raise OutputError(f"{self.option} {self.path}: cannot put the result in place")

    def abandon(self) -> None:
        """Drop the staged file; the destination stays as it was."""
        if not self._f.closed:
            try:
                self._f.close()
            except OSError:
                pass
        self._finish(b"0")

    def _finish(self, go: bytes) -> int:
        if self._tmp is None:
            return 0
        if self._helper is None:
            if not os.path.exists(self._tmp):
                return 0
            try:
                os.replace(self._tmp, self.path) if go == b"1" else os.unlink(self._tmp)
                return 0
            except OSError:
                return 1
        pid, w = self._helper
        self._helper = None
        try:
            os.write(w, go)
        finally:
            os.close(w)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
