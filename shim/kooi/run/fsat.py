"""File operations relative to a directory descriptor (git directories and their
throwaway copies), never following a link: open a directory, fingerprint, copy, read
and remove an entry, hand a tree to its owner."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path
from typing import Any

# Git's data kooi copies back from a throwaway: regular files and directories only, at most.
MAX_DATA_BYTES = 1 << 30


def open_dir(root: Path, rel: str) -> int:
    """A descriptor of ROOT/REL, no component of REL followed if it is a symlink."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in Path(rel).parts:
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


Fingerprint = tuple[Any, ...]


def fingerprint(dir_fd: int, name: str, content: bool = False) -> Fingerprint | None:
    """What NAME in DIR_FD is (never followed): a file's mode, size and either its
    content's digest (CONTENT) or its mtime, ctime and inode; a directory's with its
    entries'. None when it does not exist."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISREG(st.st_mode):
        if not content:
            return ("file", stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        h = hashlib.sha256()
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
        try:
            while chunk := os.read(fd, 1 << 20):
                h.update(chunk)
        finally:
            os.close(fd)
        return ("file", stat.S_IMODE(st.st_mode), st.st_size, h.hexdigest())
    if stat.S_ISDIR(st.st_mode):
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
        try:
            return ("dir", stat.S_IMODE(st.st_mode),
                    tuple((n, fingerprint(fd, n, content)) for n in sorted(os.listdir(fd))))
        finally:
            os.close(fd)
    return ("other", st.st_mode)


def copy_at(src_fd: int, name: str, dst_fd: int, dst_name: str, owner: tuple[int, int] | None,
          budget: list[int]) -> None:
    """Copy NAME (a regular file or a directory of them; links and anything else are
    left out) from SRC_FD to DST_NAME in DST_FD, never following a link, owned by
    OWNER; BUDGET[0]: the bytes still allowed (OSError when they run out)."""
    st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        os.mkdir(dst_name, 0o700, dir_fd=dst_fd)
        sfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=src_fd)
        dfd = os.open(dst_name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dst_fd)
        try:
            for n in os.listdir(sfd):
                copy_at(sfd, n, dfd, n, owner, budget)
            os.fchmod(dfd, stat.S_IMODE(st.st_mode))
            if owner is not None:
                os.fchown(dfd, *owner)
        finally:
            os.close(sfd)
            os.close(dfd)
        return
    if not stat.S_ISREG(st.st_mode):
        return
    sfd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=src_fd)
    try:
        if not stat.S_ISREG(os.fstat(sfd).st_mode):
            return
        dfd = os.open(dst_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dst_fd)
        try:
            while chunk := os.read(sfd, 1 << 20):
                budget[0] -= len(chunk)
                if budget[0] < 0:
                    raise OSError(27, f"git's data is larger than {MAX_DATA_BYTES >> 20} MiB")
                os.write(dfd, chunk)
            os.fchmod(dfd, stat.S_IMODE(st.st_mode))
            if owner is not None:
                os.fchown(dfd, *owner)
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def remove_at(dir_fd: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def read_at(dir_fd: int, name: str) -> bytes:
    """NAME in DIR_FD (never through a link), up to MAX_DATA_BYTES; b"" where it is none."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        return f.read(MAX_DATA_BYTES)


def chown_tree(path: Path, owner: tuple[int, int] | None) -> None:
    """PATH and everything in it owned by OWNER (never through a link); nothing when
    kooi cannot (not root) or OWNER is None."""
    if owner is None or os.geteuid() != 0:
        return
    os.chown(path, *owner, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            os.chown(os.path.join(dirpath, n), *owner, follow_symlinks=False)
