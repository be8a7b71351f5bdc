# The one parser of /etc/subuid and /etc/subgid, in kooi's host-state layer. Ansible's
# kooi_subids module uses this very file (roles/subids/module_utils/kooi_subids.py is a
# symlink to it), so it imports nothing but the standard library.
"""/etc/subuid and /etc/subgid: parse them and plan the entries of the users kooi manages.

Rules: every managed user ends with exactly one range of the requested size; ranges
never overlap each other, unmanaged entries or the ids of existing accounts; entries
of other users are preserved byte for byte and in place; an existing range that still
fits is kept (no churn); a conflict kooi must not resolve raises SubidError.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Mapping, Sequence
    from typing import Any

    # (line number, raw line, name or None for a comment/blank line, start, count)
    Line = tuple[int, str, str | None, int, int]
    # (start, count, name) of a range that is not free
    Taken = tuple[int, int, str]

SUB_ID_MIN = 100000
SUB_ID_MAX = 4294967294  # largest id a uid_map can name (2**32 - 2)
MIN_COUNT = 65536


class SubidError(Exception):
    pass


def parse(text: str, path: str = "subid file") -> list[Line]:
    """Return [(lineno, raw, name|None, start, count)]; None name for comments/blank."""
    out: list[Line] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            out.append((n, raw, None, 0, 0))
            continue
        parts = line.split(":")
        if len(parts) != 3 or not parts[0] or not parts[1].isdigit() or not parts[2].isdigit():
            raise SubidError(f"{path} line {n}: {raw!r} is not NAME:START:COUNT; fix or remove it")
        out.append((n, raw, parts[0], int(parts[1]), int(parts[2])))
    return out


def entries(text: str, path: str = "subid file") -> list[tuple[str, int, int]]:
    """(name, start, count) of every entry, in file order."""
    return [(name, start, count) for _, _, name, start, count in parse(text, path) if name is not None]


def ranges_of(text: str, user: str, path: str = "subid file") -> list[tuple[int, int]]:
    """USER's ranges as (first, last) ids, in file order."""
    return [(start, start + count - 1) for name, start, count in entries(text, path) if name == user]


def _overlaps(a_start: int, a_count: int, b_start: int, b_count: int) -> bool:
    return a_start < b_start + b_count and b_start < a_start + a_count


def _free(start: int, count: int, taken: Sequence[Taken], reserved: Collection[int]) -> bool:
    if start < SUB_ID_MIN or start + count - 1 > SUB_ID_MAX:
        return False
    if any(_overlaps(start, count, s, c) for s, c, _ in taken):
        return False
    return not any(start <= i < start + count for i in reserved)


def _allocate(count: int, taken: Sequence[Taken], reserved: Collection[int]) -> int:
    candidates = sorted({SUB_ID_MIN} | {s + c for s, c, _ in taken} | {i + 1 for i in reserved})
    for start in candidates:
        if _free(start, count, taken, reserved):
            return start
    raise SubidError(f"no free range of {count} ids between {SUB_ID_MIN} and {SUB_ID_MAX}")


def validate_users(users: Iterable[Mapping[str, Any]]) -> None:
    seen: set[str] = set()
    for u in users:
        name = u.get("name")
        if not name or ":" in name or "\n" in name:
            raise SubidError(f"invalid user name {name!r}")
        if name in seen:
            raise SubidError(f"user {name} is listed twice")
        seen.add(name)
        count = u.get("count", MIN_COUNT)
        if not isinstance(count, int) or count < MIN_COUNT:
            raise SubidError(f"user {name}: count {count!r} is below the minimum {MIN_COUNT}"
                             " (a container image needs 65536 ids)")
        start = u.get("start")
        if start is not None and (not isinstance(start, int) or start < SUB_ID_MIN):
            raise SubidError(f"user {name}: start {start!r} must be an integer >= {SUB_ID_MIN}")


def plan(text: str, users: Sequence[Mapping[str, Any]], reserved: Iterable[int] = (),
         path: str = "subid file") -> tuple[str, dict[str, tuple[int, int]]]:
    """Return (new_text, ranges) where ranges maps user -> (start, count)."""
    validate_users(users)
    entries = parse(text, path)
    reserved = set(reserved)
    managed = {u["name"]: u for u in users}
    taken = [(s, c, name) for _, _, name, s, c in entries if name is not None and name not in managed]
    existing: dict[str, list[tuple[int, int]]] = {}
    for _, _, name, s, c in entries:
        if name is not None and name in managed:
            existing.setdefault(name, []).append((s, c))

    ranges: dict[str, tuple[int, int]] = {}
    # Explicit starts first: they are the operator's word and must not be moved.
    for u in sorted(users, key=lambda u: u.get("start") is None):
        name, count = u["name"], u.get("count", MIN_COUNT)
        if u.get("start") is not None:
            start = u["start"]
            for s, c, other in taken:
                if _overlaps(start, count, s, c):
                    what = "unmanaged entry" if other not in managed else "managed user"
                    raise SubidError(f"{path}: the range {start}:{count} requested for {name} "
                                     f"overlaps the {what} {other}:{s}:{c}; choose another start "
                                     "or remove that entry")
            hit = sorted(i for i in reserved if start <= i < start + count)
            if hit:
                raise SubidError(f"{path}: the range {start}:{count} requested for {name} contains"
                                 f" the id {hit[0]} of an existing account; choose another start")
        else:
            start = None
            for s, _c in existing.get(name, []):
                if _free(s, count, taken, reserved):
                    start = s
                    break
            if start is None:
                start = _allocate(count, taken, reserved)
        ranges[name] = (start, count)
        taken.append((start, count, name))

    lines, written = [], set()
    for _, raw, name, _s, _c in entries:
        if name is None or name not in managed:
            lines.append(raw)
        elif name not in written:
            s, c = ranges[name]
            lines.append(f"{name}:{s}:{c}")
            written.add(name)
    for u in users:
        if u["name"] not in written:
            s, c = ranges[u["name"]]
            lines.append(f"{u['name']}:{s}:{c}")
    return ("\n".join(lines) + "\n") if lines else "", ranges
