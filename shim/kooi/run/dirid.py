"""Which directory a path names, for the run lock and a dead run's record.

A path is not a directory's identity: a bind mount gives a directory a second path (and
a bind of a directory inside a project gives its contents a path outside it), a rename
gives it a new one, and a directory deleted and made again keeps the old path. What
stays:

- its device and inode (what `stat` says, the same through every bind mount), and its
  birth time (statx), which tells a directory from a later one that got its inode
  number after it was deleted;
- its place in its file system: the mount's source device and root (mountinfo) plus
  the path below the mount point. A bind of A/sub mounted at B has root A/sub: B is
  "A/sub" in the file system, and its parents there are A and everything above A,
  whatever B's own path says.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_AT_FDCWD = -100
_AT_SYMLINK_NOFOLLOW = 0x100
_STATX_INO = 0x100
_STATX_BTIME = 0x800
_STATX_MNT_ID = 0x1000
_MOUNTINFO = "/proc/self/mountinfo"

_statx: Any
try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    _statx = _libc.statx
    _statx.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    _statx.restype = ctypes.c_int
except (OSError, AttributeError):  # a libc without statx (glibc before 2.28)
    _statx = None


@dataclass(frozen=True)
class DirId:
    dev: int
    ino: int
    btime: int | None  # ns; None where the file system does not keep it
    mnt_id: int | None

    def same(self, other: DirId) -> bool:
        """The same directory: one birth time unknown means the inode alone decides."""
        return (self.dev, self.ino) == (other.dev, other.ino) and \
            (self.btime is None or other.btime is None or self.btime == other.btime)

    def reused(self, other: DirId) -> bool:
        """OTHER holds this one's inode number but was born later: this one was deleted."""
        return (self.dev, self.ino) == (other.dev, other.ino) and None not in (self.btime, other.btime) \
            and self.btime != other.btime

    def as_json(self) -> dict[str, int | None]:
        return {"dev": self.dev, "ino": self.ino, "btime": self.btime}

    @classmethod
    def from_json(cls, doc: object) -> DirId | None:
        if not isinstance(doc, dict):
            return None
        try:
            bt = doc.get("btime")
            return cls(int(doc["dev"]), int(doc["ino"]), None if bt is None else int(bt), None)
        except (KeyError, TypeError, ValueError):
            return None


def of(path: Path | str) -> DirId:
    """PATH's identity (links followed: a project path is resolved already); OSError."""
    st = os.stat(path)
    btime = mnt_id = None
    if _statx is not None:
        buf = ctypes.create_string_buffer(256)
        if _statx(_AT_FDCWD, os.fsencode(str(path)), 0, _STATX_INO | _STATX_BTIME | _STATX_MNT_ID, buf) == 0:
            raw = buf.raw
            mask = int.from_bytes(raw[0:4], "little")
            if mask & _STATX_BTIME:
                btime = int.from_bytes(raw[80:88], "little", signed=True) * 10**9 + \
                    int.from_bytes(raw[88:92], "little")
            if mask & _STATX_MNT_ID:
                mnt_id = int.from_bytes(raw[144:152], "little")
    if mnt_id is None:
        mnt_id = _mnt_id_by_fd(path)
    return DirId(st.st_dev, st.st_ino, btime, mnt_id)


def _mnt_id_by_fd(path: Path | str) -> int | None:
    try:
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("mnt_id:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    finally:
        os.close(fd)
    return None


@dataclass(frozen=True)
class Mount:
    mnt_id: int
    source: str  # major:minor
    root: str    # the directory of the file system mounted here
    point: str   # where, in this process's view


def _unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def mounts() -> list[Mount]:
    out = []
    with open(_MOUNTINFO) as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 5:
                out.append(Mount(int(fields[0]), fields[2], _unescape(fields[3]), _unescape(fields[4])))
    return out


def place(real: Path, ident: DirId | None = None) -> tuple[str, str] | None:
    """REAL (a resolved path) in its file system: (the mount's source device, the path
    from the file system's top); None where the mount table does not say."""
    ident = ident or of(real)
    if ident.mnt_id is None:
        return None
    m = next((m for m in mounts() if m.mnt_id == ident.mnt_id), None)
    if m is None:
        return None
    try:
        rel = real.relative_to(m.point)
    except ValueError:
        return None
    return m.source, os.path.normpath(os.path.join(m.root, str(rel)))


def place_key(source: str, fspath: str) -> str:
    return f"fs-{hashlib.sha256(f'{source}:{fspath}'.encode()).hexdigest()[:24]}.lock"


def place_keys(real: Path, ident: DirId | None = None) -> tuple[str | None, list[str]]:
    """The lock names of REAL's place in its file system and of every directory above it
    there (the file system's own parents, which a bind mount's path does not show)."""
    where = place(real, ident)
    if where is None:
        return None, []
    source, fspath = where
    above = [place_key(source, str(p)) for p in Path(fspath).parents]
    return place_key(source, fspath), above


def mounts_inside(real: Path) -> list[str]:
    """The mount points below REAL: a run on REAL would reach what is mounted there."""
    top = str(real).rstrip("/") + "/"
    return sorted({m.point for m in mounts() if m.point.startswith(top)})
