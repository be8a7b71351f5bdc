"""The project a run works on: its checks, the ACLs that let the workload's mapped uid
write it, and the lock that lets one run of a workflow at a time work on it."""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import struct
import time
from pathlib import Path

from .. import labels
from ..hoststate import subids
from ..hoststate.engine import EngineConfig
from .errors import EXIT_BUSY, EXIT_ERROR, EXIT_INVALID, EXIT_REFUSED, EXIT_UNAVAILABLE, Log, RunError

SUBUID = "/etc/subuid"


def subid_start(user: str, path: str = SUBUID) -> int:
    """The first subordinate uid of USER (an entry by name or by uid)."""
    try:
        with open(path) as f:
            found = subids.entries(f.read(), path)
    except (OSError, subids.SubidError) as exc:
        raise RunError("error", EXIT_ERROR, f"{path}: {exc}; re-run site.yml") from None
    names = (user, str(_uid_or_none(user)))
    for name, start, _count in found:
        if name in names:
            return start
    raise RunError("error", EXIT_ERROR, f"{path} has no range for {user}; re-run site.yml")




def _uid_or_none(user: str) -> int | None:
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None



def host_uid_of(cfg: EngineConfig, container_uid: int) -> int:
    """The host uid that a container uid becomes on this engine."""
    if cfg.mode == "rootless":
        return cfg.runner_uid if container_uid == 0 else subid_start(cfg.runner_user) + container_uid - 1
    return subid_start(cfg.remap_user or "kooi-remap") + container_uid



_ACL_USER, _ACL_MASK, _RWX = 0x02, 0x10, 0o7  # as in <linux/posix_acl.h>
_MASK = -1  # the mask entry's key in acl_users()


def acl_users(path: Path, default: bool = False) -> dict[int, int]:
    """The named-user entries (uid -> permission bits) of PATH's access ACL, or of its
    default ACL, and its mask under the key _MASK: the kernel's own xattr format
    (version 2; tag u16, perm u16, id u32 per entry), read without starting getfacl on
    every run. Empty when there is none."""
    try:
        raw = os.getxattr(path, "system.posix_acl_default" if default else "system.posix_acl_access")
    except OSError:
        return {}
    if len(raw) < 4 or (len(raw) - 4) % 8 or struct.unpack_from("<I", raw)[0] != 2:
        return {}
    out: dict[int, int] = {}
    for tag, perm, uid in struct.iter_unpack("<HHI", raw[4:]):
        if tag == _ACL_USER:
            out[uid] = perm
        elif tag == _ACL_MASK:
            out[_MASK] = perm
    return out


def grant_workspace(project: Path, host_uid: int, runner_uid: int, log: Log, note: bool = True) -> None:
    """Let the container's (mapped, non-root) user write the project, and the runner keep
    access to what it writes: POSIX ACLs, set once (new files inherit the default ACL)."""
    if not shutil.which("setfacl"):
        raise RunError("unavailable", EXIT_UNAVAILABLE,
                       "setfacl is missing (package acl); re-run site.yml")

    def granted() -> bool:
        # The mask bounds every named entry: a `chmod 755` on the project narrows it to
        # r-x, and the workload could no longer write although its entry says rwx.
        access, dflt = acl_users(project), acl_users(project, default=True)
        return all(d.get(k) == _RWX for d, k in ((access, host_uid), (access, _MASK), (dflt, host_uid),
                                                 (dflt, runner_uid), (dflt, _MASK)))

    if granted():
        return
    if note:
        log.note(f"granting the workload's uid {host_uid} access to {project} (POSIX ACL, once)")
    spec = f"u:{host_uid}:rwX,d:u:{host_uid}:rwX,d:u:{runner_uid}:rwX,d:m::rwx,m::rwx"
    import subprocess  # only the first run on a project sets them

    r = subprocess.run(["setfacl", "-R", "-m", spec, str(project)], capture_output=True, text=True)
    if r.returncode != 0:
        if not granted():
            raise RunError("error", EXIT_ERROR,
                           f"cannot set ACLs on {project} ({r.stderr.strip()[-300:]}); the project must be owned "
                           "by the runner user on a filesystem with POSIX ACLs")
        # Files a workload created earlier belong to its sub-uid and keep their own ACLs.
        log.note(f"warning: some entries kept their ACLs: {r.stderr.strip().splitlines()[0][:200]}")



def check_project(project: Path, cfg: EngineConfig) -> Path:
    try:
        real = project.resolve(strict=True)
    except FileNotFoundError:
        raise RunError("invalid", EXIT_INVALID, f"project {project} does not exist") from None
    if not real.is_dir():
        raise RunError("invalid", EXIT_INVALID, f"project {real} is not a directory")
    st = real.stat()
    if st.st_uid != cfg.runner_uid:
        raise RunError("refused", EXIT_REFUSED,
                       f"project {real} is owned by uid {st.st_uid}, not by the runner user "
                       f"{cfg.runner_user}; chown it (the workload writes there as that user's sub-id)")
    for bad in ("/", "/etc", "/usr", "/var", "/home", cfg.runner_home):
        if str(real) == bad:
            raise RunError("refused", EXIT_REFUSED, f"refusing {real} as a project (too broad)")
    return real



class RunLock:
    """One run of a workflow per project at a time (flock; released when the process dies)."""

    def __init__(self, run_dir: Path, wf: str, project: Path):
        self.path = run_dir / "locks" / labels.lock_key(wf, str(project))
        self.fd: int | None = None

    def acquire(self, wait: float) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o640)
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(self.fd)
                    self.fd = None
                    raise RunError("busy", EXIT_BUSY,
                                   f"another run of this workflow holds {self.path}; retry later or pass --wait") from None
                time.sleep(0.2)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None



def lock_held(path: Path) -> bool:
    """True if a live process holds the run lock at PATH."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
