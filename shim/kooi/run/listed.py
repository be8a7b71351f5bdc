"""What the project guard (run.guard) lists rather than puts back, and how it tells a
protected path: the watched paths the run changed (WATCHED, WATCHED_GLOBS at the top,
the WATCHED_DEEP names below it), the refs it moved but its own branch (review 15)."""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

from .gitdata import (
    NULL_IDS,
    commits_of,
    entry_target,
    git_plumbing,
    introduced,
    module_work_tree,
    read_refs,
    read_tips,
    refs_changed,
    tree_changes,
    trees_named,
)
from .protected import compiled, py_shadow_name
from .shadows import MAX_GIT_DIRS as SHADOWED_GIT_DIRS
from .snapshot import Entry, change_of, scan
from .toolnames import NESTED, WATCHED, WATCHED_GLOBS, protected_parts
from .vcsconf import VCS_SETTINGS

# How many moved refs, and files changed on each, kooi judges after a run (more: said).
MAX_BRANCHES = 10
MAX_CHANGES = 20000
# How many of the commits a run introduced kooi looks into (_introduced; more: said).
MAX_COMMITS = 2000
# How many of the project's other git directories' refs kooi reads and judges: every one
# a run may have (review 36: the 21st to 32nd went unjudged, unsaid).
MAX_GIT_DIRS = SHADOWED_GIT_DIRS
HEX_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
EMPTY_BLOBS = ("e69de29bb2d1d6434b8b29ae775ad8c2e48c5391",
               "473a0f4c3be8a93681a267e3b1e9a7dcda1185436fe141f7749120a303721813")


class Repo(NamedTuple):
    """A git directory of the project (GIT, relative to the top), the place of its work
    tree (PREFIX: its files' paths in the project), its refs and HEAD before the run."""

    git: str
    prefix: str
    refs: dict[str, str]
    head: str
    # The ids in its pseudo-refs and reflogs before the run (gitdata.read_tips; None:
    # more than kooi compares; absent: a record of an older kooi, not judged).
    tips: list[str] | None | bool = False


def _tree_names(gitdir: Path, commit: str) -> set[str]:
    tree = git_plumbing(gitdir, "ls-tree", "-r", "-z", "--name-only", "--full-tree", commit)
    return {n.decode(errors="replace") for n in (tree or b"").split(b"\0") if n}


def _parent(gitdir: Path, commit: str, n: int) -> str | None:
    """COMMIT's Nth parent's id, or None."""
    found = git_plumbing(gitdir, "rev-parse", "-q", "--verify", f"{commit}^{n}^{{commit}}")
    oid = (found or b"").strip().decode(errors="replace")
    return oid if HEX_ID.fullmatch(oid) else None


class Listed:
    """Guard's part for what it lists (a mixin: Guard holds the state)."""

    root: Path
    unprotected: tuple[str, ...]
    watched: dict[str, Entry] | None
    watched_deep: tuple[str, ...]
    refs: dict[str, str] | None
    head: str
    nested_refs: dict[str, list[Any]]
    tips: dict[str, list[str] | None]
    py_own: tuple[str, ...]

    @property
    def paths(self) -> tuple[str, ...]:
        raise NotImplementedError  # Guard's

    @functools.cached_property
    def _judged_paths(self) -> tuple[str, ...]:
        """The protected paths as the checks after the run judge files against them, read
        once: `paths` lists the top and opens the NESTED directories at each call, and
        _risky runs for every file of every commit and index entry."""
        return self.paths

    def _protected_rel(self, rel: str) -> bool:
        """REL (a path in the project) is protected: what an index entry there would
        have the host's `git checkout` write (Shadows._data_refusal)."""
        if any(rel == u or rel.startswith(u + "/") for u in self.unprotected):
            return False
        parts = rel.split("/")
        return any(rel == p or rel.startswith(p + "/") for p in self._judged_paths) or protected_parts(parts) \
            or ".git" in parts

    def _risky(self, rel: str, mode: int, link_target: bytes | None, names: set[str]) -> str | None:
        """Why a file at REL (git MODE; a symlink's LINK_TARGET) is one the host would run
        or follow, as the work-tree checks judge it (review 17: committed or staged, the
        host's `git checkout`, `git stash` or `git reset --hard` writes it back; a
        gitlink's LINK_TARGET is the commit it names: entry_target); NAMES:
        the other paths of the same tree or index (a package beside a module)."""
        if self._protected_rel(rel):
            return "a protected path"
        if mode >> 12 == 0o16:
            return self._gitlinked(rel, (link_target or b"").decode(errors="replace"))
        parent, _, name = rel.rpartition("/")
        if mode >> 12 == 0o12 and link_target is None:
            return "a symlink whose target kooi could not read"  # review 39: judged as inside the project
        if mode >> 12 == 0o12:
            if name in NESTED or name in VCS_SETTINGS:
                # Tools read their settings through it (review 36: `.cargo -> c` beside
                # c/config.toml, checked out, ran cargo's rustc-wrapper).
                return f"a link in place of the directory {name}, whose settings the host's tools read"
            if b"\0" in (link_target or b""):
                # git's checkout makes the link from the blob as a C string, up to the
                # first NUL (review 18: `../../etc/passwd\0/../../top/x` looked inside)
                return "a symlink whose target holds a NUL byte"
            target = (link_target or b"").decode(errors="replace")
            dest = os.path.normpath(os.path.join("/top", parent, target))
            if target.startswith("/") or not (dest == "/top" or dest.startswith("/top/")):
                return f"a symlink out of the project (to {target[:120]})"
            if (below := next((p for p in self._judged_paths if p.startswith(rel + "/")), None)) is not None:
                # Review 37: `.yarn/releases -> ../y2` on the way to the yarnPath the
                # project's .yarnrc.yml names.
                return f"a link on the way to the protected path {below}"
            if not parent and "." not in name and py_shadow_name(name + ".py") and name not in self.py_own:
                # a package through a link (review 38: argparse -> lib/ap)
                return f"a link to a package that shadows the host's Python module {name}"
            # A link is judged by its name too (review 37: HEAD -> refs/heads/main made a
            # repository, json.py -> lib/j.py shadowed the host's json).
        if name == "HEAD" and _layout_beside(parent, names):
            # git finds a repository there (review 35: committed, then checked out by the
            # host, its config's pager ran at `git log` there)
            return "a bare repository's layout (HEAD with objects/ and refs/, or a commondir)"
        if not parent and (shadow := py_shadow_name(name)) and shadow not in self.py_own:
            return f"a module that shadows the host's Python module {shadow}"
        if "/" not in parent and parent and name.split(".", 1)[0] == "__init__" \
                and py_shadow_name(parent + ".py") and parent not in self.py_own:
            # a package at the top (review 37: argparse/__init__.py ran at `python3 -m venv`)
            return f"a package that shadows the host's Python module {parent}"
        # siblings matter for an extension module only (compiled()): not listed for others
        siblings = {n.rpartition("/")[2] for n in names if n.rpartition("/")[0] == parent} \
            if name.endswith(".so") else set()
        if compiled(name, parent, siblings):
            return "compiled Python code"
        if name.split(".", 1)[0] == "__init__" and parent:
            up, _, pkg = parent.rpartition("/")
            if any(n.startswith(f"{up}/{pkg}." if up else f"{pkg}.") and n.endswith((".py", ".so")) for n in names):
                return f"a package beside the module {parent}.py"
        return None

    def _refs_said(self) -> list[dict[str, str]]:
        """What the run did to the refs of the project's git directories (read once after
        it): the refs it moved but its own branch, and what it committed under the refs
        it moved; the top `.git` first, then the nested repositories and a `gitdir:`
        file's repository in the project (session 29: their commits went unjudged)."""
        out: list[dict[str, str]] = []
        for repo in self._repos:
            found = read_refs(self.root / repo.git) if os.path.isdir(self.root / repo.git) else None
            if found is None:
                if repo is self._first(repo.git):
                    out.append({"path": f"{repo.git}/refs", "change": "unreadable after the run, or more refs than "
                                                                      "kooi compares: check the refs before you trust them"})
                continue
            committed = self._committed(repo, *found)
            # A second place of one git directory (two `.git` files naming it): its
            # commits judged there too, its refs said once.
            moved = self._refs_moved(repo, *found) if repo is self._first(repo.git) else []
            introduced = self._introduced(repo, *found, committed)
            out += moved + [{k: v for k, v in c.items() if k != "blob"} for c in committed] + introduced
        return out

    @functools.cached_property
    def _repos(self) -> list[Repo]:
        """The project's git directories as the checks after the run judge them, each at
        every place its files are checked out: the top `.git` first, then the nested
        repositories, the submodules' and a `gitdir:` file's repositories."""
        repos = [Repo(".git", "", self.refs, self.head, self.tips.get(".git", False))] if self.refs is not None else []
        for gd, n in self.nested_refs.items():
            repos += [Repo(gd, at, n[0], n[1], self.tips.get(gd, False)) for at in self._place(gd, n[2:])]
        return repos

    @functools.cached_property
    def _gitlinks(self) -> dict[tuple[str, str], str | None]:
        """What _gitlinked found, by (path, commit id)."""
        return {}

    def _places(self, git: str) -> list[str]:
        """Where the git directory GIT (a project path) checks out its files."""
        return [r.prefix for r in self._repos if r.git == git] or [self._place(git, [])[0]]

    def _place(self, gd: str, trees: list[str]) -> list[str]:
        """Where GD checks out its files: its own place (a nested `X/.git`'s X, a
        submodule's core.worktree) and TREES, the places of `.git` files naming it."""
        own = gd[:-len("/.git")] if gd.endswith("/.git") else module_work_tree(self.root, gd) \
            if "/modules/" in f"/{gd}" else ""
        return list(dict.fromkeys([*([own] if own else []), *trees])) or [""]

    def _first(self, git: str) -> Repo | None:
        return next((r for r in self._repos if r.git == git), None)

    def _gitlinked(self, rel: str, oid: str) -> str | None:
        """Why a gitlink at REL naming the commit OID is one the host would run: a commit
        of the repository checked out at REL that none of its refs, reflogs or pseudo-refs
        reached before the run (review 36, open until now: made with `git commit-tree`,
        named only by the gitlink, `git submodule update` checked out its `.envrc`)."""
        if (rel, oid) in self._gitlinks:
            return self._gitlinks[(rel, oid)]
        self._gitlinks[(rel, oid)] = None  # a gitlink inside the commits it names: judged once
        why = None
        for repo in (r for r in self._repos if r.prefix == rel and r.git != ".git"):
            why = self._gitlink_in(repo, oid)
            if why is not None:
                break
        self._gitlinks[(rel, oid)] = why
        return why

    def _gitlink_in(self, repo: Repo, oid: str) -> str | None:
        """What `git submodule update` writes at REPO's place from the commit OID: its
        files against what REPO had checked out when the run began (review 39: a
        gitlink moved back to an older commit that still held `.envrc`), and what the
        commits new to REPO hold (a checkout of one of them there later)."""
        gitdir = self.root / repo.git
        start = repo.head if HEX_ID.fullmatch(repo.head) else repo.refs.get(repo.head)
        old = {*(repo.tips if isinstance(repo.tips, list) else ()), *([start] if start else []),
               *(v for v in repo.refs.values() if HEX_ID.fullmatch(v))}
        if not HEX_ID.fullmatch(oid) or oid == start:
            return None
        if (present := commits_of(gitdir, [oid])) == []:
            # `git submodule update` fetches it from the submodule's remote, which may lie
            # in the project (review 40: a bare repository there the workload committed to)
            return (f"a gitlink to {oid[:12]}, a commit {repo.git} does not hold: `git submodule update` fetches "
                    "it from the submodule's remote; check what it checks out")
        checked_out = tree_changes(gitdir, start, oid) if present else None
        found = introduced(gitdir, [oid], sorted(old - NULL_IDS), MAX_COMMITS) if oid not in old else ([], 0)
        if found is None or checked_out is None:
            return f"a gitlink to {oid[:12]}, whose commits in {repo.git} could not be read"
        changes, commits = found
        changes = [(oid, "", path, mode, blob) for path, mode, blob in checked_out] + changes
        names: dict[str, set[str]] = {}
        for commit, _source, path, mode, blob in changes[:MAX_CHANGES]:
            if commit not in names and _needs_names(path):
                names[commit] = {f"{repo.prefix}/{n}" for n in _tree_names(gitdir, commit)}
            why = self._risky(f"{repo.prefix}/{path}", mode, entry_target(gitdir, mode, blob), names.get(commit, set()))
            if why is not None:
                return (f"a gitlink to {oid[:12]}, whose commit {commit[:12]} in {repo.git} holds "
                        f"{repo.prefix}/{path} ({why}): `git submodule update` on the host writes it")
        if commits >= MAX_COMMITS or len(changes) > MAX_CHANGES:
            return f"a gitlink to {oid[:12]}, with more commits in {repo.git} than kooi judges"
        return None

    def _introduced(self, repo: Repo, refs: dict[str, str], head: str, said: list[dict[str, str]]) -> list[dict[str, str]]:
        """Files the host would run in any commit the run introduced (reachable from its
        refs, HEAD, pseudo-refs or reflogs after it, from none of them before), judged
        like _committed's but those it said (SAID): a commit between a branch's start
        and its tip (`git checkout main~1`), one left only in a reflog or ORIG_HEAD
        (review 25: `git checkout -` wrote the `.envrc` of a commit made on a detached
        HEAD the workload had left)."""
        if repo.tips is False or repo.tips is True:
            return []
        gitdir = self.root / repo.git
        of = "" if repo.git == ".git" else f" of {repo.git}"
        at = f"{repo.prefix}/" if repo.prefix else ""
        after = read_tips(gitdir)
        if repo.tips is None or after is None:
            return [{"path": f"{repo.git}/logs", "change": f"more ids in the reflogs and pseudo-refs{of} than kooi "
                                                          "compares: check `git reflog` before you check out an "
                                                          "earlier HEAD (`git checkout -`, HEAD@{n}, ORIG_HEAD)"}]
        labels = {oid: where for oid, where in after.items() if oid not in NULL_IDS}
        labels.update({oid: ref for ref, oid in refs.items() if refs[ref] != repo.refs.get(ref) and HEX_ID.fullmatch(oid)})
        if HEX_ID.fullmatch(head):
            labels[head] = "HEAD"
        start = repo.head if HEX_ID.fullmatch(repo.head) else repo.refs.get(repo.head)
        old = {*repo.tips, *(v for v in repo.refs.values() if HEX_ID.fullmatch(v)), *([start] if start else [])}
        tips = sorted(oid for oid in labels if oid not in old)
        if not tips:
            return []
        found = introduced(gitdir, tips, sorted(old - NULL_IDS), MAX_COMMITS)
        # A tree, not a commit, where git takes a tree-ish (review 47: `git checkout
        # ORIG_HEAD -- .`, `git restore --source=HEAD@{1}` wrote the files of a tree the
        # workload left there; AUTO_MERGE holds one by design): its files against the
        # commit the project had checked out.
        named = trees_named(gitdir, tips)
        tree_files = [tree_changes(gitdir, start, tree) for _, tree in named or ()]
        if found is None or named is None or any(f is None for f in tree_files):
            return [{"path": f"{repo.git}/logs", "change": f"the run's commits{of} could not be read: check `git "
                                                          "reflog` before you check out an earlier HEAD"}]
        trees = {tree for _, tree in named}
        changes, commits = found
        changes = [(tree, tip, path, mode, oid) for (tip, tree), files in zip(named, tree_files)
                   for path, mode, oid in files or ()] + changes
        out: list[dict[str, str]] = []
        if commits >= MAX_COMMITS:
            out.append({"path": f"{repo.git}/logs", "change": f"the run made more than {MAX_COMMITS} commits{of}: "
                                                              f"kooi judged the newest {MAX_COMMITS} only"})
        if len(changes) > MAX_CHANGES:
            out.append({"path": f"{repo.git}/logs", "change": f"{len(changes)} files changed in the run's commits{of}; "
                                                              f"kooi judged the first {MAX_CHANGES} only: check "
                                                              "`git reflog` before you check out an earlier HEAD"})
        # What _committed said, by path and content (review 37: by path alone, a harmless
        # .envrc on a branch hid a malicious one in a commit left in the reflog).
        done = {(d["path"], d.get("blob", "")): d for d in said}
        names: dict[str, set[str]] = {}
        for commit, source, rel, mode, oid in changes[:MAX_CHANGES]:
            if rel == ".gitmodules" and oid in EMPTY_BLOBS:
                continue
            if (seen := done.get((at + rel, oid))) is not None:
                # Every carrier named, not only the first (review 48: a file said on
                # refs/worktree/wd stayed in stash@{1} once that ref was deleted).
                where = labels.get(source, source[:12])
                if where not in seen["change"] and seen["change"].count("; also ") < 5:
                    seen["change"] += f"; also reachable from {where}"
                continue
            if commit not in names and _needs_names(rel):
                names[commit] = {at + n for n in _tree_names(gitdir, commit)}
            target = entry_target(gitdir, mode, oid)
            if (why := self._risky(at + rel, mode, target, names.get(commit, set()))) is not None:
                where = labels.get(source, source[:12])
                if commit in trees:
                    out.append({"path": at + rel, "change": f"in the tree {commit[:12]}{of} that {where} names "
                                                            f"({why}): `git checkout {where} -- .` on the host "
                                                            "writes it"})
                else:
                    out.append({"path": at + rel, "change": f"committed in {commit[:12]}{of}, reachable from "
                                                            f"{where} ({why}): a checkout of it on the host writes it"})
                done[(at + rel, oid)] = out[-1]
        return _capped(out, 100, f"{repo.git}/logs", "of the run's commits")

    def _committed(self, repo: Repo, refs: dict[str, str], head: str) -> list[dict[str, str]]:
        """Files the run committed under a ref it moved (REFS, HEAD: REPO's after the run)
        that the host would run once a checkout, stash or reset writes them (review 17:
        `.envrc`, `.vscode/tasks.json` and argparse.py in a commit of the workload's came
        back with `git stash`): on branches, and on what is no branch (session 29: a tag,
        a remote-tracking branch, a detached HEAD, a stash and the untracked files in
        its third parent: `git checkout v2`, `git stash pop` wrote them)."""
        gitdir = self.root / repo.git
        out: list[dict[str, str]] = []
        # HEAD's branch first, then the other branches, then the rest; past the caps,
        # said (review 18: ten new branches sorted before `main` hid its commit, 20,000
        # files hid the 20,001st).
        moved = sorted((r for r in refs if refs[r] != repo.refs.get(r)),
                       key=lambda r: (r not in (head, repo.head), not r.startswith("refs/heads/"), r))
        # What the run introduced: a moved ref against where it was, a new one against
        # the commit the project had checked out when the run began.
        start = repo.head if HEX_ID.fullmatch(repo.head) else repo.refs.get(repo.head)
        todo: list[tuple[str, str | None, str]] = [(r, repo.refs.get(r) or start, refs[r]) for r in moved]
        if head != repo.head and HEX_ID.fullmatch(head):
            # A detached HEAD the run moved: what a `git reset --hard` there writes.
            todo.insert(0, ("HEAD", start, head))
        for ref, _old, new in list(todo):
            if ref == "refs/stash":
                # `git stash pop --index` restores the index from the second parent (against
                # the first, the commit stashed on), `git stash pop` untracked files from
                # the third (all of them new).
                if (base := _parent(gitdir, new, 1)) is not None and (index := _parent(gitdir, new, 2)) is not None:
                    todo.append((f"{ref}^2", base, index))
                if (untracked := _parent(gitdir, new, 3)) is not None:
                    todo.append((f"{ref}^3", None, untracked))
        of = "" if repo.git == ".git" else f" of {repo.git}"
        at = f"{repo.prefix}/" if repo.prefix else ""
        if len(todo) > MAX_BRANCHES:
            out.append({"path": f"{repo.git}/refs", "change": f"{len(todo)} refs moved; kooi looked into the commits "
                                                              f"of {MAX_BRANCHES} ({', '.join(r for r, _, _ in todo[:MAX_BRANCHES])}) "
                                                              "only: check the others before you check them out"})
        for ref, old, new in todo[:MAX_BRANCHES]:
            changes = tree_changes(gitdir, old, new)
            where = f"{repo.git}/{ref.split('^', 1)[0]}"
            if changes is None:
                out.append({"path": where, "change": f"the new commits of {ref} could not be read: check them before "
                                                     "you check them out"})
                continue
            names: set[str] | None = None  # the ref's files, read where a judgement needs them
            if len(changes) > MAX_CHANGES:
                out.append({"path": where, "change": f"{len(changes)} files changed on {ref}; kooi judged the first "
                                                     f"{MAX_CHANGES} only: check the rest before you check it out"})
            for rel, mode, oid in changes[:MAX_CHANGES]:
                if rel == ".gitmodules" and oid in EMPTY_BLOBS:
                    continue  # the guard's own while the run lasted (a stash took it): configures nothing
                if names is None and _needs_names(rel):
                    names = {at + n for n in _tree_names(gitdir, new)}
                target = entry_target(gitdir, mode, oid)
                if (why := self._risky(at + rel, mode, target, names or set())) is not None:
                    out.append({"path": at + rel, "change": f"committed on {ref}{of} ({why}): a checkout, `git "
                                                            "stash` or `git reset --hard` on the host writes it",
                                "blob": oid})
        return _capped(out, 2 * MAX_BRANCHES + 100, f"{repo.git}/refs", "on the refs the run moved")

    def _watched_names(self) -> tuple[str, ...]:
        try:
            top = sorted(n for n in os.listdir(self.root) if any(fnmatch.fnmatch(n, g) for g in WATCHED_GLOBS))
        except OSError:
            top = []
        return tuple(dict.fromkeys((*WATCHED, *top, *self.watched_deep)))

    def _watched_changed(self) -> list[dict[str, str]]:
        """Every watched path the run created, changed or removed (kept: a pipeline gates on them)."""
        watched = self.watched
        after = scan(self.root, tuple(dict.fromkeys((*(watched or {}), *self._watched_names()))), content=False,
                     strict=False) if watched is not None else {}
        changed = []
        for rel in sorted(set(watched or {}) | set(after)):
            b, a = (watched or {}).get(rel), after.get(rel)
            if b is not None and (b.same(a) or a is not None and b.kind == "dir" == a.kind):
                continue
            changed.append({"path": rel, "change": change_of(b, a)})
        return changed

    def _refs_moved(self, repo: Repo, refs: dict[str, str], head: str) -> list[dict[str, str]]:
        """Review 15: the refs a review compares the run's work against (a remote-tracking
        branch, a tag) moved to the run's commit hide it (`git diff origin/main` shows
        nothing, `git checkout v1.0` builds the workload's code). Every ref the run
        changed (REFS, HEAD: REPO's after the run) but the branch it worked on, said."""
        why = " (not the branch the run worked on: compare the run's work against it with care)"
        # The run's own branch: what HEAD named before and after, a branch only (review 16).
        own = {h for h in (repo.head, head) if h.startswith("refs/heads/")}
        out = [{"path": f"{repo.git}/{ref}" if ref != "(more)" else f"{repo.git}/refs", "change": change + why}
               for ref, change in refs_changed(repo.refs, refs, own)]
        if head != repo.head:
            out.append({"path": f"{repo.git}/HEAD", "change": f"now names {head[:200] or '(nothing)'} "
                                                              f"(was {repo.head[:200] or '(nothing)'})"})
        return out


def _needs_names(rel: str) -> bool:
    """Judging REL needs the other paths of its tree (Listed._risky): a package's
    `__init__` (a module beside it), an extension module, a `HEAD` (a repository's
    layout around it)."""
    name = rel.rpartition("/")[2]
    return name.startswith("__init__.") or name.endswith(".so") or name == "HEAD"


def _layout_beside(parent: str, names: set[str]) -> bool:
    """NAMES (a tree's paths) hold what makes PARENT a repository to git beside its HEAD:
    `objects` and `refs` of any kind (directories, links, gitlinks), or a `commondir`
    (review 36: both forms passed, only files under objects/ and refs/ counted)."""
    at = f"{parent}/" if parent else ""
    if f"{at}commondir" in names:
        return True
    return all(f"{at}{d}" in names or any(n.startswith(f"{at}{d}/") for n in names) for d in ("objects", "refs"))


def _capped(out: list[dict[str, str]], cap: int, where: str, what: str) -> list[dict[str, str]]:
    """OUT, at most CAP entries, and a last one that says so past it (review 37: 260
    decoy entries hid an .envrc on another branch)."""
    if len(out) <= cap:
        return out
    return out[:cap] + [{"path": where, "change": f"{len(out) - cap} more risky files {what} than listed here: "
                                                  "check every ref and `git reflog` before you check anything out"}]
