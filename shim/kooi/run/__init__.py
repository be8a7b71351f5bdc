"""`kooi run WORKFLOW`: run a workflow on a provisioned host, honestly, for cron and CI.

    execute.py   the orchestration: caller, host state, privilege drop, project, lock
    context.py   RunContext: the workflow and the host state, built once per run
    backend.py   the Backend interface and the one supervise loop (signals, deadline)
    container.py the container backend (the runner's engine); brokered.py its policed
                 engine for testcontainers workloads
    jail.py      the jail backend (bubblewrap on the host); jailscope.py its systemd
                 user scope where the runner's user manager has cgroup controllers
    limits.py    every run's limits and how each backend bounds them
    identity.py  who may run, what the runner can read, the drop to the runner
    project.py   project checks, workspace ACLs, the run lock
    filters.py   kooi's seccomp filter as each backend installs it
    errors.py    exit codes, RunError, Result, Log
    leftovers.py `kooi run gc`: what ended runs left behind
    releases.py  the injector releases a run owes until they are done (next run, gc)
    deadrun.py   a run whose kooi run died: its record, and its check finished by the next
                 holder of its project (a run, `kooi gc`)
    guard.py     the project guard: protected paths kept, throwaway git directories,
                 put back; its parts protected.py, snapshot.py, fsat.py, gitdata.py,
                 shadows.py, forgery.py

Exit codes: the workload's own, or one of the EXIT_* codes; the JSON result's `reason`
tells which.
"""

from __future__ import annotations

from pathlib import Path

from .errors import EXIT_BUSY, EXIT_ERROR, EXIT_INVALID, EXIT_REFUSED, EXIT_TIMEOUT, EXIT_UNAVAILABLE, Result, RunError
from .execute import RUN_DIR, execute, isolation_of
from .identity import unreadable_by
from .project import host_uid_of, subid_start

__all__ = ["EXIT_BUSY", "EXIT_ERROR", "EXIT_INVALID", "EXIT_REFUSED", "EXIT_TIMEOUT", "EXIT_UNAVAILABLE",
           "RUN_DIR", "Result", "RunError", "execute", "gc", "host_uid_of", "isolation_of", "subid_start",
           "unreadable_by"]


def gc(run_dir: Path | None = None, engine_config: Path | None = None, dry_run: bool = False,
       keep_days: float = 14.0) -> list[str]:
    from . import leftovers  # not on the run path

    return leftovers.gc(run_dir or RUN_DIR, engine_config, dry_run, keep_days)
