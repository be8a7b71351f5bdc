"""What the workload made in the project where the host would run it, taken out after
the run (run.guard): modules at the top that shadow what the host's Python imports,
symlinks out of the project, compiled code; and where its work goes instead of away
(KEEP, review 12: an agent's own `types.py` was deleted): a tar archive per run, so
nothing kept has a name a tool reads (review 13: kept files under their own names were
live settings again, and counted as protected paths in the next run)."""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path
from typing import Any

from .fsat import open_dir, remove_at
from .protected import py_modules

# Where the guard keeps the workload's work it took out of the project (created where a
# tool on the host would run it): KEEP/RUN-ID.tar, each item under its project path.
KEEP = ".kooi-removed"
# The most one run keeps (bytes of regular files); past it, items are removed unkept.
MAX_KEEP = 256 << 20
# The most compiled Python files and outward symlinks listed one by one (the rest counted).
MAX_LISTED = 20



class MadeByWorkload:
    """Guard's part for what the workload made (a mixin: Guard holds the state)."""

    root: Path
    run_id: str
    links: dict[str, str]
    started: int | None
    py_own: tuple[str, ...]
    beside: tuple[str, ...]
    _archive: tarfile.TarFile | None = None
    _archive_name: str = ""
    _archive_file: Any = None
    _kept_bytes: int = 0

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
        not. With ITEM (its refusal): kept in the run's archive first (the workload's
        work, never lost), and ITEM says where."""
        parent, _, name = rel.rpartition("/")
        try:
            fd = open_dir(self.root, parent)
            try:
                if item is not None:
                    self._keep(fd, rel, item)
                remove_at(fd, name)
            finally:
                os.close(fd)
        except OSError as exc:
            return f"{rel}: {exc.strerror or exc}"
        return None

    def _keep_rel(self, rel: str, item: dict[str, str]) -> None:
        """_keep of REL, its directory opened from the project's top without a link."""
        try:
            fd = open_dir(self.root, rel.rpartition("/")[0])
        except OSError:
            return
        try:
            self._keep(fd, rel, item)
        finally:
            os.close(fd)

    def _keep(self, fd: int, rel: str, item: dict[str, str]) -> bool:
        """Add REL (its name in the directory FD, which kooi opened without following a
        link) to this run's archive KEEP/RUN-ID.tar before it is removed; True when
        kept. Never anything of git's; a symlink is kept as a link. Not kept: past
        MAX_KEEP, or where KEEP is not a directory of the project's own."""
        name = rel.rpartition("/")[2]
        if not self.run_id or ".git" in rel.split("/"):
            return False
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            size = _size_at(fd, name, st, MAX_KEEP - self._kept_bytes)
            if size is None or self._archive_open() is None:
                return False
            assert self._archive is not None
            self._kept_bytes += size
            self._archive.add(f"/proc/self/fd/{fd}/{name}", arcname=rel, recursive=True)
            if self._archive_file is not None:
                self._archive_file.flush()
        except (OSError, tarfile.TarError):
            return False
        item["kept"] = f"{KEEP}/{self._archive_name}"
        return True

    def _archive_open(self) -> tarfile.TarFile | None:
        if self._archive is None:
            top = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
            try:
                try:
                    os.mkdir(KEEP, 0o755, dir_fd=top)
                except FileExistsError:
                    pass
                kfd = os.open(KEEP, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
            except OSError:
                return None  # a file or link of the workload's there: nothing is kept
            finally:
                os.close(top)
            try:
                n = 0
                while True:
                    name = f"{self.run_id}{f'.{n}' if n else ''}.tar"
                    try:
                        afd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=kfd)
                        break
                    except FileExistsError:
                        n += 1  # a check resumed after kooi was killed
            finally:
                os.close(kfd)
            self._archive_file = os.fdopen(afd, "wb")
            self._archive = tarfile.open(fileobj=self._archive_file, mode="w", format=tarfile.PAX_FORMAT)
            self._archive_name = name
        return self._archive

    def _archive_close(self) -> None:
        if self._archive is not None:
            self._archive.close()
            self._archive_file.close()
            self._archive = self._archive_file = None
            self._kept_bytes = 0

    def _outward_and_compiled(self, links: dict[str, str], pyc: list[str]) -> tuple[list[dict[str, str]], list[str]]:
        """Review 12: a symlink the workload made out of the project (`target/classes ->
        /root/.ssh`: the host's next build writes there), and compiled Python it wrote
        (a .pyc whose header matches the source runs instead of it, and no diff shows
        it): removed, listed (the first MAX_LISTED one by one). The workflow's own
        environments (.venv, node_modules) are said instead (exposed)."""
        refused: list[dict[str, str]] = []
        failed: list[str] = []
        new_links = sorted(r for r, t in links.items() if self.links.get(r) != t)
        written = []
        for rel in pyc:
            try:
                if os.lstat(self.root / rel).st_ctime_ns >= (self.started or 0):
                    written.append(rel)
            except OSError:
                pass
        for rel, change in [(r, f"created (a symlink out of the project, to {links[r][:200]}: what the host "
                                "writes through it lands there)") for r in new_links] + \
                           [(r, "written (compiled Python code: it runs instead of its source, and no diff "
                                "shows it)") for r in sorted(written)]:
            if (why := self._remove_made(rel)) is not None:
                failed.append(why)
            if len(refused) < MAX_LISTED:
                refused.append({"path": rel, "change": change, "how": "put back"})
        left = len(new_links) + len(written) - len(refused)
        if left > 0:
            refused.append({"path": "(more)", "change": f"{left} more symlinks out of the project or compiled Python "
                                                       "files the run wrote, removed likewise", "how": "put back"})
        return refused, failed


    def _packages_beside_modules(self, packages: list[str]) -> tuple[list[dict[str, str]], list[str]]:
        """Review 15: a package the workload made beside a module (`app/__init__.py` next
        to `app.py`, hidden by `app/.gitignore`): the host's `import app` runs the
        package. Its `__init__` goes (kept in the run's archive; without it the directory
        is no package, and the module is what Python imports again); a link to a package
        there goes itself (review 16)."""
        refused: list[dict[str, str]] = []
        failed: list[str] = []
        for rel in packages:
            if rel in self.beside:
                continue  # the project's own
            link = os.path.islink(self.root / rel)
            pkg = rel if link else rel.rpartition("/")[0]
            item = {"path": rel, "change": f"created (a {'link to a ' if link else ''}package beside the module "
                                           f"{pkg}.py: Python imports the package instead)", "how": "put back"}
            if (why := self._remove_made(rel, item)) is not None:
                failed.append(why)
            refused.append(item)
        return refused, failed


def _size_at(fd: int, name: str, st: os.stat_result, budget: int) -> int | None:
    """Bytes of regular files in NAME (a file or a tree, never through a link), or None
    past BUDGET."""
    if not stat.S_ISDIR(st.st_mode):
        n = st.st_size if stat.S_ISREG(st.st_mode) else 0
        return n if n <= budget else None
    total = 0
    dfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
    try:
        for entry in os.scandir(dfd):
            sub = _size_at(dfd, entry.name, entry.stat(follow_symlinks=False), budget - total)
            if sub is None:
                return None
            total += sub
    finally:
        os.close(dfd)
    return total
