"""`kooi run WORKFLOW`: the orchestration. Checks the caller and the result path, loads
the host state and the workflow once, (as root) starts egress where no service manager
does, drops to the runner, checks and locks the project, and hands a RunContext to the
workflow's backend. Always returns a Result; the JSON result and the log say what
happened, and the exit code is the workload's own or one of errors.EXIT_*."""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from .. import apparmor, outputs, workflow
from ..hoststate import HostStateError, paths
from ..hoststate import engine as engine_state
from ..hoststate import limits as limits_state
from ..hoststate import secrets as secrets_state
from ..hoststate.engine import EngineConfig
from . import backend, deadrun, releases
from .context import RunContext, SessionRun, load_host_state
from .errors import EXIT_ERROR, EXIT_INVALID, Interrupted, Log, Result, RunError, now, refused, unavailable
from .identity import check_identity, check_runner_can_import, drop_to_runner
from .project import RunLock, check_project, share_with_group

RUN_DIR = Path(os.environ.get("KOOI_RUN_DIR", paths.RUNS))


def isolation_of(mode: str, cfg: EngineConfig, wanted: str | None = None) -> str:
    """The level a run of a MODE workflow gets on this host. gVisor is per workflow: a
    container workflow that asks for it (min_isolation: gvisor) runs under runsc where
    the engine has it (roles/gvisor); every other run keeps the engine's runc."""
    if mode == "jail":
        return "jail"
    if wanted == "gvisor" and cfg.gvisor is not None:
        return "gvisor"
    return cfg.mode


def why_below(name: str, wanted: str, got: str, mode: str, cfg: EngineConfig) -> str:
    """Why a run of workflow NAME gets GOT, below the WANTED level, and what provides it."""
    msg = f"workflow {name} requires isolation {wanted} or stronger; this run would get {got} " \
          f"({mode} mode on a {cfg.mode} host)"
    if wanted != "gvisor":
        return msg
    if mode == "jail":
        return msg + "; a jail shares the host's kernel and never provides gvisor: use mode: container"
    if cfg.mode == "rootless":
        return msg + ("; a rootless engine cannot run gVisor's runsc (google/gvisor#12575): gvisor needs "
                      "kooi_engine_mode: userns_remap with kooi_gvisor_enabled: true (re-run site.yml)")
    return msg + "; this host's engine has no gVisor runtime: set kooi_gvisor_enabled: true and re-run site.yml"


def _session_end(res: Result) -> None:
    """How a session ended, in its record and its result's message."""
    assert res.session is not None
    end = res.session["end"]
    if end == "running":
        end = {"ok": "ended", "failed": "ended", "timeout": "lifetime", "interrupted": "interrupted"}.get(
            res.reason, "failed")
    res.session["end"] = end
    if res.reason not in ("ok", "failed"):
        return
    if end in ("stopped", "idle"):
        res.reason, res.exit_code = "ok", 0  # what the session's processes exited with, killed, is no verdict
        res.message = "the session ended " + ("by kooi session stop" if end == "stopped" else
                                              f"after {res.session['idle_timeout']} s idle")
    elif end == "ended":
        res.message = f"the session ended: its terminal server exited with {res.exit_code}"


def new_backend(mode: str) -> backend.Backend:
    if mode == "container":
        from .container import ContainerBackend

        return ContainerBackend()
    from .jail import JailBackend

    return JailBackend()


def execute(name: str, project: Path, json_path: Path | None = None, wait: float = 0.0,
            echo: TextIO | None = sys.stdout, run_dir: Path | None = None,
            workflow_dir: Path | None = None, engine_config: Path | None = None,
            session: SessionRun | None = None) -> Result:
    """Run workflow NAME on PROJECT; always returns a Result (never raises for run failures).
    SESSION: run a session workflow as a session (run.session), to its end."""
    run_dir = run_dir or RUN_DIR
    run_id = f"{name if workflow.NAME_RE.match(name) else 'invalid'}-" \
             f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(3)}"
    res = Result(workflow=name, run_id=run_id, project=str(project), start=now())
    t0 = time.monotonic()
    out: outputs.Output | None = None
    if json_path:
        # Before anything runs, and as the caller (not the runner it drops to).
        try:
            out = outputs.Output(json_path, "--json")
        except outputs.OutputError as exc:
            res.reason, res.exit_code, res.message = "invalid", EXIT_INVALID, str(exc)
            res.end = res.start
            return res
    log = Log(None, echo)
    lock: RunLock | None = None
    ctx: RunContext | None = None
    got_signal: list[int] = []
    old_handlers: dict[signal.Signals, Any] = {}

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        got_signal.append(signum)

    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            old_handlers[s] = signal.signal(s, on_signal)
    try:
        try:
            cfg = engine_state.load(engine_config or engine_state.PATH)
        except HostStateError as exc:
            raise unavailable(str(exc)) from None
        check_identity(cfg)
        check_runner_can_import(cfg)
        wf = workflow.load(name, workflow_dir or workflow.WORKFLOW_DIR)
        res.mode, res.workflow_file = wf.mode, str(wf.path)
        if wf.session is not None and session is None:
            raise workflow.WorkflowError(f"{wf.path}: a session workflow; start it with `kooi session start {name}`")
        if wf.session is None and session is not None:
            raise workflow.WorkflowError(f"{wf.path}: not a session workflow (no key 'session'); run it with "
                                         f"`kooi run {name}`")
        if wf.session is not None and session is not None:
            res.session = {"person": session.person, "workflow": wf.name, "home": session.home,
                           "idle_timeout": wf.session.idle_timeout, "lifetime": wf.timeout, "end": "running"}
        res.isolation = isolation_of(wf.mode, cfg, wf.min_isolation)
        if wf.min_isolation and workflow.isolation_rank(res.isolation) < workflow.isolation_rank(wf.min_isolation):
            raise refused(why_below(name, wf.min_isolation, res.isolation, wf.mode, cfg))
        eg, aa, sc = load_host_state(cfg, wf)
        try:
            host_limits = limits_state.load()
        except HostStateError as exc:
            raise unavailable(str(exc)) from None
        lim, lim_origin, lim_errors = limits_state.resolve(wf.limits.named(), host_limits,
                                                           f"{wf.path}: key 'limits'")
        if lim_errors:
            raise workflow.WorkflowError("\n".join(lim_errors))
        secret_errors = workflow.secret_errors_of(wf, sc)
        if secret_errors:
            raise workflow.WorkflowError("\n".join(secret_errors))
        if sc is not None and session is not None:
            for n in wf.secrets:
                try:
                    secrets_state.value_key(sc.secrets[n], session.person)
                except HostStateError as exc:
                    raise refused(str(exc)) from None
        if os.geteuid() == 0 and sc is not None and any(sc.secrets[n].mode == "inject" for n in wf.secrets):
            from .. import inject

            try:
                inject.start(sc)  # where no service manager does
            except inject.InjectError as exc:
                raise unavailable(f"secrets: {exc}") from None
        if os.geteuid() == 0 and eg is not None:
            # Root (cron, a pipeline): re-apply the rules and start the proxy where no
            # service manager does (hosts without systemd, after a reboot).
            from .. import egress

            try:
                egress.start(eg)
            except egress.EgressError as exc:
                raise unavailable(f"egress: {exc}") from None
        if os.geteuid() == 0:
            apparmor.remember_loaded()  # the kernel's profile list is root-only
            if out and cfg.runner_uid != 0:
                out.keep_rights()  # the runner may not write where the caller asked for the result
        drop_to_runner(cfg)
        project = check_project(project, cfg, RUN_DIR)
        res.project = str(project)
        for sub in ("logs", "results", "locks", "shadows", deadrun.SUBDIR):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        log.close()
        log = Log(run_dir / "logs" / f"{run_id}.log", echo)
        res.log = str(log.path)
        if sc is not None and sc.injected:
            for line in releases.settle(run_dir, sc):  # ended runs' placeholders still live
                log.note(f"secrets: {'released the ' if line.startswith('placeholders') else ''}{line}")
        lock = RunLock(run_dir, wf.name, project)
        lock.acquire(wait)
        # What a run whose kooi run died left in this project is checked first, never
        # taken into this run's snapshot.
        deadrun.finish_held(run_dir, project, cfg, log, res)
        if res.isolation == "gvisor":
            assert cfg.gvisor is not None
            if not cfg.gvisor.group:
                raise unavailable("engine.json names no group for gVisor's workloads; re-run site.yml (role gvisor)")
            # Before the project guard's snapshot: the setgid bits it sets are mode bits.
            share_with_group(project, cfg.gvisor.group, cfg.runner_user, log)
        log.note(f"run {run_id}: workflow {wf.name} ({wf.mode}, isolation {res.isolation}) on {project}")
        ctx = RunContext(wf, cfg, project, run_id, run_dir, res, log,
                         interrupted=lambda: got_signal[0] if got_signal else None, egress=eg, apparmor=aa,
                         secrets=sc, limits=lim, limit_origin=lim_origin, session=session)
        res.exit_code = backend.run(new_backend(wf.mode), ctx)
        res.reason = "ok" if res.exit_code == 0 else "failed"
        res.message = "the workload succeeded" if res.exit_code == 0 else \
            f"the workload exited with {res.exit_code}"
    except workflow.WorkflowError as exc:
        res.reason, res.exit_code, res.message = "invalid", EXIT_INVALID, str(exc)
    except RunError as exc:
        res.reason, res.exit_code, res.message = exc.reason, exc.code, str(exc)
    except Interrupted as exc:
        res.reason, res.exit_code = "interrupted", 128 + exc.signum
        res.message = f"kooi run got signal {exc.signum}; the workload was killed"
    except Exception as exc:  # noqa: BLE001 - report, never hide, an internal failure
        res.reason, res.exit_code = "error", EXIT_ERROR
        res.message = f"kooi run failed: {exc.__class__.__name__}: {exc}"
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
        res.refused = backend.refusals(res)
        if res.session is not None:
            _session_end(res)
        if res.limit:
            res.message += f" (it reached its {res.limit} limit)"
        res.end = now()
        res.duration_s = round(time.monotonic() - t0, 3)
        log.note(f"{res.reason}: {res.message} (exit {res.exit_code}, {res.duration_s} s)")
        log.close()
        doc = json.dumps(res.as_dict(), indent=2) + "\n"
        written = False
        if res.log:
            try:
                deadrun.write_result(run_dir / "results" / f"{run_id}.json", doc)
                written = True
            except OSError as exc:
                print(f"kooi run: cannot write the result to {run_dir / 'results'} ({exc.strerror or exc}); "
                      "the run's record stays for `kooi gc` or the next run on the project", file=sys.stderr)
        if ctx is not None and written:
            deadrun.drop(ctx.record)  # after the result: run.deadrun
        if lock:
            lock.release()  # after the record: whoever takes the project next finds no dead run of this one
        if out:
            try:
                out.write(doc)
            except outputs.OutputError as exc:
                print(f"kooi run: {exc}", file=sys.stderr)
    return res
