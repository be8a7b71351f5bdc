"""/etc/kooi/egress.json: the host's egress control (roles/egress).

Where the proxy listens, the nftables table that confines the runner and its
subordinate uids, and the files of both. The role removes the file when the operator
turns egress off (kooi_egress_enabled=false), and records that intent in engine.json
(`egress`): a missing file where the intent is "on" is an error, not "no egress".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from . import _json, paths, read
from .engine import EngineConfig
from .errors import HostStateError

PATH = Path(os.environ.get("KOOI_EGRESS_CONFIG", paths.EGRESS))


@dataclass(frozen=True)
class EgressConfig:
    port: int
    listen: str = "127.0.0.1"
    table: str = "kooi_egress"
    rules_file: str = "/etc/kooi/egress/egress.nft"
    squid_config: str = "/etc/kooi/egress/squid.conf"
    allowlist: str = "/etc/kooi/egress/allow.txt"
    access_log: str = "/var/log/kooi/egress/access.log"
    pid_file: str = "/run/kooi-egress/squid.pid"
    systemd_unit: str = ""
    enabled: bool = True
    # Per-run ports (a run holds one while it lasts) and the log of their requests,
    # readable by the runner's group: how a run finds its own refusals.
    run_port_first: int = 0
    run_port_count: int = 0
    run_log: str = ""
    # userns-remap: the host's rules give a run's bridges (kp<port>n<0..N-1>) its own
    # port only (kooi.run.runnet); 0: they do not (rootless, or rules of an older role).
    run_bridges: int = 0


def parse(text: str, source: str = str(PATH)) -> EgressConfig:
    return _json.build(EgressConfig, _json.obj(text, source, "egress description"), source)


def load(path: Path | str = PATH) -> EgressConfig | None:
    """The host's egress description; None where there is none (or it is disabled)."""
    path = Path(path)
    text = read(path)
    if text is None:
        return None
    cfg = parse(text, str(path))
    return cfg if cfg.enabled else None


def missing_message(path: Path | str = PATH) -> str:
    return (f"egress control is on for this host (kooi_egress_enabled, recorded in {PATH.parent}/engine.json) "
            f"but {path} is missing: the egress role's work is gone; re-run site.yml")


def load_for(engine: EngineConfig, path: Path | str = PATH) -> EgressConfig | None:
    """The description the ENGINE's host is meant to have: None only where egress is
    off by intent; missing where it is on is an error."""
    cfg = load(path)
    if cfg is None and engine.egress:
        raise HostStateError(missing_message(path))
    return cfg if engine.egress else None
