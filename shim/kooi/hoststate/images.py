"""/etc/kooi/images.json: the images `kooi run` resolves workflow image names by.

Written by `kooi image build` (roles/runner_image): name -> the image id (digest) it was
verified as, its tag, the hash of its build inputs, its base image and when it was built.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _json, paths, read
from .errors import HostStateError

PATH = Path(os.environ.get("KOOI_IMAGES_CONFIG", paths.IMAGES))
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class Pin:
    id: str  # sha256:<64 hex>, what a run starts
    tag: str = ""
    inputs: str = ""  # sha256 hex of the build context and base (image.inputs_hash)
    base: str = ""  # the base image id the lock pins
    built_at: str = ""

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def parse(text: str, source: str = str(PATH)) -> dict[str, Pin]:
    raw = _json.obj(text, source, "image pins")
    pins = {}
    for name, entry in raw.items():
        if not isinstance(entry, dict):
            raise HostStateError(f"{source}: {name} must be an object; re-run site.yml")
        pin = _json.build(Pin, entry, f"{source}: {name}")
        if not DIGEST_RE.match(pin.id):
            raise HostStateError(f"{source}: {name}.id {pin.id!r} is not sha256:<64 hex>; re-run site.yml")
        pins[name] = pin
    return pins


def dump(pins: dict[str, Pin]) -> str:
    return json.dumps({n: p.as_dict() for n, p in pins.items()}, indent=2, sort_keys=True) + "\n"


def load(path: Path | str = PATH) -> dict[str, Pin]:
    """The pins; none where no image was built yet."""
    path = Path(path)
    text = read(path)
    return {} if text is None else parse(text, str(path))


def as_json(pins: dict[str, Pin]) -> dict[str, Any]:
    return {n: p.as_dict() for n, p in pins.items()}
