"""One interface for the ways kooi runs a workload, and the one loop that supervises it.

A backend prepares everything the workload needs (refusing what it cannot confine),
starts it, reports its exit when asked, kills it, and cleans up after it whatever
happened. `supervise` owns the signals and the deadline for every backend: a workload
killed for a signal or its timeout is killed the same way whichever backend ran it.
Backends: container.ContainerBackend (the runner's engine; runtimes such as gVisor are
its options) and jail.JailBackend (bubblewrap on the host).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

from . import deadrun
from .context import RunContext
from .errors import EXIT_TIMEOUT, MAX_OUTPUT, Interrupted, Result, RunError, refused
from .guard import Guard, GuardError


class Backend(Protocol):
    # How long one wait() may block: how quickly a signal is acted on.
    poll_interval: float

    def prepare(self, ctx: RunContext) -> None:
        """Everything before the workload starts; raises RunError to refuse."""

    def start(self) -> None:
        """Start the workload and the pump of its output into the run's log."""

    def wait(self, timeout: float) -> int | None:
        """The workload's exit code once it has ended (its output drained), else None
        after at most TIMEOUT seconds."""

    def kill(self) -> None:
        """Kill the workload and everything it started; returns once it is gone."""

    def cleanup(self) -> None:
        """Remove what prepare() and the workload left; called whatever happened."""


def supervise(backend: Backend, ctx: RunContext) -> int:
    """Run the prepared BACKEND to its end: its exit code, or Interrupted (a signal to
    kooi run) or RunError timeout, with the workload killed."""
    backend.start()
    if ctx.session and ctx.session.started:
        ctx.session.started(ctx)
    deadline = time.monotonic() + ctx.wf.timeout
    while True:
        sig = ctx.interrupted()
        if sig:
            backend.kill()
            raise Interrupted(sig)
        left = deadline - time.monotonic()
        if left <= 0:
            backend.kill()
            raise RunError("timeout", EXIT_TIMEOUT,
                           f"the {'session' if ctx.session else 'workload'} ran past its timeout of "
                           f"{ctx.wf.timeout} s and was killed")
        rc = backend.wait(min(backend.poll_interval, max(0.01, left)))
        if rc is not None:
            return rc


def run(backend: Backend, ctx: RunContext) -> int:
    """Prepare, supervise and clean up after BACKEND. The project's protected paths are
    taken before anything runs and checked (and put back) after everything the
    workload started has ended; a run that leaves one kooi cannot put back is refused
    (exit 126), whatever the workload's own exit code."""
    guard = Guard(ctx.project, ctx.wf.unprotected_paths, run_id=ctx.run_id)
    try:
        guard.snapshot()
    except (GuardError, OSError) as exc:
        raise refused(f"project: {exc}") from None
    ctx.guard = guard
    kept: Path | None = None
    try:
        backend.prepare(ctx)
        guard.snapshot_watched()
        # Before the workload starts: should kooi run die, whoever next holds the
        # project finishes this run's check from it (run.deadrun).
        kept = deadrun.keep(ctx.run_dir, guard, ctx.res)
        rc = supervise(backend, ctx)
    finally:
        if _finish(backend, ctx, guard):
            # The record stays, with the check's outcome, until the run's result is
            # written (run.execute drops it): kooi run killed in between leaves its
            # finisher the result to write, never a check to do again.
            deadrun.checked(kept, ctx.res)
            ctx.record = kept
    record = ctx.res.project_guard or {}
    if not record.get("restored", True):
        raise refused("the workload left protected project paths kooi could not put back ("
                      + "; ".join(record.get("restore_failed", [])) + f"); the workload itself exited {rc}. Do "
                      "not use this project on the host (no git command, no editor) before removing them")
    return rc


def _finish(backend: Backend, ctx: RunContext, guard: Guard) -> bool:
    """Each step on its own: one failing never skips the project check. False when the
    check could not run (its record stays for whoever next holds the project)."""
    cleanup_failed = ""
    try:
        backend.cleanup()
    except Exception as exc:  # noqa: BLE001 - reported; the project check must still run
        cleanup_failed = f"cleanup failed ({exc.__class__.__name__}: {exc})"
        ctx.res.warn(ctx.log, cleanup_failed)
    try:
        ctx.release_run_port()
    except Exception as exc:  # noqa: BLE001 - the record is only lost, the run is not
        ctx.res.warn(ctx.log, f"egress: could not read the proxy's record of this run ({exc})")
    if ctx.log.dropped:
        ctx.res.warn(ctx.log, f"output: the workload's output past {MAX_OUTPUT >> 20} MiB was dropped "
                              f"({ctx.log.dropped} bytes): the log is bounded")
    try:
        ctx.res.project_guard = record = guard.check()
    except GuardError as exc:
        ctx.res.project_guard = {"protected": list(guard.paths), "refused": [], "restored": False,
                                 "restore_failed": [f"the project check did not run: {exc}"], "watched_changed": []}
        return False
    left = (ctx.res.cleanup or {}).get("failed") or []
    late: list[str] = getattr(backend, "leftovers", list)()
    if late:
        # Made after the cleanup's listings: what it wrote after the check is unchecked.
        left = [*left, *late]
        ctx.res.cleanup = {**(ctx.res.cleanup or {}), "failed": left}
    if cleanup_failed or left:
        # Something the run started may still hold the project: the check proves nothing.
        record["restored"] = False
        record["restore_failed"].append(cleanup_failed or f"containers of the run are left ({', '.join(left)})")
    for r in record["refused"]:
        ctx.log.note(f"project: refused a change to protected {r['path']} ({r['change']}); "
                     + _done(r, record))
    if record.get("warning"):
        ctx.res.warn(ctx.log, f"project: {record['warning']}")
    if record["watched_changed"]:
        ctx.log.note("project: changed " + ", ".join(f"{c['path']} ({c['change']})"
                                                    for c in record["watched_changed"]))
    if record.get("exposed"):
        ctx.log.note("project: what the host runs from here later also runs what the workload changed, and kooi "
                     "keeps no copy of it: " + "; ".join(f"{e['path']} ({e['why']})" for e in record["exposed"])
                     + "; look at the changes before that runs (`git commit --no-verify` skips the hooks)")
    return True


def refusals(res: Result) -> list[dict[str, Any]]:
    """One record of what the cage refused this run: the broker's (engine requests),
    the proxy's (egress), the injector's (secrets) and the project guard's."""
    out: list[dict[str, Any]] = []
    for r in (res.broker or {}).get("refusals", []):
        out.append({"by": "broker", "what": r})
    for r in (res.egress or {}).get("refused", []):
        times = f", {r['count']} times" if r.get("count", 1) > 1 else ""
        out.append({"by": "egress", "what": f"{r['method']} {r['host']} ({r['status']}{times})", "time": r["time"]})
    if (egress := res.egress or {}).get("refused_omitted"):
        out.append({"by": "egress", "what": egress["refused_omitted_note"]})
    for r in (res.secrets or {}).get("refused", []):
        out.append({"by": "secrets", "what": f"{r['method']} {r['path']} ({r['status']}: {r.get('reason', '')})"})
    guard = res.project_guard or {}
    for r in guard.get("refused", []):
        out.append({"by": "project", "what": f"{r['path']} ({r['change']}; {_done(r, guard)})"})
    return out


def _done(refusal: dict[str, Any], record: dict[str, Any]) -> str:
    if refusal.get("how") == "shadowed":
        return "made in a throwaway copy, never in the project"
    done = "put back" if record.get("restored") else "NOT put back: see project_guard.restore_failed"
    return done + (f"; the workload's version is kept in {refusal['kept']}" if refusal.get("kept") else "")
