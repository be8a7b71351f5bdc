"""Git's index as git reads it (read-cache.c, create_from_disk), and written again from
what kooi read (run.shadows copies back only that): entries, their flags and stages,
the repository's object id length."""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple

# An index entry's flags that make the host's git skip comparing the file with the work
# tree: assume-unchanged (CE_VALID) and, in the extended flags, skip-worktree.
_CE_VALID, _CE_EXTENDED, _CE_SKIP_WORKTREE = 0x8000, 0x4000, 0x4000


def index_hidden(data: bytes, hashlen: int = 20) -> set[bytes] | None:
    """The paths of git's index DATA that the host's `git status` and `git diff` do not
    compare with the work tree (assume-unchanged, skip-worktree); None: unreadable."""
    out: set[bytes] = set()
    return out if index_walk(data, out, hashlen=hashlen) is None else None


class IndexEntry(NamedTuple):
    """One entry of git's index as git reads it (read-cache.c, create_from_disk)."""

    path: bytes
    stage: int
    stat: bytes  # ctime, mtime, dev, ino, mode, uid, gid, size: 40 bytes
    oid: bytes
    valid: bool  # assume-unchanged
    ext: int  # the extended flags: skip-worktree, intent-to-add


_EXT_KNOWN = 0x4000 | 0x2000  # skip-worktree, intent-to-add
# The modes git writes in an index: a file, an executable, a symlink, a gitlink.
_MODES = frozenset({0o100644, 0o100755, 0o120000, 0o160000})


def index_parse(data: bytes, hashlen: int) -> tuple[list[IndexEntry], bool] | str:
    """The entries of git's index DATA as git reads them, with ids of HASHLEN bytes (the
    repository's object format, never a guess from the file: review 42), and whether a
    split index's `link` extension follows; or why git would read it otherwise than
    kooi, or not at all (an unsorted or repeated entry, unknown flags)."""
    if len(data) < 12 or data[:4] != b"DIRC":
        return "not an index"
    version, count = int.from_bytes(data[4:8], "big"), int.from_bytes(data[8:12], "big")
    if version not in (2, 3, 4):
        return f"index version {version}"
    out: list[IndexEntry] = []
    pos, prev = 12, b""
    try:
        for _ in range(count):
            start = pos
            flags = int.from_bytes(data[pos + 40 + hashlen:pos + 42 + hashlen], "big")
            pos += 42 + hashlen
            ext = 0
            if flags & _CE_EXTENDED:  # git reads it in any version (review 42: a v2 index)
                ext = int.from_bytes(data[pos:pos + 2], "big")
                pos += 2
                if ext & ~_EXT_KNOWN:
                    return "an entry with flags git does not know"
            namelen = flags & 0xFFF
            if version == 4:
                strip, shift = 0, 0
                while True:  # git's offset varint
                    b = data[pos]
                    pos += 1
                    strip = (strip << 7) | (b & 0x7F) if shift else b & 0x7F
                    if not b & 0x80:
                        break
                    strip += 1
                    shift = 1
                end = data.index(b"\0", pos)
                if strip > len(prev):
                    return "an entry whose name git cannot expand"
                path = prev[: len(prev) - strip] + data[pos:end]
                pos = end + 1
            else:
                # git takes the name's length from the flags (review 41: `.envrc` with
                # "XYZ" after it in the padding), to its NUL only at 0xFFF and longer
                offset = pos - start
                if namelen < 0xFFF:
                    path = data[pos:pos + namelen]
                    if data[pos + namelen] != 0:
                        # git copies the name with the byte after it, taken for its NUL
                        return "an entry whose name is not the length its flags say"
                else:
                    path = data[pos:data.index(b"\0", pos)]
                if len(path) < min(namelen, 0xFFF):
                    return "the index cannot be read"
                pos = start + ((offset + len(path) + 8) & ~7)
            if not path and not namelen:
                return "a split index (core.splitIndex): kooi cannot write it again with its entries alone"
            if namelen < 0xFFF and len(path) != namelen or b"\0" in path or not path:
                return "an entry whose name is not the length its flags say"
            if int.from_bytes(data[start + 24:start + 28], "big") not in _MODES:
                # git checks out by the mode's file type alone (review 43: 0x1A1FF, a
                # symlink to git, was a file to kooi's `mode >> 12`)
                return "an entry with a mode git does not write"
            entry = IndexEntry(path, (flags >> 12) & 3, data[start:start + 40], data[start + 40:start + 40 + hashlen],
                               bool(flags & _CE_VALID), ext)
            if out and (out[-1].path, out[-1].stage) >= (path, entry.stage):
                # git writes them sorted, each (path, stage) once (review 42: the first
                # of two `.envrc` went into the host's next commit, unjudged)
                return "entries out of git's order or repeated"
            out.append(entry)
            prev = path
        if pos > len(data) - hashlen:
            return "the index cannot be read"
    except (IndexError, ValueError):
        return "the index cannot be read"
    link = False
    while pos + 8 <= len(data) - hashlen:  # the extensions: whether a split index's link is among them
        sig, size = data[pos:pos + 4], int.from_bytes(data[pos + 4:pos + 8], "big")
        link = link or sig == b"link"
        pos += 8 + size
    return out, link


def index_walk(data: bytes, hidden: set[bytes] | None = None,
               entries: dict[bytes, bytes] | None = None, hashlen: int = 20, split: bool = True) -> str | None:
    """Walk git's index DATA (index_parse): why it must not reach the host, or None;
    HIDDEN gets the paths whose flags hide them from the host's git, ENTRIES every path
    with what git writes to the work tree from it (its mode and object id): a
    conflict's stages 1 to 3 as PATH NUL STAGE (review 40: stage 2 held the
    workload's .envrc, and only the last stage of a path was judged). Not SPLIT: a
    split index is refused too."""
    parsed = index_parse(data, hashlen)
    if isinstance(parsed, str):
        return parsed
    if parsed[1] and not split:
        return "a split index (core.splitIndex): kooi cannot write it again with its entries alone (review 41)"
    for e in parsed[0]:
        parts = e.path.split(b"/")
        if e.path.startswith(b"/") or any(p in (b"", b".", b"..") or p.lower() == b".git" for p in parts):
            return f"an entry at {e.path.decode(errors='replace')[:200]!r}"
        if hidden is not None and (e.valid or e.ext & _CE_SKIP_WORKTREE):
            hidden.add(e.path)
        if entries is not None:
            entries[e.path + b"\0%d" % e.stage if e.stage else e.path] = e.stat[24:28] + e.oid
    return None


def index_canonical(data: bytes, hashlen: int) -> bytes | None:
    """Git's index DATA written again from what kooi read of it (index_parse): its
    entries alone, as git writes them, and a fresh checksum. The caches and records git
    keeps beside them (the cache tree, resolve-undo, the untracked cache) are dropped:
    git rebuilds or does without them (review 41: a cache tree of the workload's went
    into the host's next commit, a resolve-undo record came back with `git checkout
    -m`); and what git reads is what kooi judged (review 42: bytes kooi parsed one way
    and git another). None: it cannot be read, or it is a split index."""
    parsed = index_parse(data, hashlen)
    if isinstance(parsed, str) or parsed[1]:
        return None
    entries = parsed[0]
    version = 3 if any(e.ext for e in entries) else 2
    body = [b"DIRC", version.to_bytes(4, "big"), len(entries).to_bytes(4, "big")]
    for e in entries:
        flags = (_CE_VALID if e.valid else 0) | (_CE_EXTENDED if e.ext else 0) | e.stage << 12 | min(len(e.path), 0xFFF)
        head = e.stat + e.oid + flags.to_bytes(2, "big") + (e.ext.to_bytes(2, "big") if e.ext else b"")
        size = (len(head) + len(e.path) + 8) & ~7
        body.append(head + e.path + b"\0" * (size - len(head) - len(e.path)))
    out = b"".join(body)
    return out + hashlib.new("sha1" if hashlen == 20 else "sha256", out).digest()


_OBJECT_FORMAT = re.compile(rb"^\s*objectformat\s*=\s*sha256\s*$", re.M | re.I)


def object_hashlen(config: bytes | None) -> int:
    """The length of an object id in the repository whose configuration is CONFIG (the
    project's, from the snapshot): 32 for `extensions.objectFormat = sha256`."""
    return 32 if config and _OBJECT_FORMAT.search(config) else 20
