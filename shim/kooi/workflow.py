"""Workflows: YAML files in a root-owned directory, validated against a JSON Schema.

A workflow is never read from the project (the workload can write there): `kooi run`
takes a workflow *name* and reads /etc/kooi/workflows/NAME.yml, which must be owned by
root and writable by nobody else, like the directory it is in.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

WORKFLOW_DIR = Path(os.environ.get("KOOI_WORKFLOW_DIR", "/etc/kooi/workflows"))
SCHEMA_PATH = Path(__file__).with_name("schemas") / "workflow.schema.json"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
# Weakest to strongest; a workflow's min_isolation refuses anything below it.
ISOLATION_LEVELS = ("jail", "userns_remap", "rootless", "gvisor")


class WorkflowError(Exception):
    """The workflow is missing, unsafe to read or invalid; the message names file and key."""


@dataclass(frozen=True)
class Limits:
    memory: str | None = None
    cpus: float | None = None
    pids: int | None = None


@dataclass(frozen=True)
class Workflow:
    name: str
    path: Path
    command: tuple[str, ...]
    mode: str = "container"
    image: str = "runner"
    workdir: str = "."
    environment: dict[str, str] = field(default_factory=dict)
    timeout: int = 3600
    limits: Limits = Limits()
    tmpfs_size: str = "1g"
    network: str = "none"
    min_isolation: str | None = None
    description: str = ""


def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def _key_path(err) -> str:
    parts = [str(p) for p in err.absolute_path]
    return ".".join(parts) if parts else "(top level)"


def _describe(err) -> str:
    if err.validator == "additionalProperties":
        allowed = sorted((err.schema.get("properties") or {}).keys())
        unknown = sorted(set(err.instance) - set(allowed)) if isinstance(err.instance, dict) else []
        pat = err.schema.get("patternProperties")
        if pat:
            return f"key(s) {', '.join(map(repr, unknown)) or '?'} not allowed: names must match {next(iter(pat))}"
        where = _key_path(err)
        prefix = "" if where == "(top level)" else f"{where}."
        return "; ".join(f"unknown key '{prefix}{k}' (allowed: {', '.join(allowed)})"
                         for k in sorted(set(err.instance) - set(allowed)))
    if err.validator == "required":
        return f"{err.message} (key '{_key_path(err)}')"
    return f"key '{_key_path(err)}': {err.message}"


def validate(data: Any, source: str) -> list[str]:
    """All schema violations in DATA, each naming SOURCE and the key."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema())
    v = cls(schema())
    errs = sorted(v.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
    msgs = [f"{source}: {_describe(e)}" for e in errs]
    if not msgs and isinstance(data, dict):
        if data.get("mode") == "jail" and "image" in data:
            msgs.append(f"{source}: key 'image': only container mode runs an image; remove it for mode jail")
        wd = data.get("workdir", ".")
        if ".." in Path(wd).parts:
            msgs.append(f"{source}: key 'workdir': {wd!r} leaves the project ('..' is not allowed)")
    return msgs


def _check_root_owned(path: Path, what: str) -> None:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise WorkflowError(f"{path}: {what} not found") from None
    if st.st_uid != 0:
        raise WorkflowError(
            f"{path}: {what} is owned by uid {st.st_uid}, not root; refusing to read workflows a "
            "workload could have written (install them with site.yml)")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise WorkflowError(f"{path}: {what} is writable by group or others "
                            f"(mode {stat.S_IMODE(st.st_mode):04o}); refusing it")


def parse(path: Path, name: str | None = None) -> Workflow:
    """Parse and validate one workflow file (no ownership checks; see load)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise WorkflowError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WorkflowError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise WorkflowError(f"{path}: a workflow is a YAML mapping, got {type(data).__name__}")
    errors = validate(data, str(path))
    stem = name or path.name.removesuffix(".yml").removesuffix(".yaml")
    if "name" in data and isinstance(data["name"], str) and data["name"] != stem:
        errors.append(f"{path}: key 'name': {data['name']!r} differs from the file name {stem!r}")
    if errors:
        raise WorkflowError("\n".join(errors))
    lim = data.get("limits") or {}
    return Workflow(
        name=stem, path=path, command=tuple(data["command"]), mode=data.get("mode", "container"),
        image=data.get("image", "runner"), workdir=data.get("workdir", "."),
        environment=dict(data.get("environment") or {}), timeout=int(data.get("timeout", 3600)),
        limits=Limits(lim.get("memory"), lim.get("cpus"), lim.get("pids")),
        tmpfs_size=data.get("tmpfs_size", "1g"), network=data.get("network", "none"),
        min_isolation=data.get("min_isolation"), description=data.get("description", ""))


def load(name: str, directory: Path = WORKFLOW_DIR) -> Workflow:
    """Load workflow NAME from the root-owned workflow directory."""
    if not NAME_RE.match(name):
        raise WorkflowError(f"{name!r} is not a workflow name (lower-case letters, digits, . _ -); "
                            f"workflows are read by name from {directory}, never from a path")
    _check_root_owned(directory, "workflow directory")
    for suffix in (".yml", ".yaml"):
        path = directory / f"{name}{suffix}"
        if path.exists():
            if path.is_symlink():
                raise WorkflowError(f"{path}: is a symlink; refusing it")
            _check_root_owned(path, "workflow file")
            return parse(path, name)
    known = sorted(p.stem for p in directory.glob("*.y*ml"))
    raise WorkflowError(f"no workflow {name!r} in {directory} (known: {', '.join(known) or 'none'})")


def isolation_rank(level: str) -> int:
    return ISOLATION_LEVELS.index(level)
