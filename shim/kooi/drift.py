"""Engine drift: how the running daemon differs from the configuration kooi wrote for it.

A host switched between engine modes, or a daemon.json changed without a restart,
leaves a daemon that answers but does not enforce what the host description says
(the issue that found it: userns_remap configured, the rootful daemon still running
without userns-remap). `kooi engine status` and the check HOST-ENGINE-DRIFT use this
one comparison; `kooi engine start` restarts a daemon kooi manages that drifted.
"""

from __future__ import annotations

from typing import Any

from .hoststate.engine import EngineConfig


def drift(cfg: EngineConfig, info: dict[str, Any], daemon_config: dict[str, Any] | None) -> list[str]:
    """How the running daemon (its GET /info) differs from what the host is configured
    for: the engine mode, the default seccomp profile, the storage driver and the
    authorization plugins of DAEMON_CONFIG (None: its daemon.json could not be read)."""
    out: list[str] = []
    sec = [str(o) for o in info.get("SecurityOptions") or []]
    names = {o.split(",", 1)[0].removeprefix("name=") for o in sec}
    if cfg.mode == "rootless" and "rootless" not in names:
        out.append("configured rootless, but the daemon on the socket is not rootless")
    if cfg.mode == "userns_remap":
        if "rootless" in names:
            out.append("configured userns_remap, but the daemon on the socket is rootless")
        elif "userns" not in names:
            out.append("configured userns_remap, but the daemon runs without userns-remap (containers' root is "
                       "the host's root)")
    if daemon_config is None:
        return out
    want = daemon_config.get("seccomp-profile")
    got = next((o.split("profile=", 1)[1] for o in sec if o.startswith("name=seccomp,") and "profile=" in o), None)
    if want and got != want:
        out.append(f"default seccomp profile: configured {want}, running {got or 'none'}")
    if not want and got not in (None, "default", "builtin"):
        out.append(f"default seccomp profile: configured the engine's built-in, running {got}")
    driver = daemon_config.get("storage-driver")
    if driver and info.get("Driver") != driver:
        out.append(f"storage driver: configured {driver}, running {info.get('Driver')}")
    plugins = sorted(daemon_config.get("authorization-plugins") or [])
    running = sorted(((info.get("Plugins") or {}).get("Authorization")) or [])
    if plugins != running:
        out.append(f"authorization plugins: configured {plugins or 'none'}, running {running or 'none'}")
    return out
