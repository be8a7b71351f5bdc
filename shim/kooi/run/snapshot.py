"""A protected path's state as an Entry (type, mode, content, link count): read from
the project (scan), compared (change_of) and put back (restore), never through a
symlink."""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from .protected import MAX_FILE, is_git_data

# Before the run: how much kooi keeps of the protected paths.
MAX_ENTRIES = 5000
MAX_BYTES = 32 << 20
# After the run (a flood is removed, not refused): how much kooi reads before it stops.
MAX_ENTRIES_AFTER = 50000
MAX_BYTES_AFTER = 256 << 20


@dataclass(frozen=True)
class Entry:
    kind: str  # file, dir, link, other, unreadable
    mode: int = 0
    data: bytes = b""  # a file's content (watched: its fingerprint), a link's target
    nlink: int = 1

    def same(self, other: Entry | None) -> bool:
        """Equal but for the group permission bits: they hold the ACL mask, which kooi
        itself sets when it grants the workload the project."""
        return other is not None and (self.kind, self.data, self.mode & 0o7707, self.nlink) == \
            (other.kind, other.data, other.mode & 0o7707, other.nlink)


class GuardError(Exception):
    """The protected paths cannot be kept (the run is refused before it starts)."""


def lentry(p: Path, content: bool, strict: bool) -> Entry | None:
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return Entry("link", 0, os.readlink(p).encode(errors="surrogateescape"))
    if stat.S_ISDIR(st.st_mode):
        return Entry("dir", stat.S_IMODE(st.st_mode))
    if stat.S_ISREG(st.st_mode):
        if not content:
            return Entry("file", stat.S_IMODE(st.st_mode),
                         f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:{st.st_ctime_ns}".encode())
        if st.st_size > MAX_FILE:
            if strict:
                raise GuardError(f"{p} is larger than {MAX_FILE >> 20} MiB; a protected file kooi cannot keep")
            return Entry("unreadable", stat.S_IMODE(st.st_mode), b"too large", st.st_nlink)
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                return Entry("file", stat.S_IMODE(st.st_mode), f.read(MAX_FILE + 1), st.st_nlink)
        except OSError as exc:
            if strict:
                raise GuardError(f"{p}: cannot read it ({exc.strerror})") from None
            return Entry("unreadable", stat.S_IMODE(st.st_mode), (exc.strerror or "").encode(), st.st_nlink)
    return Entry("other", stat.S_IMODE(st.st_mode))


def _first_not_dir(root: Path, rel: str) -> str | None:
    """The first component of REL's parent that is not a real directory (a symlink, a
    file): the path to record instead of REL. None when all are directories or one is
    missing."""
    p = root
    parts = Path(rel).parts[:-1]
    for i, part in enumerate(parts):
        p = p / part
        try:
            if not stat.S_ISDIR(os.lstat(p).st_mode):
                return "/".join(parts[: i + 1])
        except FileNotFoundError:
            return None
    return None


def is_git_dir(root: Path, rel: str) -> bool:
    return rel in ("", ".git") or (root / rel / "HEAD").exists() or (root / rel / "config").exists()


def in_modules(rel: str, git_dirs: tuple[str, ...]) -> bool:
    """REL lies in the `modules` directory of one of GIT_DIRS (or of the project's .git):
    where git keeps submodules' repositories, also of a nested repository's submodules
    (review 39: n/.git/modules/s was scanned, copied and compared whole)."""
    return any(rel.startswith(f"{g}/modules/") for g in (".git", *git_dirs))


def scan(root: Path, paths: tuple[str, ...], content: bool = True, strict: bool = True,
         skip: tuple[str, ...] = (), git_dirs: tuple[str, ...] = (".git",)) -> dict[str, Entry]:
    """Every entry at and below PATHS in ROOT, never through a symlink (a parent that is
    one is recorded itself). In GIT_DIRS everything but the repository's data. With
    CONTENT the files' bytes, else a fingerprint. STRICT (before the run): anything
    that cannot be kept raises GuardError; after the run it is recorded as changed."""
    out: dict[str, Entry] = {}
    total = 0
    todo = list(paths)
    while todo:
        rel = todo.pop()
        if rel in out or any(rel == s or rel.startswith(s + "/") for s in skip):
            continue
        if (bad := _first_not_dir(root, rel)) is not None:
            if bad not in out and (e := lentry(root / bad, content, strict)) is not None:
                out[bad] = e
            continue
        e = lentry(root / rel, content, strict)
        if e is None:
            continue
        out[rel] = e
        total += len(e.data)
        if strict and (len(out) > MAX_ENTRIES or total > MAX_BYTES):
            raise GuardError(f"the protected paths of the project hold more than {MAX_ENTRIES} entries or "
                             f"{MAX_BYTES >> 20} MiB; clean them up or name them in unprotected_paths")
        if not strict and (len(out) > MAX_ENTRIES_AFTER or total > MAX_BYTES_AFTER) and "/" in rel:
            # After the run, a flood: its directory is recorded as changed (it is
            # removed, and the snapshot's entries put back), the rest of it not read.
            parent = rel.rsplit("/", 1)[0]
            for k in [k for k in out if k.startswith(parent + "/")]:
                total -= len(out.pop(k).data)
            todo = [t for t in todo if not t.startswith(parent + "/")]
            out[parent] = Entry("unreadable", 0o755, b"too many entries")
            continue
        if e.kind != "dir":
            continue
        try:
            names = sorted(os.listdir(root / rel))
        except OSError as exc:
            if strict:
                raise GuardError(f"{root / rel}: cannot list it ({exc.strerror})") from None
            out[rel] = Entry("unreadable", e.mode, (exc.strerror or "").encode())
            continue
        modules = in_modules(rel, git_dirs)
        in_git = rel in git_dirs or modules and is_git_dir(root, rel)
        for name in names:
            child = f"{rel}/{name}" if rel else name
            if in_git and is_git_data(name):
                if name == "modules":
                    todo.append(child)  # submodules' git directories: the same rule
                continue
            if (modules or rel.endswith("/modules") and in_modules(rel + "/", git_dirs)) and not in_git \
                    and not os.path.isdir(root / child):
                continue  # between module directories: only directories lead anywhere
            todo.append(child)
    return out


def change_of(before: Entry | None, after: Entry | None) -> str:
    if before is None:
        return "created"
    if after is None:
        return "deleted"
    if after.kind == "unreadable":
        return f"unreadable or too large ({after.data.decode(errors='replace')})"
    if before.kind != after.kind:
        return f"replaced ({before.kind} -> {after.kind})"
    if before.data != after.data:
        return "modified"
    if before.nlink != after.nlink:
        return "hard-linked"
    return "mode changed"


def remove_path(p: Path) -> None:
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(p)  # never follows symlinks (fd-based on Linux)
    else:
        os.unlink(p)


def restore(root: Path, rel: str, e: Entry) -> None:
    p = root / rel
    # A parent the workload replaced (a symlink, a file) goes first.
    q = root
    for part in Path(rel).parts[:-1]:
        q = q / part
        try:
            if not stat.S_ISDIR(os.lstat(q).st_mode):
                os.unlink(q)
                os.mkdir(q, 0o755)
        except FileNotFoundError:
            os.mkdir(q, 0o755)
    cur = lentry(p, content=False, strict=False)
    if e.kind == "dir":
        if cur is not None and cur.kind != "dir":
            remove_path(p)
            cur = None
        if cur is None:
            os.mkdir(p, e.mode)
        os.chmod(p, e.mode, follow_symlinks=False)
    elif e.kind == "file":
        remove_path(p)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, e.mode)
        with os.fdopen(fd, "wb") as f:
            f.write(e.data)
        os.chmod(p, e.mode)
    elif e.kind == "link":
        remove_path(p)
        os.symlink(e.data.decode(errors="surrogateescape"), p)
