"""Symlinks in a project as the host's tools follow them (run.guard, run.protected): where
a protected path leads through links inside the project, and whether a link leads out."""

from __future__ import annotations

import os
from pathlib import Path


def link_targets(root: Path, rels: list[str] | tuple[str, ...]) -> list[str]:
    """What the paths RELS reach inside the project through symlinks (review 15:
    `.vscode -> tools/vscode`, and VS Code ran the tasks.json the workload wrote through
    the target): every link on the way, followed one by one (review 16: re-pointing
    `tools` in `.vscode -> tools/vscode` with `tools -> shared/tools` swapped what VS
    Code read), and the place the last one leads to. The host's tools read them, so they
    are protected too. A link to the project's top itself is a ValueError (the caller's
    GuardError): kooi cannot protect the whole project."""
    real_root = os.path.realpath(root)
    out: list[str] = []
    for rel in rels:
        for found in _on_the_way(root, real_root, rel):
            if found not in out and found not in rels:
                out.append(found)
    return out


def _on_the_way(root: Path, real_root: str, rel: str) -> list[str]:
    """The links on REL's way (each by its own path in the project) and where they lead
    at the end; nothing when REL has no link on its way or leads out of the project."""
    found: list[str] = []
    parts = rel.split("/")
    i, hops = 0, 0
    while i < len(parts):
        here = "/".join(parts[: i + 1])
        p = root / here
        if not os.path.islink(p):
            if not os.path.lexists(p):
                break
            i += 1
            continue
        hops += 1
        if hops > 40:
            break
        found.append(here)
        try:
            target = os.readlink(p)
        except OSError:
            break
        base = real_root if target.startswith("/") else os.path.join(real_root, os.path.dirname(here))
        dest = os.path.normpath(os.path.join(base, target))
        if dest == real_root:
            raise ValueError(here)
        if not dest.startswith(real_root.rstrip("/") + "/"):
            return found  # out of the project (said by the walk)
        parts = os.path.relpath(dest, real_root).split("/") + parts[i + 1:]
        i = 0
    if found:
        end = "/".join(parts)
        if end and os.path.lexists(root / end) and end not in found:
            found.append(end)
    return found


def leads_out(root: Path, real_root: str, rel: str) -> bool:
    """The symlink at REL leads out of the project, as the host resolves it (through
    other links: review 13's `build -> up/up/../..` with `up -> .`): what a host tool
    that writes through it reaches."""
    real = os.path.realpath(root / rel)
    return not (real == real_root or real.startswith(real_root.rstrip("/") + "/"))
