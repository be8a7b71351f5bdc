"""The throwaway git directories a Guard mounts over the project's while the workload
runs: made from the snapshot with git's data copied in (or bound), kooi's run block in
the project's git config and its placeholder repository; afterwards git's data copied
back, but for what a host's git must not act on (refused)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from .fsat import MAX_DATA_BYTES, Fingerprint, chown_tree, copy_at, fingerprint, open_dir, read_at, remove_at
from .gitdata import entry_target, lines_matching, packed_refs_problem
from .gitindex import index_canonical, index_hidden, index_walk, object_hashlen
from .protected import MAX_FILE, is_git_data
from .snapshot import Entry, GuardError, is_git_dir, restore

# While the workload runs, every git directory of the project (its own `.git`, a
# `gitdir:` target, each submodule's under modules/, a nested repository's) is a
# throwaway copy mounted over the real one: its configuration and hooks (everything but
# the data) from the snapshot, git's data files copied in (and back afterwards), git's
# data directories bound from the real one. The host's git, which runs whenever anyone
# looks at the project, never sees a config, hook, commondir or a renamed `.git` of the
# workload's while the run runs. Bound from the real git directory:
BOUND = ("objects", "refs", "logs", "lfs")
# Git's data that is never copied back from a throwaway: what a host's git would run
# (a rebase's or cherry-pick's todo list, with its `exec` lines, on `--continue`).
NOT_COPIED_BACK = frozenset({"rebase-merge", "rebase-apply", "sequencer"})
# Git's data that must stay (without HEAD the directory is no repository, and git takes
# a directory above it, of the workload's making, for one).
NEVER_REMOVED = frozenset({"HEAD", "objects", "refs"})
# A branch or a commit; never another kind of ref (review 16: HEAD left on
# refs/remotes/origin/main moved that ref with every commit, and `git diff origin/main`
# showed nothing).
_HEAD_RE = re.compile(rb"\A(?:ref: refs/heads/[A-Za-z0-9._/-]{1,240}|[0-9a-f]{40}|[0-9a-f]{64})\n?\Z")
# The empty repository kooi makes where a project has no .git, as the throwaway's mount
# point (Guard.shadows), and what it holds (names, fingerprints without the mode).
PLACEHOLDER_HEAD = b"ref: refs/heads/kooi-run-placeholder\n"
PLACEHOLDER_CONTENT = [("HEAD", ("file", len(PLACEHOLDER_HEAD), hashlib.sha256(PLACEHOLDER_HEAD).hexdigest())),
                       ("objects", ("dir", ())), ("refs", ("dir", ()))]
# The block kooi appends to a project's git config while a run lasts (Guard._pin_config).
RUN_BLOCK_START = "# kooi run: while a kooi run runs on this project, git looks into no submodule here (kooi removes this)"
RUN_BLOCK_END = "# kooi run: end"
# The object ids of the empty blob (SHA-1, SHA-256).
EMPTY_BLOBS = (bytes.fromhex("e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"),
               bytes.fromhex("473a0f4c3be8a93681a267e3b1e9a7dcda1185436fe141f7749120a303721813"))
# How many git directories (a throwaway each) and `.git` files (a copy each) a run takes.
MAX_GIT_DIRS = 32
MAX_GIT_FILES = 64


@dataclass
class Throwaway:
    """A git directory's throwaway copy (Guard.shadows): GIT (its path in the project) is
    COPY/GIT; BOUND: its data directories bound from the real one; COPIED: git's data
    files and other directories copied in, by name: (the real one's fingerprint, the
    copy's content) as they were; MADE: there was no git directory (kooi made an empty
    one for a workload's `git init` to go to)."""
    git: str
    copy: Path
    bound: tuple[str, ...] = ()
    copied: dict[str, tuple[Fingerprint | None, Fingerprint | None]] = field(default_factory=dict)
    made: bool = False
    owner: tuple[int, int] | None = None
    refused: list[dict[str, str]] = field(default_factory=list)  # found in its data


class Shadows:
    """The part of run.guard.Guard that makes its throwaway git directories and copies
    git's data back from them. The attributes below are Guard's fields, declared here for
    the type checker."""

    root: Path
    unprotected: tuple[str, ...]
    protected: dict[str, Entry]
    git_dirs: tuple[str, ...]
    nested: tuple[str, ...]
    shadow: Path | None
    throwaways: list[Throwaway]
    file_copies: list[tuple[str, Path]]
    nested_shadows: list[tuple[str, Path]]
    made_files: list[str]
    pinned: str | None

    def _git_dirs_now(self) -> list[str]:
        """Every git directory that gets a throwaway: the project's own, a `gitdir:`
        target, nested repositories' and the submodules' under .git/modules, where they
        are real directories and protected."""
        out = [g for g in self.git_dirs if g not in self.unprotected and self.protected.get(g, Entry("x")).kind == "dir"]
        # The submodules' repositories in each one's modules/ (a nested repository's too:
        # review 39), each a throwaway of its own with its data bound in.
        mods = tuple(g for g in out if f"{g}/modules" not in self.unprotected)
        out += [k for k, e in self.protected.items() if e.kind == "dir" and any(k.startswith(f"{g}/modules/") for g in mods)
                and is_git_dir(self.root, k)]
        return sorted(dict.fromkeys(out), key=lambda g: (len(Path(g).parts), g))

    def _mine(self, t: Throwaway, rel: str) -> bool:
        """REL belongs to T's git directory (not to another inside it: a submodule's
        under .git/modules is inside the project's .git, whose throwaway is not its)."""
        if not (rel == t.git or rel.startswith(t.git + "/")):
            return False
        return not any(o.git.startswith(t.git + "/") and rel.startswith(o.git + "/") for o in self.throwaways)

    def shadows(self, base: Path) -> list[tuple[str, Path]]:
        """Make the throwaway git directories in BASE (a new directory), their config
        and hooks from the snapshot, git's data files copied from the project: what to
        mount over the project's while the workload runs, parents first: (path in the
        project, host path). nested_shadows: the same for containers the workload starts,
        without the data directories of nested repositories (which the workload could
        swap for a symlink before such a container starts)."""
        gits = self._git_dirs_now()
        files = [f for f in (".git", *self.nested) if f not in self.unprotected
                 and self.protected.get(f, Entry("x")).kind == "file"]
        made = ".git" not in self.protected and ".git" not in self.unprotected
        if len(gits) > MAX_GIT_DIRS or len(files) > MAX_GIT_FILES:
            raise GuardError(f"the project holds {len(gits)} git directories and {len(files)} `.git` files (nested "
                             f"repositories, submodules); a run takes at most {MAX_GIT_DIRS} and {MAX_GIT_FILES}")
        base.mkdir(mode=0o700, parents=True)
        self.shadow = base
        try:
            return self._make_shadows(base, gits, files, made)
        except BaseException:
            self.throwaways, self.file_copies = [], []  # nothing of a half-made copy goes back
            raise

    def _make_shadows(self, base: Path, gits: list[str], files: list[str], made: bool) -> list[tuple[str, Path]]:
        self.throwaways = [Throwaway(g, base / f"g{i}") for i, g in enumerate(gits)]
        mounts: list[tuple[str, Path]] = []
        nested: list[tuple[str, Path]] = []
        budget = [MAX_DATA_BYTES]
        for t in self.throwaways:
            t.copy.mkdir(mode=0o700)
            for rel, e in sorted(((k, e) for k, e in self.protected.items() if self._mine(t, k)),
                                 key=lambda kv: len(Path(kv[0]).parts)):
                restore(t.copy, rel, e)
            real_fd = open_dir(self.root, t.git)
            copy_fd = open_dir(t.copy, t.git)
            try:
                st = os.fstat(real_fd)
                t.owner = (st.st_uid, st.st_gid)
                bound = [*BOUND, *(p.rsplit("/", 1)[1] for p in self.unprotected if p.rsplit("/", 1)[0] == t.git)]
                for name in sorted(os.listdir(real_fd)):
                    if name in bound and stat.S_ISDIR(os.stat(name, dir_fd=real_fd, follow_symlinks=False).st_mode):
                        os.mkdir(name, 0o755, dir_fd=copy_fd)
                        t.bound += (name,)
                    elif is_git_data(name) and name != "modules":
                        copy_at(real_fd, name, copy_fd, name, None, budget)
                        t.copied[name] = (fingerprint(real_fd, name), fingerprint(copy_fd, name, content=True))
            finally:
                os.close(real_fd)
                os.close(copy_fd)
            chown_tree(t.copy / t.git, t.owner)
            mounts.append((t.git, t.copy / t.git))
            under_git = t.git == ".git" or t.git.startswith(".git/")
            nested.append((t.git, t.copy / t.git))
            for name in t.bound:
                mounts.append((f"{t.git}/{name}", self.root / t.git / name))
                if under_git:  # the real .git is out of the workload's reach: it is never swapped
                    nested.append((f"{t.git}/{name}", self.root / t.git / name))
        if made:
            t = Throwaway(".git", base / "g-new", made=True)
            (t.copy / ".git").mkdir(mode=0o755, parents=True)
            try:
                st = os.stat(self.root)
                t.owner = (st.st_uid, st.st_gid)
                chown_tree(t.copy / ".git", t.owner)
            except OSError:
                pass
            self.throwaways.append(t)
            mounts.append((".git", t.copy / ".git"))
            nested.append((".git", t.copy / ".git"))
            # The mount point, made here rather than by the engine: an empty repository
            # of kooi's (no config), so the host's git, walking up from anywhere in the
            # project while the run lasts, stops there and never takes the project's top
            # for a bare repository of the workload's making.
            top = self.root / ".git"
            top.mkdir(mode=0o755)
            (top / "objects").mkdir()
            (top / "refs").mkdir()
            (top / "HEAD").write_bytes(PLACEHOLDER_HEAD)
        for i, f in enumerate(files):
            copy = base / f"f{i}" / ".git"
            copy.parent.mkdir(mode=0o700)
            restore(copy.parent, ".git", self.protected[f])
            mounts.append((f, copy))
            nested.append((f, copy))
            self.file_copies.append((f, copy))
        # .gitmodules too (an empty one where there was none): while the run lasts, the
        # workload can name no submodule, nor make git look into one (ignore = none).
        if ".gitmodules" not in self.unprotected and self.protected.get(".gitmodules", Entry("file")).kind == "file":
            copy = base / "gitmodules" / ".gitmodules"
            copy.parent.mkdir()
            if ".gitmodules" in self.protected:
                restore(base / "gitmodules", ".gitmodules", self.protected[".gitmodules"])
            else:
                copy.write_bytes(b"")
                self.made_files.append(".gitmodules")
                # The mount point, made here: on userns-remap the engine's root may not
                # create files in the project.
                os.close(os.open(self.root / ".gitmodules", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                                 0o644))
            chown_tree(copy.parent, (os.stat(self.root).st_uid, os.stat(self.root).st_gid))
            mounts.append((".gitmodules", copy))
            nested.append((".gitmodules", copy))
            self.file_copies.append((".gitmodules", copy))
        self._pin_config()

        def depth(m: tuple[str, Path]) -> int:
            return len(Path(m[0]).parts)
        self.nested_shadows = sorted(nested, key=depth)
        return sorted(mounts, key=depth)

    def _pin_config(self) -> None:
        """While the run lasts, the project's own git (the host's) looks into no
        submodule: a workload that fills a gitlink's directory with a git directory of
        its own (or moves a nested repository aside and makes a new one, past any
        mount) would otherwise have its configuration run by the host's next
        `git status`. A block appended to the real config (which the workload never
        sees) until check() removes it; a killed run's is removed by the next snapshot."""
        top = next((t for t in self.throwaways if t.git == ".git" and not t.made), None)
        if top is None or self.protected.get(".git/config", Entry("x")).kind != "file":
            return
        names = re.findall(r'^\s*\[submodule\s+"((?:[^"\\\n]|\\.)*)"\s*\]',
                           self.protected.get(".gitmodules", Entry("x")).data.decode(errors="replace"), re.M)
        block = [RUN_BLOCK_START, "[diff]", "\tignoreSubmodules = all", "[fetch]", "\trecurseSubmodules = false",
                 "[submodule]", "\trecurse = false"]
        for n in names:
            block += [f'[submodule "{n}"]', "\tignore = all", "\tfetchRecurseSubmodules = false"]
        block.append(RUN_BLOCK_END)
        fd = os.open(self.root / ".git" / "config", os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        try:
            os.write(fd, ("\n" + "\n".join(block) + "\n").encode())
        finally:
            os.close(fd)
        self.pinned = ".git"

    def _is_placeholder(self) -> bool:
        """The project's .git is kooi's empty repository (Guard.shadows), untouched."""
        try:
            fd = open_dir(self.root, ".git")
        except OSError:
            return False
        try:
            mine = fingerprint(fd, ".", content=True)
        finally:
            os.close(fd)
        return mine is not None and [(n, c if c is None else c[:1] + c[2:]) for n, c in mine[2]] == \
            PLACEHOLDER_CONTENT

    def _drop_placeholder(self) -> None:
        """A killed run's placeholder .git, and the empty .gitmodules the engine made as
        that run's mount point."""
        if not self._is_placeholder():
            return
        shutil.rmtree(self.root / ".git")
        try:
            st = os.lstat(self.root / ".gitmodules")
            if stat.S_ISREG(st.st_mode) and st.st_size == 0:
                os.unlink(self.root / ".gitmodules")
        except FileNotFoundError:
            pass

    def _unpin_config(self) -> None:
        """Remove kooi's run block from the project's git config (this run's, or a
        killed run's)."""
        p = self.root / ".git" / "config"
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return
        with os.fdopen(fd, "rb") as f:
            text = f.read(MAX_FILE + 1).decode(errors="surrogateescape")
        start = text.find("\n" + RUN_BLOCK_START)
        if start < 0:
            return
        end = text.find(RUN_BLOCK_END, start)
        end = len(text) if end < 0 else end + len(RUN_BLOCK_END) + 1
        st = os.lstat(p)
        tmp = p.with_name(".kooi-config.new")
        tfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, stat.S_IMODE(st.st_mode))
        with os.fdopen(tfd, "wb") as f:
            f.write((text[:start] + text[end:]).encode(errors="surrogateescape"))
        os.rename(tmp, p)
        self.pinned = None


    def _copy_back(self, t: Throwaway) -> list[str]:
        """Git's data files the workload changed in T (the index, HEAD, packed-refs, a
        rebase's state...) into the project's git directory, each replaced whole; one the
        host changed meanwhile is kept and named."""
        warnings = []
        copy_fd = open_dir(t.copy, t.git)
        real_fd = open_dir(self.root, t.git)
        budget = [MAX_DATA_BYTES]
        try:
            names = {n for n in os.listdir(copy_fd) if is_git_data(n)} | set(t.copied)
            # The index and a split index's shared parts go back together or not at all
            # (review 16: a refused shared part and the index naming it left every git
            # command on the host failing).
            index_refused = None
            if "index" in names and fingerprint(copy_fd, "index", content=True) != t.copied.get("index", (None, None))[1]:
                _canonical_index(copy_fd, self._hashlen(t.git))
            for name in sorted(n for n in names - set(t.bound) if n == "index" or n.startswith("sharedindex.")):
                now = fingerprint(copy_fd, name, content=True)
                if now != t.copied.get(name, (None, None))[1] and \
                        (why := self._data_refusal(copy_fd, real_fd, name, now, t.git)) is not None:
                    index_refused = f"{name}: {why}"
                    break
            for name in sorted(names - set(t.bound) - {"modules"}):
                was_real, was_copy = t.copied.get(name, (None, None))
                now = fingerprint(copy_fd, name, content=True)
                if now == was_copy:
                    continue
                if index_refused is not None and (name == "index" or name.startswith("sharedindex.")):
                    t.refused.append({"path": f"{t.git}/{name}", "change": f"the index kept whole ({index_refused})",
                                      "how": "shadowed"})
                    continue
                if fingerprint(real_fd, name) != was_real:
                    warnings.append(f"{t.git}/{name} changed on the host while the run ran: the run's is dropped")
                    continue
                if name == "packed-refs" and now is not None and now[0] == "file" \
                        and self._strip_replace_refs(t, copy_fd, real_fd):
                    now = fingerprint(copy_fd, name, content=True)
                why = self._data_refusal(copy_fd, real_fd, name, now, t.git)
                if why is not None:
                    t.refused.append({"path": f"{t.git}/{name}", "change": why, "how": "shadowed"})
                    continue
                if now is None:
                    remove_at(real_fd, name)
                    continue
                if now[0] == "other":
                    continue
                tmp = f".kooi-{name}.new"
                remove_at(real_fd, tmp)
                copy_at(copy_fd, name, real_fd, tmp, t.owner, budget)
                if now[0] == "dir" and was_real is not None:
                    old = f".kooi-{name}.old"
                    remove_at(real_fd, old)
                    os.rename(name, old, src_dir_fd=real_fd, dst_dir_fd=real_fd)
                    os.rename(tmp, name, src_dir_fd=real_fd, dst_dir_fd=real_fd)
                    remove_at(real_fd, old)
                else:
                    os.rename(tmp, name, src_dir_fd=real_fd, dst_dir_fd=real_fd)
        finally:
            os.close(copy_fd)
            os.close(real_fd)
        return warnings

    def _strip_replace_refs(self, t: Throwaway, copy_fd: int, real_fd: int) -> bool:
        """Replace refs the workload packed into packed-refs (`git replace`, then `git
        pack-refs`): git would show another object in the history's place. Taken out of
        the run's packed-refs (its other refs, which pack-refs removed from refs/, stay),
        listed; True when any was."""
        pat = rb"^[0-9a-f]{40,64} refs/replace/"
        data = read_at(copy_fd, "packed-refs")
        new = lines_matching(data, pat) - lines_matching(read_at(real_fd, "packed-refs"), pat)
        if not new:
            return False
        keep = [ln for ln in data.splitlines(keepends=True) if ln.strip() not in new]
        tmp = ".kooi-packed-refs.new"
        remove_at(copy_fd, tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=copy_fd)
        with os.fdopen(fd, "wb") as f:
            f.write(b"".join(keep))
        os.rename(tmp, "packed-refs", src_dir_fd=copy_fd, dst_dir_fd=copy_fd)
        for ln in sorted(new):
            t.refused.append({"path": f"{t.git}/packed-refs", "change": "a replace ref "
                              f"({ln.split(b' ', 1)[1].decode(errors='replace')[:120]}: git would show another "
                              "object in the history's place): taken out", "how": "put back"})
        return True

    def _risky(self, rel: str, mode: int, link_target: bytes | None, names: set[str]) -> str | None:
        raise NotImplementedError  # Guard's (run.listed)

    def _places(self, git: str) -> list[str]:
        raise NotImplementedError  # Guard's (run.listed)

    def _hashlen(self, git: str) -> int:
        """The object id length of the git directory GIT, from its configuration as the
        snapshot holds it (never the workload's copy)."""
        e = self.protected.get(f"{git}/config")
        return object_hashlen(e.data if e is not None and e.kind == "file" else None)

    def _data_refusal(self, copy_fd: int, real_fd: int, name: str, now: Fingerprint | None,
                      git: str = ".git") -> str | None:
        """Why git's data file NAME as the workload left it (NOW, in COPY_FD) is not
        copied back over the project's (in REAL_FD, as it was when the run started) of
        the git directory GIT (its place in the project)."""
        if name in NOT_COPIED_BACK:
            return "state a host's git would act on (`git rebase --continue` runs its exec lines): not copied back"
        if now is None:
            return "removed: kept the project's" if name in NEVER_REMOVED else None
        if name == "HEAD":
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=copy_fd)
            try:
                head = os.read(fd, 512)
            finally:
                os.close(fd)
            if now[0] != "file" or not _HEAD_RE.match(head):
                return "not a branch or a commit: kept the project's"
        if name.startswith("sharedindex.") and now[0] == "file":
            # git reads it against the main index's bitmaps and by threads kooi does not
            # follow (review 43): never the workload's
            return "a split index's shared part: kept the project's"
        if name == "index" and now[0] == "file":
            after: set[bytes] = set()
            staged: dict[bytes, bytes] = {}
            hashlen = self._hashlen(git)
            problem = index_walk(read_at(copy_fd, name), after, staged, hashlen, split=False)  # paths, flags, objects
            if problem is not None:
                return f"{problem}: kept the project's"
            # Review 15: a protected file staged, not in the work tree (add, then rm): the
            # host's `git checkout -- .`, which `git status` suggests, writes it.
            was: dict[bytes, bytes] = {}
            for n in os.listdir(real_fd):
                if n == "index" or n.startswith("sharedindex."):
                    index_walk(read_at(real_fd, n), None, was, hashlen)
            touched = []
            # Where its files are checked out (a submodule's, from .git/modules: its
            # core.worktree; until now its index was judged at .git/modules and kept whole).
            for top in self._places(git):
                names = {(f"{top}/" if top else "") + p.split(b"\0")[0].decode(errors="replace") for p in staged}
                for path, entry in staged.items():
                    rel = (f"{top}/" if top else "") + path.split(b"\0")[0].decode(errors="replace")
                    mode = int.from_bytes(entry[:4], "big")
                    # An empty file writes nothing that runs (kooi's own placeholders, an
                    # empty .gitmodules, are staged by a workload's `git add -A`).
                    if was.get(path) == entry or entry[4:] in EMPTY_BLOBS and mode >> 12 == 0o10:
                        continue
                    target = entry_target(self.root / git, mode, entry[4:].hex())
                    if (why := self._risky(rel, mode, target, names)) is not None:
                        touched.append(f"{rel}: {why}")
            touched.sort()
            if touched:
                return (f"staged ({'; '.join(touched[:3])}): the host's `git checkout` or `git restore` would write "
                        "the workload's version; kept the project's")
            new = sorted(after - (index_hidden(read_at(real_fd, name), hashlen) or set()))
            if new:
                return (f"entries flagged assume-unchanged or skip-worktree ({', '.join(p.decode(errors='replace') for p in new[:3])}"
                        "): the host's `git status` and `git diff` would not show their changes; kept the project's")
        if name == "packed-refs" and now[0] == "file" and (why := packed_refs_problem(read_at(copy_fd, name))):
            return f"{why}: kept the project's"
        if name == "shallow" and now[0] == "file":
            # git reads ids in either case (review 44)
            if {x.lower() for x in lines_matching(read_at(copy_fd, name), rb"^[0-9a-fA-F]{40,64}$")} \
                    - {x.lower() for x in lines_matching(read_at(real_fd, name), rb"^[0-9a-fA-F]{40,64}$")}:
                return "commits marked shallow (the host's git would show the history cut short): kept the project's"
        return None


def _canonical_index(copy_fd: int, hashlen: int) -> None:
    """The throwaway's index (the workload's, in kooi's copy) written again from what
    kooi reads of it (gitdata.index_canonical): what is judged is what the host's git
    gets, and nothing beside the entries."""
    data = read_at(copy_fd, "index")
    canonical = index_canonical(data, hashlen)
    if canonical is None or canonical == data:
        return
    remove_at(copy_fd, ".kooi-index.new")
    fd = os.open(".kooi-index.new", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=copy_fd)
    with os.fdopen(fd, "wb") as f:
        f.write(canonical)
    os.rename(".kooi-index.new", "index", src_dir_fd=copy_fd, dst_dir_fd=copy_fd)
