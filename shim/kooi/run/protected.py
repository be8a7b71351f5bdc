"""What the project guard (run.guard) protects and watches in a project, and where it
finds it: the protected and watched paths, git's data in a git directory, what a
project's `.envrc`, git configuration and hook managers run from elsewhere in it, and
the one walk of the project for nested repositories and DEEP names."""

from __future__ import annotations

import functools
import glob
import os
import re
import stat
import sys
from pathlib import Path

from .links import leads_out
from .toolnames import ENV_DIRS, ENV_PARENTS, NESTED, deep_name, nested_name, watched_deep
from .vcsconf import VCS_SETTINGS, vcs_setting

# Python modules the host imports from the project's top when someone runs `python3 -m
# NAME` (or a script there: `setup.py` imports setuptools) in it: the current directory
# comes first on sys.path, so a NAME.py or NAME/ package there is what runs, for the
# tool itself and for every module it imports (argparse for venv, pluggy for pytest).
# One the workload makes where the project had none is removed (run.guard); a project's
# own module of such a name is its own.
PY_TOOLS = ("unittest", "pip", "pytest", "_pytest", "pluggy", "iniconfig", "pygments", "packaging", "exceptiongroup",
            "tomli", "venv", "ensurepip", "setuptools", "pkg_resources", "distutils", "wheel", "twine", "coverage",
            "mypy", "black", "flake8", "pylint", "isort", "tox", "nox", "pipx", "poetry", "pre_commit", "nbstripout",
            "nbformat", "sitecustomize", "usercustomize")
# Not kept: the standard library's names a project commonly has as its own module.
_PY_OWN = frozenset({"test", "this", "antigravity", "__main__", "site"})
# What Python imports as a module NAME from a directory on sys.path: NAME.py, NAME.pyc,
# an extension (NAME.so, NAME.abi3.so, NAME.cpython-3XX-ARCH.so), or a package NAME/
# with an __init__ of those kinds.
# The name may hold what no identifier does: importlib imports `_sysconfigdata__linux_
# x86_64-linux-gnu` by name (review 13: venv ran one).
_IMPORTABLE = re.compile(r"^([^.]+)(?:\.[A-Za-z0-9_-]+)*\.(?:py|pyc|pyw|so)$")
# Imported by a name built at run time (the platform's): every such name shadows.
_SHADOW_PREFIXES = ("_sysconfigdata",)


# The standard library of the CPython versions other than kooi's own (3.8 to 3.14): a
# host runs them too (pyenv, a `.python-version` the workload wrote picks one), and
# each imports its own private modules first (3.13's venv imports _colorize).
STDLIB_OTHER = frozenset({
    "binhex", "formatter", "parser", "symbol", "dummy_threading", "_dummy_thread", "_bootlocale", "_peg_parser",
    "_xxsubinterpreters", "_pydatetime", "_pylong", "_sha2", "_android_support", "_colorize", "_interpchannels",
    "_interpqueues", "_interpreters", "_ios_support", "_opcode_metadata", "_pyrepl", "_suggestions", "_sysconfig",
    "_wmi", "annotationlib", "compression", "_remote_debugging", "_zstd", "_hmac", "_types", "_apple_support",
    "_py_warnings"})
# Where the host's Pythons are installed system-wide: the standard library of each
# version and what is installed for all (a tool's own dependencies: pytest imports
# `py`, flask `click`). Their top-level names shadow too.
PY_SITE_GLOBS = ("/usr/lib/python3.*", "/usr/lib/python3/dist-packages", "/usr/lib/python3*/site-packages",
                 "/usr/local/lib/python3.*", "/usr/local/lib/python3*/dist-packages",
                 "/usr/local/lib/python3*/site-packages")


@functools.lru_cache(maxsize=1)
def _py_shadow_names() -> frozenset[str]:
    names = set(sys.stdlib_module_names) | STDLIB_OTHER | set(PY_TOOLS)
    for d in sorted({p for g in PY_SITE_GLOBS for p in glob.glob(g)}):
        try:
            entries = os.listdir(d)
        except OSError:
            continue
        for n in entries:
            if m := _IMPORTABLE.match(n):
                names.add(m.group(1))
            elif n.isidentifier():
                names.add(n)  # a package
    return frozenset(names - _PY_OWN)


def py_shadow_name(name: str) -> str | None:
    """The module NAME (a file at a project's top) shadows for the host's Python, if any."""
    m = _IMPORTABLE.match(name)
    if m and (m.group(1) in _py_shadow_names() or m.group(1).startswith(_SHADOW_PREFIXES)):
        return m.group(1)
    return None


def py_modules(root: Path) -> dict[str, list[str]]:
    """The modules at ROOT's top named like a PY_TOOLS, standard-library or host-installed
    module, each with what makes it one: its files, or the symlink itself where Python
    reaches the module through one (import follows links; kooi removes only the link)."""
    names = _py_shadow_names()
    out: dict[str, list[str]] = {}
    try:
        entries = list(os.scandir(root))
    except OSError:
        return out
    for e in entries:
        try:
            link = e.is_symlink()
            is_dir = e.is_dir()  # through a link, as Python's import
        except OSError:
            continue
        if is_dir and e.name in names:
            try:
                inner = [n for n in os.listdir(root / e.name) if n.split(".", 1)[0] in ("__init__", "__main__")
                         and _IMPORTABLE.match(n)]
            except OSError:
                continue
            if inner:
                out.setdefault(e.name, []).extend([e.name] if link else [f"{e.name}/{n}" for n in sorted(inner)])
        elif not is_dir and (shadow := py_shadow_name(e.name)) is not None:
            out.setdefault(shadow, []).append(e.name)
    return out


def py_top_names(root: Path) -> list[str]:
    """Every module Python imports from ROOT's top (files of the importable kinds,
    packages with an __init__), through symlinks as Python."""
    out = set()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for e in entries:
        try:
            if e.is_dir():
                if _is_package(Path(e.path)):
                    out.add(e.name)
            elif m := _IMPORTABLE.match(e.name):
                out.add(m.group(1))
        except OSError:
            continue
    return sorted(out)


# In a git directory (`.git`, a `gitdir:` target in the project, each submodule's
# under modules/) everything is protected but the repository's data: a new
# commondir, config.worktree or worktrees/ would point git at a config and hooks of the
# workload's choosing as surely as a changed config or hook.
GIT_DATA = frozenset({
    "objects", "refs", "logs", "index", "HEAD", "ORIG_HEAD", "FETCH_HEAD", "MERGE_HEAD", "MERGE_MSG",
    "MERGE_MODE", "AUTO_MERGE", "CHERRY_PICK_HEAD", "REVERT_HEAD", "COMMIT_EDITMSG", "TAG_EDITMSG", "SQUASH_MSG",
    "packed-refs", "shallow", "rebase-merge", "rebase-apply", "sequencer", "modules", "lfs"})
# Not data, though git writes them as it works (review 41), so throwaway like the config:
# `rr-cache` (rerere replays its recorded resolutions into the host's next merge),
# `branches/` (remotes by another name: `git pull` fetched from a bundle the workload
# named), a bisect's state (`git bisect reset` checks out BISECT_START, any revision),
# `gc.log` (printed raw to the host's terminal at `git gc --auto`); `description`,
# `gc.pid` and `lost-found` (git resolves any path in the git directory as a ref:
# review 44's `git checkout -` took a commit of the workload's from `description`).


def is_git_data(name: str) -> bool:
    """NAME, in a git directory, is the repository's data (a split index's shared part too)."""
    return name in GIT_DATA or name.startswith("sharedindex.")
# How far kooi looks for nested repositories (entries of the project; before and after).
MAX_WALK = 2_000_000
# The most kooi reads of one protected file (a larger one cannot be kept).
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


_HOOKS_PATH = re.compile(r"^\s*hookspath\s*=\s*(.+?)\s*$", re.I | re.M)


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


def package_targets(root: Path) -> list[str]:
    """Code of the package managers' own that the project's settings name: Yarn's
    `yarnPath` release and `plugins:` (.yarnrc.yml), Yarn 1's `yarn-path` (.yarnrc),
    pnpm's `pnpmfile` (.npmrc): the host's next `yarn` or `pnpm` runs it."""
    out: list[str] = []

    def read(name: str) -> str:
        try:
            return (root / name).read_text(errors="replace")[:MAX_FILE]
        except OSError:
            return ""
    yarnrc = read(".yarnrc.yml")
    found = re.findall(r"^\s*yarnPath\s*:\s*(\S+)", yarnrc, re.M)
    plugins = re.split(r"^plugins\s*:", yarnrc, maxsplit=1, flags=re.M)[1:]  # the block under `plugins:`
    if plugins:
        block = re.split(r"^\S", plugins[0], maxsplit=1, flags=re.M)[0]
        found += re.findall(r"^\s*(?:-\s*)?path\s*:\s*(\S+)", block, re.M)
        found += re.findall(r"^\s*-\s*([^\s:]+\.c?js)\s*$", block, re.M)
    found += re.findall(r"^\s*yarn-path\s+(\S+)", read(".yarnrc"), re.M)
    found += re.findall(r"^\s*pnpmfile\s*=\s*(\S+)", read(".npmrc"), re.M)
    found += re.findall(r"^\s*pnpmfile\s*:\s*(\S+)", read("pnpm-workspace.yaml"), re.M)
    # mise's env directives: files it sources or reads, directories it puts on PATH
    for name in ("mise.toml", ".mise.toml", ".config/mise.toml", "mise.local.toml", ".mise.local.toml"):
        for m in re.finditer(r"^\s*_\.(?:source|path|file)\s*=\s*(\[[^\]]*\]|\S+)", read(name), re.M):
            found += re.findall(r"[\"']([^\"']+)[\"']", m.group(1)) or [m.group(1)]
    for value in found:
        if (t := _in_project(root, root, value.strip("\"'"))) is not None and t not in out:
            out.append(t)
    return out


# git configuration that runs a command on the host (githooks aside): filters, diff and
# merge drivers, the fsmonitor hook, editors, pagers, ssh, credential helpers, aliases
# and submodule updates that start with `!`, trailers' commands, transports' programs.
_GIT_COMMAND = re.compile(r"^(filter\.[^.]+\.(clean|smudge|process)|diff\.[^.]+\.(textconv|command)|diff\.external|"
                          r"merge\.[^.]+\.driver|core\.(fsmonitor|sshcommand|editor|pager|askpass|gitproxy)|"
                          r"sequence\.editor|interactive\.difffilter|gpg(\.[^.]+)?\.program|"
                          r"gpg\.ssh\.defaultkeycommand|credential(\..*)?\.helper|alias\..*|pager\..*|"
                          r"submodule\..*\.update|trailer\..*\.cmd|remote\..*\.(uploadpack|receivepack)|"
                          r"uploadpack\.packobjectshook)$", re.I)
_BANG_ONLY = ("alias.", "submodule.")  # these run a command only with a leading `!`
_HEADER = re.compile(r'^\s*\[\s*([^\]\s"]+)\s*(?:"((?:[^"\\]|\\.)*)")?\s*\]\s*(.*)$')


def config_items(text: str) -> list[tuple[str, str]]:
    """The (SECTION[.SUB].KEY, value) entries of a git config TEXT, read as git reads
    them: `[s "sub"]` and `[s.sub]` headers, a key on a header's line, quoted values,
    continuations, trailing comments."""
    out, section = [], ""
    for line in text.replace("\\\n", "").splitlines():
        if (h := _HEADER.match(line)) is not None:
            section = h.group(1) + (f".{h.group(2)}" if h.group(2) is not None else "")
            line = h.group(3)
        k, eq, v = line.strip().partition("=")
        if eq and section:
            value = v.split(" #", 1)[0].split(" ;", 1)[0].strip()
            out.append((f"{section}.{k.strip()}", value.strip('"').strip()))
    return out


def config_commands(text: str) -> list[str]:
    """KEY=VALUE of the commands a git config TEXT has git run (not `core.fsmonitor =
    true`, not an alias that is a git command)."""
    out = []
    for key, bare in config_items(text):
        if not _GIT_COMMAND.match(key) or bare.lower() in ("true", "false", "yes", "no", "on", "off", "", "cat"):
            continue
        if key.lower().startswith(_BANG_ONLY) and not bare.startswith("!"):
            continue
        out.append(f"{key}={bare[:120]}")
    return out


def present_exposed(root: Path) -> list[dict[str, str]]:
    """Interpreters and libraries in the project that editors and tools on the host run
    when the project is opened (VS Code's Python, PyCharm, ESLint, Prettier): far too
    large to keep a copy of."""
    python = "an editor opened on the project runs its Python (VS Code, PyCharm)"
    node = "editors' extensions and the host's npm, npx and yarn run code from it (ESLint, Prettier, lint-staged)"
    why = {".venv": python, "venv": python, "env": python, ".conda": python, "node_modules": node,
           ".pnp.cjs": "Yarn's Plug'n'Play loader: the host's yarn and editors load the project's packages "
                       "through it", ".pnp.loader.mjs": "Yarn's Plug'n'Play loader (ES modules)",
           ".yarn/sdks": "editors run TypeScript, ESLint and Prettier from it (Yarn's editor SDKs)",
           ".yarn/unplugged": "packages Yarn runs from the project", "_opam": "opam's switch: its bin/ on PATH",
           ".terraform": "Terraform's provider binaries: `terraform plan` and its language server run them "
                         "(checked against .terraform.lock.hcl, which the workload can write too)"}
    out = []
    for d, w in why.items():
        p = root / d
        # A symlink to one is what the tools follow (review 12).
        if os.path.lexists(p) and (os.path.isdir(p) or d.endswith(("js", "mjs"))):
            out.append({"path": d, "why": w + (" (a symlink to it)" if os.path.islink(p) else "")})
    return out


def is_env(path: Path, name: str) -> bool:
    """PATH (named NAME, one of ENV_DIRS) is an environment the host's tools run from."""
    if name in ("node_modules", ".terraform"):
        return True
    return os.path.exists(path / "pyvenv.cfg") or os.path.isdir(path / "conda-meta")


def _is_package(path: Path) -> bool:
    """PATH (through links, as Python's import) is a directory with an `__init__`."""
    try:
        return os.path.isdir(path) and any(n.split(".", 1)[0] == "__init__" and _IMPORTABLE.match(n)
                                           for n in os.listdir(path))
    except OSError:
        return False


# Compiled code Python runs instead of a module's source: byte code, and an extension
# module (it wins over NAME.py; `*.so` is in the usual Python .gitignore).
_EXTENSION = re.compile(r"^[^.]+\.(?:cpython-[^.]+|abi3|pypy[^.]*)\.so$")


def compiled(name: str, rel: str, siblings: set[str]) -> bool:
    """NAME (in the directory REL holding SIBLINGS) is compiled code Python imports."""
    if name.endswith((".pyc", ".pyo")):
        return True
    if not name.endswith(".so"):
        return False
    return bool(_EXTENSION.match(name)) or not rel or "__init__.py" in siblings or \
        f"{name.split('.', 1)[0]}.py" in siblings


def installed_hooks(root: Path, gitdir: Path, config: str) -> list[dict[str, str]]:
    """The git hooks the host runs at its next commit, merge or push in this project (the
    git directory's hooks/ and an in-project core.hooksPath): each runs code of the
    project's (a hook manager's `npx lint-staged` runs node_modules, a pre-commit
    `repo: local` hook runs the project's scripts), which kooi cannot keep a copy of."""
    dirs = [gitdir / "hooks"]
    for m in _HOOKS_PATH.finditer(config):
        if (t := _in_project(root, root, m.group(1))) is not None:
            dirs = [root / t]  # core.hooksPath replaces hooks/
    out = []
    for d in dirs:
        try:
            names = sorted(n for n in os.listdir(d) if not n.endswith(".sample") and n in GIT_HOOKS
                           and os.access(d / n, os.X_OK) and (d / n).is_file())
        except OSError:
            continue
        if names:
            rel = os.path.relpath(d, root)
            out.append({"path": rel, "why": f"git runs {', '.join(names)} from it on the host, and hooks run "
                                            "code of the project's (scripts, node_modules)"})
    return out


# The hooks git runs (githooks(5)).
GIT_HOOKS = frozenset({
    "applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit", "prepare-commit-msg",
    "commit-msg", "post-commit", "pre-rebase", "post-checkout", "post-merge", "pre-push", "pre-receive", "update",
    "proc-receive", "post-receive", "post-update", "reference-transaction", "push-to-checkout", "pre-auto-gc",
    "post-rewrite", "sendemail-validate", "fsmonitor-watchman", "p4-changelist", "p4-prepare-changelist",
    "p4-post-changelist", "p4-pre-submit", "post-index-change"})


def gitfile_targets(root: Path, files: list[str]) -> dict[str, list[str]]:
    """The git directories inside the project that the `.git` files FILES (below the top)
    name, each with its work trees (review 37: `git init --separate-git-dir` put a nested
    repository's refs where nothing read them; review 38: a second `.git` file naming
    the same directory is a second place its commits are checked out)."""
    out: dict[str, list[str]] = {}
    real_root = os.path.realpath(root)
    for rel in files:
        try:
            fd = os.open(root / rel, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                text = f.read(4096).decode(errors="replace")
        except OSError:
            continue
        m = re.match(r"gitdir:\s*(.+)", text.strip())
        if m is None:
            continue
        tree = os.path.dirname(rel)
        # Resolved as git does, through links (review 38: `gitdir: ../L` with L -> .subgit
        # was skipped; `L/..` is not the directory normpath makes of it).
        real = os.path.realpath(os.path.join(root, tree, m.group(1).strip()))
        if real.startswith(real_root + os.sep) and os.path.isdir(real):
            out.setdefault(os.path.relpath(real, real_root), []).append(tree)
    return out


def config_targets(root: Path) -> tuple[list[str], list[str], list[dict[str, str]]]:
    """What the project's git setup executes from elsewhere in the project: (paths to
    protect, git directories, installed hooks: exposed). core.hooksPath inside the project (its top directory:
    husky's `.husky/_` runs `.husky/pre-commit`), include.path / includeIf.*.path
    files, a `gitdir:` target of a `.git` file, and what an installed hook's manager
    reads from the working tree (HOOK_MANAGERS: pre-commit's and prek's
    `.pre-commit-config.yaml`, lefthook's, hk's, overcommit's configurations, mise's
    task directories)."""
    extra: list[str] = []
    gitdirs: list[str] = []
    git = root / ".git"
    gitdir = git  # where the config and hooks are
    try:
        st = os.lstat(git)
        if stat.S_ISREG(st.st_mode):
            m = re.match(r"gitdir:\s*(.+)", git.read_text(errors="replace").strip())
            target = _in_project(root, root, m.group(1)) if m else None
            if target:
                gitdirs.append(target)
                gitdir = root / target
            elif m:
                # A linked worktree or a submodule's checkout: its git directory, and the
                # common one it names (hooks, config), are outside the project. kooi keeps
                # nothing there, but what they run from the project is read and said.
                gitdir = Path(os.path.normpath(root / m.group(1).strip()))
                common = _read(gitdir / "commondir").strip()
                if common:
                    gitdir = Path(os.path.normpath(gitdir / common))
    except OSError:
        return extra, gitdirs, []
    text = _read(gitdir / "config")
    for m in _HOOKS_PATH.finditer(text):
        if (t := _in_project(root, root, m.group(1))) is not None:
            extra.append(Path(t).parts[0] if not t.startswith(".git/") else t)
    included = ""
    for key, value in config_items(text):
        if key.lower().startswith("include") and key.lower().endswith(".path"):
            if (t := _in_project(root, gitdir, value)) is not None:
                extra.append(t)
            if not value.startswith("~"):
                included += "\n" + _read(gitdir / value)
    try:
        hooks = [gitdir / "hooks" / n for n in os.listdir(gitdir / "hooks") if not n.endswith(".sample")]
        heads = [h.read_bytes()[:8192] for h in hooks if h.is_file() and not h.is_symlink()]
    except OSError:
        heads = []
    for mark, paths in HOOK_MANAGERS:
        if any(mark in head for head in heads):
            extra.extend(p for p in paths if p not in extra)
    said = installed_hooks(root, gitdir, text)
    if commands := config_commands(text) + config_commands(included):
        rel = os.path.relpath(gitdir / "config", root)
        said.append({"path": rel, "why": "git runs these commands from the repository's configuration on the "
                                         "host, and what they load from the project runs too: " + "; ".join(commands)})
    return extra, gitdirs, said


def _read(path: Path) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read(MAX_FILE)
    except OSError:
        return ""


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


def nested_names(root: Path, rel: str, kind: str = "") -> list[str]:
    """The protected names (NESTED; of the directory name KIND, by default REL's own) in
    the directory REL of ROOT, as paths; none where REL is not a directory of its own (a
    link is not followed)."""
    try:
        fd = os.open(root / rel, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return []
    try:
        return sorted(f"{rel}/{n}" for n in os.listdir(fd) if nested_name(kind or os.path.basename(rel), n))
    finally:
        os.close(fd)


def nested_top(root: Path) -> list[str]:
    """The NESTED names in the directories of those names at ROOT's top, and in the
    directory inside the project one of them links to (review 35: `.github` -> ci/github,
    whose `hooks/` was made through the link), with every NESTED path there (the
    literal ones whether or not they exist, so that one made later is seen)."""
    out, real_root = [], os.path.realpath(root)
    for d, names in NESTED.items():
        out += nested_names(root, d)
        if os.path.islink(root / d) and os.path.isdir(root / d):
            target = os.path.realpath(root / d)
            if target.startswith(real_root + os.sep):
                rel = os.path.relpath(target, real_root)
                out += nested_names(root, rel, d) + [f"{rel}/{n}" for n in names if "*" not in n]
    return out


def walk_project(root: Path, limit: int = MAX_WALK, bare: list[str] | None = None,
                 blind: list[str] | None = None, watched: list[str] | None = None,
                 links: dict[str, str] | None = None, pyc: list[str] | None = None,
                 envs: list[str] | None = None,
                 packages: list[str] | None = None) -> tuple[list[str], list[str], list[str], bool]:
    """One walk of ROOT, never through a symlink and never into a git directory: every
    `.git` below the top (directories, other entries), every DEEP name below the top (NESTED ones in directories of those names, a bare
    repository's settings)
    (outside node_modules), complete: False when ROOT holds more than LIMIT entries.
    BARE gets every directory that holds a bare repository's layout ("." for ROOT);
    BLIND every directory the caller cannot list (what is in it is unchecked: a
    workload's `chmod 0311` hid a nested repository there from an earlier walk that
    skipped it). WATCHED gets every WATCHED_DEEP name below the top (outside
    node_modules). Outside the environments (ENV_DIRS): LINKS gets every symlink that
    leads out of the project (with its target), PYC every compiled Python file; ENVS
    gets every environment below the top, and every symlink named like one; PACKAGES
    every package's `__init__` whose directory NAME stands beside a module NAME.py (or
    another importable NAME.*), or the symlink NAME to a package there: Python imports
    the package instead (reviews 15, 16)."""
    dirs: list[str] = []
    others: list[str] = []
    deep: list[str] = []
    real_root = os.path.realpath(root)
    n = 0
    todo: list[tuple[str, bool, bool, bool]] = [("", False, False, False)]
    while todo:
        rel, in_modules, in_env, beside = todo.pop()
        try:
            it = os.scandir(root / rel if rel else root)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if blind is not None:
                blind.append(f"{rel or '.'} ({exc.strerror or exc})")
            continue
        names: set[str] = set()
        with it:
            entries = list(it)
        names_here = {e.name for e in entries}
        stems = {m.group(1) for n in names_here if (m := _IMPORTABLE.match(n))} if packages is not None else set()
        for e in entries:
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
            if rel and not in_modules and deep_name(e.name):
                deep.append(child)
                continue
            if rel and not in_modules and e.name in NESTED:
                # A link (or file) is kept itself: tools read through it (review 33).
                deep += nested_names(root, child) if is_dir else [child]
            if rel and not in_modules and e.name in VCS_SETTINGS:  # a link or file: itself (review 29)
                deep += [f"{child}/{s}" for s in VCS_SETTINGS[e.name] if vcs_setting(root / child / s)] \
                    if is_dir else [child]
            if watched is not None and rel and not in_modules and watched_deep(e.name, in_env):
                watched.append(child)
            link = e.is_symlink()
            out = link and links is not None and not in_env and leads_out(root, real_root, child)
            if out and links is not None:
                try:
                    links[child] = os.readlink(root / child)
                except OSError:
                    links[child] = "?"
            env = not out and not in_env and (e.name in ENV_DIRS or rel.rpartition("/")[2] in ENV_PARENTS) and (
                link or is_dir and is_env(root / child, e.name))
            if env and envs is not None and (rel or link):
                envs.append(child)
            if pyc is not None and not in_env and not env and not link and compiled(e.name, rel, names_here):
                pyc.append(child)
            if packages is not None and beside and not in_env and e.name.split(".", 1)[0] == "__init__" \
                    and _IMPORTABLE.match(e.name):
                packages.append(child)
            if packages is not None and link and not in_env and e.name in stems and _is_package(root / child):
                packages.append(child)  # a link to a package, beside the module (review 16): the link
            if is_dir:
                todo.append((child, in_modules or e.name == "node_modules", in_env or env,
                             not link and e.name in stems))
        if bare is not None and is_layout(names):
            bare.append(rel or ".")
        if rel and not in_modules and is_layout(names):
            # A bare repository's settings, like a `.git`'s (review 34: a test fixture's
            # `remote.git`, Jujutsu's `.jj/repo/store/git`: git run there reads them).
            deep += [f"{rel}/{n}" for n in sorted(names) if not is_git_data(n)]
    return sorted(dirs), sorted(others), sorted(deep), True
