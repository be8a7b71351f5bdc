"""The host description that the Ansible roles write to /etc/kooi/engine.json.

It is root-owned and read-only for everyone else: the shim and the checks trust it
because a workload cannot change it. Everything here is derived from the inventory.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_PATH = Path(os.environ.get("KOOI_ENGINE_CONFIG", "/etc/kooi/engine.json"))
ENGINE_MODES = ("rootless", "userns_remap")


class ConfigError(Exception):
    """The host description is missing or malformed; the message says what to do."""


@dataclass(frozen=True)
class EngineConfig:
    mode: str
    runner_user: str
    runner_uid: int
    runner_gid: int
    runner_home: str
    socket: str
    daemon_config: str
    launcher: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    storage_driver: str = ""
    systemd_unit: str = ""
    log_file: str = ""
    managed_files: list[str] = field(default_factory=list)
    socket_group: str = ""
    remap_user: str = ""
    # roles/authz: {"plugin", "socket", "token_file", "unit"} when the daemon is guarded.
    authz: dict = field(default_factory=dict)

    @property
    def runtime_dir(self) -> str:
        return f"/run/user/{self.runner_uid}"


def load(path: Path | str = DEFAULT_PATH) -> EngineConfig:
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"{path} not found: this host has not been provisioned by kooi; "
            "run ansible-playbook site.yml against it first"
        ) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the host description: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    known = set(EngineConfig.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown keys {', '.join(unknown)}; re-run site.yml")
    required = ("mode", "runner_user", "runner_uid", "runner_gid", "runner_home", "socket",
                "daemon_config")
    missing = [k for k in required if k not in raw]
    if missing:
        raise ConfigError(f"{path}: missing keys {', '.join(missing)}; re-run site.yml")
    if raw["mode"] not in ENGINE_MODES:
        raise ConfigError(f"{path}: mode {raw['mode']!r} is not one of {', '.join(ENGINE_MODES)}")
    try:
        for key in ("runner_uid", "runner_gid"):
            raw[key] = int(raw[key])
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: {key} must be an integer; re-run site.yml") from None
    return EngineConfig(**raw)
