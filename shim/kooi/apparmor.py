"""What AppArmor confinement a run gets, from what roles/apparmor recorded
(/etc/kooi/apparmor.json) and what the kernel has loaded.

Container mode: the runner profile where the engine can apply it (rootful Docker with
userns-remap; rootless Docker cannot confine containers with AppArmor). Jail mode: the
jail profile through aa-exec. A profile the role installed but the kernel no longer
holds in enforce mode fails the run (the host is not what site.yml made it); a host
without AppArmor runs unconfined by it, and the result says so.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .hoststate.apparmor import AppArmorState

PROFILES_PATH = Path("/sys/kernel/security/apparmor/profiles")


class AppArmorError(Exception):
    """The host's AppArmor is not in the state the role left it in."""


@dataclass(frozen=True)
class Confinement:
    profile: str | None      # the profile applied, None when none is
    note: str                # why (for the result and the log)

    def as_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "applied": self.profile is not None, "note": self.note}


def parse_profiles(text: str) -> dict[str, str]:
    """name -> mode (enforce, complain, kill, unconfined) from the kernel's profile list."""
    out = {}
    for line in text.splitlines():
        name, _, mode = line.rstrip().rpartition(" (")
        if name and mode.endswith(")"):
            out[name] = mode[:-1]
    return out


def loaded_profiles(path: Path = PROFILES_PATH) -> dict[str, str]:
    """The profiles the kernel holds, with their modes."""
    return parse_profiles(path.read_text())


# The kernel's list is root-only (mode 0440 on Debian's kernels, measured in the QEMU
# scenario): `kooi run` reads it while still root, before it drops to the runner.
_snapshot: dict[str, str] | None = None


def remember_loaded(path: Path = PROFILES_PATH) -> None:
    """Read the kernel's list now (as root), for decisions made after dropping privileges."""
    global _snapshot
    try:
        _snapshot = loaded_profiles(path)
    except OSError:
        _snapshot = None


def _enforced(name: str, profiles_path: Path) -> str:
    """'' when NAME is loaded in enforce mode, a caveat when that cannot be read;
    raises when it is loaded in another mode or not at all."""
    if profiles_path == PROFILES_PATH and _snapshot is not None:
        profiles = _snapshot
    else:
        try:
            profiles = loaded_profiles(profiles_path)
        except PermissionError:
            return (" (enforce mode not verified: only root can read the kernel's profile list; cron and "
                    "pipelines run kooi run as root, which verifies it)")
        except OSError as exc:
            raise AppArmorError(f"cannot read the kernel's AppArmor profiles ({exc})") from None
    mode = profiles.get(name)
    if mode != "enforce":
        raise AppArmorError(f"AppArmor profile {name} is {'in ' + mode + ' mode' if mode else 'not loaded'}; "
                            "kooi runs it only in enforce mode: re-run site.yml (role apparmor)")
    return ""


def _unconfined(state: AppArmorState | None) -> str | None:
    if state is None:
        return "AppArmor: not provisioned on this host (no /etc/kooi/apparmor.json; role apparmor)"
    if not state.enabled:
        return "AppArmor: off (kooi_apparmor_enabled=false)"
    if not state.kernel:
        return "AppArmor: not applied, the kernel has no AppArmor (profiles installed and syntax-checked only)"
    return None


def for_container(engine_mode: str, state: AppArmorState | None, profiles_path: Path = PROFILES_PATH) -> Confinement:
    if (why := _unconfined(state)) is not None:
        return Confinement(None, why)
    if engine_mode == "rootless":
        return Confinement(None, "AppArmor: not applied, rootless Docker cannot confine containers with "
                                 "AppArmor (the user namespace, seccomp and dropped capabilities remain)")
    assert state is not None
    name = state.runner_profile
    if not name:
        raise AppArmorError("AppArmor: the state names no runner profile; re-run site.yml (role apparmor)")
    caveat = _enforced(name, profiles_path)
    return Confinement(name, f"AppArmor: {name} (enforce){caveat}")


def for_jail(state: AppArmorState | None, profiles_path: Path = PROFILES_PATH) -> tuple[Confinement, list[str]]:
    """The confinement and the argv prefix that applies it (aa-exec)."""
    if (why := _unconfined(state)) is not None:
        return Confinement(None, why), []
    assert state is not None
    name = state.jail_profile
    if not name:
        raise AppArmorError("AppArmor: the state names no jail profile; re-run site.yml (role apparmor)")
    caveat = _enforced(name, profiles_path)
    exe = shutil.which("aa-exec")
    if not exe:
        raise AppArmorError("aa-exec is missing (package apparmor); re-run site.yml (role apparmor)")
    return Confinement(name, f"AppArmor: {name} (enforce){caveat}"), [exe, "-p", name, "--"]


def allowed_profiles(state: AppArmorState | None) -> tuple[str, ...]:
    """Profiles a container create may name (the policy refuses any other apparmor=)."""
    if state and state.enabled and state.runner_profile:
        return (state.runner_profile,)
    return ()


def host_profiles(warn: Callable[[str], object]) -> tuple[str, ...]:
    """kooi's own AppArmor profiles on this host, which the policy lets container
    creates name; none (and WARN says why) when the host's description is unreadable."""
    from .hoststate import HostStateError
    from .hoststate import apparmor as apparmor_state

    try:
        return allowed_profiles(apparmor_state.load())
    except HostStateError as exc:
        warn(f"{exc}; no AppArmor profile may be named")
        return ()
