"""/etc/kooi/fuse.json: whether the operator opted in to /dev/fuse for the runner (roles/fuse)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import _json, paths, read

PATH = Path(paths.FUSE)


@dataclass(frozen=True)
class FuseState:
    enabled: bool
    udev_rule: str = ""


def parse(text: str, source: str = str(PATH)) -> FuseState:
    return _json.build(FuseState, _json.obj(text, source, "FUSE state"), source)


def load(path: Path = PATH) -> FuseState | None:
    text = read(path)
    return None if text is None else parse(text, str(path))
