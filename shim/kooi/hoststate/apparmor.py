"""/etc/kooi/apparmor.json: kooi's AppArmor profiles and whether the kernel enforces them (roles/apparmor)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import _json, paths, read

PATH = Path(paths.APPARMOR)


@dataclass(frozen=True)
class AppArmorState:
    enabled: bool
    kernel: bool = False  # the kernel has AppArmor (else profiles are only checked on disk)
    abi: str = ""
    runner_profile: str | None = None
    jail_profile: str | None = None
    rootlesskit_profile: str | None = None
    profile_dir: str = "/etc/apparmor.d"
    nested_runtimes: tuple[str, ...] = ()

    @property
    def profiles(self) -> list[str]:
        return [n for n in (self.runner_profile, self.jail_profile, self.rootlesskit_profile) if n]


def parse(text: str, source: str = str(PATH)) -> AppArmorState:
    return _json.build(AppArmorState, _json.obj(text, source, "AppArmor state"), source)


def load(path: Path = PATH) -> AppArmorState | None:
    text = read(path)
    return None if text is None else parse(text, str(path))
