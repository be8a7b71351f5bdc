"""`kooi run gc`: remove what runs left behind."""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path

from .. import labels
from ..hoststate import engine as engine_state
from . import deadrun, releases, runnet
from .project import lock_held


def gc(run_dir: Path, engine_config: Path | None = None, dry_run: bool = False,
       keep_days: float = 14.0) -> list[str]:
    """Remove containers of runs that no live process owns, scan containers, networks
    and volumes of ended runs, and logs/results older than KEEP_DAYS."""
    import docker.errors

    from .. import engine

    cfg = engine_state.load(engine_config or engine_state.PATH)
    # First the runs whose kooi run died: their containers go, then their checks run
    # (run.deadrun), before anyone takes what their workloads left for the project's.
    removed: list[str] = _as_runner(cfg, lambda: deadrun.finish_all(run_dir, cfg, dry_run, keep_days))
    # Then the placeholders of ended runs whose release failed (run.releases).
    removed += _as_runner(cfg, lambda: _settle(run_dir, dry_run))
    client = engine.client(cfg, timeout=30, version=None)
    locks = run_dir / "locks"
    live_runs = {f.name for f in (locks.glob("*.lock") if locks.is_dir() else []) if lock_held(f)}
    managed: dict[str, str | list[str] | bool] = {"label": f"{labels.MANAGED}=1"}
    for c in client.containers.list(all=True, filters=managed):
        if labels.lock_key_of(c.labels) in live_runs and (c.status == "running" or c.labels.get(labels.NESTED)):
            continue  # a live run's workload, or what it started through its broker
        removed.append(f"container {c.name}")
        if not dry_run:
            c.remove(force=True, v=True)
    for c in client.containers.list(all=True, filters={"label": f"{labels.SCAN}=1"}):
        if _age(c.attrs.get("Created", "")) < SCAN_GRACE:
            continue  # a scan may be running now (kooi image build); a killed one's goes next time
        removed.append(f"container {c.name}")
        if not dry_run:
            c.remove(force=True, v=True)
    # Networks and volumes of testcontainers runs that ended without cleaning up.
    for coll, kind in ((client.networks, "network"), (client.volumes, "volume")):
        for obj in coll.list(filters=managed):
            if labels.lock_key_of(obj.attrs.get("Labels") or {}) in live_runs:
                continue
            removed.append(f"{kind} {obj.name}")
            if not dry_run:
                try:
                    obj.remove()
                except docker.errors.APIError as exc:
                    removed[-1] += f" (not removed: {exc.explanation})"
    # The rules of dead runs' ways to the host (run.runnet), in the engine's namespace.
    removed += _as_runner(cfg, lambda: runnet.sweep(cfg, run_dir, dry_run))
    cutoff = time.time() - keep_days * 86400
    for sub in ("logs", "results"):
        removed += _sweep(run_dir, sub, cutoff, dry_run, tree=False)
    # Throwaway copies of git's hooks, config and info (run.guard) a run could not
    # remove (entries the workload's uid made unwritable): never read again.
    removed += _sweep(run_dir, "shadows", cutoff, dry_run, tree=True)
    client.close()
    return removed


def _settle(run_dir: Path, dry_run: bool) -> list[str]:
    from ..hoststate import HostStateError
    from ..hoststate import secrets as secrets_state

    try:
        sc = secrets_state.load()
    except HostStateError as exc:
        return [f"warning: ended runs' placeholders not checked: {exc}"]
    if sc is None or not sc.injected:
        return []
    if dry_run:
        return [f"placeholders of run {n} (released if its process is gone)" for n in releases.owed(run_dir)]
    return releases.settle(run_dir, sc)


SCAN_GRACE = 3600.0  # seconds: an image scan's container younger than this may be in use


def _age(created: str) -> float:
    """Seconds since an engine timestamp (RFC 3339 with nanoseconds); 0 if unreadable."""
    from datetime import datetime

    try:
        stamp = datetime.fromisoformat(created[:26].rstrip("Z") + "+00:00" if "." in created else
                                       created.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return time.time() - stamp.timestamp()


WARNING = "warning: "  # gc's items that say what it did not remove, and why


def _sweep(run_dir: Path, sub: str, cutoff: float, dry_run: bool, tree: bool) -> list[str]:
    """Remove the entries of RUN_DIR/SUB older than CUTOFF (directories whole where
    TREE). These directories are the runner's, and a workload that became the runner
    could point them anywhere, while gc runs as root: nothing here follows a symlink
    (the directory is opened with O_NOFOLLOW, every entry removed relative to it,
    directories by shutil.rmtree's fd-based walk)."""
    what = {"logs": "log", "results": "result", "shadows": "shadow"}[sub]
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        top = os.open(run_dir, flags)
    except FileNotFoundError:
        return []
    out: list[str] = []
    try:
        try:
            fd = os.open(sub, flags, dir_fd=top)
        except FileNotFoundError:
            return []
        except OSError as exc:
            return [f"{WARNING}{sub}: {run_dir / sub} not swept: it is not a directory kooi made "
                    f"({exc.strerror}); look at it as root"]
        try:
            with os.scandir(fd) as entries:
                for e in entries:
                    st = e.stat(follow_symlinks=False)
                    if st.st_mtime >= cutoff:
                        continue
                    out.append(f"{what} {run_dir / sub / e.name}")
                    if dry_run:
                        continue
                    if tree and stat.S_ISDIR(st.st_mode):
                        shutil.rmtree(e.name, dir_fd=fd, ignore_errors=True)
                        try:
                            os.lstat(e.name, dir_fd=fd)
                            out[-1] += " (not all removed: files of the workload's uid; remove them as root)"
                        except FileNotFoundError:
                            pass
                    else:
                        try:
                            os.unlink(e.name, dir_fd=fd)
                        except OSError as exc:
                            out[-1] += f" (not removed: {exc.strerror})"
        finally:
            os.close(fd)
    finally:
        os.close(top)
    return out


def _as_runner(cfg: engine_state.EngineConfig, fn: Callable[[], list[str]]) -> list[str]:
    """FN's lines, computed as the runner: root forks a child that drops to the runner
    (no new interpreter, so nothing of the runner's ~/.local runs) and reads them back.
    The guard works on the runner's project and records the way a run does, never as root."""
    import json

    from .identity import drop_to_runner

    if os.geteuid() != 0:
        return fn()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.close(r)
            drop_to_runner(cfg)
            out = fn()
        except BaseException as exc:  # noqa: BLE001 - reported through the pipe
            out, code = [f"{WARNING}dead runs: {exc.__class__.__name__}: {exc}"], 1
        try:
            with os.fdopen(w, "w") as f:
                json.dump(out, f)
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    try:
        lines = json.loads(data)
        return [str(x) for x in lines] if isinstance(lines, list) else []
    except ValueError:
        return [f"{WARNING}dead runs: the runner's check said nothing readable"]
