"""The project a run works on: its checks, the ACLs that let the workload's mapped uid
write it, and the lock that lets one run of a workflow at a time work on it."""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import stat
import struct
import time
from pathlib import Path

from .. import labels
from ..hoststate import paths, subids
from ..hoststate.engine import EngineConfig
from . import dirid
from .errors import EXIT_BUSY, EXIT_ERROR, EXIT_INVALID, EXIT_REFUSED, EXIT_UNAVAILABLE, Log, RunError

SUBUID = "/etc/subuid"
SUBGID = "/etc/subgid"


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


def share_with_group(project: Path, gid: int, runner_user: str, log: Log) -> None:
    """Give PROJECT to group GID (the workload's gid as the remapped engine maps it), with
    setgid directories so that what the runner adds later joins it too: gVisor judges a
    file by its owner, group and mode bits alone and never reads the POSIX ACLs
    grant_workspace sets (measured: a runc workload writes the project, the same
    workload under runsc gets EACCES). The group bits are the ACL mask (rwx). Once per
    project, before the project guard's snapshot (the setgid bits are mode bits); the
    runner must be in the group (role gvisor). The walk never follows a symbolic link
    (os.fwalk, changes through the open directory and *at calls without following), so
    a workload of another run on the project cannot point it elsewhere."""
    import grp
    import stat

    st = project.stat()
    if st.st_gid == gid and st.st_mode & stat.S_ISGID:
        return
    if gid != os.getegid() and gid not in os.getgroups():
        try:
            listed = runner_user in grp.getgrgid(gid).gr_mem
        except KeyError:
            listed = False
        raise RunError("refused", EXIT_REFUSED,
                       f"this process of the runner is not in gVisor's workload group (gid {gid}, "
                       "kooi_gvisor_group), which a gVisor run needs to write its project: "
                       + ("the runner joined it after this session began; run kooi as root or from a new login"
                          if listed else "re-run site.yml (roles runner_user and gvisor)"))
    log.note(f"giving {project} to group {gid}, the workload's gid on this engine (gVisor ignores POSIX ACLs; once)")
    me, kept = os.geteuid(), 0
    for _dirpath, _dirs, files, dfd in os.fwalk(project, follow_symlinks=False):
        dst = os.fstat(dfd)
        if dst.st_uid != me:
            kept += 1  # a workload's directory: its group is already the workload's
            continue
        os.fchown(dfd, -1, gid)
        os.fchmod(dfd, stat.S_IMODE(dst.st_mode) | stat.S_ISGID)
        for name in files:
            try:
                if os.stat(name, dir_fd=dfd, follow_symlinks=False).st_uid == me:
                    os.chown(name, -1, gid, dir_fd=dfd, follow_symlinks=False)
                else:
                    kept += 1
            except OSError:
                kept += 1
    st = project.stat()
    if st.st_gid != gid or not st.st_mode & stat.S_ISGID:
        raise RunError("error", EXIT_ERROR, f"cannot give {project} to group {gid}")
    if kept:
        log.note(f"{kept} entries the workload created kept their owner's group (its own gid already)")


def grant_search(path: Path, uid: int, runner_uid: int, log: Log) -> None:
    """Let host uid UID reach PATH, as gVisor's gofer must reach every bind source: it
    opens them itself, as the remap range's root, where runc mounts as real root
    (measured: "cannot create sandbox" below the runner's 0750 home). Search (x) is
    granted by a POSIX ACL on each ancestor the runner owns that others cannot search;
    an ancestor the runner does not own and that keeps UID out is refused, not changed."""
    import subprocess

    for d in reversed(path.parents):
        try:
            st = d.stat()
        except OSError as exc:
            raise RunError("error", EXIT_ERROR, f"cannot stat {d}: {exc}") from None
        if st.st_mode & 0o001 or st.st_uid == uid:
            continue
        perm = acl_users(d).get(uid)
        if perm is not None and perm & 1 and acl_users(d).get(_MASK, _RWX) & 1:
            continue
        if st.st_uid != runner_uid:
            raise RunError("refused", EXIT_REFUSED,
                           f"{d} keeps gVisor's gofer (host uid {uid}) from {path}: give others search "
                           f"(chmod o+x {d}) or move the project below a directory the runner owns")
        log.note(f"granting gVisor's gofer (host uid {uid}) search on {d} (POSIX ACL, once)")
        r = subprocess.run(["setfacl", "-m", f"u:{uid}:x", str(d)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RunError("error", EXIT_ERROR, f"cannot set an ACL on {d} ({r.stderr.strip()[-300:]}); "
                           "gVisor's gofer could not reach the run's files")



# Where no project may be, nor hold one of (review 15: a jail run on the runner's
# ~/.config wrote git/config, on /run/user/UID it reached the rootless engine's raw
# socket, on kooi's run directory it forged results and guard records): the system's
# own trees, the runner's runtime directory and kooi's state. The runner's home and every
# hidden directory (~/.config, ~/.local with the rootless engine's data, ~/.ssh) come
# from the path itself (_place_problem).
SYSTEM_PLACES = ("/etc", "/usr", "/boot", "/proc", "/sys", "/dev", "/run", "/var/run", "/var/log", "/var/lib/docker",
                 "/var/lib/containerd", "/var/spool", "/root", "/bin", "/sbin", "/lib", "/lib64")
KOOI_PLACES = (paths.ETC, "/var/lib/kooi", paths.LOG_DIR, paths.ENGINE_STATE_DIR, paths.INJECT_RUN_DIR, "/opt/kooi")
# kooi's own projects in its state (the checks' runs: kooi verify).
OWN_PROJECTS = (paths.SELFTEST_PROJECT, paths.RUNCHECK_PROJECT)


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _place_problem(real: Path, cfg: EngineConfig, run_dir: str) -> str | None:
    """Why REAL (resolved) is no place for a project: it is, or lies inside or around, a
    place the workload must not write (it writes its project as the runner's sub-id, or in
    a jail as the runner itself)."""
    p = str(real)
    if p in OWN_PROJECTS:
        return None
    # ~/bin: Debian's ~/.profile puts it first on the runner's PATH (review 16: a jail
    # wrote a `git` there, and the runner's next login shell ran it).
    sensitive = (*SYSTEM_PLACES, *KOOI_PLACES, run_dir, f"/run/user/{cfg.runner_uid}", os.path.dirname(cfg.socket),
                 os.path.join(cfg.runner_home, "bin"))
    for top in sensitive:
        if _within(p, top):
            return f"it is {top}" if p == top else f"it lies inside {top}"
        if _within(top, p):
            return f"it holds {top}"
    if _within(cfg.runner_home, p):
        return "it is the runner's home" if p == cfg.runner_home else f"it holds the runner's home {cfg.runner_home}"
    if p in ("/", "/var", "/home", "/srv", "/opt", "/tmp", "/var/tmp", "/var/lib"):
        return "it is a system directory"
    hidden = [part for part in real.parts[1:] if part.startswith(".")]
    if hidden:
        return f"it lies inside the hidden directory {hidden[0]} (tools' settings and state, an engine's data)"
    return None


def check_project(project: Path, cfg: EngineConfig, run_dir: Path | str = paths.RUNS) -> Path:
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
    if (why := _place_problem(real, cfg, str(run_dir))) is not None:
        raise RunError("refused", EXIT_REFUSED,
                       f"{real} is not a place for a project: {why}; the workload writes its project, so kooi "
                       "takes none among the system's, the runner's or its own settings and state. Use a "
                       "directory of its own (e.g. below the runner's home)")
    inside = dirid.mounts_inside(real)
    if inside:
        # The workload gets the project with what is mounted in it (a recursive bind), and
        # the guard and the run lock would see neither: another run's project, the host's
        # files, bound there.
        raise RunError("refused", EXIT_REFUSED,
                       f"project {real} has a mount point inside it ({', '.join(inside[:3])}): a run would reach "
                       "what is mounted there, out of the run lock's and the project guard's sight; unmount it "
                       "or choose a project without mounts")
    return real



def lock_names(project: Path) -> tuple[list[str], list[str]]:
    """The run lock's names for PROJECT (resolved): its own (taken exclusively) and the
    directories' above it (shared). Each directory by its device and inode (a second path
    to it, a bind mount or a rename, is the same), and by its place in its file system
    (run.dirid): a bind mount of a directory inside another run's project has that
    project above it there, not on its path. Above the project from the top down: every
    run takes them in one order."""
    own = [labels.lock_key(str(project))]
    above = [labels.lock_key(str(a)) for a in reversed(project.parents)]
    try:
        here, up = dirid.place_keys(project)
    except OSError:
        here, up = None, []
    if here is not None:
        own.append(here)
        above += [k for k in reversed(up) if k not in above]
    return own, above


class RunLock:
    """One run per project at a time, whatever its workflow, and none on a directory
    inside or around it (flock; released when the process dies): the project's own locks
    exclusively, each directory above it shared (lock_names). A run on P and one on P/n
    would each take the other's changes into its snapshot and put them back, and one
    could swap a directory of the other's project for a link before that run's guard
    works on it."""

    def __init__(self, run_dir: Path, wf: str, project: Path):
        own, above = lock_names(project)
        self.path = run_dir / "locks" / own[0]
        self.own = [run_dir / "locks" / n for n in own]
        self.above = [run_dir / "locks" / n for n in above]
        self.fds: list[int] = []

    def _try(self) -> Path | None:
        """Every lock at once, or none (the one another run holds)."""
        for path, mode in [*((a, fcntl.LOCK_SH) for a in self.above), *((o, fcntl.LOCK_EX) for o in self.own)]:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
            self.fds.append(fd)
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                self.release()
                return path
        return None

    def acquire(self, wait: float) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + wait
        while True:
            held = self._try()
            if held is None:
                return
            if time.monotonic() >= deadline:
                what = "this project or inside it" if held in self.own else "a directory around it"
                raise RunError("busy", EXIT_BUSY,
                               f"another run on {what} holds {held} (one run per project at a time, whatever its "
                               "workflow, and none on a directory inside another run's project); retry later or "
                               "pass --wait") from None
            time.sleep(0.2)

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []



def lock_held(path: Path) -> bool:
    """True if a live process holds the run lock at PATH. The locks directory is the
    runner's and root's `kooi gc` reads it: a link there is never followed (root would
    open and lock whatever it names), and only a regular file is a lock (read-only,
    non-blocking: a FIFO neither blocks nor counts)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
