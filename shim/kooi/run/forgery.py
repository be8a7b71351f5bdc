"""What a workload forged in the real git data bound into its view (git's objects, packs
and their caches, replace refs; what git never makes in its data directories): checked
after the run, removed, listed on the throwaway."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from .fsat import open_dir, remove_at
from .gitdata import bound_problems, lfs_object_problem, loose_problem, pack_problem
from .shadows import Throwaway
from .snapshot import MAX_ENTRIES_AFTER

_LOOSE_DIR = re.compile(r"[0-9a-f]{2}")
_LOOSE_NAME = re.compile(r"[0-9a-f]{38}|[0-9a-f]{62}")
_LFS_OID = re.compile(r"[0-9a-f]{64}")
_PACK_NAME = re.compile(r"(pack-(?:[0-9a-f]{40}|[0-9a-f]{64}))\.(pack|idx|rev|bitmap|mtimes|keep|promisor)")


class ForgeryChecks:
    """The part of run.guard.Guard that checks the real git data a throwaway had bound
    in. The attributes below are Guard's fields, declared here for the type checker."""

    root: Path
    started: int | None

    def _check_bound(self, t: Throwaway) -> None:
        """What git never makes in its data directories (links out of the project, FIFOs)
        and the workload made in the bound real ones: removed, listed."""
        real_fd = open_dir(self.root, t.git)
        try:
            for name in t.bound:
                found: list[str] = []
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=real_fd)
                except (FileNotFoundError, NotADirectoryError, OSError) as exc:
                    if exc.errno == errno.ELOOP:
                        os.unlink(name, dir_fd=real_fd)
                        t.refused.append({"path": f"{t.git}/{name}", "change": "replaced (dir -> link)",
                                          "how": "put back"})
                    continue  # gone: the put-back of the git directory says so
                try:
                    bound_problems(fd, f"{t.git}/{name}", found, [MAX_ENTRIES_AFTER * 20])
                finally:
                    os.close(fd)
                t.refused += [{"path": p, "change": "created (not a file git makes)", "how": "put back"}
                              for p in found]
        finally:
            os.close(real_fd)

    def _check_history(self, t: Throwaway, budget: list[int]) -> None:
        """What the workload forged in T's real objects and refs (bound into its view):
        git reads an object by its name and never checks a loose object's content
        against it, and takes replace refs, alternates and the commit-graph on trust, so
        a rewritten blob of a committed file (the file changed to match) is a change the
        host's `git diff` never shows and `git checkout` writes. Every object file
        changed since the workload started is verified (loose: its hash; a pack: `git
        verify-pack`); one that does not match its name, a replace ref, alternates, and
        the caches git rebuilds (commit-graph, multi-pack-index, bitmaps) are removed
        and listed."""
        if self.started is None:
            return
        real_fd = open_dir(self.root, t.git)
        try:
            if "objects" in t.bound:
                self._check_objects(real_fd, f"{t.git}/objects", t, budget)
            if "refs" in t.bound:
                self._check_replace_refs(real_fd, t)
            self._check_lfs(real_fd, f"{t.git}/lfs/objects", t, budget)
        finally:
            os.close(real_fd)

    def _check_lfs(self, real_fd: int, rel: str, t: Throwaway, budget: list[int]) -> None:
        """Git LFS's objects (lfs/objects/AB/CD/ABCD..., named by the SHA-256 of their
        content; bound in, or copied back where the project had none): git-lfs smudges a
        committed pointer's file from the local object without hashing it, so a rewritten
        one is content the host's next checkout writes unseen. Every object written since
        the workload started is hashed; one that does not match its name, and whatever
        else the workload made there, is removed and listed (`git lfs fetch` gets a
        removed object again)."""
        try:
            lfs = os.open("lfs", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=real_fd)
        except OSError:
            return
        try:
            top = os.open("objects", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=lfs)
        except OSError:
            return
        finally:
            os.close(lfs)
        stray = "not an object where git-lfs keeps them (lfs/objects/AB/CD/<its SHA-256>): removed"
        try:
            for a in os.scandir(top):
                if not (a.is_dir(follow_symlinks=False) and _LOOSE_DIR.fullmatch(a.name)):
                    if self._new(a.stat(follow_symlinks=False)):
                        self._refuse(t, top, a.name, f"{rel}/{a.name}", stray)
                    continue
                afd = os.open(a.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
                try:
                    for b in os.scandir(afd):
                        here = f"{rel}/{a.name}/{b.name}"
                        if not (b.is_dir(follow_symlinks=False) and _LOOSE_DIR.fullmatch(b.name)):
                            if self._new(b.stat(follow_symlinks=False)):
                                self._refuse(t, afd, b.name, here, stray)
                            continue
                        bfd = os.open(b.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=afd)
                        try:
                            for f in os.scandir(bfd):
                                if not self._new(f.stat(follow_symlinks=False)):
                                    continue
                                if not (f.is_file(follow_symlinks=False) and _LFS_OID.fullmatch(f.name)
                                        and f.name.startswith(a.name + b.name)):
                                    self._refuse(t, bfd, f.name, f"{here}/{f.name}", stray)
                                elif (why := lfs_object_problem(bfd, f.name, budget)) is not None:
                                    self._refuse(t, bfd, f.name, f"{here}/{f.name}", why)
                        finally:
                            os.close(bfd)
                finally:
                    os.close(afd)
        finally:
            os.close(top)

    def _new(self, st: os.stat_result) -> bool:
        return self.started is not None and st.st_ctime_ns >= self.started

    def _refuse(self, t: Throwaway, dir_fd: int, name: str, rel: str, why: str) -> None:
        remove_at(dir_fd, name)
        t.refused.append({"path": rel, "change": why, "how": "put back"})

    def _check_objects(self, real_fd: int, rel: str, t: Throwaway, budget: list[int]) -> None:
        try:
            ofd = os.open("objects", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=real_fd)
        except OSError:
            return  # gone or a link: the put-back of the git directory says so
        try:
            for e in sorted(os.scandir(ofd), key=lambda e: e.name):
                if not e.is_dir(follow_symlinks=False):
                    continue
                sub = os.open(e.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=ofd)
                try:
                    if _LOOSE_DIR.fullmatch(e.name):
                        for f in os.scandir(sub):
                            if f.is_file(follow_symlinks=False) and _LOOSE_NAME.fullmatch(f.name) \
                                    and self._new(f.stat(follow_symlinks=False)):
                                why = loose_problem(sub, f.name, e.name + f.name, budget)
                                if why:
                                    self._refuse(t, sub, f.name, f"{rel}/{e.name}/{f.name}", why)
                    elif e.name == "pack":
                        self._check_packs(sub, f"{rel}/pack", t, budget)
                    elif e.name == "info":
                        self._check_object_info(sub, f"{rel}/info", t)
                finally:
                    os.close(sub)
        finally:
            os.close(ofd)

    def _check_packs(self, fd: int, rel: str, t: Throwaway, budget: list[int]) -> None:
        stems: dict[str, list[str]] = {}
        new: set[str] = set()
        for f in os.scandir(fd):
            if not f.is_file(follow_symlinks=False):
                continue
            m = _PACK_NAME.fullmatch(f.name)
            fresh = self._new(f.stat(follow_symlinks=False))
            if m is None:
                if fresh:
                    # git loads every *.idx here whatever its name (a forged pack named
                    # evil.pack), and trusts the multi-pack-index: none is git's own pack.
                    self._refuse(t, fd, f.name, f"{rel}/{f.name}", "changed by the workload: not a pack git names "
                                 "(pack-<hash>) or a cache git rebuilds; git would read objects from it unverified: "
                                 "removed")
                continue
            stems.setdefault(m.group(1), []).append(f.name)
            if fresh:
                new.add(f.name)
        for stem, names in sorted(stems.items()):
            if not new.intersection(names):
                continue
            why = None
            if f"{stem}.pack" in new or f"{stem}.idx" in new:
                why = pack_problem(fd, stem, budget) if {f"{stem}.pack", f"{stem}.idx"} <= set(names) else \
                    "a pack without its index (or an index without its pack)"
            for n in sorted(names):
                ext = n.rsplit(".", 1)[1]
                if why is not None and ext not in ("keep",):
                    self._refuse(t, fd, n, f"{rel}/{n}", why + ": removed")
                elif n in new and ext in ("rev", "bitmap", "mtimes", "promisor"):
                    self._refuse(t, fd, n, f"{rel}/{n}", "changed by the workload: "
                                 + ("makes git fetch what it misses from a remote" if ext == "promisor" else
                                    "a cache git rebuilds") + ", removed (kooi cannot verify it)")

    def _check_object_info(self, fd: int, rel: str, t: Throwaway) -> None:
        for f in os.scandir(fd):
            if not self._new(f.stat(follow_symlinks=False)) and not (
                    f.name == "commit-graphs" and f.is_dir(follow_symlinks=False)):
                continue
            if f.name in ("alternates", "http-alternates"):
                self._refuse(t, fd, f.name, f"{rel}/{f.name}", "changed by the workload: git would take objects "
                                                               "from where it names, unverified; removed")
            elif f.name in ("commit-graph", "packs"):
                self._refuse(t, fd, f.name, f"{rel}/{f.name}", "changed by the workload: a cache git rebuilds "
                                                               "and trusts, removed (kooi cannot verify it)")
            elif f.name == "commit-graphs" and f.is_dir(follow_symlinks=False):
                sub = os.open(f.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                try:
                    changed = any(self._new(g.stat(follow_symlinks=False)) for g in os.scandir(sub))
                finally:
                    os.close(sub)
                if changed or self._new(f.stat(follow_symlinks=False)):
                    self._refuse(t, fd, f.name, f"{rel}/{f.name}", "changed by the workload: a cache git "
                                                                   "rebuilds and trusts, removed")

    def _check_replace_refs(self, real_fd: int, t: Throwaway) -> None:
        """refs/replace/*: git shows the object a replace ref names in place of the one
        the history names (`git diff`, `git checkout` and `git log` alike)."""
        try:
            fd = os.open("refs/replace", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=real_fd)
        except OSError:
            return
        try:
            stack: list[tuple[int, str, bool]] = [(fd, f"{t.git}/refs/replace", False)]
            while stack:
                dfd, rel, close = stack.pop()
                try:
                    for f in os.scandir(dfd):
                        if f.is_dir(follow_symlinks=False):
                            stack.append((os.open(f.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd),
                                          f"{rel}/{f.name}", True))
                        elif self._new(f.stat(follow_symlinks=False)):
                            self._refuse(t, dfd, f.name, f"{rel}/{f.name}", "created: a replace ref, git would "
                                                                           "show another object in its place; "
                                                                           "removed")
                finally:
                    if close:
                        os.close(dfd)
        finally:
            os.close(fd)
