"""A run whose `kooi run` died (kill -9, the OOM killer) has its check finished by whoever
next holds its project: the next run on the project (or on a directory inside or around
it), or the hourly `kooi gc`.

While a workload runs, the guard's state (run.guard: the snapshot, the throwaway git
directories, kooi's mount points) is kept in RUN_DIR/guards/, one record per project,
written before the workload starts and removed once the run's own check has run. A
record whose project lock no live process holds is a dead run's. Its workload may live
on: a container runs to its deadline (kooi's init), and what the workload started
through its broker longer. So the finisher, holding the project's lock, first removes
every container of the dead run, then runs the dead run's check from the record (what
the workload left is put back and listed, as the run's own check would have done), and
writes the dead run's result (reason `interrupted`). Before, the next run's snapshot took
whatever the dead run's workload had left (a `.envrc`, a pager in `.git/config`) for the
project's own, and put it back after every later run.

A record kooi cannot finish (the engine does not answer, so the dead run's containers
may still write; a path the check cannot put back) refuses every run on the project,
saying which record, until it is finished."""

from __future__ import annotations

import fcntl
import json
import os
import stat
from pathlib import Path
from typing import Any

from .. import labels
from ..hoststate.engine import EngineConfig
from .errors import Log, Result, RunError, now, refused, unavailable
from .guard import Guard, GuardError
from .project import RunLock

SUBDIR = "guards"
DEAD = ("finished the project check of run ", "would finish the project check of run ", "run ")
VERSION = 1


def record_path(run_dir: Path, project: Path) -> Path:
    return run_dir / SUBDIR / (labels.lock_key(str(project)).removesuffix(".lock") + ".json")


def keep(run_dir: Path, guard: Guard, res: Result) -> Path:
    """Write the running run's record (atomically; the runner's own directory, out of
    every workload's reach)."""
    path = record_path(run_dir, guard.root)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if os.path.lexists(path):
        # finish_held finished every dead run's record before this run's snapshot; one
        # here now is a run kooi does not know about: its check must not be lost.
        raise refused(f"{path}, another run's record, appeared while run {res.run_id} held the project's lock; "
                      "run `kooi gc`, then retry")
    doc = {"version": VERSION, "run_id": res.run_id, "workflow": res.workflow, "mode": res.mode,
           "isolation": res.isolation, "project": str(guard.root), "start": res.start, "log": res.log,
           "pid": os.getpid(), "guard": guard.dump()}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def drop(path: Path | None) -> None:
    if path is not None:
        path.unlink(missing_ok=True)


def _records(run_dir: Path) -> list[tuple[Path, dict[str, Any] | None]]:
    d = run_dir / SUBDIR
    out: list[tuple[Path, dict[str, Any] | None]] = []
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith(".json") and not n.startswith("."))
    except FileNotFoundError:
        return []
    for n in names:
        try:
            fd = os.open(d / n, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as f:
                doc = json.load(f)
            out.append((d / n, doc if isinstance(doc, dict) and doc.get("version") == VERSION else None))
        except (OSError, ValueError):
            out.append((d / n, None))
    return out


def _related(a: str, b: str) -> bool:
    """A is B, or one is inside the other, by the identity RunLock locks them by (a
    directory's device and inode, so a second path to it, a bind mount, is the same):
    exactly the records whose run the lock of either keeps out."""
    def up(p: str) -> set[str]:
        return {labels.lock_key(p), *(labels.lock_key(str(q)) for q in Path(p).parents)}

    return labels.lock_key(a) in up(b) or labels.lock_key(b) in up(a)


def finish_held(run_dir: Path, project: Path, cfg: EngineConfig, log: Log, res: Result) -> None:
    """Once a run on PROJECT holds its lock (RunLock: PROJECT's exclusively, each directory
    above it shared), no live run works on PROJECT or on a directory inside or around it:
    every record of such a run is a dead run's. Finish each before this run's snapshot,
    which would otherwise take what their workloads left for the project's own. The
    records are read now, not before waiting for the lock: a run that took the lock first
    may have written its record, and died, while this one waited."""
    for path, doc in _records(run_dir):
        if doc is None:
            if path == record_path(run_dir, project):
                raise refused(f"{path} is a dead run's record kooi cannot read: check {project} for what its "
                              "workload left (`.git/config`, hooks, `.envrc`), then remove the record")
            continue
        if not _related(str(doc.get("project", "")), str(project)) and path != record_path(run_dir, project):
            continue
        said = finish(path, doc, cfg, log, f"run {res.run_id}")
        if said:
            res.warn(log, said)


def finish_all(run_dir: Path, cfg: EngineConfig, dry_run: bool = False) -> list[str]:
    """`kooi gc`: finish every dead run whose project no live run holds."""
    out = []
    log = Log(None, None)
    for path, doc in _records(run_dir):
        if doc is None:
            out.append(f"warning: {path} is a dead run's record kooi cannot read: check its project, then remove it")
            continue
        lock = RunLock(run_dir, "", Path(doc["project"]))
        try:
            lock.acquire(0)
        except RunError:
            continue  # a live run's record, or another finisher's
        try:
            if not path.exists():
                continue
            if dry_run:
                out.append(f"would finish the project check of run {doc['run_id']} on {doc['project']}, whose "
                           "kooi run died")
                continue
            said = finish(path, doc, cfg, log, "kooi gc")
            if said:
                out.append(said)
        except RunError as exc:
            out.append(f"warning: {exc}")
        finally:
            lock.release()
    return out


def finish(path: Path, doc: dict[str, Any], cfg: EngineConfig, log: Log, by: str) -> str | None:
    """Finish the dead run DOC (its record at PATH), holding a lock that keeps every live
    run off its project: its containers removed, its check run, its result written, the
    record removed. What it did, in one line (None: another finisher was first); RunError
    when it cannot be finished. Two runs on sibling projects may both hold the directory
    around them (shared) and find the same dead record there: the record's own flock
    makes one of them the finisher, and the other finds it gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_nlink == 0:
            return None  # finished while this one waited
        try:
            with os.fdopen(os.dup(fd)) as f:
                fresh = json.load(f)
            if isinstance(fresh, dict) and fresh.get("version") == VERSION:
                doc = fresh
        except (OSError, ValueError):
            pass
        return _finish(path, doc, cfg, log, by)
    finally:
        os.close(fd)


def _finish(path: Path, doc: dict[str, Any], cfg: EngineConfig, log: Log, by: str) -> str:
    run_id, project = str(doc["run_id"]), Path(doc["project"])
    gone = _remove_containers(cfg, run_id) if doc.get("mode") != "jail" else []
    try:
        guard = Guard.load(doc["guard"])
    except GuardError as exc:
        raise refused(f"{path}, the record of run {run_id} whose kooi run died, is unreadable ({exc}): check "
                      f"{project} for what its workload left, then remove the record") from None
    if guard.root != project:
        raise refused(f"{path}: run {run_id}'s record names {guard.root}, not {project}; remove the record")
    try:
        st = os.lstat(project)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise refused(f"{path}: run {run_id}, whose kooi run died, worked on {project}, which is now not a "
                      "directory (a link?): check what it points to for what the workload left, then remove "
                      "the record")
    if st is None:
        drop(path)
        return f"run {run_id}, whose kooi run died, worked on {project}, which is gone: nothing to check"
    record = guard.check()
    res = Result(workflow=str(doc.get("workflow", "")), run_id=run_id, project=str(project),
                 mode=str(doc.get("mode", "")), isolation=str(doc.get("isolation", "")),
                 start=str(doc.get("start", "")), log=str(doc.get("log", "")))
    res.end, res.exit_code, res.reason = now(), 137, "interrupted"
    res.message = (f"kooi run died during the run without a result (SIGKILL: the OOM killer or an operator); "
                   f"{by} removed its {len(gone)} container(s) and finished its project check at {res.end}")
    res.project_guard = record
    res.cleanup = {"containers": gone, "failed": []}
    from .backend import refusals

    res.refused = refusals(res)
    n = len(record["refused"])
    said = (f"finished the project check of run {run_id}, whose kooi run died: "
            + (f"removed its container(s) {', '.join(gone)}; " if gone else "")
            + (f"{n} change(s) to protected paths refused ("
               + ", ".join(r["path"] for r in record["refused"][:8]) + ("…" if n > 8 else "") + ")"
               if n else "its workload changed no protected path"))
    _write_result(path.parent.parent / "results" / f"{run_id}.json", res)
    _append_log(Path(res.log) if res.log else None, said)
    if not record["restored"]:
        raise refused(f"{said}; but kooi could not put back {'; '.join(record['restore_failed'])}: do not use "
                      f"{project} on the host (no git command, no editor) before removing them, then remove {path}")
    drop(path)
    return said + (", put back" if n else "")


def _remove_containers(cfg: EngineConfig, run_id: str) -> list[str]:
    """Every container of the run (its workload's, and what it started through its
    broker): removed, so nothing of it writes the project while its check runs."""
    from .. import engineapi

    why = f"run {run_id}'s kooi run died and its containers may still write its project; its check waits for them"
    try:
        client = engineapi.connect(cfg)
    except engineapi.EngineError as exc:
        raise unavailable(f"{why}: {exc}") from None
    flt = json.dumps({"label": [f"{labels.RUN}={run_id}"]})
    try:
        left = client.request("GET", "/containers/json", query={"all": "1", "filters": flt}) or []
        gone = []
        for c in left:
            try:
                client.remove(c["Id"])
            except engineapi.NotFound:
                continue
            gone.append((c.get("Names") or ["?"])[0].lstrip("/"))
        if client.request("GET", "/containers/json", query={"all": "1", "filters": flt}):
            raise unavailable(f"{why}: the engine still lists some after removing them")
        return gone
    except (engineapi.APIError, OSError) as exc:
        raise unavailable(f"{why}: {exc}") from None


def _write_result(path: Path, res: Result) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
    except FileExistsError:
        return  # kooi run wrote one after all
    except OSError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(res.as_dict(), indent=2) + "\n")


def _append_log(path: Path | None, said: str) -> None:
    if path is None:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    except OSError:
        return
    with os.fdopen(fd, "a") as f:
        f.write(f"kooi: {said}\n")
