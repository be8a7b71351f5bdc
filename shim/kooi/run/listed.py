"""What the project guard (run.guard) lists rather than puts back, and how it tells a
protected path: the watched paths the run changed (WATCHED, WATCHED_GLOBS at the top,
the WATCHED_DEEP names below it), the refs it moved but its own branch (review 15)."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

from .gitdata import read_refs, refs_changed
from .protected import DEEP, PROTECTED_GLOBS, WATCHED, WATCHED_GLOBS
from .snapshot import Entry, change_of, scan


class Listed:
    """Guard's part for what it lists (a mixin: Guard holds the state)."""

    root: Path
    unprotected: tuple[str, ...]
    watched: dict[str, Entry] | None
    watched_deep: tuple[str, ...]
    refs: dict[str, str] | None
    head: str

    @property
    def paths(self) -> tuple[str, ...]:
        raise NotImplementedError  # Guard's

    def _protected_rel(self, rel: str) -> bool:
        """REL (a path in the project) is protected: what an index entry there would
        have the host's `git checkout` write (Shadows._data_refusal)."""
        if any(rel == u or rel.startswith(u + "/") for u in self.unprotected):
            return False
        parts = rel.split("/")
        return any(rel == p or rel.startswith(p + "/") for p in self.paths) \
            or any(fnmatch.fnmatch(parts[0], g) for g in PROTECTED_GLOBS) \
            or any(part in DEEP for part in parts[1:]) or ".git" in parts

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

    def _refs_moved(self) -> list[dict[str, str]]:
        """Review 15: the refs a review compares the run's work against (a remote-tracking
        branch, a tag) moved to the run's commit hide it (`git diff origin/main` shows
        nothing, `git checkout v1.0` builds the workload's code). Every ref the run
        changed but the branch it worked on, said."""
        if self.refs is None or not os.path.isdir(self.root / ".git"):
            return []
        found = read_refs(self.root / ".git")
        if found is None:
            return [{"path": ".git/refs", "change": "unreadable after the run, or more refs than kooi compares: "
                                                    "check the refs before you trust them"}]
        refs, head = found
        why = " (not the branch the run worked on: compare the run's work against it with care)"
        # The run's own branch: what HEAD named before and after, a branch only (review 16).
        own = {h for h in (self.head, head) if h.startswith("refs/heads/")}
        out = [{"path": f".git/{ref}" if ref != "(more)" else ".git/refs", "change": change + why}
               for ref, change in refs_changed(self.refs, refs, own)]
        if head != self.head:
            out.append({"path": ".git/HEAD", "change": f"now names {head[:200] or '(nothing)'} "
                                                       f"(was {self.head[:200] or '(nothing)'})"})
        return out
