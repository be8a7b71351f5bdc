"""JSON bodies read the way the engine reads them (Go's encoding/json).

A Go struct field is filled from the JSON key that matches its name case-insensitively
(`privileged` fills `Privileged`); a map key (Labels, EndpointsConfig) is matched
exactly. A duplicate key replaces scalars and lists but *merges* objects, so a body
with a duplicate key (compared case-insensitively) is not read at all: `parse`
reports it. Documents are plain dicts and lists; `field` and `set_field` read and write
a struct field the way the engine would, keeping the key as the client spelled it.

The request policy and the broker read bodies through this module only, so that what
they read is what the engine reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from typing import Any


class DuplicateKey(ValueError):
    pass


# Go matches a key to a field name with Unicode simple case folding (bytes.EqualFold's
# orbits), under which two non-ASCII letters equal ASCII ones: U+017F LATIN SMALL LETTER
# LONG S is an `s` and U+212A KELVIN SIGN a `k`. Measured with encoding/json (Go 1.19, the
# engine's, and 1.26): `{"HoſtConfig": ...}` fills HostConfig and `"Linkſ"` fills Links;
# no other rune below U+20000 stands in for an ASCII letter of a field name.
_GO_ASCII_FOLDS = str.maketrans({"\u017f": "s", "\u212a": "k"})


def fold(name: str) -> str:
    """The form under which the engine matches NAME to a struct field."""
    return name.translate(_GO_ASCII_FOLDS).lower()


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for k, _ in pairs:
        if fold(k) in seen:
            raise DuplicateKey(k)
        seen.add(fold(k))
    return dict(pairs)


def parse(body: bytes) -> dict[str, Any] | str:
    """BODY as a JSON object, or why it cannot be read."""
    try:
        doc = json.loads(body, object_pairs_hook=_object)
    except DuplicateKey as exc:
        return f"duplicate key {str(exc)!r} (compared case-insensitively; Docker would merge them)"
    except (ValueError, UnicodeDecodeError, RecursionError):
        return "body is not a JSON object"
    return doc if isinstance(doc, dict) else "body is not a JSON object"


def field_key(doc: Mapping[str, Any], name: str) -> str | None:
    """The key of DOC that the engine reads as the field NAME."""
    want = fold(name)
    for k in doc:
        if fold(k) == want:
            return k
    return None


def field(doc: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """The value of the field NAME of DOC (DEFAULT if absent)."""
    k = field_key(doc, name)
    return doc[k] if k is not None else default


def set_field(doc: MutableMapping[str, Any], name: str, value: Any) -> None:
    """Set the field NAME of DOC, under the key the client used for it if any."""
    doc[field_key(doc, name) or name] = value
