"""Route tables: (method, path pattern) -> what to do, first match wins.

A pattern is a path template:
- `/containers/create`: exactly this path;
- `/containers/{id}/exec`: `{id}` is one path segment, captured as `id`;
- `/{containers|networks}/prune`: one segment, one of the alternatives;
- `/plugins/**`: this path and everything below it (`/plugins`, `/plugins/x/enable`).
Paths are matched as given (already normalised by the caller: no query, no empty or
dot segments, no trailing slash).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

ANY: tuple[str, ...] = ()  # every method
GET: tuple[str, ...] = ("GET",)
READ: tuple[str, ...] = ("GET", "HEAD")
POST: tuple[str, ...] = ("POST",)
DELETE: tuple[str, ...] = ("DELETE",)

_PART = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}|\{([^{}/]+(?:\|[^{}/]+)+)\}")


def compile_path(template: str) -> re.Pattern[str]:
    """The regex of a path template (see the module's doc)."""
    if not template.startswith("/"):
        raise ValueError(f"path template {template!r} does not start with /")
    rest = ""
    if template.endswith("/**"):
        template, rest = template[:-3], r"(?:/.*)?"
    out: list[str] = []
    literals: list[str] = []
    pos = 0
    for m in _PART.finditer(template):
        literals.append(template[pos:m.start()])
        out.append(re.escape(literals[-1]))
        if m.group(1):
            out.append(f"(?P<{m.group(1)}>[^/]+)")
        else:
            out.append("(?:" + "|".join(re.escape(a) for a in m.group(2).split("|")) + ")")
        pos = m.end()
    literals.append(template[pos:])
    out.append(re.escape(literals[-1]))
    if any(c in lit for lit in literals for c in "{}*"):
        raise ValueError(f"path template {template!r}: unsupported pattern")
    return re.compile("".join(out) + rest, re.DOTALL)


R = TypeVar("R")


@dataclass(frozen=True)
class Match(Generic[R]):
    """The first route that matched, and what its pattern captured."""

    route: R
    params: dict[str, str] = field(default_factory=dict)


class Table(Generic[R]):
    """Routes in order; `match` gives the first whose methods and pattern fit."""

    def __init__(self, routes: Iterable[R], methods: Callable[[R], tuple[str, ...]],
                 path: Callable[[R], str]) -> None:
        self.routes = tuple(routes)
        self._compiled = [(frozenset(methods(r)), compile_path(path(r)), r) for r in self.routes]

    def match(self, method: str, path: str) -> Match[R] | None:
        method = method.upper()
        for methods, pattern, route in self._compiled:
            if methods and method not in methods:
                continue
            if m := pattern.fullmatch(path):
                return Match(route, {k: v for k, v in m.groupdict().items() if v is not None})
        return None
