"""/etc/kooi/engine.json: the engine, its runner and what this host is meant to enforce.

Written by roles/docker_rootless or roles/docker_userns_remap (whichever
kooi_engine_mode chose), root-owned, read-only for everyone else. `egress` records the
operator's intent (kooi_egress_enabled): a check or a run that finds egress.json
missing where egress is meant to be on fails instead of calling it "not applicable".
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from . import _json, paths, read
from .errors import HostStateError

PATH = Path(os.environ.get("KOOI_ENGINE_CONFIG", paths.ENGINE))
MODES = ("rootless", "userns_remap")


@dataclass(frozen=True)
class Authz:
    """roles/authz: the authorization plugin the rootful daemon is configured with."""

    plugin: str
    socket: str
    token_file: str
    unit: str = ""


@dataclass(frozen=True)
class Gvisor:
    """roles/gvisor: runsc registered as a runtime of the rootful (userns-remap) daemon."""

    runtime: str          # the name containers ask for (HostConfig.Runtime)
    path: str             # what the daemon runs: runsc, or kooi's wrapper around it
    runsc: str            # the runsc binary
    args: tuple[str, ...]  # the daemon's runtimeArgs for it
    version: str          # runsc's release date, YYYYMMDD
    platform: str         # systrap or ptrace (never kvm here)
    network: str          # sandbox (gVisor's netstack) or host (the container's netns, host stack)
    netns_workaround: bool = False  # the wrapper hides /proc/sys/net (google/gvisor#10704)
    # The host gid of the runner image's gid on this engine (kooi_gvisor_group, the
    # runner is in it): gVisor ignores POSIX ACLs, so a gVisor run's project is given
    # to this group. 0: none recorded (re-run site.yml).
    group: int = 0


@dataclass(frozen=True)
class EngineConfig:
    mode: str
    runner_user: str
    runner_uid: int
    runner_gid: int
    runner_home: str
    socket: str
    daemon_config: str
    launcher: tuple[str, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)
    storage_driver: str = ""
    systemd_unit: str = ""
    log_file: str = ""
    managed_files: tuple[str, ...] = ()
    socket_group: str = ""
    remap_user: str = ""
    # Written by the engine roles from kooi_egress_enabled (on by default).
    egress: bool = True
    # Where kooi's command is installed (kooi_bin); the checks run it on the host.
    kooi_bin: str = paths.BIN
    # None when the daemon is not guarded by the authorization plugin.
    authz: Authz | None = None
    # None when gVisor is not a runtime of this engine (kooi_gvisor_enabled).
    gvisor: Gvisor | None = None

    @property
    def runtime_dir(self) -> str:
        return f"/run/user/{self.runner_uid}"


def parse(text: str, source: str = str(PATH)) -> EngineConfig:
    raw = _json.obj(text, source, "host description")
    authz = raw.pop("authz", None)
    gvisor = raw.pop("gvisor", None)
    cfg = _json.build(EngineConfig, raw, source)
    if cfg.mode not in MODES:
        raise HostStateError(f"{source}: mode {cfg.mode!r} is not one of {', '.join(MODES)}; re-run site.yml")
    if authz:
        if not isinstance(authz, dict):
            raise HostStateError(f"{source}: authz must be an object; re-run site.yml")
        cfg = dataclasses.replace(cfg, authz=_json.build(Authz, authz, f"{source}: authz"))
    if gvisor:
        if not isinstance(gvisor, dict):
            raise HostStateError(f"{source}: gvisor must be an object; re-run site.yml")
        g = _json.build(Gvisor, gvisor, f"{source}: gvisor")
        if g.platform not in ("systrap", "ptrace") or g.network not in ("sandbox", "host"):
            raise HostStateError(f"{source}: gvisor platform {g.platform!r} / network {g.network!r} unknown; "
                                 "re-run site.yml")
        cfg = dataclasses.replace(cfg, gvisor=g)
    return cfg


def load(path: Path | str = PATH) -> EngineConfig:
    path = Path(path)
    text = read(path)
    if text is None:
        raise HostStateError(f"{path} not found: this host has not been provisioned by kooi; "
                             "run ansible-playbook site.yml against it first")
    return parse(text, str(path))
