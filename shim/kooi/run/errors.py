"""What a run ends with: the exit codes, the errors that carry them, the result and the log."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from ..neutral import neutral

EXIT_INVALID = 2        # bad command line or workflow: nothing ran
EXIT_BUSY = 75          # the same workflow is running on the same project
EXIT_TIMEOUT = 124      # the workload ran past its timeout and was killed
EXIT_UNAVAILABLE = 125  # engine or pinned image unavailable
EXIT_REFUSED = 126      # a policy refused the run (isolation level, ownership, root)
EXIT_ERROR = 70         # kooi itself failed


class RunError(Exception):
    """The run cannot go on: REASON (the result's `reason`) and exit CODE."""

    def __init__(self, reason: str, code: int, message: str):
        super().__init__(message)
        self.reason = reason
        self.code = code


def unavailable(message: str) -> RunError:
    return RunError("unavailable", EXIT_UNAVAILABLE, message)


def refused(message: str) -> RunError:
    return RunError("refused", EXIT_REFUSED, message)


class Interrupted(Exception):
    """kooi run got SIGNUM; the workload was killed."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


@dataclass
class Result:
    workflow: str
    run_id: str
    project: str
    mode: str = ""
    isolation: str = ""
    workflow_file: str = ""
    image: str | None = None
    image_digest: str | None = None
    start: str = ""
    end: str = ""
    duration_s: float = 0.0
    exit_code: int = EXIT_ERROR
    reason: str = "error"
    message: str = ""
    log: str = ""
    limits: dict[str, Any] = field(default_factory=dict)
    limit: str | None = None  # the limit the workload reached, where the engine or its cgroup says so
    warnings: list[str] = field(default_factory=list)
    broker: dict[str, Any] | None = None
    cleanup: dict[str, Any] | None = None
    egress: dict[str, Any] | None = None
    apparmor: dict[str, Any] | None = None
    seccomp: dict[str, Any] | None = None
    gvisor: dict[str, Any] | None = None  # isolation gvisor: the runtime and how runsc runs
    secrets: dict[str, Any] | None = None
    project_guard: dict[str, Any] | None = None
    refused: list[dict[str, Any]] = field(default_factory=list)
    session: dict[str, Any] | None = None  # a session's (run.session)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def warn(self, log: Log, message: str) -> None:
        self.warnings.append(message)
        log.note(f"warning: {message}")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


# The workload's output kooi keeps (log file and echo) per run; past it, output is
# counted and dropped, and the result says how much (a workload flooding the log).
MAX_OUTPUT = 64 << 20


class Log:
    """Workload output to stdout and the run's log file, line-buffered."""

    def __init__(self, path: Path | None, echo: TextIO | None):
        self.path = path
        self.f = path.open("a", buffering=1) if path else None
        self.echo = echo
        self.lock = threading.Lock()
        self.output_bytes = 0  # the workload's, kept
        self.dropped = 0       # the workload's, past MAX_OUTPUT
        self.line_open = False  # the last text written ended inside a line

    def output(self, text: str) -> None:
        """The workload's output: neutralised, and only up to MAX_OUTPUT bytes."""
        n = len(text.encode("utf-8", "replace"))
        with self.lock:
            if self.output_bytes + n > MAX_OUTPUT:
                self.dropped += n
                return
            self.output_bytes += n
        self.write(neutral(text))

    def write(self, text: str) -> None:
        # A name the workload made that is not UTF-8 reaches kooi's lines as lone
        # surrogates, which no UTF-8 stream can encode: shown escaped, never a crash
        # (eighth review: the crash left a record that crashed every later run).
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        with self.lock:
            if text:
                self.line_open = not text.endswith("\n")
            if self.f:
                self.f.write(text)
            if self.echo:
                try:
                    self.echo.write(text)
                    self.echo.flush()
                except (OSError, ValueError):
                    self.echo = None  # the caller stopped reading; the log file keeps it all

    def note(self, text: str) -> None:
        """One line of kooi's own, always at the start of a line: after a workload's last
        line without a newline, kooi's verdict was glued onto it, and a reader of
        `^kooi: ` lines saw only a line the workload had printed. One line, its control
        characters made visible: it names paths and hosts the workload chose (review 12:
        a directory's name forged `kooi: ok:` lines and cleared root's screen)."""
        line = neutral(text).replace("\n", "\\n").replace("\t", "\\t")
        self.write(f"{chr(10) if self.line_open else ''}kooi: {line}\n")

    def close(self) -> None:
        if self.f:
            self.f.close()
