"""Whether git's data is what git itself wrote (the index: run.gitindex): a loose
object (its hash), a pack (`git index-pack --verify`), git's data directories (nothing
there git never makes), packed-refs; and what the refs, reflogs and pseudo-refs hold."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path

from .protected import is_layout

# Objects the workload wrote, verified after the run (decompressed bytes, over every
# git directory of the run): past it, what is left unverified goes.
MAX_VERIFY_BYTES = 4 << 30
_OBJECT_TYPES = (b"blob", b"tree", b"commit", b"tag")



def lines_matching(data: bytes, pattern: bytes) -> set[bytes]:
    return {ln.strip() for ln in data.splitlines() if re.match(pattern, ln.strip())}


def loose_problem(dir_fd: int, name: str, oid: str, budget: list[int]) -> str | None:
    """Why the loose object NAME (OID) is not what its name says, or None."""
    h = hashlib.new("sha1" if len(oid) == 40 else "sha256")
    d = zlib.decompressobj()
    head = b""
    total = 0
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "rb") as f:
            while chunk := f.read(1 << 20):
                data = d.decompress(chunk, 1 << 22)
                while True:
                    total += len(data)
                    budget[0] -= len(data)
                    if budget[0] < 0:
                        return "written by the workload past what kooi verifies in a run: removed"
                    if len(head) < 64:
                        head += data[:64]
                    h.update(data)
                    if not d.unconsumed_tail:
                        break
                    data = d.decompress(d.unconsumed_tail, 1 << 22)
            tail = d.flush()
            total += len(tail)
            h.update(tail)
            if len(head) < 64:
                head += tail[:64]
    except zlib.error:
        return "not an object git wrote (it does not inflate): removed"
    kind, _, rest = head.partition(b" ")
    size, nul, _ = rest.partition(b"\0")
    if kind not in _OBJECT_TYPES or not nul or not size.isdigit() or int(size) != total - len(kind) - len(size) - 2:
        return "not an object git wrote (its header): removed"
    if h.hexdigest() != oid:
        return ("rewritten under its name (its content does not match it; the host's `git diff` would not show "
                "the change, `git checkout` would write it): removed, so the history that needs it is broken until "
                "it is fetched again")
    return None


def lfs_object_problem(dir_fd: int, name: str, budget: list[int]) -> str | None:
    """Why the Git LFS object NAME (the SHA-256 of its content) is not what its name says."""
    h = hashlib.sha256()
    with os.fdopen(os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd), "rb") as f:
        while chunk := f.read(1 << 20):
            budget[0] -= len(chunk)
            if budget[0] < 0:
                return "written by the workload past what kooi verifies in a run: removed (`git lfs fetch` gets it again)"
            h.update(chunk)
    if h.hexdigest() != name:
        return ("rewritten under its name (its content does not hash to it; git-lfs would write it into the file "
                "at the host's next checkout): removed (`git lfs fetch` gets it again)")
    return None


def pack_problem(fd: int, stem: str, budget: list[int]) -> str | None:
    """Why the pack STEM (and its index) in FD is not what git wrote (`git index-pack
    --verify`: every object hashed, the index compared), run outside any repository
    with no configuration."""
    size = os.stat(f"{stem}.pack", dir_fd=fd, follow_symlinks=False).st_size
    budget[0] -= size
    if budget[0] < 0:
        return "written by the workload past what kooi verifies in a run"
    fmt = "sha1" if len(stem) == len("pack-") + 40 else "sha256"
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CEILING_DIRECTORIES": "/", "LC_ALL": "C"}
    try:
        # what `git verify-pack` runs: every object hashed, the index compared
        r = subprocess.run(["git", "index-pack", f"--object-format={fmt}", "--verify", f"{stem}.pack"],
                           cwd=f"/proc/self/fd/{fd}", env=env, capture_output=True, text=True, timeout=600,
                           pass_fds=(fd,))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"not verified ({exc})"
    if r.returncode != 0:
        return f"not a pack git wrote (`git verify-pack`: {(r.stderr.strip().splitlines() or ['failed'])[-1][:200]})"
    return None


def bound_problems(fd: int, rel: str, out: list[str], budget: list[int]) -> None:
    """Entries in git's data directories git never makes there (a symlink, a FIFO, a
    device; a repository's layout, whose HEAD goes): removed, named in OUT (relative
    paths)."""
    names = set()
    for e in os.scandir(fd):
        budget[0] -= 1
        if budget[0] < 0:
            # Said, never a silent stop (review 40: a link among the entries past it stayed)
            raise OSError(errno.E2BIG, "more entries than kooi checks there; remove the extra directories")
        names.add(e.name)
        child = f"{rel}/{e.name}"
        if e.is_dir(follow_symlinks=False):
            sub = os.open(e.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            try:
                bound_problems(sub, child, out, budget)
            finally:
                os.close(sub)
        elif not e.is_file(follow_symlinks=False):
            os.unlink(e.name, dir_fd=fd)
            out.append(child)
    if is_layout(names):
        os.unlink("HEAD", dir_fd=fd)
        out.append(f"{rel}/HEAD")


# The most refs kooi reads of one repository (loose and packed); past it, none is compared.
MAX_REFS = 100_000


def _files_below(top: int, rel: str, size: int,
                 skip: tuple[type[OSError], ...]) -> Iterator[tuple[str, bytes | None]]:
    """(path, its first SIZE bytes) of every file below REL in the directory TOP (a
    descriptor), (path, None) of every directory, never through a symlink, lock files
    left out; a directory whose opening raises one of SKIP is left out, any other
    error raised."""
    todo = [rel]
    while todo:
        rel = todo.pop()
        try:
            dfd = os.open(rel, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
        except skip:
            continue
        try:
            for e in os.scandir(dfd):
                child = f"{rel}/{e.name}"
                if e.is_dir(follow_symlinks=False):
                    todo.append(child)
                    yield child, None
                elif e.is_file(follow_symlinks=False) and not e.name.endswith(".lock"):
                    with os.fdopen(os.open(e.name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd), "rb") as f:
                        data = f.read(size)
                    yield child, data
        finally:
            os.close(dfd)


def read_refs(gitdir: str | os.PathLike[str]) -> tuple[dict[str, str], str] | None:
    """The refs of the git directory GITDIR (loose ones over packed-refs: what git reads)
    and what HEAD names, never through a symlink; None when it holds more than MAX_REFS
    or cannot be read."""
    refs: dict[str, str] = {}
    try:
        top = os.open(gitdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fd = os.open("packed-refs", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=top)
            with os.fdopen(fd, "rb") as f:
                for line in f.read(64 << 20).splitlines():
                    oid, _, name = line.partition(b" ")
                    if name.startswith(b"refs/") and not oid.startswith((b"#", b"^")):
                        refs[name.decode(errors="replace")] = oid.decode(errors="replace").lower()
        except FileNotFoundError:
            pass
        for child, data in _files_below(top, "refs", 512, (OSError,)):
            if data is not None:
                refs[child] = ref_value(data)
            if len(refs) > MAX_REFS:
                return None
        try:
            fd = os.open("HEAD", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=top)
            with os.fdopen(fd, "rb") as f:
                head = f.read(512).strip().decode(errors="replace")
        except OSError:
            head = ""
    except OSError:
        return None
    finally:
        os.close(top)
    head = head.removeprefix("ref: ")
    return refs, head.lower() if HEX_ID_TEXT.fullmatch(head) else head


_LOOSE_ID = re.compile(rb"([0-9a-fA-F]{64}|[0-9a-fA-F]{40})(?:[ \t\n\r\0]|$)")


def ref_value(data: bytes) -> str:
    """A loose ref's content as git reads it (refs/files-backend.c,
    parse_loose_ref_contents): trailing blanks trimmed, `ref:` and the name it points
    to, or an id followed by nothing, a blank or a NUL (review 47: `ID\\0junk` and `ID
    junk` are ID to git); anything else as it is (a broken ref to git)."""
    data = data.rstrip(b" \t\n\r")
    if data.startswith(b"ref:"):
        return "ref: " + data[4:].lstrip(b" \t\n\r").decode(errors="replace")
    if (m := _LOOSE_ID.match(data)) is not None:
        return m.group(1).decode().lower()
    return data.decode(errors="replace")


def refs_changed(before: dict[str, str], after: dict[str, str], own: set[str], limit: int = 50) -> list[tuple[str, str]]:
    """(ref, change) for every ref that BEFORE and AFTER disagree on, but the branches in
    OWN (the ones the run worked on: HEAD's before and after); the first LIMIT, then a count."""
    out = []
    for ref in sorted(set(before) | set(after)):
        b, a = before.get(ref), after.get(ref)
        if b == a or ref in own:
            continue
        out.append((ref, "created" if b is None else "deleted" if a is None else f"moved from {b[:12]} to {a[:12]}"))
    if len(out) > limit:
        out = out[:limit] + [("(more)", f"{len(out) - limit} more refs changed")]
    return out


def git_plumbing(gitdir: str | os.PathLike[str], *args: str, timeout: float = 120,
                 stdin: bytes | None = None) -> bytes | None:
    """Run a git plumbing command on the git directory GITDIR (objects and refs only: no
    work tree, no system or global configuration, no hooks, no fsmonitor, no replace
    refs), STDIN its input; its stdout, or None when it failed."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "GIT_DIR": str(gitdir), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_NO_REPLACE_OBJECTS": "1", "GIT_OPTIONAL_LOCKS": "0",
           "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    try:
        # The caches git takes on trust are never read (review 39: a junk multi-pack-index
        # made `cat-file` fail, and a commit counted as none).
        r = subprocess.run(["git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null",
                            "-c", "core.multiPackIndex=false", "-c", "core.commitGraph=false", *args],
                           cwd="/", env=env, input=stdin if stdin is not None else b"", capture_output=True,
                           timeout=timeout, check=False)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None  # ValueError: an argument git could not be given (a NUL: review 47)
    return r.stdout if r.returncode == 0 else None


def entry_target(gitdir: str | os.PathLike[str], mode: int, oid: str) -> bytes | None:
    """What a tree or index entry of git MODE naming OID points to: a symlink's target
    (its blob), a gitlink's commit id (run.listed judges both)."""
    if mode >> 12 == 0o12:
        return git_plumbing(gitdir, "cat-file", "blob", oid)
    return oid.encode() if mode >> 12 == 0o16 else None


def tree_changes(gitdir: str | os.PathLike[str], old: str | None, new: str) -> list[tuple[str, int, str]] | None:
    """(path, mode, object id) of every file the commit NEW adds or changes against the
    commit OLD (all of NEW's files without OLD); None when git cannot tell."""
    if old:
        out = git_plumbing(gitdir, "diff-tree", "-r", "-z", "--no-renames", "--raw", old, new)
    else:
        out = git_plumbing(gitdir, "ls-tree", "-r", "-z", "--full-tree", new)
    if out is None:
        return None
    found: list[tuple[str, int, str]] = []
    if old:
        parts = out.split(b"\0")
        for i in range(0, len(parts) - 1, 2):
            meta, path = parts[i].split(b" "), parts[i + 1]
            if len(meta) >= 5 and meta[4][:1] in (b"A", b"M", b"T"):
                found.append((path.decode(errors="replace"), int(meta[1], 8), meta[3].decode()))
    else:
        for entry in out.split(b"\0"):
            head, _, name = entry.partition(b"\t")
            bits = head.split(b" ")
            if len(bits) == 3 and bits[1] in (b"blob", b"commit"):  # files, links, gitlinks
                found.append((name.decode(errors="replace"), int(bits[0], 8), bits[2].decode()))
    return found


# What else a host's git checks out besides refs and HEAD (review 25: a commit of the
# workload's left only in HEAD's reflog came back with `git checkout -`): the names git
# resolves at a git directory's top (refs.c, is_pseudoref_syntax: ORIG_HEAD, FETCH_HEAD,
# MERGE_HEAD, CHERRY_PICK_HEAD, AUTO_MERGE, ...) and the reflogs (`HEAD@{1}`, `git
# checkout -`, which takes the commit a "checkout: moving from X" message names).
PSEUDO_REF = re.compile(r"[A-Z_-]+")
HEX_ID_TEXT = re.compile(r"[0-9a-fA-F]{40}|[0-9a-fA-F]{64}")
# git reads ids in either case (review 37: an upper-case id in a reflog line went unread).
HEX_TOKEN = re.compile(rb"(?<![0-9a-fA-F])(?:[0-9a-fA-F]{64}|[0-9a-fA-F]{40})(?![0-9a-fA-F])")
NULL_IDS = {"0" * 40, "0" * 64}
MAX_TIPS = 200_000
MAX_TIP_FILE = 64 << 20


# `git checkout -` takes NAME from the newest "checkout: moving from NAME to ..." (up to
# the first " to "). git's reflog parser skips a tab before the message only where there
# is one (review 46): any occurrence in a line is read.
_MOVING_FROM = re.compile(rb"checkout: moving from (.*?) to ")
MAX_NAMES = 100_000


def packed_refs_problem(data: bytes) -> str | None:
    """Why git's packed-refs DATA is not one git writes: lines of its grammar only (a
    header first, `ID NAME`, `^ID` after a ref), ids in lower case, names in order and
    each once (review 44: git's binary search found the first of two `refs/tags/v1`,
    kooi the last; an upper-case replace ref passed the filter)."""
    prev, last_ref = b"", False
    for i, line in enumerate(data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n")):
        if i == 0 and line.startswith(b"# pack-refs with:"):
            continue
        if line.startswith(b"^") and last_ref and _PEELED.fullmatch(line):
            last_ref = False
            continue
        m = _PACKED.fullmatch(line)
        if m is None:
            return "a packed-refs line git does not write"
        if m.group(1) <= prev:
            return "packed refs out of order or repeated"
        prev, last_ref = m.group(1), True
    return None


_PACKED = re.compile(rb"(?:[0-9a-f]{40}|[0-9a-f]{64}) (refs/\S+)")
_PEELED = re.compile(rb"\^(?:[0-9a-f]{40}|[0-9a-f]{64})")


def read_tips(gitdir: str | os.PathLike[str]) -> dict[str, str] | None:
    """Every object id GITDIR's pseudo-refs and reflogs hold (an entry's old and new
    ids and the ids its message names) and every id a name they give resolves to, with
    where ({id: "ORIG_HEAD" or "HEAD@{2}"}), never through a symlink; None past MAX_TIPS
    or MAX_NAMES or when they cannot be read.

    Git resolves any path in the git directory as a ref (review 44: `git checkout -`
    after "checkout: moving from objects/info/x") and follows `ref: NAME` in any file it
    reads as one, to any such path (review 46: ORIG_HEAD, a branch, a reflog as
    `ref: objects/info/y`): the names a reflog's checkouts give and every symref in the
    pseudo-refs, refs and reflogs are resolved by git itself (resolve_names), not by a
    second reading of git's rules."""
    tips: dict[str, str] = {}
    names: dict[bytes, str] = {}

    def take(data: bytes, label: str) -> bool:
        if len(data) >= MAX_TIP_FILE:
            return False  # git reads its newest entries at the end (review 37): unread, said
        for m in HEX_TOKEN.finditer(data):
            tips.setdefault(m.group().decode().lower(), label)
        return len(tips) <= MAX_TIPS

    def name(raw: bytes, label: str) -> bool:
        if raw and b"\n" not in raw and not HEX_TOKEN.fullmatch(raw):
            names.setdefault(raw, label)
        return len(names) <= MAX_NAMES

    def symref(rel: str, data: bytes) -> bool:
        # git: the file's first bytes "ref:", blanks, the name (its end trimmed)
        if not data.startswith(b"ref:"):
            return True
        return name(rel.encode(), rel) and name(data[4:].strip(), f"{rel} -> {data[4:].strip()[:80].decode(errors='replace')}")

    try:
        top = os.open(gitdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        for e in os.scandir(top):
            if e.name != "HEAD" and PSEUDO_REF.fullmatch(e.name) and e.is_file(follow_symlinks=False):
                with os.fdopen(os.open(e.name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=top), "rb") as f:
                    pseudo = f.read(MAX_TIP_FILE)
                if not take(pseudo, e.name) or not symref(e.name, pseudo):
                    return None
        for child, ref in _files_below(top, "refs", 4096, (FileNotFoundError, NotADirectoryError)):
            if ref is not None and not symref(child, ref):
                return None
        # A directory that cannot be read is no reflog-free one: unreadable (None).
        for child, data in _files_below(top, "logs", MAX_TIP_FILE, (FileNotFoundError, NotADirectoryError)):
            if data is None:
                continue
            if not symref(child, data):
                return None
            # An entry's new id named by the entry, before the ids its old id and
            # message name.
            at = [(line, f"{child.removeprefix('logs/')}@{{{n}}}")
                  for n, line in enumerate(reversed(data.splitlines()))]
            if len(data) >= MAX_TIP_FILE or not all(take(line[41:105].split(b" ", 1)[0], where) for line, where in at) \
                    or not all(take(line, where) for line, where in at):
                return None
            if not all(name(m.group(1), f"{m.group(1)[:80].decode(errors='replace')} ({where})")
                       for line, where in at for m in _MOVING_FROM.finditer(line)):
                return None
    except OSError:
        return None
    finally:
        os.close(top)
    resolved = resolve_names(gitdir, list(names))
    if resolved is None:
        return None
    for raw, oid in resolved.items():
        tips.setdefault(oid, names[raw])
    return tips if len(tips) <= MAX_TIPS else None


def resolve_names(gitdir: str | os.PathLike[str], names: list[bytes], calls: int = 64) -> dict[bytes, str] | None:
    """{name: object id} of the NAMES git resolves in GITDIR (as `git checkout NAME`
    would: every rule of git's, symrefs followed); None when git cannot tell. Git gives
    up on the whole batch at some names (`HEAD@{999}`: "log for 'HEAD' only has 1
    entries"), which no host command resolves either: the batch is halved until they
    stand alone, at most CALLS git runs."""
    budget = [calls]
    works: list[bool] = []  # whether git runs here at all, asked once a batch fails

    def batch(part: list[bytes]) -> dict[bytes, str] | None:
        if not part:
            return {}
        budget[0] -= 1
        if budget[0] < 0:
            return None
        out = git_plumbing(gitdir, "cat-file", "--batch-check=%(objectname)", stdin=b"".join(n + b"\n" for n in part))
        if out is None:
            if not works:
                works.append(git_plumbing(gitdir, "cat-file", "--batch-check=%(objectname)") is not None)
            if not works[0]:
                return None  # git fails on no name at all: nothing is resolved, said (never skipped)
            if len(part) == 1:
                return {}  # git dies on it: nothing a host command checks out
            half = len(part) // 2
            first, second = batch(part[:half]), batch(part[half:])
            return None if first is None or second is None else {**first, **second}
        lines = out.splitlines()
        if len(lines) != len(part):
            return None
        return {n: line.decode().lower() for n, line in zip(part, lines)
                if HEX_ID_TEXT.fullmatch(line.decode(errors="replace"))}

    return batch(names)


def _kinds(gitdir: str | os.PathLike[str], names: list[str]) -> list[tuple[str, str]] | None:
    """(object id, type) of each of NAMES in GITDIR (`git cat-file --batch-check`; a name
    it lacks: (name, "missing")); None when git cannot tell."""
    out = git_plumbing(gitdir, "cat-file", "--batch-check=%(objectname) %(objecttype)",
                       stdin="".join(f"{n}\n" for n in names).encode())
    if out is None:
        return None
    lines = [line.partition(" ") for line in out.decode(errors="replace").splitlines()]
    return [(oid, kind) for oid, _, kind in lines] if len(lines) == len(names) else None


def commits_of(gitdir: str | os.PathLike[str], ids: list[str]) -> list[str] | None:
    """The IDS that name a commit (or a tag) in GITDIR's objects."""
    if not ids:
        return []
    kinds = _kinds(gitdir, ids)
    return None if kinds is None else [oid for oid, kind in kinds if kind in ("commit", "tag")]


def trees_named(gitdir: str | os.PathLike[str], ids: list[str]) -> list[tuple[str, str]] | None:
    """(id, tree) of the IDS that are a tree, or a tag (of a tag...) of one: what git's
    tree-ish takes (`git checkout ID -- .`), which `git log` drops without a word
    (review 50: a tag of a tree in ORIG_HEAD)."""
    if not ids:
        return []
    kinds = _kinds(gitdir, [f"{i}^{{}}" for i in ids])
    return None if kinds is None else [(i, oid) for i, (oid, kind) in zip(ids, kinds) if kind == "tree"]


def introduced(gitdir: str | os.PathLike[str], tips: list[str], old: list[str],
               max_commits: int) -> tuple[list[tuple[str, str, str, int, str]], int] | None:
    """(commit, the tip it was reached from, path, mode, object id) of every file that a
    commit reachable from TIPS but from none of OLD adds or changes against a parent
    (each parent of a merge; a root commit's files), newest first, and how many commits
    that was (MAX_COMMITS at most); None when git cannot tell."""
    found_tips, found_old = commits_of(gitdir, tips), commits_of(gitdir, old)
    if found_tips is None or found_old is None:
        return None  # unreadable is no "no commits" (review 39)
    tips, old = found_tips, found_old
    if not tips:
        return [], 0
    out = git_plumbing(gitdir, "log", "--stdin", f"--max-count={max_commits}", "-m", "--raw", "-z",
                       "--no-renames", "--no-abbrev", "--format=%x01%H%x02%S",
                       stdin="".join([f"{t}\n" for t in tips] + [f"^{o}\n" for o in old]).encode())
    if out is None:
        return None
    found: list[tuple[str, str, str, int, str]] = []
    commits: set[str] = set()
    for chunk in out.split(b"\x01")[1:]:
        head, _, rest = chunk.partition(b"\0")
        commit, _, source = head.decode(errors="replace").partition("\x02")
        commits.add(commit)
        parts = rest.lstrip(b"\n").split(b"\0")
        for i in range(0, len(parts) - 1, 2):
            meta, path = parts[i].split(b" "), parts[i + 1]
            if len(meta) >= 5 and meta[4][:1] in (b"A", b"M", b"T"):
                found.append((commit, source, path.decode(errors="replace"), int(meta[1], 8), meta[3].decode()))
    return found, len(commits)


def module_git_dirs(root: Path, limit: int) -> list[str]:
    """The submodules' repositories under the project's `.git/modules` (and theirs under
    their own modules/), as project paths, never through a link; at most LIMIT."""
    out: list[str] = []
    todo = [".git/modules"]
    while todo and len(out) < limit:
        rel = todo.pop()
        try:
            with os.scandir(root / rel) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        dirs = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        if rel != ".git/modules" and "HEAD" in {e.name for e in entries}:
            out.append(rel)
            todo += [f"{rel}/modules"] if "modules" in dirs else []
            continue
        todo += [f"{rel}/{d}" for d in reversed(dirs)]
    return out[:limit]


_WORKTREE = re.compile(rb"^\s*worktree\s*=\s*(.+?)\s*$", re.M | re.I)


def module_work_tree(root: Path, gitdir: str) -> str:
    """Where the submodule repository GITDIR (a project path) checks out: its
    core.worktree, as a project path; "" where it has none or it leads out."""
    try:
        with open(root / gitdir / "config", "rb") as f:
            m = _WORKTREE.search(f.read(1 << 16))
    except OSError:
        return ""
    if m is None:
        return ""
    rel = os.path.normpath(os.path.join(gitdir, m.group(1).decode(errors="replace").strip('"')))
    return "" if os.path.isabs(rel) or rel == "." or rel.startswith("..") else rel
