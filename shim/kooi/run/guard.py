"""The project cannot be turned against the host: the paths in it that later execute
outside the cage (git hooks and configuration, direnv, editor tasks, dev containers)
are protected, and the paths a pipeline should look at after a run (CI definitions,
build scripts, lockfiles) are watched.

- Before the workload starts, kooi takes a snapshot of every protected path (type,
  mode, content; directories with everything in them) and a digest of every watched one.
- While it runs, the protected paths that exist are mounted read-only over the
  project (container and jail): writes fail with EROFS.
- After the workload and everything it started have ended, kooi compares: every
  protected path that differs (created, changed, deleted, replaced by a symlink, also
  by renaming a parent away) is put back as it was and listed as refused; every
  watched path that differs is listed as changed. Nothing is followed through a
  symlink the workload made.

A workflow can drop protected paths from the list (unprotected_paths).
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Paths that execute on the host later: at the next git command (hooks, config:
# core.hooksPath, core.fsmonitor, core.sshCommand, filters, aliases; info/attributes
# selects filters; submodules' own config and hooks), on `cd` (direnv, mise), in the
# editor (VS Code tasks, settings, launch configurations), when a dev container is
# built. `.git` itself: turned into a file or symlink (gitdir: elsewhere) it points git
# at a repository the workload chose.
PROTECTED = (".git", ".git/hooks", ".git/config", ".git/info", ".git/modules", ".gitmodules", ".envrc",
             ".mise.toml", "mise.toml", ".vscode/tasks.json", ".vscode/settings.json", ".vscode/launch.json",
             ".devcontainer")
# Changed paths a pipeline should look at before it trusts the result: CI definitions,
# build scripts and wrappers, lockfiles, hook managers.
WATCHED = (".github/workflows", ".gitlab-ci.yml", "Jenkinsfile", ".circleci", "azure-pipelines.yml", ".buildkite",
           "pom.xml", "mvnw", ".mvn", "build.gradle", "build.gradle.kts", "settings.gradle", "settings.gradle.kts",
           "gradlew", "gradle/wrapper", "package.json", "package-lock.json", "yarn.lock", "pnpm-lock.yaml",
           "Makefile", "setup.py", "setup.cfg", "pyproject.toml", "tox.ini", "noxfile.py", "requirements.txt",
           "poetry.lock", "uv.lock", "Pipfile.lock", "Cargo.lock", "go.sum", "Gemfile.lock", "Dockerfile",
           "docker-compose.yml", "compose.yaml", ".pre-commit-config.yaml", ".husky")
MAX_ENTRIES = 5000
MAX_BYTES = 32 << 20


@dataclass(frozen=True)
class Entry:
    kind: str  # file, dir, link, other
    mode: int = 0
    data: bytes = b""  # a file's content, a link's target

    def same(self, other: Entry | None) -> bool:
        """Equal but for the group permission bits: they hold the ACL mask, which kooi
        itself sets when it grants the workload the project."""
        return other is not None and (self.kind, self.data, self.mode & 0o7707) == \
            (other.kind, other.data, other.mode & 0o7707)


class GuardError(Exception):
    """The protected paths are too large to keep (the run is refused before it starts)."""


def _lentry(p: Path, content: bool) -> Entry | None:
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
            return Entry("file", stat.S_IMODE(st.st_mode), f"{st.st_size}:{st.st_mtime_ns}".encode())
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            return Entry("file", stat.S_IMODE(st.st_mode), f.read())
    return Entry("other", stat.S_IMODE(st.st_mode))


def _parents_real(root: Path, rel: str) -> bool:
    """Every component of REL's parent is a real directory (no symlink, no file)."""
    p = root
    for part in Path(rel).parts[:-1]:
        p = p / part
        try:
            if not stat.S_ISDIR(os.lstat(p).st_mode):
                return False
        except FileNotFoundError:
            return False
    return True


def scan(root: Path, paths: tuple[str, ...], content: bool = True) -> dict[str, Entry]:
    """Every entry at and below PATHS in ROOT, never through a symlink; with CONTENT the
    files' bytes, else their size and mtime."""
    out: dict[str, Entry] = {}
    total = 0
    todo = [p for p in paths]
    while todo:
        rel = todo.pop()
        if rel in out or not _parents_real(root, rel):
            continue
        e = _lentry(root / rel, content)
        if e is None:
            continue
        if rel == ".git" and e.kind == "dir":
            out[rel] = e  # the repository's own contents are not protected, only its kind
            continue
        out[rel] = e
        total += len(e.data)
        if len(out) > MAX_ENTRIES or total > MAX_BYTES:
            raise GuardError(f"the protected paths of the project hold more than {MAX_ENTRIES} entries or "
                             f"{MAX_BYTES >> 20} MiB; clean them up or name them in unprotected_paths")
        if e.kind == "dir":
            with os.scandir(root / rel) as it:
                for d in it:
                    child = f"{rel}/{d.name}"
                    if rel == ".git/modules" or rel.startswith(".git/modules/"):
                        # A submodule's repository: only its config and hooks execute.
                        if d.is_dir(follow_symlinks=False) and d.name not in ("objects", "refs", "logs"):
                            todo.append(child)
                        elif d.name == "config" or "/hooks" in child:
                            todo.append(child)
                    else:
                        todo.append(child)
    return out


def _change(before: Entry | None, after: Entry | None) -> str:
    if before is None:
        return "created"
    if after is None:
        return "deleted"
    if before.kind != after.kind:
        return f"replaced ({before.kind} -> {after.kind})"
    if before.data != after.data:
        return "modified"
    return "mode changed"


def _remove(p: Path) -> None:
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(p)  # never follows symlinks (fd-based on Linux)
    else:
        os.unlink(p)


def _restore(root: Path, rel: str, e: Entry) -> None:
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
    cur = _lentry(p, content=False)
    if e.kind == "dir":
        if cur is not None and cur.kind != "dir":
            _remove(p)
            cur = None
        if cur is None:
            os.mkdir(p, e.mode)
        os.chmod(p, e.mode, follow_symlinks=False)
    elif e.kind == "file":
        _remove(p)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, e.mode)
        with os.fdopen(fd, "wb") as f:
            f.write(e.data)
        os.chmod(p, e.mode)
    elif e.kind == "link":
        _remove(p)
        os.symlink(e.data.decode(errors="surrogateescape"), p)


@dataclass
class Guard:
    root: Path
    unprotected: tuple[str, ...] = ()
    protected: dict[str, Entry] = field(default_factory=dict)
    watched: dict[str, Entry] = field(default_factory=dict)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(p for p in PROTECTED if p not in self.unprotected)

    def snapshot(self) -> None:
        self.protected = scan(self.root, self.paths)
        self.watched = scan(self.root, WATCHED, content=False)

    def read_only(self) -> list[str]:
        """The protected paths that exist as real directories or files: mounted
        read-only over the project while the workload runs."""
        return [p for p in self.paths if p != ".git" and p in self.protected
                and self.protected[p].kind in ("dir", "file")]

    def check(self) -> dict[str, Any]:
        """After the run: restore every protected path that differs; the record."""
        after = scan(self.root, self.paths)
        refused = []
        for rel in sorted(set(self.protected) | set(after)):
            b, a = self.protected.get(rel), after.get(rel)
            if b is None and a is None or b is not None and b.same(a):
                continue
            refused.append({"path": rel, "change": _change(b, a)})
        failed = []
        # Remove what the workload created (deepest first), then put back what was
        # there (shallowest first).
        for item in sorted(refused, key=lambda r: -len(Path(r["path"]).parts)):
            if item["path"] not in self.protected:
                try:
                    _remove(self.root / item["path"])
                except OSError as exc:
                    failed.append(f"{item['path']}: {exc.strerror or exc}")
        for item in sorted(refused, key=lambda r: len(Path(r["path"]).parts)):
            e = self.protected.get(item["path"])
            if e is not None:
                try:
                    _restore(self.root, item["path"], e)
                except OSError as exc:
                    failed.append(f"{item['path']}: {exc.strerror or exc}")
        # Entries under a restored directory that the scan could not see (a parent
        # was a symlink) are restored with it; entries the workload added below are
        # removed above.
        w_after = scan(self.root, WATCHED, content=False)
        changed = []
        for rel in sorted(set(self.watched) | set(w_after)):
            b, a = self.watched.get(rel), w_after.get(rel)
            if b is not None and (b.same(a) or a is not None and b.kind == "dir" == a.kind):
                continue
            changed.append({"path": rel, "change": _change(b, a)})
        return {"protected": list(self.paths), "refused": refused, "restored": not failed,
                "restore_failed": failed, "watched_changed": changed}
