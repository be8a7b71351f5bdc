"""What a project's `.envrc` runs from the project when direnv loads it on the host
(run.guard protects it, or says it cannot).

An `.envrc` is bash: no reading of it is complete (a loop, a function, `eval`). So
every `.envrc` is said to run on the host (exposed), and what kooi can read in it, as
the shell splits it, is protected where it is small enough to keep a copy of, or said:

- files it sources or loads (`source_env*`, `source`, `.`, `dotenv*` and its `.env`,
  `watch_file`, `use flake`/`use nix`/`use devenv` files), read in turn (three deep):
  an `.envrc.local` or a virtualenv's `activate` puts directories on PATH too;
- files it runs (`./x`), and project files named in any variable it sets (a
  GIT_CONFIG_GLOBAL, a KUBECONFIG, NODE_OPTIONS' `--require=./x`);
- the directories it puts on PATH or MANPATH (`PATH_add`, `load_prefix`, `layout go`,
  `PATH=$PWD/bin:$PATH`): a `bin/git` there answers the host's next `git status`;
- said, not kept (source trees and environments, far too large, and the workload's
  own work is there): directories on module paths (PYTHONPATH, NODE_PATH, ...),
  VIRTUAL_ENV and `*_HOME`, and what `layout node|php|python|...` puts on PATH.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from .protected import MAX_FILE, _in_project

_FILE = {"source_env", "source_env_if_exists", "dotenv", "dotenv_if_exists", "source", "."}
_SOURCED = {"source_env", "source_env_if_exists", "source", "."}  # bash: read in turn
_DEFAULTS = {"dotenv": ".env", "dotenv_if_exists": ".env"}
_DIRS = {"PATH_add": 1, "MANPATH_add": 1, "path_add": 2, "load_prefix": 1}
# What `layout X` puts first on the host's PATH: kept (go's bin) and said (the rest).
_LAYOUTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "go": (("bin",), (".direnv",)), "node": ((), ("node_modules/.bin",)), "php": ((), ("vendor/bin",)),
    "pipenv": ((), (".venv", ".direnv")), "poetry": ((), (".venv", ".direnv")), "uv": ((), (".venv",)),
    "opam": ((), ("_opam",))}
# What `use X` loads and runs (stdlib.sh), without arguments.
_USE = {"flake": ("flake.nix", "flake.lock"), "nix": ("shell.nix", "default.nix"),
        "devenv": ("devenv.nix", "devenv.yaml", "devenv.lock", ".devenv.flake.nix"),
        "guix": ("guix.scm", "manifest.scm", "channels.scm"), "vim": (".vimrc.local",),
        "flox": (".flox/env/manifest.toml",)}
# Directories of installed environments: on a search path they are said, not kept (the
# workload's own `pip install` or `npm install` goes there).
_ENVS = frozenset({"node_modules", ".venv", "venv", ".direnv", "vendor", ".conda", "env", "_opam"})
_KEEPERS = {"if", "then", "else", "elif", "do", "while", "until", "!", "export", "local", "declare", "readonly",
            "exec", "command", "builtin", "eval"}
# Variables whose project directories hold code or environments, not a few executables.
_MODULE_VAR = re.compile(r"^(PYTHONPATH|PYTHONHOME|NODE_PATH|RUBYLIB|PERL5LIB|GEM_PATH|GEM_HOME|GOPATH|CLASSPATH|"
                         r"LD_LIBRARY_PATH|VIRTUAL_ENV|CONDA_PREFIX|[A-Z0-9_]*_HOME|[A-Z0-9_]*PATH)$")
_PWD = re.compile(r"\$\{PWD\}|\$PWD\b|\$\(pwd\)|`pwd`|\$\{DIRENV_DIR#-\}|\$\(git rev-parse --show-toplevel\)")
_EXPAND_PATH = re.compile(r"\$\(expand_path\s+([^)\s]+)\s*\)")
_EXPANSION = re.compile(r"\$\{[^}]*\}|\$\([^)]*\)|\$[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\+?=")


def _words(text: str) -> list[list[str]]:
    """The simple commands of TEXT as the shell splits them (quotes, `;`, `&&`, `if ...;
    then`, line continuations), the project's own directory ($PWD, ...) as `.`."""
    commands: list[list[str]] = []
    text = _EXPAND_PATH.sub(lambda m: m.group(1), _PWD.sub(".", text.replace("\\\n", "")))
    for line in text.splitlines():
        lex = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lex.whitespace_split = True
        lex.commenters = "#"
        cmd: list[str] = []
        try:
            for tok in lex:
                if tok and set(tok) <= set(";&|()"):
                    commands.append(cmd)
                    cmd = []
                elif not cmd and tok in _KEEPERS:
                    continue
                else:
                    cmd.append(tok)
        except ValueError:  # unbalanced quotes: the words up to there
            pass
        commands.append(cmd)
    return [c for c in commands if c]


class _Reading:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.protect: list[str] = []
        self.exposed: list[dict[str, str]] = []
        self.read: set[str] = set()

    def keep(self, rel: str) -> None:
        if rel not in self.protect:
            self.protect.append(rel)

    def say(self, rel: str, why: str) -> None:
        if rel not in {e["path"] for e in self.exposed}:
            self.exposed.append({"path": rel, "why": why})

    def path(self, base: Path, value: str) -> str | None:
        """VALUE (relative to BASE) as a project path: expansions dropped (`${PATH:+...}`
        adds nothing of the project's), "." for the project's top, None outside."""
        value = _EXPANSION.sub("", value).strip()
        if not value:
            return None
        if _in_project(self.root, base, value + "/x") is None:
            return None
        return _in_project(self.root, base, value) or "."

    def on_path(self, base: Path, value: str, var: str = "PATH") -> None:
        rel = self.path(base, value)
        if rel is None:
            return
        if rel == ".":
            self.say(".", f"the .envrc puts the project's top directory on {var} of the host's (a `git` there "
                          "answers the next `git status`)")
        elif set(Path(rel).parts) & _ENVS:
            env = next(p for p in Path(rel).parts if p in _ENVS)
            self.say(rel.split(env, 1)[0] + env, f"the .envrc puts {rel} on {var}: an installed environment "
                                                 "the host's programs run")
        elif _MODULE_VAR.match(var) and var not in ("PATH", "MANPATH"):
            self.say(rel, f"the .envrc puts it on {var}: the host's programs load code from it")
            for hook in ("sitecustomize.py", "usercustomize.py"):  # every Python on the host runs these
                self.keep(f"{rel}/{hook}")
        else:
            self.keep(rel)

    def file(self, base: Path, value: str, depth: int, verb: str = "") -> None:
        rel = self.path(base, value)
        if rel is None or rel == ".":
            return
        if verb.startswith(("source_env", "dotenv")) and (self.root / rel).is_dir() \
                and not (self.root / rel).is_symlink():
            rel = f"{rel}/{'.envrc' if verb.startswith('source_env') else '.env'}"  # what direnv reads there
        if verb in _SOURCED and rel.endswith("bin/activate"):  # a virtualenv's: its bin/ goes first on PATH
            env = rel.rsplit("/", 2)[0]
            self.say(env, "the .envrc activates it: the host's PATH gets its bin/ first")
            return
        self.keep(rel)
        if verb in _SOURCED and depth < 3:
            # `source`/`.` run in the .envrc's directory ($PWD); source_env in the file's
            self.envrc(rel, depth + 1, base if verb in ("source", ".") else None)

    def envrc(self, rel: str, depth: int = 0, base: Path | None = None) -> None:
        """Read the project file REL (an .envrc, or a file one sources), its relative
        paths from BASE (default: its own directory), following a link within the
        project (direnv does; the target is kept too)."""
        if rel in self.read:
            return
        self.read.add(rel)
        path = self.root / rel
        base = base or path.parent
        try:
            if path.is_symlink():
                target = _in_project(self.root, self.root, str(path.resolve()))
                if target is None or (self.root / target).is_symlink():
                    return
                self.keep(target)
                path = self.root / target
            if not path.is_file():
                return
            text = path.read_text(errors="replace")[:MAX_FILE]
        except OSError:
            return
        for cmd in _words(text):
            verb, args = cmd[0], cmd[1:]
            for word in cmd:
                if _ASSIGN.match(word):  # VAR=value (or +=), also before a command
                    var, _, value = word.partition("=")
                    self.assignment(base, var.rstrip("+"), value)
            if _ASSIGN.match(verb):
                continue
            if verb in _FILE:
                self.file(base, args[0] if args else _DEFAULTS.get(verb, ""), depth, verb)
            elif verb in _DIRS:
                for a in args[_DIRS[verb] - 1:]:
                    var = args[0] if verb == "path_add" and args else "PATH"
                    if verb == "load_prefix":
                        for sub in ("bin", "sbin", "lib", "lib64"):
                            if (r := self.path(base, a)) is not None:
                                self.keep(sub if r == "." else f"{r}/{sub}")
                    else:
                        self.on_path(base, a, var)
            elif verb == "use" and args and args[0] in _USE:
                given = [a for a in args[1:] if not a.startswith("-")]
                if args[0] == "nix" and given:
                    for a in given:
                        self.file(base, a, depth)
                elif args[0] == "flake" and given:
                    ref = given[0].split("#", 1)[0] or "."
                    for f in ("flake.nix", "flake.lock"):
                        self.file(base, f"{ref}/{f}", depth)
                else:
                    for f in _USE[args[0]]:
                        self.file(base, f, depth)
            elif verb == "layout" and args:
                keep, say = _LAYOUTS.get(args[0], ((), (".direnv",)))
                if args[0] == "anaconda" and len(args) > 1:
                    say = (*say, args[1])
                for k in keep:
                    self.file(base, k, depth)
                for s in say:
                    if (r := self.path(base, s)) is not None:
                        self.say(r, f"direnv's `layout {args[0]}` puts it first on the host's PATH")
            elif verb.startswith(("./", "../")):
                self.file(base, verb, depth)  # run directly
            elif "devbox" in cmd:
                self.file(base, "devbox.json", depth)

    def assignment(self, base: Path, var: str, value: str) -> None:
        for part in re.split(r"[:\s]", _EXPANSION.sub(lambda m: " " if ":" in m.group(0) else "", value)):
            if part.startswith("-"):  # an option: its value (`--require=./x`)
                part = part.partition("=")[2]
            if not part:
                continue
            if var in ("PATH", "MANPATH") or _MODULE_VAR.match(var):
                self.on_path(base, part, var)
            elif (rel := self.path(base, part)) is not None and rel != ".":
                self.keep(rel)  # a file the variable names (a config, a kubeconfig)


def envrc_targets(root: Path, envrcs: tuple[str, ...] = (".envrc",)) -> tuple[list[str], list[dict[str, str]]]:
    """What the project's `.envrc` files (ENVRCS: the top one and those below it) run
    from the project on the host: (paths to protect, what is said: every `.envrc`
    itself, and what cannot be kept)."""
    r = _Reading(root)
    for rel in envrcs:
        if (root / rel).is_file():
            r.say(rel, "direnv runs it on the host at `cd` once it is allowed: it is shell, and what it loads "
                       "from the project that kooi cannot read in it runs too")
            r.envrc(rel)
    return r.protect, r.exposed
