"""Who runs: only the runner user, or root, which checks what the runner can read and drops to it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..hoststate.engine import EngineConfig
from .errors import EXIT_REFUSED, RunError, unavailable


def check_identity(cfg: EngineConfig) -> None:
    """Only the runner user, or root (which drops to it), may run workflows."""
    uid = os.geteuid()
    if uid not in (0, cfg.runner_uid):
        raise RunError("refused", EXIT_REFUSED,
                       f"kooi run runs as the runner user {cfg.runner_user} (or root, which drops to it), "
                       f"not as uid {uid}")



def _import_roots() -> list[str]:
    """Where this interpreter may still import from: its search path and kooi itself."""
    roots = [p for p in sys.path if p] + [str(Path(__file__).resolve().parents[1])]
    return [p for p in dict.fromkeys(roots) if os.path.exists(p)]



def unreadable_by(uid: int, gid: int, groups: list[int], paths: list[str]) -> list[str]:
    """The PATHS that UID (with GID and GROUPS) cannot read (directories: list and enter).
    Asked with the effective ids switched and switched back, so it needs root."""
    saved = (os.getgroups(), os.getegid(), os.geteuid())
    bad = []
    try:
        os.setgroups(groups)
        os.setegid(gid)
        os.seteuid(uid)
        for p in paths:
            mode = os.R_OK | (os.X_OK if os.path.isdir(p) else 0)
            if not os.access(p, mode, effective_ids=True):
                bad.append(p)
    finally:
        os.seteuid(saved[2])
        os.setegid(saved[1])
        os.setgroups(saved[0])
    return bad



def check_runner_can_import(cfg: EngineConfig) -> None:
    """Root drops to the runner before the run and imports modules after that (lazily,
    and so do the libraries kooi uses). Refuse up front when this interpreter lives where
    the runner cannot read: a pyenv or conda Python, or a venv, under /root."""
    if os.geteuid() != 0 or cfg.runner_uid == 0:
        return
    bad = unreadable_by(cfg.runner_uid, cfg.runner_gid,
                        os.getgrouplist(cfg.runner_user, cfg.runner_gid), _import_roots())
    if bad:
        raise unavailable(
            f"kooi run drops to the runner user {cfg.runner_user}, who cannot read where this kooi's Python "
            f"imports from: {', '.join(bad)}. Use the kooi that site.yml installed (/usr/local/bin/kooi, the "
            "system python3), or install kooi with an interpreter and in a directory the runner can read")



def drop_to_runner(cfg: EngineConfig) -> None:
    """Run as the runner user from here on (root drops to it)."""
    check_identity(cfg)
    if os.geteuid() == cfg.runner_uid:
        return
    # The runner's own groups only (userns_remap: the socket group is one of them).
    os.setgroups(os.getgrouplist(cfg.runner_user, cfg.runner_gid))
    os.setgid(cfg.runner_gid)
    os.setuid(cfg.runner_uid)
    os.environ.update(HOME=cfg.runner_home, USER=cfg.runner_user, LOGNAME=cfg.runner_user,
                      XDG_RUNTIME_DIR=cfg.runtime_dir)
