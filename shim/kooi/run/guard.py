"""The project cannot be turned against the host: the paths in it that later execute
outside the cage (git's hooks, configuration and anything else in a git directory
but the repository's data, direnv and mise files, editor and agent settings, dev
containers) are protected, and the paths a pipeline should look at after a run (CI
definitions, build scripts, lockfiles) are watched.

- Before the workload starts, kooi takes a snapshot of every protected path (type,
  mode, content, link count; directories with everything in them) and a fingerprint
  of every watched one (size, mtime, inode, ctime: ctime cannot be set from user space).
- While it runs, git's hooks, config and info (where they are real) are shadowed:
  throwaway copies, made from the snapshot, are mounted over them (container and
  jail). The project's own never change while the workload runs, and afterwards
  every change the workload made to a copy is listed as refused (how: shadowed) and
  dropped with the copy. A read-only mount would also keep them, but would fail the
  write without a trace: nothing could list it.
- After the workload and everything it started have ended, kooi compares: every
  protected path that differs (created, changed, deleted, replaced by a symlink, a
  parent replaced by a symlink, also by renaming `.git` away) is put back as it was
  and listed as refused (how: put back); anything it cannot read or put back fails
  the run. Every
  watched path that differs is listed. Nothing is followed through a symlink.

A workflow can drop protected paths from the list (unprotected_paths).

Here: Guard (its snapshot, check, dump and load). Its parts: protected.py (what is
protected and watched, and where), snapshot.py (a path's Entry: scan, compare, put
back), fsat.py (file operations relative to a directory descriptor), gitdata.py (is
git's data what git wrote), shadows.py (the throwaway git directories), forgery.py
(forged objects and refs in the real git data).
"""

from __future__ import annotations

import base64
import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .editors import editor_targets
from .envrc import envrc_targets
from .forgery import ForgeryChecks
from .fsat import open_dir, remove_at
from .gitdata import MAX_VERIFY_BYTES, bound_problems, module_git_dirs, read_refs, read_tips
from .links import link_targets
from .listed import MAX_GIT_DIRS, Listed
from .made import KEEP as KEEP  # re-exported: where kept work goes
from .made import MadeByWorkload
from .protected import (
    MAX_WALK,
    config_targets,
    gitfile_targets,
    is_git_data,
    nested_top,
    package_targets,
    present_exposed,
    py_modules,
    py_top_names,
    walk_project,
)
from .shadows import Shadows, Throwaway
from .snapshot import MAX_ENTRIES_AFTER, Entry, change_of, is_git_dir, lentry, remove_path, restore, scan
from .snapshot import GuardError as GuardError  # re-exported: Guard raises it
from .toolnames import PROTECTED, top_glob


@dataclass
class Guard(Listed, Shadows, ForgeryChecks, MadeByWorkload):
    root: Path
    unprotected: tuple[str, ...] = ()
    protected: dict[str, Entry] = field(default_factory=dict)
    watched: dict[str, Entry] | None = None  # None: the workload never started
    extra: list[str] = field(default_factory=list)
    git_dirs: tuple[str, ...] = (".git",)
    nested: tuple[str, ...] = ()  # the `.git` entries below the top before the run
    deep: tuple[str, ...] = ()  # the DEEP names below the top before the run
    py_own: tuple[str, ...] = ()  # the project's own modules named like a tool's (protected.py_modules)
    py_top: tuple[str, ...] = ()  # every module at the project's top before the run (protected.py_top_names)
    beside: tuple[str, ...] = ()  # packages beside a module of their name before the run (walk_project)
    watched_deep: tuple[str, ...] = ()  # the WATCHED_DEEP names below the top, before and after the run
    # What runs on the host from the project that kooi cannot keep a copy of (installed
    # git hooks, direnv layouts' directories): said in the record, never put back.
    exposed: list[dict[str, str]] = field(default_factory=list)
    bare: tuple[str, ...] = ()  # directories with a bare repository's layout before the run
    nested_ino: dict[tuple[int, int], str] = field(default_factory=dict)  # their git directories, by inode
    shadow: Path | None = None  # where the shadows are (shadows()), until check() drops them
    throwaways: list[Throwaway] = field(default_factory=list)
    file_copies: list[tuple[str, Path]] = field(default_factory=list)  # `.git` files' copies
    nested_shadows: list[tuple[str, Path]] = field(default_factory=list)  # for nested containers
    made_files: list[str] = field(default_factory=list)  # mount points kooi's shadows made
    pinned: str | None = None  # the git directory whose config holds kooi's run block
    # How far check() got with the throwaways (its git directories done, what they
    # showed; "all": every one, the shadows only left to remove): a check killed
    # half-way goes on from there (run.deadrun), never compares a throwaway it already
    # copied back and removed.
    progress: dict[str, Any] | None = None
    run_id: str = ""  # names the run's archive in KEEP, where the workload's removed work is kept
    links: dict[str, str] = field(default_factory=dict)  # symlinks out of the project before the run
    envs: tuple[str, ...] = ()  # environments below the top after the run (protected.walk_project)
    # The project's refs and what HEAD named before the run (gitdata.read_refs; None: not
    # read): refs the run moved but its own branch are said (watched_changed).
    refs: dict[str, str] | None = None
    head: str = ""
    # The same of the project's other git directories (nested repositories, a `gitdir:`
    # file's repository in the project): {git directory: [refs, head]}, the first
    # listed.MAX_GIT_DIRS of them.
    nested_refs: dict[str, list[Any]] = field(default_factory=dict)
    # The object ids in the pseudo-refs and reflogs of each of those git directories
    # before the run (gitdata.read_tips; None: more than kooi compares).
    tips: dict[str, list[str] | None] = field(default_factory=dict)
    # When the workload started (ns, a little before): what changed in git's real
    # objects and refs since is the workload's, or the host's while the run ran.
    started: int | None = None
    # Called with the phase ("checking", "checked") and, once checked, the record:
    # run.deadrun keeps the dead run's record up to date with it.
    on_progress: Callable[[str, dict[str, Any] | None], None] | None = field(default=None, repr=False,
                                                                          compare=False)

    @property
    def paths(self) -> tuple[str, ...]:
        globs = []
        try:
            globs = [n for n in os.listdir(self.root) if top_glob(n)] + nested_top(self.root)
        except OSError:
            pass
        return tuple(dict.fromkeys(p for p in (*PROTECTED, *self.extra, *self.git_dirs[1:], *globs)
                                   if p not in self.unprotected))

    def _scan(self, strict: bool) -> dict[str, Entry]:
        return scan(self.root, self.paths, strict=strict, skip=self.unprotected, git_dirs=self.git_dirs)

    def _no_mounts_inside(self) -> None:
        """The guard works on the project's own files: a mount inside it (made after
        the run's start) would have its walks "put back" whatever is mounted there,
        another repository's configuration among it."""
        from .dirid import mounts_inside

        try:
            inside = mounts_inside(self.root)
        except OSError as exc:
            raise GuardError(f"cannot read the mount table ({exc.strerror or exc})") from None
        if inside:
            raise GuardError(f"{', '.join(inside[:3])} is mounted inside the project: kooi neither checks nor puts "
                             "back anything there (it would work on what is mounted, not on the project); unmount "
                             "it, then run on the project again (that run finishes this one's check first)")

    def snapshot(self) -> None:
        """Before anything of the run touches the project."""
        self._no_mounts_inside()
        try:
            self._unpin_config()  # a killed run's
            self._drop_placeholder()  # a killed run's
        except OSError as exc:
            raise GuardError(f".git: cannot remove what a killed kooi run left ({exc.strerror or exc})") from None
        extra, gitdirs, hooks = config_targets(self.root)
        bare: list[str] = []
        blind: list[str] = []
        watched: list[str] = []
        links: dict[str, str] = {}
        beside: list[str] = []
        dirs, others, deep, complete = walk_project(self.root, bare=bare, blind=blind, watched=watched, links=links,
                                                    packages=beside)
        self.beside = tuple(beside)
        self.watched_deep = tuple(watched)
        self.links = links
        envrc, said = envrc_targets(self.root, (".envrc", *(d for d in deep if d.endswith("/.envrc"))))
        editor, runs = editor_targets(self.root, ("", *sorted({
            d.rpartition("/")[0] for d in deep if d.rpartition("/")[2] in (".vscode", ".devcontainer",
                                                                           ".devcontainer.json")})))
        extra += [t for t in envrc + package_targets(self.root) + editor if t not in extra]
        self.py_own = tuple(sorted(py_modules(self.root)))
        self.py_top = tuple(sorted(py_top_names(self.root)))
        self.exposed = hooks + said + runs
        self.bare = tuple(bare)
        if blind:
            raise GuardError(f"kooi cannot list {', '.join(blind)} in the project, so it cannot check what a run "
                             "leaves there; make it listable by the runner (chmod u+rx) and run again")
        if not complete:
            raise GuardError(f"the project holds more than {MAX_WALK} entries; kooi cannot look for the nested "
                             "git repositories in it")
        self.deep = tuple(deep)
        linked = [p for p in (".git", *others) if os.path.islink(self.root / p)]
        if linked:
            raise GuardError(f"{linked[0]} is a symlink: kooi cannot keep a git directory reached through a link "
                             "(the workload could change what it points to); make it the directory itself, or a "
                             "`gitdir:` file")
        self.nested = tuple(dirs + others)
        for d in dirs:
            try:
                st = os.lstat(self.root / d)
                self.nested_ino[(st.st_dev, st.st_ino)] = d
            except OSError:
                pass
        self.extra = extra + others + deep
        targets = gitfile_targets(self.root, others)  # review 39: those outside other git directories too
        self.git_dirs = tuple(dict.fromkeys((".git", *gitdirs, *dirs, *(t for t in targets if is_git_dir(self.root, t) and not any(
            t.startswith(f"{g}/") for g in (".git", *dirs))))))
        # A protected or watched name that leads elsewhere in the project through a link:
        # the host's tools read the target, so that is protected (watched) too.
        try:
            self.extra += link_targets(self.root, [p for p in self.paths if p not in self.git_dirs])
            self.watched_deep += tuple(link_targets(self.root, self._watched_names()))
        except ValueError as exc:
            raise GuardError(f"{exc} is a symlink to the project's top: kooi cannot protect what the host's tools "
                             "read through it; make it a directory of its own") from None
        found = read_refs(self.root / ".git") if os.path.isdir(self.root / ".git") else None
        self.refs, self.head = found if found is not None else (None, "")
        self.nested_refs = {}
        # Submodules' (review 36), at every place a `.git` file names one from (reviews 37, 39)
        trees: dict[str, list[str]] = {m: [] for m in (*self.git_dirs[1:], *module_git_dirs(self.root, MAX_GIT_DIRS))}
        for gd, places in targets.items():
            trees.setdefault(gd, []).extend(places)
        for gd, places in trees.items():
            if len(self.nested_refs) < MAX_GIT_DIRS and os.path.isdir(self.root / gd) \
                    and not os.path.islink(self.root / gd) and (nested := read_refs(self.root / gd)) is not None:
                self.nested_refs[gd] = [nested[0], nested[1], *places]
        self.tips = {}
        for gd in ([".git"] if self.refs is not None else []) + list(self.nested_refs):
            found_tips = read_tips(self.root / gd)
            self.tips[gd] = None if found_tips is None else sorted(found_tips)
        self.protected = self._scan(strict=True)

    def snapshot_watched(self) -> None:
        """Right before the workload starts (after kooi's own ACL grant, which changes
        the files' ctime)."""
        self.watched = scan(self.root, self._watched_names(), content=False, strict=False)
        # A file's ctime comes from a clock that may lag by a tick: what kooi itself
        # changed (the ACL grant) is older than STARTED, what the workload changes newer.
        time.sleep(0.03)
        self.started = time.time_ns() - 15_000_000


    def _check_shadows(self) -> tuple[list[dict[str, str]], list[str], str]:
        """What the workload changed in the throwaways (never in the project), git's data
        copied back, the throwaways removed: (refused, failures, a warning)."""
        if self.shadow is None:
            return [], [], ""
        done = self.progress or {"gits": [], "refused": [], "failed": [], "warnings": [], "all": False}
        self.progress = done
        refused: list[dict[str, str]] = done["refused"]
        failed: list[str] = done["failed"]
        warnings: list[str] = done["warnings"]
        verify_budget = [MAX_VERIFY_BYTES]
        for t in self.throwaways:
            if done["all"] or t.git in done["gits"]:
                continue
            try:
                after = {k: e for k, e in scan(t.copy, (t.git,), strict=False,
                                                git_dirs=() if t.made else (t.git,)).items() if self._mine(t, k)}
            except OSError as exc:
                refused.append({"path": t.git, "change": f"its throwaway unreadable ({exc.strerror or exc})",
                                "how": "shadowed"})
                continue
            if t.made:
                if set(after) - {t.git}:
                    refused.append({"path": t.git, "change": "created", "how": "shadowed"})
                continue
            before = {k: e for k, e in self.protected.items() if self._mine(t, k)}
            for rel in sorted(set(before) | set(after)):
                b, a = before.get(rel), after.get(rel)
                if b is not None and b.same(a):
                    continue
                refused.append({"path": rel, "change": change_of(b, a), "how": "shadowed"})
            try:
                warnings += self._copy_back(t)
            except OSError as exc:
                failed.append(f"{t.git}: git's data not copied back from the run ({exc.strerror or exc})")
            try:
                self._check_bound(t)
            except OSError as exc:
                failed.append(f"{t.git}: git's data directories unreadable ({exc.strerror or exc})")
            try:
                self._check_history(t, verify_budget)
            except OSError as exc:
                failed.append(f"{t.git}: git's objects and refs not verified ({exc.strerror or exc})")
            refused += t.refused
            done["gits"].append(t.git)
            self._progress("checking")
        for rel, copy in self.file_copies if not done["all"] else []:
            a = lentry(copy, content=True, strict=False)
            b = self.protected.get(rel, Entry("file", a.mode if a else 0) if rel in self.made_files else None)
            if b is None or not b.same(a):
                refused.append({"path": rel, "change": change_of(None if rel in self.made_files else b, a),
                                "how": "shadowed"})
        if not done["all"]:
            done["all"] = True
            self._progress("checking")
        try:
            remove_path(self.shadow)
        except OSError as exc:
            warnings.append(f"the throwaway copies in {self.shadow} are left ({exc.strerror or exc}); kooi gc "
                            "removes them")
        self.shadow = None
        return refused, failed, "; ".join(warnings)


    def _nested_created(self) -> tuple[list[dict[str, str]], list[str]]:
        """`.git` entries below the project's top the workload made (a nested repository,
        a `.git` file pointing git elsewhere): removed, listed."""
        bare: list[str] = []
        blind: list[str] = []
        watched: list[str] = []
        links: dict[str, str] = {}
        pyc: list[str] = []
        envs: list[str] = []
        packages: list[str] = []
        dirs, others, deep, complete = walk_project(self.root, bare=bare, blind=blind, watched=watched, links=links,
                                                    pyc=pyc, envs=envs, packages=packages)
        self.watched_deep = tuple(dict.fromkeys((*self.watched_deep, *watched)))
        self.envs = tuple(envs)
        failed = [] if complete else [f"the project holds more than {MAX_WALK} entries: kooi could not look for "
                                      "nested git repositories the workload made"]
        # Anything kooi cannot read fails the run: what the workload hid there is unchecked.
        failed += [f"kooi cannot list {b}: what the workload left in it is unchecked" for b in blind]
        refused = []
        for rel in bare:
            if rel in self.bare or any(rel == g or rel.startswith(g + "/") for g in self.git_dirs):
                continue
            # git would take it for a repository and run its config: without HEAD it is none
            path = "HEAD" if rel == "." else f"{rel}/HEAD"
            refused.append({"path": path, "change": "created (a bare repository's layout: HEAD removed)",
                            "how": "put back"})
            if (why := self._remove_made(path)) is not None:
                failed.append(why)
        for rel in deep:
            if rel in self.deep or any(rel == u or rel.startswith(u + "/") for u in self.unprotected):
                continue
            if any(rel.startswith(g + "/") for g in self.git_dirs):
                continue
            item = {"path": rel, "change": "created", "how": "put back"}
            refused.append(item)
            if (why := self._remove_made(rel, item)) is not None:
                failed.append(why)
        more, more_failed = self._outward_and_compiled(links, pyc)
        refused += more
        failed += more_failed
        more, more_failed = self._packages_beside_modules(packages)
        refused += more
        failed += more_failed
        for rel in dirs + others:
            # Not even below an unprotected path: a workflow may change .vscode, but a
            # repository made there runs its config at the host's next `git status`
            # once the index names it (eighth review).
            if rel in self.nested:
                continue
            if any(rel.startswith(g + "/") for g in self.git_dirs):
                continue  # inside a git directory kooi already compares
            parent, _, name = rel.rpartition("/")
            try:
                fd = open_dir(self.root, parent)
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if not stat.S_ISDIR(st.st_mode):
                        remove_at(fd, name)
                        refused.append({"path": rel, "change": "created", "how": "put back"})
                        continue
                    # A git directory: its data may be a repository's history (one the
                    # workload moved here): kept; its configuration, hooks and the rest go.
                    was = self.nested_ino.get((st.st_dev, st.st_ino))
                    gfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                    try:
                        for n in os.listdir(gfd):
                            if not is_git_data(n):
                                remove_at(gfd, n)
                        # in its data (a submodule's git directory among it): no link, no
                        # repository's layout
                        found: list[str] = []
                        for n in os.listdir(gfd):
                            if stat.S_ISDIR(os.stat(n, dir_fd=gfd, follow_symlinks=False).st_mode):
                                sub = os.open(n, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=gfd)
                                try:
                                    bound_problems(sub, f"{rel}/{n}", found, [MAX_ENTRIES_AFTER * 20])
                                finally:
                                    os.close(sub)
                            elif not stat.S_ISREG(os.stat(n, dir_fd=gfd, follow_symlinks=False).st_mode):
                                os.unlink(n, dir_fd=gfd)
                                found.append(f"{rel}/{n}")
                        refused += [{"path": p, "change": "created (not something git makes there)",
                                     "how": "put back"} for p in found]
                    finally:
                        os.close(gfd)
                    change = f"moved here from {was}" if was else "created"
                    refused.append({"path": rel, "change": f"{change} (a git directory: its configuration and hooks "
                                                           "removed, its data kept)", "how": "put back"})
                finally:
                    os.close(fd)
            except OSError as exc:
                failed.append(f"{rel}: {exc.strerror or exc}")
        return refused, failed

    def _progress(self, phase: str, record: dict[str, Any] | None = None) -> None:
        if self.on_progress is not None:
            self.on_progress(phase, record)

    def check(self) -> dict[str, Any]:
        """After the run: put back every protected path that differs; the record.
        restored is False when anything could not be read or put back; GuardError,
        with nothing done, when something is mounted inside the project. Killed half-way,
        it goes on where it was from its dump() (progress): every step after the
        throwaways compares the project with the snapshot, and does again what is left."""
        self._no_mounts_inside()
        self._progress("checking")
        failed: list[str] = []
        try:
            self._unpin_config()
        except OSError as exc:
            failed.append(f".git/config: kooi's run block not removed ({exc.strerror or exc})")
        shadowed, shadow_failed, warning = self._check_shadows()
        failed += shadow_failed
        try:
            after = self._scan(strict=False)
        except OSError as exc:
            after = {}
            failed.append(f"the project's protected paths: {exc.strerror or exc}")
        # The empty directory the engine (or bwrap) made to mount a throwaway `.git` on.
        made = next((t for t in self.throwaways if t.made), None)
        if made is not None and ".git" not in self.protected:
            e = after.get(".git")
            if e is not None and e.kind == "dir" and not any(k.startswith(".git/") for k in after):
                try:
                    if self._is_placeholder():
                        shutil.rmtree(self.root / ".git")
                        del after[".git"]
                except OSError:
                    pass
        for rel in self.made_files:
            e = after.get(rel)
            if rel not in self.protected and e is not None and e.kind == "file" and not e.data:
                try:
                    os.unlink(self.root / rel)
                    del after[rel]
                except OSError:
                    pass
        self.made_files = []
        self.throwaways = []
        self.file_copies = []
        refused = []
        for rel in sorted(set(self.protected) | set(after)):
            b, a = self.protected.get(rel), after.get(rel)
            if b is None and a is None or b is not None and b.same(a):
                continue
            refused.append({"path": rel, "change": change_of(b, a), "how": "put back"})
        # Remove what the workload created or made unreadable (deepest first), then
        # put back what was there (shallowest first).
        # What the workload wrote there is its work: kept in the run's archive (KEEP)
        # before the put-back (review 12), shallowest first (a created directory goes
        # whole): what it created, and its version of a file it changed.
        for item in sorted(refused, key=lambda r: len(Path(r["path"]).parts)):
            a, b = after.get(item["path"]), self.protected.get(item["path"])
            if a is None or not (b is None and a.kind in ("file", "dir") or b is not None and b.kind == a.kind == "file"):
                continue
            if not any(item["path"].startswith(k["path"] + "/") for k in refused if k.get("kept")):
                self._keep_rel(item["path"], item)
        for item in sorted(refused, key=lambda r: -len(Path(r["path"]).parts)):
            a = after.get(item["path"])
            if item["path"] not in self.protected or (a is not None and a.kind == "unreadable"):
                try:
                    remove_path(self.root / item["path"])
                except OSError as exc:
                    failed.append(f"{item['path']}: {exc.strerror or exc}")
        for item in sorted(refused, key=lambda r: len(Path(r["path"]).parts)):
            e = self.protected.get(item["path"])
            if e is not None:
                try:
                    restore(self.root, item["path"], e)
                except OSError as exc:
                    failed.append(f"{item['path']}: {exc.strerror or exc}")
        nested, nested_failed = self._nested_created()
        refused += nested
        failed += nested_failed
        shadowing, shadow_failed = self._shadows_created()
        refused += shadowing
        failed += shadow_failed
        if not failed:
            # Put back means: a second look finds the snapshot.
            try:
                again = self._scan(strict=False)
                left = sorted(r for r in set(self.protected) | set(again)
                              if not (self.protected.get(r) is None and again.get(r) is None)
                              and not (self.protected.get(r) is not None and self.protected[r].same(again.get(r))))
                failed += [f"{r}: still differs after the restore" for r in left]
            except OSError as exc:
                failed.append(f"the project's protected paths: {exc.strerror or exc}")
        self._archive_close()
        changed = self._watched_changed() + self._refs_said()
        record: dict[str, Any] = {"protected": list(self.paths), "refused": shadowed + refused,
                                  "restored": not failed, "restore_failed": failed, "watched_changed": changed,
                                  "exposed": self.exposed + [e for e in present_exposed(self.root)
                                                             if e["path"] not in {x["path"] for x in self.exposed}]
                                  + [{"path": e, "why": "an environment below the top: the host's tools and editors "
                                                        "run code from it there"} for e in self.envs
                                     if "/" in e]
                                  + [{"path": m, "why": "a new top-level Python module: `python3 -m TOOL` and scripts "
                                                        "in the project import it before an installed module of that "
                                                        "name (kooi removes the names it knows the host has)"}
                                     for m in sorted(set(py_top_names(self.root)) - set(self.py_top))]}
        if warning:
            record["warning"] = warning
        self.progress = None
        self._progress("checked", record)
        return record


    def dump(self) -> dict[str, Any]:
        """Everything check() needs, as JSON (run.deadrun): kept while the workload runs,
        so that whoever next holds the project finishes the check of a run whose kooi
        run died (kill -9, the OOM killer) before anyone takes its state for the project's."""
        return {"root": str(self.root), "unprotected": list(self.unprotected),
                "protected": {k: _entry_out(e) for k, e in self.protected.items()},
                "watched": None if self.watched is None else {k: _entry_out(e) for k, e in self.watched.items()},
                "extra": list(self.extra), "git_dirs": list(self.git_dirs), "nested": list(self.nested),
                "deep": list(self.deep), "bare": list(self.bare), "watched_deep": list(self.watched_deep),
                "py_own": list(self.py_own), "py_top": list(self.py_top), "beside": list(self.beside),
                "exposed": self.exposed,
                "nested_ino": [[d, i, r] for (d, i), r in self.nested_ino.items()],
                "shadow": None if self.shadow is None else str(self.shadow),
                "throwaways": [{"git": t.git, "copy": str(t.copy), "bound": list(t.bound),
                                "copied": {n: [_fp_out(a), _fp_out(b)] for n, (a, b) in t.copied.items()},
                                "made": t.made, "owner": None if t.owner is None else list(t.owner),
                                "refused": t.refused} for t in self.throwaways],
                "file_copies": [[r, str(p)] for r, p in self.file_copies],
                "nested_shadows": [[r, str(p)] for r, p in self.nested_shadows],
                "made_files": list(self.made_files), "pinned": self.pinned, "progress": self.progress,
                "started": self.started, "run_id": self.run_id, "links": self.links,
                "refs": self.refs, "head": self.head, "nested_refs": self.nested_refs, "tips": self.tips}

    @classmethod
    def load(cls, doc: dict[str, Any]) -> Guard:
        """The guard dump() wrote; GuardError when DOC is not one."""
        try:
            g = cls(Path(doc["root"]), tuple(map(str, doc["unprotected"])))
            g.protected = {str(k): _entry_in(v) for k, v in doc["protected"].items()}
            g.watched = None if doc["watched"] is None else {str(k): _entry_in(v) for k, v in doc["watched"].items()}
            g.extra = [str(x) for x in doc["extra"]]
            g.git_dirs = tuple(map(str, doc["git_dirs"]))
            g.nested, g.deep, g.bare = (tuple(map(str, doc[k])) for k in ("nested", "deep", "bare"))
            g.watched_deep = tuple(map(str, doc.get("watched_deep", ())))  # a record of an older kooi has none
            g.py_own = tuple(map(str, doc.get("py_own", ())))
            # A record of an older kooi has none: what is there now counts as there before
            # (else every module of the project would be said new).
            g.py_top = tuple(map(str, doc["py_top"])) if "py_top" in doc else tuple(py_top_names(g.root))
            if "beside" in doc:
                g.beside = tuple(map(str, doc["beside"]))
            else:  # an older kooi's record: what is there now was there (nothing removed)
                found: list[str] = []
                walk_project(g.root, packages=found)
                g.beside = tuple(found)
            g.exposed = [{"path": str(e["path"]), "why": str(e["why"])} for e in doc.get("exposed", ())]
            g.nested_ino = {(int(d), int(i)): str(r) for d, i, r in doc["nested_ino"]}
            g.shadow = None if doc["shadow"] is None else Path(doc["shadow"])
            g.throwaways = [Throwaway(str(t["git"]), Path(t["copy"]), tuple(map(str, t["bound"])),
                                      {str(n): (_fp_in(a), _fp_in(b)) for n, (a, b) in t["copied"].items()},
                                      bool(t["made"]), None if t["owner"] is None else (int(t["owner"][0]),
                                                                                      int(t["owner"][1])),
                                      [dict(r) for r in t["refused"]]) for t in doc["throwaways"]]
            g.file_copies = [(str(r), Path(p)) for r, p in doc["file_copies"]]
            g.nested_shadows = [(str(r), Path(p)) for r, p in doc["nested_shadows"]]
            g.made_files = [str(x) for x in doc["made_files"]]
            g.pinned = None if doc["pinned"] is None else str(doc["pinned"])
            g.started = None if doc.get("started") is None else int(doc["started"])
            g.run_id = str(doc.get("run_id", ""))
            g.links = {str(k): str(v) for k, v in doc.get("links", {}).items()}
            refs = doc.get("refs")
            g.refs = None if refs is None else {str(k): str(v) for k, v in refs.items()}
            g.head = str(doc.get("head", ""))
            g.nested_refs = {str(d): [{str(k): str(v) for k, v in n[0].items()}, *map(str, n[1:])]
                             for d, n in doc.get("nested_refs", {}).items()}
            # A record of an older kooi has none: nothing judged beyond the refs.
            g.tips = {str(d): None if t is None else [str(x) for x in t] for d, t in doc.get("tips", {}).items()}
            prog = doc.get("progress")
            if prog is not None:
                g.progress = {"gits": [str(x) for x in prog["gits"]], "refused": [dict(r) for r in prog["refused"]],
                              "failed": [str(x) for x in prog["failed"]],
                              "warnings": [str(x) for x in prog["warnings"]], "all": bool(prog["all"])}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise GuardError(f"not a guard's record ({exc.__class__.__name__}: {exc})") from None
        return g


def _entry_out(e: Entry) -> list[Any]:
    return [e.kind, e.mode, base64.b64encode(e.data).decode(), e.nlink]


def _entry_in(v: list[Any]) -> Entry:
    kind, mode, data, nlink = v
    return Entry(str(kind), int(mode), base64.b64decode(data, validate=True), int(nlink))


def _fp_out(fp: Any) -> Any:
    """A Fingerprint (nested tuples of str and int) as JSON lists."""
    return [_fp_out(x) for x in fp] if isinstance(fp, tuple) else fp


def _fp_in(v: Any) -> Any:
    """The Fingerprint _fp_out wrote: every list a tuple again (fingerprints hold no lists)."""
    return tuple(_fp_in(x) for x in v) if isinstance(v, list) else v
