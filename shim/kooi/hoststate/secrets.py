"""/etc/kooi/secrets.json: which secrets the host holds and how each reaches a workload
(roles/secrets). Names and routes only, never a value: the values live in the
root-only store (/etc/kooi/secrets/NAME, directory 0700, files 0600), and only the
injector reads them, as root, before it drops to its own user.

Two ways to a workload:
- inject (the default, for HTTP credentials): the workload gets a per-run placeholder
  in ENV and the injector's address in BASE_URL_ENV; the injector forwards requests
  that carry the placeholder to UPSTREAM (only METHODS on PATHS), replacing whatever
  credential the request carried with the real one in HEADER.
- environment (weaker, explicit): the value itself in ENV; every process of the
  workload can read it.

A secret holds one value for the host (store file NAME), or one per person (PERSONS:
store files NAME@PERSON), e.g. each participant's own Claude subscription token
(`claude setup-token`): only a session, which belongs to a person, can use it, and it
gets that person's value.

The file is missing where the operator provisioned no secrets; then workflows that
name secrets are refused.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _json, paths, read
from .errors import HostStateError

PATH = Path(os.environ.get("KOOI_SECRETS_CONFIG", paths.SECRETS))
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}\Z")
PERSON_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}\Z")  # kooi.workflow.NAME_RE: persons are named alike
ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
HEADER_RE = re.compile(r"^[A-Za-z0-9-]{1,64}\Z")
UPSTREAM_RE = re.compile(r"^https://([A-Za-z0-9.-]+)(?::([0-9]{1,5}))?\Z")
QUERY_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}=(\*|[A-Za-z0-9_.:-]{0,128})")
MODES = ("inject", "environment")
# What the injector checks in a request body before it forwards it (injectbody.body_refusal):
# none, or the Anthropic Messages API's (no MCP connector, no server-side tools but
# those the route's server_tools names).
BODIES = ("", "anthropic-messages")


@dataclass(frozen=True)
class SecretDef:
    mode: str
    env: str
    base_url_env: str = ""
    upstream: str = ""
    ca_file: str = ""
    header: str = "x-api-key"
    scheme: str = ""
    paths: tuple[str, ...] = ()
    methods: tuple[str, ...] = ("POST",)
    body: str = ""
    server_tools: tuple[str, ...] = ()
    query: tuple[str, ...] = ()
    persons: tuple[str, ...] = ()
    name: str = ""

    @property
    def upstream_host(self) -> str:
        m = UPSTREAM_RE.match(self.upstream)
        return m.group(1) if m else ""

    @property
    def upstream_port(self) -> int:
        m = UPSTREAM_RE.match(self.upstream)
        return int(m.group(2) or 443) if m else 443

    def allows(self, method: str, path: str) -> bool:
        """METHOD on PATH (without its query) is one this secret may be used for: a
        listed path exactly, or one below a listed `PREFIX/*`; never a path with a dot
        segment, an empty segment, a percent-encoding, a backslash or a semicolon (an
        upstream that normalises any of them could route elsewhere)."""
        if method not in self.methods or any(c in path for c in "%\\;") or "//" in path:
            return False
        if any(seg in (".", "..") for seg in path.split("/")):
            return False
        return any(path == p or p.endswith("/*") and path.startswith(p[:-1]) and len(path) > len(p) - 1
                   for p in self.paths)

    def allows_query(self, query: str) -> bool:
        """QUERY (after the `?`, possibly empty) holds only pairs the route's `query`
        lists (`KEY=VALUE` exactly, or `KEY=*`: any value), each key once, nothing
        encoded: an upstream's parser must not read another request than kooi's."""
        if not query:
            return True
        pairs = query.split("&")
        keys = [p.partition("=")[0] for p in pairs]
        if len(set(keys)) != len(keys) or any(c in query for c in "%+#;\\"):
            return False
        return all(p in self.query or (p.partition("=")[1] and f"{p.partition('=')[0]}=*" in self.query)
                   for p in pairs)


@dataclass(frozen=True)
class InjectorConfig:
    port: int
    listen: str = "127.0.0.1"
    user: str = "kooi-inject"
    control: str = paths.INJECT_CONTROL
    control_group: int = 0
    access_log: str = f"{paths.INJECT_LOG_DIR}/access.log"
    pid_file: str = f"{paths.INJECT_RUN_DIR}/injector.pid"
    systemd_unit: str = ""


@dataclass(frozen=True)
class SecretsConfig:
    injector: InjectorConfig
    store: str = paths.SECRETS_DIR
    secrets: dict[str, SecretDef] = field(default_factory=dict)

    @property
    def injected(self) -> dict[str, SecretDef]:
        return {n: s for n, s in self.secrets.items() if s.mode == "inject"}


def _secret(name: str, raw: Any, source: str) -> SecretDef:
    where = f"{source}: secrets.{name}"
    if not NAME_RE.match(name):
        raise HostStateError(f"{where}: not a secret name (lower-case letters, digits, _ -); re-run site.yml")
    if not isinstance(raw, dict):
        raise HostStateError(f"{where} must be a JSON object; re-run site.yml")
    s = _json.build(SecretDef, {**raw, "name": name}, where)
    bad = []
    if s.mode not in MODES:
        bad.append(f"mode {s.mode!r} is not one of {', '.join(MODES)}")
    if not ENV_RE.match(s.env):
        bad.append(f"env {s.env!r} is not an environment variable name")
    if s.mode == "inject":
        if not UPSTREAM_RE.match(s.upstream):
            bad.append(f"upstream {s.upstream!r} is not https://HOST[:PORT]")
        if not HEADER_RE.match(s.header):
            bad.append(f"header {s.header!r} is not a header name")
        if not s.paths or not all(p.startswith("/") for p in s.paths):
            bad.append("paths must name at least one absolute path")
        if s.body not in BODIES:
            bad.append(f"body {s.body!r} is not one of: {', '.join(repr(b) for b in BODIES)}")
        if not all(re.fullmatch(r"[a-z][a-z0-9_]{0,63}", t) for t in s.server_tools):
            bad.append("server_tools must name tool types (web_search, web_fetch, code_execution, mcp, ...)")
        if not all(isinstance(q, str) and QUERY_RE.fullmatch(q) for q in s.query):
            bad.append("query must list KEY=VALUE or KEY=* pairs (letters, digits, _ . - :)")
        if s.base_url_env and not ENV_RE.match(s.base_url_env):
            bad.append(f"base_url_env {s.base_url_env!r} is not an environment variable name")
    if not all(isinstance(p, str) and PERSON_RE.match(p) for p in s.persons) or len(set(s.persons)) != len(s.persons):
        bad.append("persons must name each person once (lower-case letters, digits, . _ -)")
    if bad:
        raise HostStateError(f"{where}: {'; '.join(bad)}; re-run site.yml")
    return s


def parse(text: str, source: str = str(PATH)) -> SecretsConfig:
    raw = _json.obj(text, source, "secrets description")
    unknown = sorted(set(raw) - {"injector", "store", "secrets"})
    if unknown:
        raise HostStateError(f"{source}: unknown keys {', '.join(unknown)}; re-run site.yml")
    inj = raw.get("injector")
    if not isinstance(inj, dict):
        raise HostStateError(f"{source}: injector must be a JSON object; re-run site.yml")
    sec = raw.get("secrets", {})
    if not isinstance(sec, dict):
        raise HostStateError(f"{source}: secrets must be a JSON object; re-run site.yml")
    store = raw.get("store", paths.SECRETS_DIR)
    if not isinstance(store, str):
        raise HostStateError(f"{source}: store must be a string; re-run site.yml")
    return SecretsConfig(injector=_json.build(InjectorConfig, inj, f"{source}: injector"), store=store,
                         secrets={n: _secret(n, v, source) for n, v in sorted(sec.items())})


def load(path: Path | str = PATH) -> SecretsConfig | None:
    """The host's secrets description; None where the operator provisioned none."""
    path = Path(path)
    text = read(path)
    return None if text is None else parse(text, str(path))


def value_keys(s: SecretDef) -> list[str]:
    """The store's file names of secret S's values: NAME, or NAME@PERSON for each person."""
    return [f"{s.name}@{p}" for p in s.persons] if s.persons else [s.name]


def value_key(s: SecretDef, person: str | None) -> str:
    """Which of S's values a run of PERSON (None: not a session) gets; raises
    HostStateError where it has none."""
    if not s.persons:
        return s.name
    if not person:
        raise HostStateError(f"secret {s.name!r} holds one value per person (kooi_secrets.{s.name}.persons): only "
                             "a session, which belongs to a person, can use it (kooi session start --person)")
    if person not in s.persons:
        raise HostStateError(f"secret {s.name!r} holds no value for person {person!r} (it has: "
                             f"{', '.join(s.persons)}); add theirs to kooi_secrets.{s.name}.persons and re-run "
                             "site.yml")
    return f"{s.name}@{person}"


def value_path(cfg: SecretsConfig, key: str) -> Path:
    return Path(cfg.store) / key
