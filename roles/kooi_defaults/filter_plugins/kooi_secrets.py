"""`kooi_secrets_description(secrets, presets, injector)`: the secrets description
(/etc/kooi/secrets.json: names and routes, never a value) that kooi_secrets stands for,
checked by the shim's own parser (kooi.hoststate.secrets).

Each entry of kooi_secrets is a mapping with `value` (from Ansible Vault), or
`persons` (person name to that person's own value, e.g. each participant's
`claude setup-token` token; only their sessions get it), and either a `preset` from
kooi_secrets_preset_map or its own route (mode, env, base_url_env, upstream, ca_file,
header, scheme, paths, query, methods, body, server_tools); its own keys override the preset's.

`kooi_secrets_values(secrets)`: the store's files, [{key, value}], key NAME or
NAME@PERSON (kooi.hoststate.secrets.value_keys).
Errors name the secret and the key, never the value. Runs on the controller."""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # used without Ansible (unit tests)
    class AnsibleFilterError(Exception):  # type: ignore[no-redef]
        pass

_SHIM = Path(__file__).resolve().parents[3] / "shim"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}\Z")
PERSON_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}\Z")
ROUTE_KEYS = ("mode", "env", "base_url_env", "upstream", "ca_file", "header", "scheme", "paths", "query", "methods",
              "body", "server_tools")


def _hoststate():
    if (_SHIM / "kooi" / "hoststate").is_dir() and str(_SHIM) not in sys.path:
        sys.path.insert(0, str(_SHIM))
    return importlib.import_module("kooi.hoststate.secrets")


def _one_line(value, where):
    if not isinstance(value, str) or not value.strip() or "\n" in value.strip() or "\r" in value.strip():
        raise AnsibleFilterError(f"{where}: must be a non-empty one-line string (from Ansible Vault)")


def kooi_secrets_values(secrets):
    """The store's files of SECRETS (checked by kooi_secrets_description first)."""
    out = []
    for name, entry in sorted((secrets or {}).items()):
        if "persons" in entry:
            out += [{"key": f"{name}@{p}", "value": v.strip()} for p, v in sorted(entry["persons"].items())]
        else:
            out.append({"key": name, "value": entry["value"].strip()})
    return out


def kooi_secrets_description(secrets, presets, injector):
    if not isinstance(secrets, dict):
        raise AnsibleFilterError("kooi_secrets: a mapping of secret name to {value, preset or route}")
    presets = presets or {}
    out = {}
    for name, entry in secrets.items():
        where = f"kooi_secrets.{name}"
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise AnsibleFilterError(f"kooi_secrets: {name!r} is not a secret name (lower-case letters, digits, _ -)")
        if not isinstance(entry, dict):
            raise AnsibleFilterError(f"{where}: a mapping with value and preset (or a route), got "
                                     f"{type(entry).__name__}")
        unknown = sorted(set(entry) - {"value", "persons", "preset", *ROUTE_KEYS})
        if unknown:
            raise AnsibleFilterError(f"{where}: unknown key(s) {', '.join(unknown)} (allowed: value or persons, "
                                     f"preset, {', '.join(ROUTE_KEYS)})")
        route = {}
        if ("value" in entry) == ("persons" in entry):
            raise AnsibleFilterError(f"{where}: give either value (one for the host) or persons (one per person)")
        if "persons" in entry:
            if not isinstance(entry["persons"], dict) or not entry["persons"]:
                raise AnsibleFilterError(f"{where}.persons: a mapping of person name to that person's value")
            for person, value in entry["persons"].items():
                if not isinstance(person, str) or not PERSON_RE.match(person):
                    raise AnsibleFilterError(f"{where}.persons: {person!r} is not a person's name (lower-case "
                                             "letters, digits, . _ -)")
                _one_line(value, f"{where}.persons.{person}")
            route["persons"] = sorted(entry["persons"])
        else:
            _one_line(entry["value"], f"{where}.value")
        if "preset" in entry:
            if entry["preset"] not in presets:
                raise AnsibleFilterError(f"{where}.preset: {entry['preset']!r} is not in kooi_secrets_preset_map "
                                         f"(known: {', '.join(sorted(presets))})")
            route.update(presets[entry["preset"]])
        route.update({k: v for k, v in entry.items() if k in ROUTE_KEYS})
        route.setdefault("mode", "inject")
        if "env" not in route:
            raise AnsibleFilterError(f"{where}: name the variable the workload gets (env) or a preset")
        for k in ("paths", "query", "methods", "server_tools"):
            if k in route and not isinstance(route[k], list):
                raise AnsibleFilterError(f"{where}.{k}: a list")
        out[name] = route
    doc = {"injector": dict(injector), "secrets": out}
    text = json.dumps(doc, indent=2, sort_keys=True)
    try:
        _hoststate().parse(text, source="kooi_secrets")
    except Exception as exc:  # noqa: BLE001 - HostStateError; anything else is a bug, shown as is
        raise AnsibleFilterError(str(exc).replace("; re-run site.yml", "")) from None
    return doc


class FilterModule:
    def filters(self):
        return {"kooi_secrets_description": kooi_secrets_description, "kooi_secrets_values": kooi_secrets_values}
