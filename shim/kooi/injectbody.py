"""What the injector reads of a request body before it forwards it: the check against
what the operator allowed (kooi.hoststate.secrets BODY_CHECKS) and what parsing it
costs in memory (kooi.injectproxy charges it before it parses)."""

from __future__ import annotations

import json
import re
from typing import Any

from .hoststate.secrets import SecretDef

# What parsing a body costs beyond its bytes, per JSON separator or bracket (the objects
# it makes; review 28: 64 was half of what a key and its value make).
PARSE_COST = 160
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abAB]")
# Anthropic-defined tools the client runs (the API only describes them to the model);
# every other typed tool runs on the API's side, reaching hosts the request names.
CLIENT_TOOL_TYPES = ("custom", "bash_", "text_editor_", "computer_", "memory_")


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for k, v in pairs:
        if k in seen:
            raise _Duplicate(k)
        seen[k] = v
    return seen


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def body_refusal(sdef: SecretDef, body: bytes | bytearray) -> tuple[int, str] | None:
    """Why the route SDEF does not forward BODY (status, message), or None. With body
    anthropic-messages: a JSON object (no key twice anywhere: the API's parser and
    this one must not see different requests) without the MCP connector
    (mcp_servers), without server-side tools (web fetch and search, code
    execution, any typed tool but the client's own) and without content the API
    fetches from a URL (image and document blocks with a url source), unless
    server_tools names them (mcp, a tool's type, url_sources)."""
    if sdef.body != "anthropic-messages":
        return None
    try:
        doc = json.loads(body.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _Duplicate as exc:
        return 400, f"the request body names {str(exc)[:80]!r} twice in one object"
    except (ValueError, UnicodeDecodeError):
        return 400, "the request body is not JSON (UTF-8)"
    except RecursionError:  # review 25: the connection dropped, the refusal in no record
        return 400, "the request body nests deeper than the injector reads"
    if not isinstance(doc, dict):
        return 400, "the request body is not a JSON object"
    if doc.get("mcp_servers") and "mcp" not in sdef.server_tools:
        return 403, (f"mcp_servers is not allowed for secret {sdef.name} (the API's MCP connector reaches the "
                     "servers the request names); the operator allows it with server_tools: [mcp]")
    tools = doc.get("tools") or []
    if not isinstance(tools, list):
        return 400, "tools is not a list"
    for t in tools:
        if not isinstance(t, dict):
            return 400, "a tool is not a JSON object"
        kind = t.get("type")
        if kind is None or isinstance(kind, str) and (kind == "custom" or kind.startswith(CLIENT_TOOL_TYPES[1:])):
            continue
        if not isinstance(kind, str):
            return 400, "a tool's type is not a string"
        if any(kind == a or kind.startswith(a + "_") for a in sdef.server_tools):
            continue
        return 403, (f"the server tool {kind[:80]} is not allowed for secret {sdef.name} (the API runs it, reaching "
                     "hosts the request names); the operator allows it with server_tools")
    if "url_sources" not in sdef.server_tools and (where := _url_source(doc)):
        return 403, (f"a content block with a URL source ({where}) is not allowed for secret {sdef.name} (the API "
                     "fetches the URL, a host the request names); the operator allows it with server_tools: "
                     "[url_sources]")
    return None


def _url_source(node: Any, depth: int = 0) -> str:
    """Where NODE holds a content block the API fetches from a URL itself (an image or
    document whose source is {"type": "url"}; review 14): its type, or ""."""
    if depth > 64:
        return "nesting"
    if isinstance(node, dict):
        src = node.get("source")
        if isinstance(src, dict) and src.get("type") == "url":
            return str(node.get("type", "a block"))[:40]
        return next((w for v in node.values() if (w := _url_source(v, depth + 1))), "")
    if isinstance(node, list):
        return next((w for v in node if (w := _url_source(v, depth + 1))), "")
    return ""


def parse_cost(body: bytes | bytearray) -> int:
    """About what parsing BODY makes besides the body itself: the decoded text and the
    strings parsed from it (1, 2 or 4 bytes a character: review 27, one character
    past the BMP made a 32 MiB ASCII body hold 288 MiB) and PARSE_COST per JSON
    separator or bracket (the objects)."""
    if max(body, default=0) >= 0xF0 or SURROGATE_ESCAPE.search(body):
        width = 4
    elif not body.isascii() or b"\\u" in body:
        width = 2
    else:
        width = 1
    return 2 * width * len(body) + PARSE_COST * sum(body.count(c) for c in (b",", b":", b"{", b"["))
