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
"""

from __future__ import annotations

import base64
import errno
import fnmatch
import hashlib
import os
import re
import shutil
import stat
import subprocess
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Other agents' and editors' project settings: the MCP servers, hooks, plugins, tasks
# and language servers they start on the host when opened here, vim's exrc, sdkman's
# environment.
AGENTS = (".gemini", ".cursor", ".codex", ".amazonq", ".roo", ".kiro", ".windsurf", ".continue", ".opencode",
          "opencode.json", "opencode.jsonc", ".zed", ".helix", ".nvim.lua", ".nvimrc", ".exrc", ".sdkmanrc")
# Paths that execute on the host later: on `cd` (direnv, mise), in the editor (VS Code
# tasks, settings, launch configurations, workspaces), when a dev container is built,
# when an agent runs there (Claude Code's hooks and MCP servers), and `.git` (below).
PROTECTED = (".git", ".gitmodules", ".envrc", ".mise.toml", "mise.toml", ".mise.local.toml", "mise.local.toml",
             ".mise", "mise", ".config/mise.toml", ".config/mise", ".vscode", ".idea", ".devcontainer",
             ".devcontainer.json", ".claude", ".mcp.json",
             # what package managers run when someone builds on the host: cargo's
             # rustc-wrapper and aliases, yarn's yarnPath, npm's node-options and
             # script-shell, pnpm's hooks file
             ".cargo/config.toml", ".cargo/config", ".yarnrc.yml", ".yarnrc", ".npmrc", ".pnpmfile.cjs",
             # a toolchain at a path of the workload's: rustup's `path`, mise's `path:` versions
             "rust-toolchain", "rust-toolchain.toml", ".tool-versions", *AGENTS)
# mise's environment variants (mise.ENV.toml) and editor workspaces.
PROTECTED_GLOBS = ("*.code-workspace", ".mise.*.toml", "mise.*.toml")
# In a git directory (`.git`, a `gitdir:` target in the project, each submodule's
# under modules/) everything is protected but the repository's data: a new
# commondir, config.worktree or worktrees/ would point git at a config and hooks of the
# workload's choosing as surely as a changed config or hook.
GIT_DATA = frozenset({
    "objects", "refs", "logs", "index", "HEAD", "ORIG_HEAD", "FETCH_HEAD", "MERGE_HEAD", "MERGE_MSG",
    "MERGE_MODE", "AUTO_MERGE", "CHERRY_PICK_HEAD", "REVERT_HEAD", "COMMIT_EDITMSG", "TAG_EDITMSG", "SQUASH_MSG",
    "packed-refs", "description", "shallow", "rebase-merge", "rebase-apply", "sequencer", "lost-found", "gc.log",
    "gc.pid", "BISECT_LOG", "BISECT_START", "BISECT_TERMS", "BISECT_NAMES", "BISECT_EXPECTED_REV",
    "BISECT_ANCESTORS_OK", "branches", "modules", "lfs", "rr-cache"})


def is_git_data(name: str) -> bool:
    """NAME, in a git directory, is the repository's data (a split index's shared part too)."""
    return name in GIT_DATA or name.startswith("sharedindex.")
# Protected wherever they are in the project (below its top, outside node_modules): what
# runs on the host when someone works in that directory (direnv on cd, cargo, npm, yarn
# and pnpm when they build there, mise, Claude Code and MCP clients started there, a dev
# container opened there).
DEEP = frozenset({".envrc", ".npmrc", ".yarnrc", ".yarnrc.yml", ".pnpmfile.cjs", ".cargo", ".mise.toml", "mise.toml",
                  ".mise", ".claude", ".mcp.json", ".devcontainer", ".devcontainer.json", ".gitmodules",
                  # a toolchain at a path of the workload's: rustup's `path`, mise's `path:`
                  "rust-toolchain", "rust-toolchain.toml", ".tool-versions", *AGENTS})
# While the workload runs, every git directory of the project (its own `.git`, a
# `gitdir:` target, each submodule's under modules/, a nested repository's) is a
# throwaway copy mounted over the real one: its configuration and hooks (everything but
# the data) from the snapshot, git's data files copied in (and back afterwards), git's
# data directories bound from the real one. The host's git, which runs whenever anyone
# looks at the project, never sees a config, hook, commondir or a renamed `.git` of the
# workload's while the run runs. Bound from the real git directory:
BOUND = ("objects", "refs", "logs", "lfs", "rr-cache")
# The paths of a git directory a workflow may leave to the workload for real.
SHADOWED = (".git/hooks", ".git/config", ".git/info")
# What a workflow may unprotect (unprotected_paths; the schema's enum).
UNPROTECTABLE = PROTECTED + SHADOWED + (".git/modules",)
# Git's data that is never copied back from a throwaway: what a host's git would run
# (a rebase's or cherry-pick's todo list, with its `exec` lines, on `--continue`).
NOT_COPIED_BACK = frozenset({"rebase-merge", "rebase-apply", "sequencer"})
# Git's data that must stay (without HEAD the directory is no repository, and git takes
# a directory above it, of the workload's making, for one).
NEVER_REMOVED = frozenset({"HEAD", "objects", "refs"})
_HEAD_RE = re.compile(rb"\A(?:ref: refs/[A-Za-z0-9._/-]{1,240}|[0-9a-f]{40}|[0-9a-f]{64})\n?\Z")
# The empty repository kooi makes where a project has no .git, as the throwaway's mount
# point (Guard.shadows), and what it holds (names, fingerprints without the mode).
PLACEHOLDER_HEAD = b"ref: refs/heads/kooi-run-placeholder\n"
PLACEHOLDER_CONTENT = [("HEAD", ("file", len(PLACEHOLDER_HEAD), hashlib.sha256(PLACEHOLDER_HEAD).hexdigest())),
                       ("objects", ("dir", ())), ("refs", ("dir", ()))]
# The block kooi appends to a project's git config while a run lasts (Guard._pin_config).
RUN_BLOCK_START = "# kooi run: while a kooi run runs on this project, git looks into no submodule here (kooi removes this)"
RUN_BLOCK_END = "# kooi run: end"
# How many git directories (a throwaway each) and `.git` files (a copy each) a run takes.
MAX_GIT_DIRS = 32
MAX_GIT_FILES = 64
# How far kooi looks for nested repositories (entries of the project; before and after).
MAX_WALK = 2_000_000
# Git's data kooi copies back from a throwaway: regular files and directories only, at most.
MAX_DATA_BYTES = 1 << 30
# Objects the workload wrote, verified after the run (decompressed bytes, over every
# git directory of the run): past it, what is left unverified goes.
MAX_VERIFY_BYTES = 4 << 30
_LOOSE_DIR = re.compile(r"[0-9a-f]{2}")
_LOOSE_NAME = re.compile(r"[0-9a-f]{38}|[0-9a-f]{62}")
_PACK_NAME = re.compile(r"(pack-(?:[0-9a-f]{40}|[0-9a-f]{64}))\.(pack|idx|rev|bitmap|mtimes|keep|promisor)")
_OBJECT_TYPES = (b"blob", b"tree", b"commit", b"tag")
# Changed paths a pipeline should look at before it trusts the result: CI definitions,
# build scripts and wrappers, lockfiles, hook managers, agent instructions.
WATCHED = (".github/workflows", ".gitlab-ci.yml", "Jenkinsfile", ".circleci", "azure-pipelines.yml", ".buildkite",
           "pom.xml", "mvnw", ".mvn", "build.gradle", "build.gradle.kts", "settings.gradle", "settings.gradle.kts",
           "gradlew", "gradle/wrapper", "package.json", "package-lock.json", "yarn.lock", "pnpm-lock.yaml",
           "Makefile", "setup.py", "setup.cfg", "pyproject.toml", "tox.ini", "noxfile.py", "requirements.txt",
           "poetry.lock", "uv.lock", "Pipfile.lock", "Cargo.lock", "go.sum", "Gemfile.lock", "Dockerfile",
           "docker-compose.yml", "compose.yaml", ".pre-commit-config.yaml", ".husky", "CLAUDE.md",
           "AGENTS.md")
MAX_ENTRIES = 5000
MAX_BYTES = 32 << 20
# After the run (a flood is removed, not refused): how much kooi reads before it stops.
MAX_ENTRIES_AFTER = 50000
MAX_BYTES_AFTER = 256 << 20
MAX_FILE = 8 << 20
# Git hook managers: what an installed hook (in the git directory's hooks/) says about
# its manager, and the files in the working tree that manager then runs at the host's
# next commit or push (its configuration, and scripts it keeps beside it).
_LEFTHOOK = tuple(f"{dot}lefthook{local}.{ext}" for dot in ("", ".") for local in ("", "-local")
                  for ext in ("yml", "yaml", "toml", "json", "jsonc")) + (".config/lefthook.yml", ".lefthook",
                                                                         ".lefthook-local")
HOOK_MANAGERS: tuple[tuple[bytes, tuple[str, ...]], ...] = (
    (b"File generated by pre-commit", (".pre-commit-config.yaml", ".pre-commit-config.yml")),
    (b"prek", (".pre-commit-config.yaml", ".pre-commit-config.yml")),
    (b"lefthook", _LEFTHOOK),
    (b"hk run", ("hk.pkl", "hk.local.pkl", ".config/hk.pkl")),
    (b"overcommit", (".overcommit.yml",)),
    (b"mise run", ("mise-tasks", ".mise-tasks")),
)


@dataclass(frozen=True)
class Entry:
    kind: str  # file, dir, link, other, unreadable
    mode: int = 0
    data: bytes = b""  # a file's content (watched: its fingerprint), a link's target
    nlink: int = 1

    def same(self, other: Entry | None) -> bool:
        """Equal but for the group permission bits: they hold the ACL mask, which kooi
        itself sets when it grants the workload the project."""
        return other is not None and (self.kind, self.data, self.mode & 0o7707, self.nlink) == \
            (other.kind, other.data, other.mode & 0o7707, other.nlink)


class GuardError(Exception):
    """The protected paths cannot be kept (the run is refused before it starts)."""


def _lentry(p: Path, content: bool, strict: bool) -> Entry | None:
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
            return Entry("file", stat.S_IMODE(st.st_mode),
                         f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:{st.st_ctime_ns}".encode())
        if st.st_size > MAX_FILE:
            if strict:
                raise GuardError(f"{p} is larger than {MAX_FILE >> 20} MiB; a protected file kooi cannot keep")
            return Entry("unreadable", stat.S_IMODE(st.st_mode), b"too large", st.st_nlink)
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                return Entry("file", stat.S_IMODE(st.st_mode), f.read(MAX_FILE + 1), st.st_nlink)
        except OSError as exc:
            if strict:
                raise GuardError(f"{p}: cannot read it ({exc.strerror})") from None
            return Entry("unreadable", stat.S_IMODE(st.st_mode), (exc.strerror or "").encode(), st.st_nlink)
    return Entry("other", stat.S_IMODE(st.st_mode))


def _first_not_dir(root: Path, rel: str) -> str | None:
    """The first component of REL's parent that is not a real directory (a symlink, a
    file): the path to record instead of REL. None when all are directories or one is
    missing."""
    p = root
    parts = Path(rel).parts[:-1]
    for i, part in enumerate(parts):
        p = p / part
        try:
            if not stat.S_ISDIR(os.lstat(p).st_mode):
                return "/".join(parts[: i + 1])
        except FileNotFoundError:
            return None
    return None


def _is_git_dir(root: Path, rel: str) -> bool:
    return rel in ("", ".git") or (root / rel / "HEAD").exists() or (root / rel / "config").exists()


def scan(root: Path, paths: tuple[str, ...], content: bool = True, strict: bool = True,
         skip: tuple[str, ...] = (), git_dirs: tuple[str, ...] = (".git",)) -> dict[str, Entry]:
    """Every entry at and below PATHS in ROOT, never through a symlink (a parent that is
    one is recorded itself). In GIT_DIRS everything but the repository's data. With
    CONTENT the files' bytes, else a fingerprint. STRICT (before the run): anything
    that cannot be kept raises GuardError; after the run it is recorded as changed."""
    out: dict[str, Entry] = {}
    total = 0
    todo = list(paths)
    while todo:
        rel = todo.pop()
        if rel in out or any(rel == s or rel.startswith(s + "/") for s in skip):
            continue
        if (bad := _first_not_dir(root, rel)) is not None:
            if bad not in out and (e := _lentry(root / bad, content, strict)) is not None:
                out[bad] = e
            continue
        e = _lentry(root / rel, content, strict)
        if e is None:
            continue
        out[rel] = e
        total += len(e.data)
        if strict and (len(out) > MAX_ENTRIES or total > MAX_BYTES):
            raise GuardError(f"the protected paths of the project hold more than {MAX_ENTRIES} entries or "
                             f"{MAX_BYTES >> 20} MiB; clean them up or name them in unprotected_paths")
        if not strict and (len(out) > MAX_ENTRIES_AFTER or total > MAX_BYTES_AFTER) and "/" in rel:
            # After the run, a flood: its directory is recorded as changed (it is
            # removed, and the snapshot's entries put back), the rest of it not read.
            parent = rel.rsplit("/", 1)[0]
            for k in [k for k in out if k.startswith(parent + "/")]:
                total -= len(out.pop(k).data)
            todo = [t for t in todo if not t.startswith(parent + "/")]
            out[parent] = Entry("unreadable", 0o755, b"too many entries")
            continue
        if e.kind != "dir":
            continue
        try:
            names = sorted(os.listdir(root / rel))
        except OSError as exc:
            if strict:
                raise GuardError(f"{root / rel}: cannot list it ({exc.strerror})") from None
            out[rel] = Entry("unreadable", e.mode, (exc.strerror or "").encode())
            continue
        in_git = rel in git_dirs or rel.startswith(".git/modules/") and _is_git_dir(root, rel)
        for name in names:
            child = f"{rel}/{name}" if rel else name
            if in_git and is_git_data(name):
                if name == "modules":
                    todo.append(child)  # submodules' git directories: the same rule
                continue
            if rel.startswith(".git/modules") and not in_git and not os.path.isdir(root / child):
                continue  # between module directories: only directories lead anywhere
            todo.append(child)
    return out


def _change(before: Entry | None, after: Entry | None) -> str:
    if before is None:
        return "created"
    if after is None:
        return "deleted"
    if after.kind == "unreadable":
        return f"unreadable or too large ({after.data.decode(errors='replace')})"
    if before.kind != after.kind:
        return f"replaced ({before.kind} -> {after.kind})"
    if before.data != after.data:
        return "modified"
    if before.nlink != after.nlink:
        return "hard-linked"
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
    cur = _lentry(p, content=False, strict=False)
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


_HOOKS_PATH = re.compile(r"^\s*hookspath\s*=\s*(.+?)\s*$", re.I | re.M)
_SECTION = re.compile(r"^\s*\[([^\]]+)\]", re.M)
_PATH_KEY = re.compile(r"^\s*path\s*=\s*(.+?)\s*$", re.I)


def _in_project(root: Path, base: Path, value: str) -> str | None:
    """VALUE (a path from git's configuration, relative to BASE) as a path relative to
    ROOT when it lies inside the project; None otherwise."""
    value = value.strip().strip('"')
    if not value or value.startswith("~"):
        return None
    p = Path(os.path.normpath(base / value))
    try:
        rel = p.relative_to(root)
    except ValueError:
        return None
    return str(rel) if str(rel) != "." else None


# direnv's standard library: the directives of a project's `.envrc` that name files or
# directories of the project (the first argument; _ENVRC_DEFAULTS where it may be left out).
_ENVRC_LINE = re.compile(r"^\s*(source_env_if_exists|source_env|dotenv_if_exists|dotenv|PATH_add|path_add|"
                         r"load_prefix|watch_file|use\s+flake|use\s+nix|layout)\b[ \t]*([^\s;#]*)", re.M)
_ENVRC_DEFAULTS = {"dotenv": ".env", "dotenv_if_exists": ".env", "use flake": "flake.nix", "use nix": "shell.nix"}


def envrc_targets(root: Path) -> list[str]:
    """What the project's `.envrc` loads from inside the project when direnv runs it on
    the host: files it sources (`source_env`, `dotenv`, a nix flake or shell), the
    directories it puts first on PATH (`PATH_add bin`: a `bin/git` there answers the
    host's next `git status`). Not `.direnv/`, where `layout` keeps the virtualenvs
    it puts on PATH (too large to keep a copy of; docs/workflows.md)."""
    try:
        text = (root / ".envrc").read_text(errors="replace")[:MAX_FILE]
    except OSError:
        return []
    out: list[str] = []
    for m in _ENVRC_LINE.finditer(text):
        verb, arg = re.sub(r"\s+", " ", m.group(1)), m.group(2).strip("\"'")
        if verb == "layout":
            continue
        if verb in ("use flake", "use nix"):
            out += ["flake.nix", "flake.lock"] if verb == "use flake" else ["shell.nix", "default.nix"]
            continue
        value = arg or _ENVRC_DEFAULTS.get(verb, "")
        if "$" in value or not value:
            continue
        if (t := _in_project(root, root, value)) is not None and t not in out:
            out.append(t)
    return out


def config_targets(root: Path) -> tuple[list[str], list[str]]:
    """What the project's git setup executes from elsewhere in the project: (paths to
    protect, git directories). core.hooksPath inside the project (its top directory:
    husky's `.husky/_` runs `.husky/pre-commit`), include.path / includeIf.*.path
    files, a `gitdir:` target of a `.git` file, and what an installed hook's manager
    reads from the working tree (HOOK_MANAGERS: pre-commit's and prek's
    `.pre-commit-config.yaml`, lefthook's, hk's, overcommit's configurations, mise's
    task directories)."""
    extra: list[str] = []
    gitdirs: list[str] = []
    git = root / ".git"
    gitdir = git
    try:
        st = os.lstat(git)
        if stat.S_ISREG(st.st_mode):
            m = re.match(r"gitdir:\s*(.+)", git.read_text(errors="replace").strip())
            target = _in_project(root, root, m.group(1)) if m else None
            if target:
                gitdirs.append(target)
                gitdir = root / target
    except OSError:
        return extra, gitdirs
    try:
        text = (gitdir / "config").read_text(errors="replace")
    except OSError:
        text = ""
    for m in _HOOKS_PATH.finditer(text):
        if (t := _in_project(root, root, m.group(1))) is not None:
            extra.append(Path(t).parts[0] if not t.startswith(".git/") else t)
    section = ""
    for line in text.splitlines():
        if (s := _SECTION.match(line)) is not None:
            section = s.group(1).strip().lower()
            continue
        if section.startswith("include") and (k := _PATH_KEY.match(line)) is not None:
            if (t := _in_project(root, gitdir, k.group(1))) is not None:
                extra.append(t)
    try:
        hooks = [gitdir / "hooks" / n for n in os.listdir(gitdir / "hooks") if not n.endswith(".sample")]
        heads = [h.read_bytes()[:8192] for h in hooks if h.is_file() and not h.is_symlink()]
    except OSError:
        heads = []
    for mark, paths in HOOK_MANAGERS:
        if any(mark in head for head in heads):
            extra.extend(p for p in paths if p not in extra)
    return extra, gitdirs


def find_git_entries(root: Path, limit: int = MAX_WALK) -> tuple[list[str], list[str], bool]:
    """Every `.git` below ROOT's top (nested repositories, submodules' checkouts), never
    through a symlink and never into a git directory: (directories, other entries,
    complete: False when ROOT holds more than LIMIT entries)."""
    dirs, others, _, complete = walk_project(root, limit)
    return dirs, others, complete


# What makes a directory a (bare) repository to git: it looks for these in every
# directory it walks up through, and runs the `config` next to them.
BARE = frozenset({"HEAD", "objects", "refs"})


def is_layout(names: set[str]) -> bool:
    """A directory holding NAMES is a repository to git: HEAD with objects and refs, or
    HEAD with a commondir (which names where objects, refs and config are)."""
    return "HEAD" in names and (BARE <= names or "commondir" in names)


def walk_project(root: Path, limit: int = MAX_WALK, bare: list[str] | None = None) \
        -> tuple[list[str], list[str], list[str], bool]:
    """One walk of ROOT, never through a symlink and never into a git directory: every
    `.git` below the top (directories, other entries), every DEEP name below the top
    (outside node_modules), complete: False when ROOT holds more than LIMIT entries.
    BARE gets every directory that holds a bare repository's layout ("." for ROOT)."""
    dirs: list[str] = []
    others: list[str] = []
    deep: list[str] = []
    n = 0
    todo: list[tuple[str, bool]] = [("", False)]
    while todo:
        rel, in_modules = todo.pop()
        try:
            it = os.scandir(root / rel if rel else root)
        except OSError:
            continue
        names: set[str] = set()
        with it:
            for e in it:
                n += 1
                if n > limit:
                    return sorted(dirs), sorted(others), sorted(deep), False
                names.add(e.name)
                child = f"{rel}/{e.name}" if rel else e.name
                try:
                    is_dir = e.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                if e.name == ".git":
                    if rel:
                        (dirs if is_dir else others).append(child)
                    continue
                if rel and not in_modules and e.name in DEEP:
                    deep.append(child)
                    continue
                if is_dir:
                    todo.append((child, in_modules or e.name == "node_modules"))
        if bare is not None and is_layout(names):
            bare.append(rel or ".")
    return sorted(dirs), sorted(others), sorted(deep), True


def _open_dir(root: Path, rel: str) -> int:
    """A descriptor of ROOT/REL, no component of REL followed if it is a symlink."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in Path(rel).parts:
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


Fingerprint = tuple[Any, ...]


def _fingerprint(dir_fd: int, name: str, content: bool = False) -> Fingerprint | None:
    """What NAME in DIR_FD is (never followed): a file's mode, size and either its
    content's digest (CONTENT) or its mtime, ctime and inode; a directory's with its
    entries'. None when it does not exist."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISREG(st.st_mode):
        if not content:
            return ("file", stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        h = hashlib.sha256()
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
        try:
            while chunk := os.read(fd, 1 << 20):
                h.update(chunk)
        finally:
            os.close(fd)
        return ("file", stat.S_IMODE(st.st_mode), st.st_size, h.hexdigest())
    if stat.S_ISDIR(st.st_mode):
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
        try:
            return ("dir", stat.S_IMODE(st.st_mode),
                    tuple((n, _fingerprint(fd, n, content)) for n in sorted(os.listdir(fd))))
        finally:
            os.close(fd)
    return ("other", st.st_mode)


def _copy(src_fd: int, name: str, dst_fd: int, dst_name: str, owner: tuple[int, int] | None,
          budget: list[int]) -> None:
    """Copy NAME (a regular file or a directory of them; links and anything else are
    left out) from SRC_FD to DST_NAME in DST_FD, never following a link, owned by
    OWNER; BUDGET[0]: the bytes still allowed (OSError when they run out)."""
    st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        os.mkdir(dst_name, 0o700, dir_fd=dst_fd)
        sfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=src_fd)
        dfd = os.open(dst_name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dst_fd)
        try:
            for n in os.listdir(sfd):
                _copy(sfd, n, dfd, n, owner, budget)
            os.fchmod(dfd, stat.S_IMODE(st.st_mode))
            if owner is not None:
                os.fchown(dfd, *owner)
        finally:
            os.close(sfd)
            os.close(dfd)
        return
    if not stat.S_ISREG(st.st_mode):
        return
    sfd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=src_fd)
    try:
        if not stat.S_ISREG(os.fstat(sfd).st_mode):
            return
        dfd = os.open(dst_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dst_fd)
        try:
            while chunk := os.read(sfd, 1 << 20):
                budget[0] -= len(chunk)
                if budget[0] < 0:
                    raise OSError(27, f"git's data is larger than {MAX_DATA_BYTES >> 20} MiB")
                os.write(dfd, chunk)
            os.fchmod(dfd, stat.S_IMODE(st.st_mode))
            if owner is not None:
                os.fchown(dfd, *owner)
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def _remove_at(dir_fd: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


# An index entry's flags that make the host's git skip comparing the file with the work
# tree: assume-unchanged (CE_VALID) and, in the extended flags, skip-worktree.
_CE_VALID, _CE_EXTENDED, _CE_SKIP_WORKTREE = 0x8000, 0x4000, 0x4000


def index_hidden(data: bytes) -> set[bytes] | None:
    """The paths of git's index DATA that the host's `git status` and `git diff` do not
    compare with the work tree (assume-unchanged, skip-worktree); None: unreadable."""
    out: set[bytes] = set()
    return out if _index_walk(data, out) is None else None


def _index_walk(data: bytes, hidden: set[bytes] | None = None) -> str | None:
    """Walk git's index DATA: why it must not reach the host, or None; HIDDEN gets the
    paths whose flags hide them from the host's git."""
    if len(data) < 12 or data[:4] != b"DIRC":
        return "not an index"
    version, count = int.from_bytes(data[4:8], "big"), int.from_bytes(data[8:12], "big")
    if version not in (2, 3, 4):
        return f"index version {version}"
    for hashlen in (20, 32):
        pos, prev, bad = 12, b"", None
        found: set[bytes] = set()
        try:
            for _ in range(count):
                start = pos
                flags = int.from_bytes(data[pos + 40 + hashlen:pos + 42 + hashlen], "big")
                pos += 42 + hashlen
                ext = 0
                if version >= 3 and flags & _CE_EXTENDED:
                    ext = int.from_bytes(data[pos:pos + 2], "big")
                    pos += 2
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
                    path = prev[: len(prev) - strip] + data[pos:end]
                    pos = end + 1
                else:
                    end = data.index(b"\0", pos)
                    path = data[pos:end]
                    pos = start + ((end - start) // 8 + 1) * 8
                prev = path
                if flags & _CE_VALID or ext & _CE_SKIP_WORKTREE:
                    found.add(path)
                parts = path.split(b"/")
                if path.startswith(b"/") or any(p in (b"", b".", b"..") or p.lower() == b".git" for p in parts):
                    bad = path.decode(errors="replace")[:200]
                    break
            if pos > len(data):
                continue
        except (IndexError, ValueError):
            continue
        if hidden is not None:
            hidden |= found
        return f"an entry at {bad!r}" if bad is not None else None
    return "the index cannot be read"


def index_problem(data: bytes) -> str | None:
    """Why git's index DATA must not reach the host (an entry whose path has a `.git`
    component, in any case, or is not a relative path: a `git restore` on the host would
    write it into the git directory), or None. Index versions 2 to 4, SHA-1 or SHA-256."""
    return _index_walk(data)


def _read_at(dir_fd: int, name: str) -> bytes:
    """NAME in DIR_FD (never through a link), up to MAX_DATA_BYTES; b"" where it is none."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        return f.read(MAX_DATA_BYTES)


def _lines(data: bytes, pattern: bytes) -> set[bytes]:
    return {ln.strip() for ln in data.splitlines() if re.match(pattern, ln.strip())}


def _loose_problem(dir_fd: int, name: str, oid: str, budget: list[int]) -> str | None:
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


def _pack_problem(fd: int, stem: str, budget: list[int]) -> str | None:
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


def _bound_problems(fd: int, rel: str, out: list[str], budget: list[int]) -> None:
    """Entries in git's data directories git never makes there (a symlink, a FIFO, a
    device; a repository's layout, whose HEAD goes): removed, named in OUT (relative
    paths)."""
    names = set()
    for e in os.scandir(fd):
        budget[0] -= 1
        if budget[0] < 0:
            return
        names.add(e.name)
        child = f"{rel}/{e.name}"
        if e.is_dir(follow_symlinks=False):
            sub = os.open(e.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            try:
                _bound_problems(sub, child, out, budget)
            finally:
                os.close(sub)
        elif not e.is_file(follow_symlinks=False):
            os.unlink(e.name, dir_fd=fd)
            out.append(child)
    if is_layout(names):
        os.unlink("HEAD", dir_fd=fd)
        out.append(f"{rel}/HEAD")


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


@dataclass
class Guard:
    root: Path
    unprotected: tuple[str, ...] = ()
    protected: dict[str, Entry] = field(default_factory=dict)
    watched: dict[str, Entry] | None = None  # None: the workload never started
    extra: list[str] = field(default_factory=list)
    git_dirs: tuple[str, ...] = (".git",)
    nested: tuple[str, ...] = ()  # the `.git` entries below the top before the run
    deep: tuple[str, ...] = ()  # the DEEP names below the top before the run
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
            globs = [n for n in os.listdir(self.root) if any(fnmatch.fnmatch(n, g) for g in PROTECTED_GLOBS)]
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
        extra, gitdirs = config_targets(self.root)
        extra += [t for t in envrc_targets(self.root) if t not in extra]
        bare: list[str] = []
        dirs, others, deep, complete = walk_project(self.root, bare=bare)
        self.bare = tuple(bare)
        if not complete:
            raise GuardError(f"the project holds more than {MAX_WALK} entries; kooi cannot look for the nested "
                             "git repositories in it")
        self.deep = tuple(deep)
        links = [p for p in (".git", *others) if os.path.islink(self.root / p)]
        if links:
            raise GuardError(f"{links[0]} is a symlink: kooi cannot keep a git directory reached through a link "
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
        self.git_dirs = tuple(dict.fromkeys((".git", *gitdirs, *dirs)))
        self.protected = self._scan(strict=True)

    def snapshot_watched(self) -> None:
        """Right before the workload starts (after kooi's own ACL grant, which changes
        the files' ctime)."""
        self.watched = scan(self.root, WATCHED, content=False, strict=False)
        # A file's ctime comes from a clock that may lag by a tick: what kooi itself
        # changed (the ACL grant) is older than STARTED, what the workload changes newer.
        time.sleep(0.03)
        self.started = time.time_ns() - 15_000_000

    def _git_dirs_now(self) -> list[str]:
        """Every git directory that gets a throwaway: the project's own, a `gitdir:`
        target, nested repositories' and the submodules' under .git/modules, where they
        are real directories and protected."""
        out = [g for g in self.git_dirs if g not in self.unprotected and self.protected.get(g, Entry("x")).kind == "dir"]
        if ".git" in out and ".git/modules" not in self.unprotected:
            out += [k for k, e in self.protected.items() if k.startswith(".git/modules/") and e.kind == "dir"
                    and _is_git_dir(self.root, k)]
        return sorted(dict.fromkeys(out), key=lambda g: (len(Path(g).parts), g))

    def _mine(self, t: Throwaway, rel: str) -> bool:
        """REL belongs to T's git directory (not to another inside it)."""
        if not (rel == t.git or rel.startswith(t.git + "/")):
            return False
        return not any(o.git != t.git and rel.startswith(o.git + "/") for o in self.throwaways)

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
                _restore(t.copy, rel, e)
            real_fd = _open_dir(self.root, t.git)
            copy_fd = _open_dir(t.copy, t.git)
            try:
                st = os.fstat(real_fd)
                t.owner = (st.st_uid, st.st_gid)
                bound = [*BOUND, *(p.rsplit("/", 1)[1] for p in self.unprotected if p.rsplit("/", 1)[0] == t.git)]
                for name in sorted(os.listdir(real_fd)):
                    if name in bound and stat.S_ISDIR(os.stat(name, dir_fd=real_fd, follow_symlinks=False).st_mode):
                        os.mkdir(name, 0o755, dir_fd=copy_fd)
                        t.bound += (name,)
                    elif is_git_data(name) and name != "modules":
                        _copy(real_fd, name, copy_fd, name, None, budget)
                        t.copied[name] = (_fingerprint(real_fd, name), _fingerprint(copy_fd, name, content=True))
            finally:
                os.close(real_fd)
                os.close(copy_fd)
            _chown_tree(t.copy / t.git, t.owner)
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
                _chown_tree(t.copy / ".git", t.owner)
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
            _restore(base / f"f{i}", ".git", self.protected[f])
            mounts.append((f, copy))
            nested.append((f, copy))
            self.file_copies.append((f, copy))
        # .gitmodules too (an empty one where there was none): while the run lasts, the
        # workload can name no submodule, nor make git look into one (ignore = none).
        if ".gitmodules" not in self.unprotected and self.protected.get(".gitmodules", Entry("file")).kind == "file":
            copy = base / "gitmodules" / ".gitmodules"
            copy.parent.mkdir()
            if ".gitmodules" in self.protected:
                _restore(base / "gitmodules", ".gitmodules", self.protected[".gitmodules"])
            else:
                copy.write_bytes(b"")
                self.made_files.append(".gitmodules")
                # The mount point, made here: on userns-remap the engine's root may not
                # create files in the project.
                os.close(os.open(self.root / ".gitmodules", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                                 0o644))
            _chown_tree(copy.parent, (os.stat(self.root).st_uid, os.stat(self.root).st_gid))
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
            fd = _open_dir(self.root, ".git")
        except OSError:
            return False
        try:
            mine = _fingerprint(fd, ".", content=True)
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
                refused.append({"path": rel, "change": _change(b, a), "how": "shadowed"})
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
            a = _lentry(copy, content=True, strict=False)
            b = self.protected.get(rel, Entry("file", a.mode if a else 0) if rel in self.made_files else None)
            if b is None or not b.same(a):
                refused.append({"path": rel, "change": _change(None if rel in self.made_files else b, a),
                                "how": "shadowed"})
        if not done["all"]:
            done["all"] = True
            self._progress("checking")
        try:
            _remove(self.shadow)
        except OSError as exc:
            warnings.append(f"the throwaway copies in {self.shadow} are left ({exc.strerror or exc}); kooi gc "
                            "removes them")
        self.shadow = None
        return refused, failed, "; ".join(warnings)

    def _copy_back(self, t: Throwaway) -> list[str]:
        """Git's data files the workload changed in T (the index, HEAD, packed-refs, a
        rebase's state...) into the project's git directory, each replaced whole; one the
        host changed meanwhile is kept and named."""
        warnings = []
        copy_fd = _open_dir(t.copy, t.git)
        real_fd = _open_dir(self.root, t.git)
        budget = [MAX_DATA_BYTES]
        try:
            names = {n for n in os.listdir(copy_fd) if is_git_data(n)} | set(t.copied)
            for name in sorted(names - set(t.bound) - {"modules"}):
                was_real, was_copy = t.copied.get(name, (None, None))
                now = _fingerprint(copy_fd, name, content=True)
                if now == was_copy:
                    continue
                if _fingerprint(real_fd, name) != was_real:
                    warnings.append(f"{t.git}/{name} changed on the host while the run ran: the run's is dropped")
                    continue
                if name == "packed-refs" and now is not None and now[0] == "file" \
                        and self._strip_replace_refs(t, copy_fd, real_fd):
                    now = _fingerprint(copy_fd, name, content=True)
                why = self._data_refusal(copy_fd, real_fd, name, now)
                if why is not None:
                    t.refused.append({"path": f"{t.git}/{name}", "change": why, "how": "shadowed"})
                    continue
                if now is None:
                    _remove_at(real_fd, name)
                    continue
                if now[0] == "other":
                    continue
                tmp = f".kooi-{name}.new"
                _remove_at(real_fd, tmp)
                _copy(copy_fd, name, real_fd, tmp, t.owner, budget)
                if now[0] == "dir" and was_real is not None:
                    old = f".kooi-{name}.old"
                    _remove_at(real_fd, old)
                    os.rename(name, old, src_dir_fd=real_fd, dst_dir_fd=real_fd)
                    os.rename(tmp, name, src_dir_fd=real_fd, dst_dir_fd=real_fd)
                    _remove_at(real_fd, old)
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
        data = _read_at(copy_fd, "packed-refs")
        new = _lines(data, pat) - _lines(_read_at(real_fd, "packed-refs"), pat)
        if not new:
            return False
        keep = [ln for ln in data.splitlines(keepends=True) if ln.strip() not in new]
        tmp = ".kooi-packed-refs.new"
        _remove_at(copy_fd, tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=copy_fd)
        with os.fdopen(fd, "wb") as f:
            f.write(b"".join(keep))
        os.rename(tmp, "packed-refs", src_dir_fd=copy_fd, dst_dir_fd=copy_fd)
        for ln in sorted(new):
            t.refused.append({"path": f"{t.git}/packed-refs", "change": "a replace ref "
                              f"({ln.split(b' ', 1)[1].decode(errors='replace')[:120]}: git would show another "
                              "object in the history's place): taken out", "how": "put back"})
        return True

    @staticmethod
    def _data_refusal(copy_fd: int, real_fd: int, name: str, now: Fingerprint | None) -> str | None:
        """Why git's data file NAME as the workload left it (NOW, in COPY_FD) is not
        copied back over the project's (in REAL_FD, as it was when the run started)."""
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
        if (name == "index" or name.startswith("sharedindex.")) and now[0] == "file":
            after: set[bytes] = set()
            problem = _index_walk(_read_at(copy_fd, name), after)  # read once: its paths and its flags
            if problem is not None:
                return f"{problem}: kept the project's"
            new = sorted(after - (index_hidden(_read_at(real_fd, name)) or set()))
            if new:
                return (f"entries flagged assume-unchanged or skip-worktree ({', '.join(p.decode(errors='replace') for p in new[:3])}"
                        "): the host's `git status` and `git diff` would not show their changes; kept the project's")
        if name == "shallow" and now[0] == "file":
            if _lines(_read_at(copy_fd, name), rb"^[0-9a-f]{40,64}$") - _lines(_read_at(real_fd, name),
                                                                              rb"^[0-9a-f]{40,64}$"):
                return "commits marked shallow (the host's git would show the history cut short): kept the project's"
        return None

    def _check_bound(self, t: Throwaway) -> None:
        """What git never makes in its data directories (links out of the project, FIFOs)
        and the workload made in the bound real ones: removed, listed."""
        real_fd = _open_dir(self.root, t.git)
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
                    _bound_problems(fd, f"{t.git}/{name}", found, [MAX_ENTRIES_AFTER * 20])
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
        real_fd = _open_dir(self.root, t.git)
        try:
            if "objects" in t.bound:
                self._check_objects(real_fd, f"{t.git}/objects", t, budget)
            if "refs" in t.bound:
                self._check_replace_refs(real_fd, t)
        finally:
            os.close(real_fd)

    def _new(self, st: os.stat_result) -> bool:
        return self.started is not None and st.st_ctime_ns >= self.started

    def _refuse(self, t: Throwaway, dir_fd: int, name: str, rel: str, why: str) -> None:
        _remove_at(dir_fd, name)
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
                                why = _loose_problem(sub, f.name, e.name + f.name, budget)
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
                why = _pack_problem(fd, stem, budget) if {f"{stem}.pack", f"{stem}.idx"} <= set(names) else \
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

    def _nested_created(self) -> tuple[list[dict[str, str]], list[str]]:
        """`.git` entries below the project's top the workload made (a nested repository,
        a `.git` file pointing git elsewhere): removed, listed."""
        bare: list[str] = []
        dirs, others, deep, complete = walk_project(self.root, bare=bare)
        failed = [] if complete else [f"the project holds more than {MAX_WALK} entries: kooi could not look for "
                                      "nested git repositories the workload made"]
        refused = []
        for rel in bare:
            if rel in self.bare or any(rel == g or rel.startswith(g + "/") for g in self.git_dirs):
                continue
            # git would take it for a repository and run its config: without HEAD it is none
            path = "HEAD" if rel == "." else f"{rel}/HEAD"
            refused.append({"path": path, "change": "created (a bare repository's layout: HEAD removed)",
                            "how": "put back"})
            try:
                fd = _open_dir(self.root, "" if rel == "." else rel)
                try:
                    _remove_at(fd, "HEAD")
                finally:
                    os.close(fd)
            except OSError as exc:
                failed.append(f"{path}: {exc.strerror or exc}")
        for rel in deep:
            if rel in self.deep or any(rel == u or rel.startswith(u + "/") for u in self.unprotected):
                continue
            if any(rel.startswith(g + "/") for g in self.git_dirs):
                continue
            refused.append({"path": rel, "change": "created", "how": "put back"})
            parent, _, name = rel.rpartition("/")
            try:
                fd = _open_dir(self.root, parent)
                try:
                    _remove_at(fd, name)
                finally:
                    os.close(fd)
            except OSError as exc:
                failed.append(f"{rel}: {exc.strerror or exc}")
        for rel in dirs + others:
            if rel in self.nested or any(rel == u or rel.startswith(u + "/") for u in self.unprotected):
                continue
            if any(rel.startswith(g + "/") for g in self.git_dirs):
                continue  # inside a git directory kooi already compares
            parent, _, name = rel.rpartition("/")
            try:
                fd = _open_dir(self.root, parent)
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if not stat.S_ISDIR(st.st_mode):
                        _remove_at(fd, name)
                        refused.append({"path": rel, "change": "created", "how": "put back"})
                        continue
                    # A git directory: its data may be a repository's history (one the
                    # workload moved here): kept; its configuration, hooks and the rest go.
                    was = self.nested_ino.get((st.st_dev, st.st_ino))
                    gfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                    try:
                        for n in os.listdir(gfd):
                            if not is_git_data(n):
                                _remove_at(gfd, n)
                        # in its data (a submodule's git directory among it): no link, no
                        # repository's layout
                        found: list[str] = []
                        for n in os.listdir(gfd):
                            if stat.S_ISDIR(os.stat(n, dir_fd=gfd, follow_symlinks=False).st_mode):
                                sub = os.open(n, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=gfd)
                                try:
                                    _bound_problems(sub, f"{rel}/{n}", found, [MAX_ENTRIES_AFTER * 20])
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
            refused.append({"path": rel, "change": _change(b, a), "how": "put back"})
        # Remove what the workload created or made unreadable (deepest first), then
        # put back what was there (shallowest first).
        for item in sorted(refused, key=lambda r: -len(Path(r["path"]).parts)):
            a = after.get(item["path"])
            if item["path"] not in self.protected or (a is not None and a.kind == "unreadable"):
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
        nested, nested_failed = self._nested_created()
        refused += nested
        failed += nested_failed
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
        watched = self.watched
        w_after = scan(self.root, WATCHED, content=False, strict=False) if watched is not None else {}
        changed = []
        for rel in sorted(set(watched or {}) | set(w_after)):
            b, a = (watched or {}).get(rel), w_after.get(rel)
            if b is not None and (b.same(a) or a is not None and b.kind == "dir" == a.kind):
                continue
            changed.append({"path": rel, "change": _change(b, a)})
        record: dict[str, Any] = {"protected": list(self.paths), "refused": shadowed + refused,
                                  "restored": not failed, "restore_failed": failed, "watched_changed": changed}
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
                "deep": list(self.deep), "bare": list(self.bare),
                "nested_ino": [[d, i, r] for (d, i), r in self.nested_ino.items()],
                "shadow": None if self.shadow is None else str(self.shadow),
                "throwaways": [{"git": t.git, "copy": str(t.copy), "bound": list(t.bound),
                                "copied": {n: [_fp_out(a), _fp_out(b)] for n, (a, b) in t.copied.items()},
                                "made": t.made, "owner": None if t.owner is None else list(t.owner),
                                "refused": t.refused} for t in self.throwaways],
                "file_copies": [[r, str(p)] for r, p in self.file_copies],
                "nested_shadows": [[r, str(p)] for r, p in self.nested_shadows],
                "made_files": list(self.made_files), "pinned": self.pinned, "progress": self.progress,
                "started": self.started}

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


def _chown_tree(path: Path, owner: tuple[int, int] | None) -> None:
    """PATH and everything in it owned by OWNER (never through a link); nothing when
    kooi cannot (not root) or OWNER is None."""
    if owner is None or os.geteuid() != 0:
        return
    os.chown(path, *owner, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            os.chown(os.path.join(dirpath, n), *owner, follow_symlinks=False)
