"""`kooi run gc`: remove what runs left behind."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from .. import labels
from ..hoststate import engine as engine_state
from .project import lock_held


def gc(run_dir: Path, engine_config: Path | None = None, dry_run: bool = False,
       keep_days: float = 14.0) -> list[str]:
    """Remove containers of runs that no live process owns, scan containers, networks
    and volumes of ended runs, and logs/results older than KEEP_DAYS."""
    import docker.errors

    from .. import engine

    cfg = engine_state.load(engine_config or engine_state.PATH)
    removed: list[str] = []
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
    cutoff = time.time() - keep_days * 86400
    for sub in ("logs", "results"):
        d = run_dir / sub
        for f in d.glob("*") if d.is_dir() else []:
            if f.stat().st_mtime < cutoff:
                removed.append(f"{sub[:-1]} {f}")
                if not dry_run:
                    f.unlink()
    # Throwaway copies of git's hooks, config and info (run.guard) a run could not
    # remove (entries the workload's uid made unwritable): never read again.
    d = run_dir / "shadows"
    for f in d.glob("*") if d.is_dir() else []:
        if f.lstat().st_mtime < cutoff:
            removed.append(f"shadow {f}")
            if not dry_run:
                shutil.rmtree(f, ignore_errors=True)
                if f.exists():
                    removed[-1] += " (not all removed: files of the workload's uid; remove them as root)"
    client.close()
    return removed
