"""Shared strict reading of a JSON object into a frozen dataclass."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, TypeVar

from .errors import HostStateError

T = TypeVar("T")


def obj(text: str, source: str, what: str) -> dict[str, Any]:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HostStateError(f"{source}: cannot read the {what}: {exc}; re-run site.yml") from None
    if not isinstance(raw, dict):
        raise HostStateError(f"{source}: the {what} must be a JSON object; re-run site.yml")
    return raw


def build(cls: type[T], raw: dict[str, Any], source: str, *, strict: bool = True) -> T:
    """CLS(**RAW) with the field types checked: unknown keys (when STRICT), missing
    required keys and wrongly typed values are errors that name the key."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(fields))
    if unknown and strict:
        raise HostStateError(f"{source}: unknown keys {', '.join(unknown)}; re-run site.yml")
    missing = [n for n, f in fields.items() if n not in raw
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise HostStateError(f"{source}: missing keys {', '.join(missing)}; re-run site.yml")
    kw: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in fields:
            continue
        kw[name] = _typed(value, str(fields[name].type), f"{source}: {name}")
    return cls(**kw)


def _typed(value: Any, hint: str, where: str) -> Any:
    """Check VALUE against the (string) annotation HINT of the simple kinds used here."""
    hint = hint.replace(" ", "")
    optional = hint.endswith("|None")
    if optional:
        if value is None:
            return None
        hint = hint[: -len("|None")]
    if hint == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            # The roles' templates have written ids as strings; accept digits only.
            if isinstance(value, str) and value.isdigit():
                return int(value)
            raise HostStateError(f"{where} must be an integer; re-run site.yml")
        return value
    if hint == "bool":
        if not isinstance(value, bool):
            raise HostStateError(f"{where} must be true or false; re-run site.yml")
        return value
    if hint == "str":
        if not isinstance(value, str):
            raise HostStateError(f"{where} must be a string; re-run site.yml")
        return value
    if hint.startswith("tuple[str"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise HostStateError(f"{where} must be a list of strings; re-run site.yml")
        return tuple(value)
    if hint.startswith("dict[str,str]"):
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise HostStateError(f"{where} must be an object of strings; re-run site.yml")
        return dict(value)
    raise AssertionError(f"unsupported field type {hint}")  # a schema bug, not bad input
