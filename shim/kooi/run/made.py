"""What the workload made in the project where the host would run it, taken out after
the run (run.guard): modules at the top that shadow what the host's Python imports,
symlinks out of the project, compiled Python; and where its work goes instead of away
(KEEP, review 12: an agent's own `types.py` was deleted)."""

from __future__ import annotations

import os
import stat
import urllib.parse
from pathlib import Path

from .fsat import open_dir, remove_at
from .protected import py_modules

# Where the guard keeps the workload's work it took out of the project (created where a
# tool on the host would run it): KEEP/RUN/PATH-with-slashes-quoted. A name no tool
# reads (not a module, no DEEP name); its contents run nowhere.
KEEP = ".kooi-removed"
# The most compiled Python files and outward symlinks listed one by one (the rest counted).
MAX_LISTED = 20



class MadeByWorkload:
    """Guard's part for what the workload made (a mixin: Guard holds the state)."""

    root: Path
    run_id: str
    links: dict[str, str]
    started: int | None
    py_own: tuple[str, ...]

    def _shadows_created(self) -> tuple[list[dict[str, str]], list[str]]:
        """Modules the workload made at the project's top that shadow what the host's
        `python3 -m TOOL` imports (protected.py_modules): removed, listed."""
        refused, failed = [], []
        for name, rels in py_modules(self.root).items():
            if name in self.py_own:
                continue
            for rel in rels:
                item = {"path": rel, "change": f"created (shadows the Python module {name} of the host's "
                                              "`python3 -m` and tools there)", "how": "put back"}
                refused.append(item)
                if (why := self._remove_made(rel, item)) is not None:
                    failed.append(why)
        return refused, failed

    def _remove_made(self, rel: str, item: dict[str, str] | None = None) -> str | None:
        """Remove REL, something the workload made, never through a symlink; None, or why
        not. With ITEM (its refusal): a regular file or directory is moved to KEEP
        instead (the workload's work, never lost), and ITEM says where."""
        parent, _, name = rel.rpartition("/")
        try:
            fd = open_dir(self.root, parent)
            try:
                if item is None or not self._keep(fd, rel, item):
                    remove_at(fd, name)
            finally:
                os.close(fd)
        except OSError as exc:
            return f"{rel}: {exc.strerror or exc}"
        return None

    def _keep(self, fd: int, rel: str, item: dict[str, str]) -> bool:
        """Move REL (its name in the directory FD) to KEEP/RUN/ under one flat name that
        no tool reads (review 12: an agent's own types.py was lost); True when moved.
        Never a symlink or anything of git's, never through a symlink (KEEP itself a
        symlink: nothing is kept, the caller removes)."""
        name = rel.rpartition("/")[2]
        if not self.run_id or ".git" in rel.split("/") or rel.split("/", 1)[0] == KEEP:
            return False
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                return False
            top = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
            try:
                for part in (KEEP, self.run_id):
                    try:
                        os.mkdir(part, 0o755, dir_fd=top)
                    except FileExistsError:
                        pass
                    nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
                    os.close(top)
                    top = nfd
                flat = urllib.parse.quote(rel, safe="")
                os.rename(name, flat, src_dir_fd=fd, dst_dir_fd=top)
            finally:
                os.close(top)
        except OSError:
            return False
        item["kept"] = f"{KEEP}/{self.run_id}/{flat}"
        return True

    def _outward_and_compiled(self, links: dict[str, str], pyc: list[str]) -> tuple[list[dict[str, str]], list[str]]:
        """Review 12: a symlink the workload made out of the project (`target/classes ->
        /root/.ssh`: the host's next build writes there), and compiled Python it wrote
        (a .pyc whose header matches the source runs instead of it, and no diff shows
        it): removed, listed (the first MAX_LISTED one by one). The workflow's own
        environments (.venv, node_modules) are said instead (exposed)."""
        refused: list[dict[str, str]] = []
        failed: list[str] = []
        new_links = sorted(r for r, t in links.items() if self.links.get(r) != t and r.split("/", 1)[0] != KEEP)
        written = []
        for rel in pyc:
            try:
                if os.lstat(self.root / rel).st_ctime_ns >= (self.started or 0):
                    written.append(rel)
            except OSError:
                pass
        for rel, change in [(r, f"created (a symlink out of the project, to {links[r][:200]}: what the host "
                                "writes through it lands there)") for r in new_links] + \
                           [(r, "written (compiled Python: it runs instead of its source, and no diff shows "
                                "it)") for r in sorted(written)]:
            if (why := self._remove_made(rel)) is not None:
                failed.append(why)
            if len(refused) < MAX_LISTED:
                refused.append({"path": rel, "change": change, "how": "put back"})
        left = len(new_links) + len(written) - len(refused)
        if left > 0:
            refused.append({"path": "(more)", "change": f"{left} more symlinks out of the project or compiled Python "
                                                       "files the run wrote, removed likewise", "how": "put back"})
        return refused, failed

