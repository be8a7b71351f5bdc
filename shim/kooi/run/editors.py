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
    """TEXT read as VS Code reads its settings; None where it is not JSON then."""
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


def _named(root: Path, command: str) -> list[str]:
    """The project's regular files COMMAND names (./x, dir/x, ${workspaceFolder}/x)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    out = []
    for w in words:
        for var in ("${workspaceFolder}", "${localWorkspaceFolder}", "${containerWorkspaceFolder}"):
            w = w.replace(var, str(root))
        if "/" not in w and not w.endswith((".sh", ".py", ".js", ".mjs", ".cjs", ".ts", ".ps1", ".bat")):
            continue
        rel = _in_project(root, root, w)
        if rel and not os.path.islink(root / rel) and os.path.isfile(root / rel) and rel not in out:
            out.append(rel)
    return out


def editor_targets(root: Path) -> tuple[list[str], list[dict[str, str]]]:
    """(the files the project's editor settings run, kept; what they run, said)."""
    keep: list[str] = []
    said: list[dict[str, str]] = []

    def runs(rel: str, command: str, when: str) -> None:
        said.append({"path": rel, "why": f"runs `{command[:200]}` on the host {when}"})
        keep.extend(f for f in _named(root, command) if f not in keep)

    containers = [".devcontainer/devcontainer.json", ".devcontainer.json",
                  *sorted(str(Path(p).relative_to(root)) for p in glob.glob(str(root / ".devcontainer/*/devcontainer.json")))]
    for rel in containers:
        doc = _read(root, rel)
        if isinstance(doc, dict):
            for cmd in _commands(doc.get("initializeCommand")):
                runs(rel, cmd, "when its dev container is built or reopened (initializeCommand)")
    workspaces = [n for n in sorted(os.listdir(root)) if n.endswith(".code-workspace")] if root.is_dir() else []
    for rel in (".vscode/tasks.json", *workspaces):
        doc = _read(root, rel)
        if isinstance(doc, dict) and rel != ".vscode/tasks.json":
            doc = doc.get("tasks")
        tasks: Any = doc.get("tasks") if isinstance(doc, dict) else None
        for t in tasks if isinstance(tasks, list) else []:
            if isinstance(t, dict) and (t.get("runOptions") or {}).get("runOn") == "folderOpen":
                args: list[Any] = t["args"] if isinstance(t.get("args"), list) else []
                cmd = " ".join([str(t.get("command", "")), *(shlex.quote(str(a)) for a in args)]).strip()
                runs(rel, cmd or str(t.get("label", "a task")), "when the folder opens in VS Code (a folderOpen task)")
    for rel in (".vscode/settings.json", *workspaces):
        doc = _read(root, rel)
        if isinstance(doc, dict) and rel != ".vscode/settings.json":
            doc = doc.get("settings")
        if isinstance(doc, dict) and any(doc.get(k) not in (None, False, "off") for k in _TEST_DISCOVERY):
            said.append({"path": rel, "why": "the editor's test discovery imports the project's tests (conftest.py, "
                                             "test modules) on the host when the folder opens"})
    return keep, said
