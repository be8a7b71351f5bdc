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
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from .hoststate import limits as limits_state
from .hoststate import paths
from .hoststate.secrets import PATH as SECRETS_PATH
from .hoststate.secrets import SecretsConfig

WORKFLOW_DIR = Path(os.environ.get("KOOI_WORKFLOW_DIR", paths.WORKFLOWS))
SCHEMA_PATH = Path(__file__).with_name("schemas") / "workflow.schema.json"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}\Z")
# Weakest to strongest; a workflow's min_isolation refuses anything below it.
ISOLATION_LEVELS = ("jail", "userns_remap", "rootless", "gvisor")


class WorkflowError(Exception):
    """The workflow is missing, unsafe to read or invalid; the message names file and key."""


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    sch: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return sch


def _defaults(props: dict[str, Any]) -> dict[str, Any]:
    return {k: v["default"] for k, v in props.items() if "default" in v}


# Every setting is declared once, in the schema (type, default, doc); the defaults
# below, parse() and docs/workflows.md's key table (scripts/workflow-docs.py) derive
# from it.
DEFAULTS = _defaults(schema()["properties"])
SESSION_DEFAULTS = _defaults(schema()["properties"]["session"]["properties"])


@dataclass(frozen=True)
class Limits:
    memory: str | None = None
    cpus: float | None = None
    pids: int | None = None
    files: int | None = None

    def named(self) -> dict[str, Any]:
        """Each limit key, None where the workflow does not name it."""
        return {k: getattr(self, k) for k in limits_state.KEYS}


@dataclass(frozen=True)
class Session:
    """A session workflow's `session` key (docs/sessions.md)."""

    shell: tuple[str, ...] = tuple(SESSION_DEFAULTS["shell"])
    idle_timeout: int = SESSION_DEFAULTS["idle_timeout"]
    seed: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Workflow:
    name: str
    path: Path
    command: tuple[str, ...]
    mode: str = DEFAULTS["mode"]
    image: str = DEFAULTS["image"]
    workdir: str = DEFAULTS["workdir"]
    environment: dict[str, str] = field(default_factory=dict)
    timeout: int = DEFAULTS["timeout"]
    limits: Limits = Limits()
    tmpfs_size: str = DEFAULTS["tmpfs_size"]
    network: str = DEFAULTS["network"]
    testcontainers: bool = DEFAULTS["testcontainers"]
    min_isolation: str | None = None
    description: str = ""
    secrets: tuple[str, ...] = ()
    unprotected_paths: tuple[str, ...] = ()
    debugger: bool = DEFAULTS["debugger"]
    session: Session | None = None


@dataclass
class SchemaError:
    """One violation, shaped like jsonschema's ValidationError (the fields kooi uses)."""

    absolute_path: list[str | int]
    validator: str
    message: str
    schema: dict[str, Any]
    instance: Any


_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def _is_type(value: Any, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[name])


def iter_errors(value: Any, sch: dict[str, Any], path: list[str | int] | None = None) -> Iterator[SchemaError]:
    """Validate VALUE against the JSON Schema subset kooi's schemas use (type, enum,
    pattern, minLength, minimum, maximum, exclusiveMinimum, minItems, items, required,
    properties, patternProperties, additionalProperties: false). The run path uses this,
    not the jsonschema package (its import alone costs a cold `kooi run` ~0.15 s);
    tests/unit check that both agree."""
    path = path or []
    if "type" in sch and not _is_type(value, sch["type"]):
        yield SchemaError(path, "type", f"{value!r} is not of type {sch['type']!r}", sch, value)
        return
    if "enum" in sch and value not in sch["enum"]:
        yield SchemaError(path, "enum", f"{value!r} is not one of {sch['enum']!r}", sch, value)
    if isinstance(value, str):
        if "minLength" in sch and len(value) < sch["minLength"]:
            yield SchemaError(path, "minLength", f"{value!r} is too short", sch, value)
        if "pattern" in sch and not re.search(sch["pattern"], value):
            yield SchemaError(path, "pattern", f"{value!r} does not match {sch['pattern']!r}", sch, value)
    if _is_type(value, "number"):
        if "minimum" in sch and value < sch["minimum"]:
            yield SchemaError(path, "minimum", f"{value!r} is less than the minimum of {sch['minimum']!r}", sch, value)
        if "maximum" in sch and value > sch["maximum"]:
            yield SchemaError(path, "maximum", f"{value!r} is greater than the maximum of {sch['maximum']!r}",
                              sch, value)
        if "exclusiveMinimum" in sch and value <= sch["exclusiveMinimum"]:
            yield SchemaError(path, "exclusiveMinimum",
                              f"{value!r} is less than or equal to the minimum of {sch['exclusiveMinimum']!r}", sch, value)
    if isinstance(value, list):
        if "minItems" in sch and len(value) < sch["minItems"]:
            yield SchemaError(path, "minItems", f"{value!r} should be non-empty" if sch["minItems"] == 1
                              else f"{value!r} is too short", sch, value)
        if "items" in sch:
            for i, item in enumerate(value):
                yield from iter_errors(item, sch["items"], path + [i])
    if isinstance(value, dict):
        for key in sch.get("required", []):
            if key not in value:
                yield SchemaError(path, "required", f"{key!r} is a required property", sch, value)
        props = sch.get("properties", {})
        pats = sch.get("patternProperties", {})
        extra = []
        for key, item in value.items():
            matched = False
            if key in props:
                matched = True
                yield from iter_errors(item, props[key], path + [key])
            for pat, sub in pats.items():
                if re.search(pat, str(key)):
                    matched = True
                    yield from iter_errors(item, sub, path + [key])
            if not matched:
                extra.append(key)
        if extra and sch.get("additionalProperties") is False:
            yield SchemaError(path, "additionalProperties",
                              f"Additional properties are not allowed ({', '.join(map(repr, extra))} "
                              f"{'was' if len(extra) == 1 else 'were'} unexpected)", sch, value)


def _key_path(err: SchemaError) -> str:
    parts = [str(p) for p in err.absolute_path]
    return ".".join(parts) if parts else "(top level)"


def _describe(err: SchemaError) -> str:
    if err.validator == "additionalProperties":
        allowed = sorted((err.schema.get("properties") or {}).keys())
        pats = list((err.schema.get("patternProperties") or {}).keys())
        unknown = sorted(k for k in err.instance if k not in allowed
                         and not any(re.search(p, str(k)) for p in pats))
        where = _key_path(err)
        prefix = "" if where == "(top level)" else f"{where}."
        if pats and not allowed:
            return "; ".join(f"key '{prefix}{k}': not a valid name (must match {pats[0]})" for k in unknown)
        return "; ".join(f"unknown key '{prefix}{k}' (allowed: {', '.join(allowed)})" for k in unknown)
    if err.validator == "required":
        return f"{err.message} (at {_key_path(err)})"
    return f"key '{_key_path(err)}': {err.message}"


def validate(data: Any, source: str) -> list[str]:
    """All schema violations in DATA, each naming SOURCE and the key."""
    errs = sorted(iter_errors(data, schema()), key=lambda e: [str(p) for p in e.absolute_path])
    msgs = [f"{source}: {_describe(e)}" for e in errs]
    if not msgs and isinstance(data, dict):
        if data.get("mode") == "jail" and "image" in data:
            msgs.append(f"{source}: key 'image': only container mode runs an image; remove it for mode jail")
        if data.get("mode") == "jail" and data.get("testcontainers"):
            msgs.append(f"{source}: key 'testcontainers': a jail gets no container engine; use mode container")
        names = data.get("secrets") or []
        if len(set(names)) != len(names):
            msgs.append(f"{source}: key 'secrets': a secret is named twice")
        if "session" in data:
            if "command" in data:
                msgs.append(f"{source}: key 'command': a session has no command; its terminals start "
                            "session.shell")
            if data.get("mode", DEFAULTS["mode"]) != "container":
                msgs.append(f"{source}: key 'session': sessions run in container mode only")
            for rel in (data["session"].get("seed") or {}):
                if ".." in Path(rel).parts:
                    msgs.append(f"{source}: key 'session.seed.{rel}': '..' leaves the home")
        elif "command" not in data:
            msgs.append(f"{source}: 'command' is a required property (or 'session' for a session workflow)")
        wd = data.get("workdir", DEFAULTS["workdir"])
        if ".." in Path(wd).parts:
            msgs.append(f"{source}: key 'workdir': {wd!r} leaves the project ('..' is not allowed)")
    return msgs


def secret_errors_of(wf: Workflow, store: SecretsConfig | None) -> list[str]:
    return secret_errors(wf.secrets, wf.mode, wf.network == "proxy" or wf.testcontainers, wf.environment,
                         str(wf.path), store, session=wf.session is not None)


def check_inline(name: Any, data: Any, source: str) -> list[str]:
    """Errors of an inline workflow (inventory variable kooi_workflows): name and body."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        return [f"{source}: {name!r} is not a workflow name (lower-case letters, digits, . _ -)"]
    if not isinstance(data, dict):
        return [f"{source}: a workflow is a mapping, got {type(data).__name__}"]
    errors = validate(data, source)
    if "name" in data and data["name"] != name:
        errors.append(f"{source}: key 'name': {data['name']!r} differs from the workflow name {name!r}")
    return errors


def inline_errors(name: Any, data: Any, source: str, store: SecretsConfig | None,
                  host: limits_state.LimitsConfig) -> list[str]:
    """Every error of an inline workflow: its name and body, then (when those are
    valid) its secrets against STORE and its limits against HOST."""
    errors = check_inline(name, data, source)
    if errors:
        return errors
    return (secret_errors(data.get("secrets"), data.get("mode", DEFAULTS["mode"]),
                          data.get("network") == "proxy" or bool(data.get("testcontainers")),
                          data.get("environment") or {}, source, store, session="session" in data)
            + limit_errors(data.get("limits"), source, host))


def _check_root_owned(path: Path, what: str) -> None:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise WorkflowError(f"{path}: {what} not found") from None
    except PermissionError:
        raise WorkflowError(f"{path}: {what} is not readable by uid {os.geteuid()}") from None
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
    ses = data.get("session")
    return Workflow(
        name=stem, path=path, command=tuple(data.get("command") or ()), mode=_get(data, "mode"),
        image=_get(data, "image"), workdir=_get(data, "workdir"),
        environment=dict(data.get("environment") or {}), timeout=int(_get(data, "timeout")),
        limits=Limits(lim.get("memory"), lim.get("cpus"), lim.get("pids"), lim.get("files")),
        tmpfs_size=_get(data, "tmpfs_size"), network=_get(data, "network"),
        testcontainers=bool(_get(data, "testcontainers")),
        min_isolation=data.get("min_isolation"), description=data.get("description", ""),
        secrets=tuple(data.get("secrets") or ()), unprotected_paths=tuple(data.get("unprotected_paths") or ()),
        debugger=bool(_get(data, "debugger")),
        session=None if ses is None else Session(
            shell=tuple(ses.get("shell", SESSION_DEFAULTS["shell"])),
            idle_timeout=int(ses.get("idle_timeout", SESSION_DEFAULTS["idle_timeout"])),
            seed=tuple(sorted((ses.get("seed") or {}).items()))))


def _get(data: dict[str, Any], key: str) -> Any:
    return data.get(key, DEFAULTS[key])


def limit_errors(lim: Any, source: str, host: limits_state.LimitsConfig) -> list[str]:
    """Errors of a workflow's LIMITS (its `limits` mapping) against the host's maximum."""
    if not isinstance(lim, dict):
        return []
    _, _, errors = limits_state.resolve({k: lim.get(k) for k in limits_state.KEYS}, host, f"{source}: key 'limits'")
    return errors


def limit_errors_of(wf: Workflow, host: limits_state.LimitsConfig) -> list[str]:
    return limit_errors(wf.limits.named(), str(wf.path), host)


def secret_errors(names: Any, mode: str, networked: bool, environment: dict[str, Any], source: str,
                  store: SecretsConfig | None, session: bool = False) -> list[str]:
    """Errors of a workflow's SECRETS against the host's secrets description STORE
    (None: the host has none): unknown names, secrets whose variable the workflow's
    own environment also sets, inject secrets in a jail (it has no path to the
    injector) or without a network (NETWORKED: network proxy or testcontainers),
    secrets held per person in a workflow that is not a SESSION's."""
    names = [n for n in names or [] if isinstance(n, str)]
    if not names:
        return []
    if store is None:
        return [f"{source}: key 'secrets': this host has no secrets store ({SECRETS_PATH} is missing); "
                "provision the secrets with site.yml (role secrets, kooi_secrets) or remove the key"]
    errs = []
    for n in names:
        s = store.secrets.get(n)
        if s is None:
            errs.append(f"{source}: key 'secrets': unknown secret {n!r} (this host has: "
                        f"{', '.join(sorted(store.secrets)) or 'none'}); add it to kooi_secrets and re-run site.yml")
            continue
        for var in (s.env, s.base_url_env):
            if var and var in (environment or {}):
                errs.append(f"{source}: key 'environment.{var}': secret {n!r} sets it; remove it from environment")
        if s.persons and not session:
            errs.append(f"{source}: key 'secrets': {n!r} holds one value per person; only a session workflow "
                        "(key 'session'), which belongs to a person, can name it")
        if mode == "jail":
            errs.append(f"{source}: key 'secrets': {n!r}: jails get no secrets (a jail runs as the runner on "
                        "the host and has no path to the injector); use mode container")
        elif s.mode == "inject" and not networked:
            errs.append(f"{source}: key 'secrets': {n!r} is injected by the host, which the workload reaches "
                        "on its proxy path; set network: proxy")
    return errs


def load(name: str, directory: Path = WORKFLOW_DIR) -> Workflow:
    """Load workflow NAME from the root-owned workflow directory."""
    if not NAME_RE.match(name):
        raise WorkflowError(f"{name!r} is not a workflow name (lower-case letters, digits, . _ -); "
                            f"workflows are read by name from {directory}, never from a path")
    _check_root_owned(directory, "workflow directory")
    for suffix in (".yml", ".yaml"):
        path = directory / f"{name}{suffix}"
        try:
            present = path.lstat() is not None
        except FileNotFoundError:
            present = False
        except PermissionError:
            raise WorkflowError(f"{directory}: workflow directory is not readable by uid {os.geteuid()}") from None
        if present:
            if path.is_symlink():
                raise WorkflowError(f"{path}: is a symlink; refusing it")
            _check_root_owned(path, "workflow file")
            return parse(path, name)
    known = sorted(p.stem for p in directory.glob("*.y*ml"))
    raise WorkflowError(f"no workflow {name!r} in {directory} (known: {', '.join(known) or 'none'})")


def isolation_rank(level: str) -> int:
    return ISOLATION_LEVELS.index(level)
