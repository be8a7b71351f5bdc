"""/etc/kooi/limits.json: what every run is bounded by unless its workflow asks for other
limits, and the most a workflow may ask for (role shim: kooi_workflow_default_limits,
kooi_workflow_max_limits).

    {"default": {"memory": "4g", "cpus": 2, "pids": 2048, "files": 65536},
     "max": {"memory": "16g", "cpus": 16, "pids": 32768, "files": 1048576}}

memory: the workload's memory (k, m, g suffixes); cpus: CPU time in CPUs (a fraction is
allowed); pids: processes and threads; files: open files per process. A host without
the file (provisioned before kooi wrote it) bounds its runs by BUILTIN, the roles'
defaults, and has no maximum beyond kooi's own bounds (CEILING).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _json, paths, read
from .errors import HostStateError

PATH = Path(paths.LIMITS)
KEYS = ("memory", "cpus", "pids", "files")
# The roles' defaults (roles/kooi_defaults/defaults/main.yml; tests/unit check they agree).
BUILTIN: dict[str, Any] = {"memory": "4g", "cpus": 2, "pids": 2048, "files": 65536}
BUILTIN_MAX: dict[str, Any] = {"memory": "16g", "cpus": 16, "pids": 32768, "files": 1048576}
SIZE_RE = re.compile(r"^[0-9]+[kmg]?$")
# kooi's own bounds on any value (below: a run could not start; above: meaningless).
FLOOR: dict[str, float] = {"memory": 16 << 20, "cpus": 0.01, "pids": 16, "files": 64}
CEILING: dict[str, float] = {"memory": 1 << 50, "cpus": 1024, "pids": 4194304, "files": 1048576}


def size(s: str) -> int:
    """Bytes of a size string: 512m, 4g, 1048576."""
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def amount(key: str, value: Any) -> float:
    """VALUE of limit KEY as a number (memory in bytes) for comparisons."""
    return float(size(value)) if key == "memory" else float(value)


def value_error(key: str, value: Any) -> str | None:
    """Why VALUE is not a valid limit KEY, or None."""
    if key == "memory":
        if not isinstance(value, str) or not SIZE_RE.match(value):
            return f"{value!r} is not a size (digits with an optional k, m or g: 512m, 4g)"
    elif key == "cpus":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{value!r} is not a number of CPUs"
    elif key in ("pids", "files"):
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{value!r} is not an integer"
    else:
        return f"unknown limit {key!r} (known: {', '.join(KEYS)})"
    n = amount(key, value)
    if n < FLOOR[key] or n > CEILING[key]:
        lo, hi = ("16m", "1048576g") if key == "memory" else (f"{FLOOR[key]:.15g}", f"{CEILING[key]:.15g}")
        return f"{value!r} is outside {lo}..{hi}"
    return None


@dataclass(frozen=True)
class LimitsConfig:
    default: dict[str, Any] = field(default_factory=lambda: dict(BUILTIN))
    max: dict[str, Any] = field(default_factory=dict)  # a missing key: up to CEILING
    source: str = str(PATH)


def _table(raw: Any, what: str, source: str, complete: bool) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise HostStateError(f"{source}: {what} must be an object; re-run site.yml")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if value is None:
            continue
        # Inventory values given on a command line (-e) arrive as strings.
        if key in ("pids", "files") and isinstance(value, str) and value.isdigit():
            value = int(value)
        elif key == "cpus" and isinstance(value, str) and re.fullmatch(r"[0-9]+(\.[0-9]+)?", value):
            value = float(value)
        err = value_error(key, value)
        if err:
            raise HostStateError(f"{source}: {what}.{key}: {err}; fix the variable and re-run site.yml")
        out[key] = value
    missing = [k for k in KEYS if k not in out]
    if complete and missing:
        raise HostStateError(f"{source}: {what} has no {', '.join(missing)}; re-run site.yml")
    return out


def parse(text: str, source: str = str(PATH)) -> LimitsConfig:
    raw = _json.obj(text, source, "limits description")
    unknown = sorted(set(raw) - {"default", "max"})
    if unknown:
        raise HostStateError(f"{source}: unknown keys {', '.join(unknown)}; re-run site.yml")
    default = _table(raw.get("default"), "default", source, complete=True)
    mx = _table(raw.get("max", {}), "max", source, complete=False)
    for key, value in default.items():
        if key in mx and amount(key, value) > amount(key, mx[key]):
            raise HostStateError(f"{source}: default.{key} {value!r} is above max.{key} {mx[key]!r} "
                                 "(kooi_workflow_default_limits, kooi_workflow_max_limits); re-run site.yml")
    return LimitsConfig(default, mx, source)


def load(path: Path = PATH) -> LimitsConfig:
    """The host's limits; kooi's built-in defaults where the host has no description."""
    text = read(path)
    if text is None:
        return LimitsConfig(dict(BUILTIN), {}, f"kooi's built-in defaults ({path} is missing; re-run site.yml)")
    return parse(text, str(path))


def resolve(requested: dict[str, Any], cfg: LimitsConfig, where: str = "limits") -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """A run's limits: the workflow's REQUESTED (None: not named) or the host's default.
    Returns (values, origin per key: "workflow" or "default", errors for values above the
    host's maximum)."""
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    errors: list[str] = []
    for key in KEYS:
        v = requested.get(key)
        if v is None:
            values[key], origin[key] = cfg.default[key], "default"
            continue
        if key in cfg.max and amount(key, v) > amount(key, cfg.max[key]):
            errors.append(f"{where}.{key}: {v!r} is above this host's maximum {cfg.max[key]!r} "
                          f"({cfg.source}; kooi_workflow_max_limits)")
        values[key], origin[key] = v, "workflow"
    return values, origin, errors
