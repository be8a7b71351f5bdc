#!/usr/bin/env python3
"""Extract a compact description of a Docker Engine API specification (Swagger 2.0).

Source of tests/data/engine-api-1.41.json and tests/data/engine-api-1.45.json, which the
policy coverage test reads to check that kooi's request policy has a verdict for every
endpoint and every request-body field.

Input: the moby/moby repository (https://github.com/moby/moby), files api/docs/v1.41.yaml
(API 1.41, docker.io 20.10) and api/docs/v1.45.yaml (API 1.45, docker 26.1), read at commit
b985e2313a8676e18072b442911fc8f64f17d440 (both files last changed in 2339385bba5df8855e209a77c34008ea16d9f4ba).
(They used to live in docs/api/; that directory now only holds a README pointing to api/docs/.)

Rerun (stdlib + PyYAML only):

    git -C MOBY show REV:api/docs/v1.41.yaml > /tmp/v1.41.yaml
    python3 scripts/engine-api-extract.py /tmp/v1.41.yaml > tests/data/engine-api-1.41.json

Output (JSON, indent=1, sorted keys):

- "version": info.version of the spec, e.g. "1.41".
- "endpoints": every path+method of "paths", sorted by path then method, as
  {"method", "path", "operationId", "body"}; "body" is the operationId when the request body
  (the `in: body` parameter) is JSON (an object, or an array as for PluginPull/PluginSet),
  "binary" for tar/raw bodies (type string), and null when there is no body parameter.
- "bodies": operationId -> {field path: type} with $refs resolved and allOf merged. Paths:
  "Field", "Parent.Child" (object), "Parent[].Child" (array items), "Parent{}.Child" (map values,
  i.e. additionalProperties). A top-level array body has "[]" (its item type) and "[].Child".
  Otherwise an element of an array or map gets its own entry ("X[]", "X{}") only if it is itself
  an array or map (Env is just "array", Labels just "map"). Types:
  string, integer, number, boolean, object, array, map, any (no type given).
- "truncated": body field paths whose children were not expanded because of the depth limit
  (6 nesting levels) or a $ref cycle; empty when nothing was cut.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml

MAX_DEPTH = 6
METHODS = ("get", "put", "post", "delete", "options", "head", "patch")
SCALARS = ("string", "integer", "number", "boolean")


class Spec:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.truncated: set[str] = set()

    def ref(self, ref: str) -> dict[str, Any]:
        if not ref.startswith("#/"):
            raise ValueError(f"external $ref not supported: {ref}")
        node: Any = self.doc
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def resolve(self, schema: dict[str, Any], seen: frozenset[str]) -> tuple[dict[str, Any], frozenset[str]]:
        """Follow $ref and merge allOf; returns the flattened schema and the refs passed through."""
        while "$ref" in schema:
            ref = schema["$ref"]
            if ref in seen:
                return {"x-cycle": ref}, seen
            seen = seen | {ref}
            schema = self.ref(ref)
        if "allOf" not in schema:
            return schema, seen
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        props: dict[str, Any] = dict(merged.get("properties") or {})
        for part in schema["allOf"]:
            sub, seen_sub = self.resolve(part, seen)
            if "x-cycle" in sub:
                merged["x-cycle"] = sub["x-cycle"]
                continue
            for key, value in sub.items():
                if key == "properties":
                    for name, prop in (value or {}).items():
                        # keep the ref trail of the component that defined the property
                        props[name] = {"x-seen": seen_sub, **prop} if "$ref" in prop else prop
                elif key not in merged:
                    merged[key] = value
        if props:
            merged["properties"] = props
        return merged, seen

    @staticmethod
    def type_of(schema: dict[str, Any]) -> str:
        kind = schema.get("type")
        if kind in SCALARS:
            return kind
        if kind == "array" or "items" in schema:
            return "array"
        if isinstance(schema.get("additionalProperties"), dict) and not schema.get("properties"):
            return "map"
        if kind == "object" or schema.get("properties"):
            return "object"
        return "any"

    def walk(self, schema: dict[str, Any], path: str, depth: int, seen: frozenset[str], out: dict[str, str]) -> None:
        """Record the children of `schema` (already resolved), found at `path`, into `out`."""
        if "x-cycle" in schema:
            self.truncated.add(path or "(body)")
            return
        kind = self.type_of(schema)
        if kind == "object":
            props = schema.get("properties") or {}
            if props and depth >= MAX_DEPTH:
                self.truncated.add(path)
                return
            for name, prop in props.items():
                sub_seen = prop.get("x-seen", seen)
                child, child_seen = self.resolve(prop, sub_seen)
                child_path = f"{path}.{name}" if path else name
                out[child_path] = "any" if "x-cycle" in child else self.type_of(child)
                self.walk(child, child_path, depth + 1, child_seen, out)
            extra = schema.get("additionalProperties")
            if props and isinstance(extra, dict):
                self.element(extra, path + "{}", depth, seen, out)
        elif kind == "array":
            self.element(schema.get("items") or {}, path + "[]", depth, seen, out)
        elif kind == "map":
            self.element(schema["additionalProperties"], path + "{}", depth, seen, out)

    def element(self, schema: dict[str, Any], path: str, depth: int, seen: frozenset[str], out: dict[str, str]) -> None:
        child, child_seen = self.resolve(schema, seen)
        kind = self.type_of(child)
        if kind in ("array", "map"):
            out[path] = kind
        self.walk(child, path, depth, child_seen, out)


def extract(doc: dict[str, Any]) -> dict[str, Any]:
    spec = Spec(doc)
    endpoints: list[dict[str, Any]] = []
    bodies: dict[str, dict[str, str]] = {}
    for path, item in doc["paths"].items():
        shared = item.get("parameters") or []
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            op_id = op.get("operationId") or f"{method.upper()} {path}"
            body = None
            for param in [*shared, *(op.get("parameters") or [])]:
                param, _ = spec.resolve(param, frozenset())
                if param.get("in") != "body":
                    continue
                schema, seen = spec.resolve(param.get("schema") or {}, frozenset())
                kind = spec.type_of(schema)
                if kind in ("object", "array", "map"):
                    body = op_id
                    fields: dict[str, str] = {}
                    spec.walk(schema, "", 0, seen, fields)
                    if kind != "object":  # top-level array or map: always name its element
                        element, _ = spec.resolve(schema.get("items") or schema.get("additionalProperties") or {}, seen)
                        fields["[]" if kind == "array" else "{}"] = spec.type_of(element)
                    bodies[op_id] = fields
                else:
                    body = "binary"
            endpoints.append({"method": method.upper(), "path": path, "operationId": op_id, "body": body})
    endpoints.sort(key=lambda e: (e["path"], e["method"]))
    return {
        "version": str(doc["info"]["version"]),
        "endpoints": endpoints,
        "bodies": bodies,
        "truncated": sorted(spec.truncated),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} SPEC.yaml > tests/data/engine-api-X.json", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    json.dump(extract(doc), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
