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

The record names the project by what stays when its path does not (run.dirid): its
device, inode and birth time, and the run lock's names. A run finishes the records
related to its own lock's names, wherever the dead run's project is now (moved here, or
a bind mount of a directory inside this project); `kooi gc` finishes a record whose
project is where it was. The record follows the check (its phase and how far it got):
a check killed half-way is taken up where it was, and a run killed after its check has
its result written from the record. A record is removed only once its run's result is
written.

A record kooi cannot finish (the engine does not answer, so the dead run's containers
may still write; a path the check cannot put back; a project no longer where it was,
around or inside the one a run is for) refuses every run on the project, saying which
record, until it is finished."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

from .. import labels
from ..hoststate.engine import EngineConfig
from . import dirid
from .errors import Log, Result, RunError, now, refused, unavailable
from .guard import Guard, GuardError
from .project import RunLock, lock_names

SUBDIR = "guards"
DEAD = ("finished the project check of run ", "would finish the project check of run ", "run ")
VERSION = 1
# Directories a run looks through for a dead run's project moved into its own.
MAX_SEARCH = 200_000


def record_path(run_dir: Path, project: Path) -> Path:
    return run_dir / SUBDIR / (labels.lock_key(str(project)).removesuffix(".lock") + ".json")


def _save(path: Path, doc: dict[str, Any]) -> None:
    """DOC at PATH, whole or not at all (a kill half-way leaves the last one)."""
    write_result(path, json.dumps(doc), mode=0o600)


def _follow(path: Path, doc: dict[str, Any], guard: Guard) -> None:
    """From now on the record at PATH follows GUARD's check: its phase, how far it got,
    its outcome."""
    def progress(phase: str, record: dict[str, Any] | None) -> None:
        doc["phase"] = phase
        doc["guard"] = guard.dump()
        if record is not None:
            doc["outcome"] = record
        _save(path, doc)
    guard.on_progress = progress


def keep(run_dir: Path, guard: Guard, res: Result) -> Path:
    """Write the running run's record (atomically; the runner's own directory, out of
    every workload's reach); it follows the run's check until the run's result is
    written (checked, drop)."""
    path = record_path(run_dir, guard.root)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if os.path.lexists(path):
        # finish_held finished every dead run's record before this run's snapshot; one
        # here now is a run kooi does not know about: its check must not be lost.
        raise refused(f"{path}, another run's record, appeared while run {res.run_id} held the project's lock; "
                      "run `kooi gc`, then retry")
    ident = dirid.of(guard.root)
    own, above = lock_names(guard.root)
    doc = {"version": VERSION, "run_id": res.run_id, "workflow": res.workflow, "mode": res.mode,
           "isolation": res.isolation, "project": str(guard.root), "start": res.start, "log": res.log,
           "pid": os.getpid(), "identity": ident.as_json(), "place": dirid.place(guard.root, ident),
           "locks": {"own": own, "above": above}, "phase": "running", "guard": guard.dump()}
    _save(path, doc)
    _follow(path, doc, guard)
    return path


def checked(path: Path | None, res: Result) -> None:
    """The run's own check is over (its outcome in RES): killed from here on, only its
    result is missing, and whoever finishes the record writes it from there."""
    if path is None:
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return
    doc["phase"], doc["outcome"] = "checked", res.project_guard
    doc["cleanup"] = res.cleanup
    _save(path, doc)


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


def _locks_of(doc: dict[str, Any]) -> tuple[set[str], set[str]]:
    locks = doc.get("locks")
    if isinstance(locks, dict):
        return set(map(str, locks.get("own", []))), set(map(str, locks.get("above", [])))
    p = Path(str(doc.get("project", "")))  # a record kooi wrote before it kept the lock's names
    return {labels.lock_key(str(p))}, {labels.lock_key(str(q)) for q in p.parents}


def _live(run_dir: Path, doc: dict[str, Any]) -> bool:
    """DOC's run lives: a process holds a lock by the names the run took at its start
    (the project's path may name another lock now: moved, deleted, replaced)."""
    from .project import lock_held

    return any(lock_held(run_dir / "locks" / n) for n in _locks_of(doc)[0])


def _related(doc: dict[str, Any], own: list[str], above: list[str]) -> bool:
    """DOC's run worked on the project of a run holding the locks OWN (exclusively) and
    ABOVE (shared), or on a directory inside or around it: the records whose run that
    lock keeps out (RunLock, by every name: a second path, a bind mount of a directory
    inside, is the same)."""
    r_own, r_above = _locks_of(doc)
    return bool(r_own & (set(own) | set(above))) or bool(r_above & set(own))


def _locate(doc: dict[str, Any], near: Path | None) -> tuple[Path | None, bool]:
    """Where the dead run DOC's project is now: at the path it was, or (NEAR: the project
    of the run that finishes it) at NEAR, a directory above it, or the place inside NEAR
    the record's place in its file system says (a bind mount of a directory inside NEAR).
    (its path or None; True when it is provably deleted: a directory born later has its
    inode number)."""
    recorded = Path(str(doc.get("project", "")))
    ident = dirid.DirId.from_json(doc.get("identity"))
    cands = [recorded]
    if near is not None:
        cands += [near, *near.parents]
        place = doc.get("place")
        try:
            here = dirid.place(near)
        except OSError:
            here = None
        if isinstance(place, list) and len(place) == 2 and here is not None and place[0] == here[0] \
                and str(place[1]).startswith(here[1].rstrip("/") + "/"):
            cands.append(near / os.path.relpath(str(place[1]), here[1]))
    deleted = False
    for c in cands:
        try:
            if not stat.S_ISDIR(os.lstat(c).st_mode):
                continue
            now_id = dirid.of(c)
        except OSError:
            continue
        if ident is None:
            if c == recorded:
                return c, False
            continue
        if ident.same(now_id) and (c == recorded or None not in (ident.btime, now_id.btime)):
            return c, False
        deleted = deleted or ident.reused(now_id)
    return None, deleted


def finish_held(run_dir: Path, project: Path, cfg: EngineConfig | None, log: Log, res: Result) -> None:
    """Once a run on PROJECT holds its lock (RunLock: PROJECT's exclusively, each directory
    above it shared), no live run works on PROJECT or on a directory inside or around it:
    every record of such a run is a dead run's. Finish each before this run's snapshot,
    which would otherwise take what their workloads left for the project's own. The
    records are read now, not before waiting for the lock: a run that took the lock first
    may have written its record, and died, while this one waited."""
    own, above = lock_names(project)
    records = _records(run_dir)
    moved: dict[Path, Path] | None = None
    for path, doc in records:
        if doc is None:
            if path == record_path(run_dir, project):
                raise refused(f"{path} is a dead run's record kooi cannot read: check {project} for what its "
                              "workload left (`.git/config`, hooks, `.envrc`), then remove the record")
            continue
        near: Path | None = project
        if not _related(doc, own, above) and path != record_path(run_dir, project):
            # A dead run's project moved into this one since (mv A B/A): found by its
            # identity, finished where it is now before this run's snapshot takes it.
            if moved is None:
                moved = _moved_inside(run_dir, records, project)
            near = moved.get(path)
            if near is None:
                continue
        said = finish(path, doc, cfg, log, f"run {res.run_id}", near=near)
        if said:
            res.warn(log, said)


def _moved_inside(run_dir: Path, records: list[tuple[Path, dict[str, Any] | None]],
                  project: Path) -> dict[Path, Path]:
    """Where inside PROJECT the projects of dead runs that are not where they were are
    now (record -> path): one walk of PROJECT, only when there is such a record."""
    want: dict[tuple[int, int], list[tuple[Path, dirid.DirId]]] = {}
    for path, doc in records:
        if doc is None:
            continue
        ident = dirid.DirId.from_json(doc.get("identity"))
        if ident is None or ident.btime is None:
            continue
        if _live(run_dir, doc) or _locate(doc, None)[0] is not None:
            continue  # a live run's, or where it was
        want.setdefault((ident.dev, ident.ino), []).append((path, ident))
    found: dict[Path, Path] = {}
    if not want:
        return found
    budget = [MAX_SEARCH]
    stack = [project]
    while stack and budget[0] > 0 and len(found) < sum(map(len, want.values())):
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            budget[0] -= 1
            try:
                if not e.is_dir(follow_symlinks=False):
                    continue
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            for path, ident in want.get((st.st_dev, st.st_ino), []):
                try:
                    if ident.same(dirid.of(e.path)):
                        found[path] = Path(e.path)
                except OSError:
                    pass
            stack.append(Path(e.path))
    return found


def finish_all(run_dir: Path, cfg: EngineConfig | None, dry_run: bool = False,
               keep_days: float | None = None) -> list[str]:
    """`kooi gc`: finish every dead run whose project is where it was and no live run
    holds; say which records wait for a run on a project that moved, and drop (with a
    result that says so) those that waited longer than KEEP_DAYS, like logs and results."""
    out = []
    log = Log(None, None)
    for path, doc in _records(run_dir):
        if doc is None:
            out.append(f"warning: {path} is a dead run's record kooi cannot read: check its project, then remove it")
            continue
        if _live(run_dir, doc):
            continue  # a live run's record, wherever its project is now
        where, deleted = _locate(doc, None)
        lock = RunLock(run_dir, "", where or Path(str(doc.get("project", ""))))
        try:
            lock.acquire(0)
        except RunError:
            continue  # a live run's record, or another finisher's
        try:
            if not path.exists():
                continue
            if where is None and not deleted:
                age = time.time() - path.stat().st_mtime
                if keep_days is None or age < keep_days * 86400:
                    out.append(f"warning: {_not_there(path, doc)}")
                    continue
                if not dry_run:
                    _expire(path, doc, age)
                out.append(f"record of run {doc.get('run_id')} (its project {doc.get('project')} not found for "
                           f"{age / 86400:.0f} days: dropped without a check; its result says so)")
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
        except Exception as exc:  # noqa: BLE001 - one record's failure holds up no other's check
            out.append(f"warning: the check of run {doc.get('run_id')} on {doc.get('project')}, whose kooi run "
                       f"died, failed ({exc.__class__.__name__}: {exc}); its record is kept for the next run "
                       "there or kooi gc")
        finally:
            lock.release()
    return out


def _expire(path: Path, doc: dict[str, Any], age: float) -> None:
    run_id = str(doc.get("run_id", ""))
    res = Result(workflow=str(doc.get("workflow", "")), run_id=run_id, project=str(doc.get("project", "")),
                 mode=str(doc.get("mode", "")), isolation=str(doc.get("isolation", "")),
                 start=str(doc.get("start", "")), log=str(doc.get("log", "")))
    res.end, res.exit_code, res.reason = now(), 137, "interrupted"
    res.message = (f"kooi run died during the run without a result; its project was not found at "
                   f"{doc.get('project')} for {age / 86400:.0f} days (moved, unmounted or deleted), so kooi gc "
                   "dropped its record without checking what its workload left")
    _write_result(path.parent.parent / "results" / f"{run_id}.json", res)
    drop(path)


def _not_there(path: Path, doc: dict[str, Any]) -> str:
    return (f"{path}: run {doc.get('run_id')}, whose kooi run died, worked on {doc.get('project')}, which is not "
            "there now (moved, unmounted, or deleted): what its workload left may be wherever it is. If it moved, "
            "run on it where it is now (that finishes its check there first); if it was deleted, remove the record")


def finish(path: Path, doc: dict[str, Any], cfg: EngineConfig | None, log: Log, by: str,
           near: Path | None = None) -> str | None:
    """Finish the dead run DOC (its record at PATH), holding a lock that keeps every live
    run off its project (NEAR: the project of the run that holds it): its containers
    removed, its check run, its result written, the record removed. What it did, in one
    line (None: another finisher was first, or the record is not this run's to finish);
    RunError when it cannot be finished. Two runs on sibling projects may both hold the
    directory around them (shared) and find the same dead record there: a lock of the
    record's own (a file that stays: the record itself is replaced as its check goes
    on) makes one of them the finisher, and the other finds it gone."""
    locks = path.parent.parent / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    lfd = os.open(locks / f"record-{path.stem}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o640)
    try:
        fcntl.flock(lfd, fcntl.LOCK_EX)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None  # finished while this one waited
        try:
            with os.fdopen(fd) as f:
                fresh = json.load(f)
            if isinstance(fresh, dict) and fresh.get("version") == VERSION:
                doc = fresh
        except (OSError, ValueError):
            pass
        return _finish(path, doc, cfg, log, by, near)
    finally:
        os.close(lfd)


def _finish(path: Path, doc: dict[str, Any], cfg: EngineConfig | None, log: Log, by: str,
            near: Path | None) -> str | None:
    run_id, recorded = str(doc["run_id"]), Path(doc["project"])
    res = Result(workflow=str(doc.get("workflow", "")), run_id=run_id, project=str(recorded),
                 mode=str(doc.get("mode", "")), isolation=str(doc.get("isolation", "")),
                 start=str(doc.get("start", "")), log=str(doc.get("log", "")))
    res.exit_code, res.reason = 137, "interrupted"
    if doc.get("phase") == "checked" and isinstance(doc.get("outcome"), dict):
        # Its own check ran to the end: only its result is missing.
        record = doc["outcome"]
        res.end = now()
        res.message = (f"kooi run died after its project check, before writing its result (SIGKILL: the OOM "
                       f"killer or an operator); {by} wrote it at {res.end} from the run's record")
        res.project_guard, res.cleanup = record, doc.get("cleanup")
        return _done(path, res, record, [], by, recorded)
    where, deleted = _locate(doc, near)
    if where is None and not deleted:
        if near is not None and _same_place(doc, near):
            # Another directory at its path now: its own is elsewhere (a run there
            # finishes it) or deleted; nothing of it is in this one.
            return f"run {run_id}'s record names {recorded}, which is now another directory: kept ({path})"
        raise refused(_not_there(path, doc))
    gone = _remove_containers(cfg, run_id) if doc.get("mode") != "jail" else []
    res.secrets = _release_secrets(path.parent.parent, run_id)
    if where is None:
        res.end = now()
        res.message = (f"kooi run died during the run without a result (SIGKILL: the OOM killer or an operator); "
                       f"{by} removed its {len(gone)} container(s); its project {recorded} was deleted since: "
                       "nothing to check")
        res.cleanup = {"containers": gone, "failed": []}
        _write_result(path.parent.parent / "results" / f"{run_id}.json", res)
        drop(path)
        return f"run {run_id}, whose kooi run died, worked on {recorded}, which was deleted since: nothing to check"
    try:
        guard = Guard.load(doc["guard"])
    except GuardError as exc:
        raise refused(f"{path}, the record of run {run_id} whose kooi run died, is unreadable ({exc}): check "
                      f"{where} for what its workload left, then remove the record") from None
    if guard.root != recorded:
        raise refused(f"{path}: run {run_id}'s record names {guard.root}, not {recorded}; remove the record")
    guard.root = where
    _follow(path, doc, guard)
    try:
        record = guard.check()
    except GuardError as exc:
        raise refused(f"{path}: run {run_id}, whose kooi run died, worked on {where}: {exc}") from None
    res.end = now()
    res.message = (f"kooi run died during the run without a result (SIGKILL: the OOM killer or an operator); "
                   f"{by} removed its {len(gone)} container(s) and finished its project check at {res.end}"
                   + (f" in {where}, where the project is now" if where != recorded else ""))
    res.project_guard = record
    res.cleanup = {"containers": gone, "failed": []}
    return _done(path, res, record, gone, by, where)


def _release_secrets(run_dir: Path, run_id: str) -> dict[str, Any] | None:
    """The injector's placeholders of a run whose kooi died die with its containers
    (review 14: a killed session's stayed live until its timeout); what they were used
    for goes into its result. None where the host holds no secrets or the injector
    knows no such run, or does not answer (then the release stays owed: run.releases)."""
    from .. import inject
    from ..hoststate import HostStateError
    from ..hoststate import secrets as secrets_state
    from . import releases

    try:
        sc = secrets_state.load()
        rec = releases.release(run_dir, sc, run_id) if sc and sc.injected else None
    except (HostStateError, inject.InjectError):
        return None
    if not rec:
        return None
    assert sc is not None
    return {"injected": {n: {"env": sc.secrets[n].env, "base_url": "", "upstream": sc.secrets[n].upstream,
                             "paths": list(sc.secrets[n].paths)} for n in rec.get("secrets", []) if n in sc.secrets},
            "environment": [],
            "forwarded": rec.get("forwarded", 0), "refused": rec.get("refused", []),
            "requests": rec.get("requests", [])}


def _same_place(doc: dict[str, Any], near: Path) -> bool:
    try:
        here = dirid.place(near)
    except OSError:
        return False
    return isinstance(doc.get("place"), list) and here is not None and list(here) == doc["place"]


def _done(path: Path, res: Result, record: dict[str, Any], gone: list[str], by: str, where: Path) -> str:
    """Write the dead run's result, then remove its record (never the other way round)."""
    from .backend import refusals

    res.refused = refusals(res)
    run_id = res.run_id
    n = len(record.get("refused", []))
    said = (f"finished the project check of run {run_id}, whose kooi run died: "
            + (f"removed its container(s) {', '.join(gone)}; " if gone else "")
            + (f"{n} change(s) to protected paths refused ("
               + ", ".join(r["path"] for r in record["refused"][:8]) + ("…" if n > 8 else "") + ")"
               if n else "its workload changed no protected path"))
    _write_result(path.parent.parent / "results" / f"{run_id}.json", res)
    _append_log(Path(res.log) if res.log else None, said)
    if not record.get("restored", True):
        raise refused(f"{said}; but kooi could not put back {'; '.join(record.get('restore_failed', []))}: do not "
                      f"use {where} on the host (no git command, no editor) before removing them, then remove {path}")
    drop(path)
    return said + (", put back" if n else "")


def _remove_containers(cfg: EngineConfig | None, run_id: str) -> list[str]:
    """Every container of the run (its workload's, and what it started through its
    broker): removed, so nothing of it writes the project while its check runs."""
    from .. import engineapi

    why = f"run {run_id}'s kooi run died and its containers may still write its project; its check waits for them"
    if cfg is None:
        raise unavailable(f"{why}: no engine is configured")
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


def write_result(path: Path, doc: str, replace: bool = True, mode: int = 0o640) -> None:
    """A run's result (or record), whole or not at all (a kill half-way leaves none,
    never half of one); REPLACE False: one already there is kept (kooi run wrote it
    after all)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(doc)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def _write_result(path: Path, res: Result) -> None:
    """The dead run's result; RunError when it cannot be written (the record stays)."""
    try:
        write_result(path, json.dumps(res.as_dict(), indent=2) + "\n", replace=False)
    except OSError as exc:
        raise unavailable(f"cannot write run {res.run_id}'s result {path} ({exc.strerror or exc}); its record "
                          "stays until it can") from None


def _append_log(path: Path | None, said: str) -> None:
    if path is None:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    except OSError:
        return
    with os.fdopen(fd, "a") as f:
        f.write(f"kooi: {said}\n")
