"""What a project's editor and dev-container settings run on the host (review 12): a
dev container's `initializeCommand` (on the host, before any container), VS Code tasks
that run when the folder opens, and test discovery that imports the project's tests.

The settings files themselves are protected (protected.PROTECTED). What they run from
elsewhere in the project changes with the workload's edits, as an `.envrc`'s sourced
files do (envrc.py): each such setting is said (the record's `exposed`), and the files
its command names in the project are protected too, where they are regular files.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

from .protected import MAX_FILE, _in_project

# JSON with comments and trailing commas, as VS Code and the dev-container CLI read it.
_COMMENT = re.compile(r'"(?:[^"\\]|\\.)*"|//[^\n]*|/\*.*?\*/', re.S)
_TRAILING = re.compile(r'"(?:[^"\\]|\\.)*"|,(?=\s*[}\]])')
_TEST_DISCOVERY = ("python.testing.pytestEnabled", "python.testing.unittestEnabled", "jest.runMode",
                   "vitest.enable", "deno.enable")


def jsonc(text: str) -> Any:
    """TEXT read as VS Code reads its settings (jsonc-parser: comments, trailing commas,
    a byte-order mark); None where it is not JSON then."""
    text = text.lstrip("\ufeff")
    try:
        keep = (lambda m: m.group(0) if m.group(0).startswith('"') else "")  # noqa: E731
        return json.loads(_TRAILING.sub(keep, _COMMENT.sub(keep, text)))
    except ValueError:
        return None


def _read(root: Path, rel: str) -> Any:
    p = root / rel
    try:
        if os.path.islink(p) or not os.path.isfile(p) or os.path.getsize(p) > MAX_FILE:
            return None
        return jsonc(p.read_text(errors="replace"))
    except OSError:
        return None


def _commands(v: Any) -> list[str]:
    """A command setting's commands: a string, an argv list, or an object of either."""
    if isinstance(v, str):
        return [v]
    if isinstance(v, list):
        return [shlex.join(str(x) for x in v)]
    if isinstance(v, dict):
        return [c for x in v.values() for c in _commands(x)]
    return []


_VARS = ("${workspaceFolder}", "${workspaceRoot}", "${localWorkspaceFolder}", "${containerWorkspaceFolder}",
         "${fileWorkspaceFolder}")
# Settings whose value is a program or file the editor runs (python.defaultInterpreterPath,
# git.path, eslint.nodePath, *.executable, ...).
_RUNS_KEY = re.compile(r"(?:path|Path|executable|Executable|command|Command|interpreter|Interpreter)$")


def _expand(text: str, root: Path) -> str:
    for var in _VARS:
        text = text.replace(var, str(root))
    return text


def _named(root: Path, base: Path, command: str) -> list[str]:
    """The project's regular files COMMAND names (./x, dir/x, ${workspaceFolder}/x;
    also inside `a&&b`, `a;b`, `a|b`), relative paths from BASE."""
    command = _expand(command, root)
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    out = []
    for w in (x for word in words for x in re.split(r"[;&|()`]+", word) if x):
        if "/" not in w and not w.endswith((".sh", ".py", ".js", ".mjs", ".cjs", ".ts", ".ps1", ".bat", ".yml",
                                            ".yaml")):
            continue
        rel = _in_project(root, base, w)
        if rel and not os.path.islink(root / rel) and os.path.isfile(root / rel) and rel not in out:
            out.append(rel)
    return out


def _task_commands(task: dict[str, Any], by_label: dict[str, dict[str, Any]], seen: set[int]) -> list[tuple[str, str]]:
    """(command, cwd) of TASK as VS Code runs it on Linux, and of the tasks it dependsOn."""
    if id(task) in seen:
        return []
    seen.add(id(task))
    linux: Any = task.get("linux")
    spec: dict[str, Any] = {**task, **(linux if isinstance(linux, dict) else {})}
    args: Any = spec.get("args") if isinstance(spec.get("args"), list) else []
    cmd = " ".join([str(spec.get("command", "")), *(shlex.quote(str(a)) for a in args)]).strip()
    options: Any = spec.get("options") if isinstance(spec.get("options"), dict) else {}
    out = [(cmd, str(options.get("cwd", "")))] if cmd else []
    deps = task.get("dependsOn")
    for d in [deps] if isinstance(deps, (str, dict)) else deps if isinstance(deps, list) else []:
        label = d if isinstance(d, str) else d.get("task") if isinstance(d, dict) else None
        if isinstance(label, str) and label in by_label:
            out += _task_commands(by_label[label], by_label, seen)
    return out


def editor_targets(root: Path, bases: tuple[str, ...] = ("",)) -> tuple[list[str], list[dict[str, str]]]:
    """(the files the project's editor settings run, kept; what they run, said), for the
    settings at the top and at each of BASES below it (a module opened on its own)."""
    keep: list[str] = []
    said: list[dict[str, str]] = []
    for base in bases:
        _targets(root, base, keep, said)
    return keep, said


def _targets(root: Path, base: str, keep: list[str], said: list[dict[str, str]]) -> None:
    at = root / base if base else root

    def rel_of(name: str) -> str:
        return f"{base}/{name}" if base else name

    def runs(rel: str, command: str, when: str, cwd: Path) -> None:
        said.append({"path": rel, "why": f"runs `{command[:200]}` on the host {when}"})
        keep.extend(f for f in _named(root, cwd, command) if f not in keep)

    containers = [".devcontainer/devcontainer.json", ".devcontainer.json",
                  *sorted(str(Path(p).relative_to(at)) for p in glob.glob(str(at / ".devcontainer/*/devcontainer.json")))]
    for name in containers:
        doc = _read(root, rel_of(name))
        if not isinstance(doc, dict):
            continue
        where = (at / name).parent
        for cmd in _commands(doc.get("initializeCommand")):  # run in the folder opened
            runs(rel_of(name), cmd, "when its dev container is built or reopened (initializeCommand)", at)
        # What the container is made from: a compose file with `privileged` or `pid: host`
        # gives it the host (review 13), and a Dockerfile's build runs on the host's engine.
        build: Any = doc.get("build") if isinstance(doc.get("build"), dict) else {}
        files = _commands(doc.get("dockerComposeFile")) + _commands(build.get("dockerfile"))
        for f in files:
            named = _in_project(root, where, f)
            if named and named not in keep and os.path.isfile(root / named) and not os.path.islink(root / named):
                keep.append(named)
                said.append({"path": rel_of(name), "why": f"its dev container is made from {named} (docker compose or "
                                                          "a Dockerfile) when it is built or reopened"})
    workspaces = [n for n in sorted(os.listdir(at)) if n.endswith(".code-workspace")] if at.is_dir() else []
    for name in (".vscode/tasks.json", *workspaces):
        doc = _read(root, rel_of(name))
        if isinstance(doc, dict) and name != ".vscode/tasks.json":
            doc = doc.get("tasks")
        tasks: Any = doc.get("tasks") if isinstance(doc, dict) else None
        tasks = [t for t in tasks if isinstance(t, dict)] if isinstance(tasks, list) else []
        by_label = {str(t.get("label")): t for t in tasks if "label" in t}
        for t in tasks:
            if (t.get("runOptions") or {}).get("runOn") == "folderOpen":
                for cmd, cwd in _task_commands(t, by_label, set()) or [(str(t.get("label", "a task")), "")]:
                    cwd = _expand(cwd, root)
                    runs(rel_of(name), cmd, "when the folder opens in VS Code (a folderOpen task)",
                         Path(os.path.normpath(at / cwd)) if cwd else at)
    for name in (".vscode/settings.json", *workspaces):
        doc = _read(root, rel_of(name))
        if isinstance(doc, dict) and name != ".vscode/settings.json":
            doc = doc.get("settings")
        if not isinstance(doc, dict):
            continue
        if any(doc.get(k) not in (None, False, "off") for k in _TEST_DISCOVERY):
            said.append({"path": rel_of(name), "why": "the editor's test discovery imports the project's tests "
                                                      "(conftest.py, test modules) on the host when the folder opens"})
        for key, value in doc.items():
            if isinstance(value, str) and _RUNS_KEY.search(key):
                for f in _named(root, at, value if "/" in value else f"./{value}"):
                    if f not in keep:
                        keep.append(f)
                    said.append({"path": rel_of(name), "why": f"{key} runs {f} on the host when the editor uses it"})
