"""The runner image: build on the runner's engine from a rendered context, pin, verify.

roles/runner_image renders images/runner/Containerfile.j2 and the files it needs into
a build context on the host and calls `kooi image build`. This module:
- makes sure the engine holds the base the lock pins (loading the archive if needed)
  and refuses a base whose id differs from the pin;
- builds only when an input changed: the inputs hash (every context file, its mode and
  the pinned base) is a label on the image, so an unchanged context finds its image;
- verifies the result: built on the pinned base (its layers are a prefix), no setuid or
  setgid file, no file capability but the declared ones, a non-root default user;
- records the pin in /etc/kooi/images.json, which `kooi run` resolves image names by.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import yaml

from . import labels
from .hoststate import HostStateError
from .hoststate import images as images_state
from .hoststate.images import Pin

if TYPE_CHECKING:
    import docker

# A docker.DockerClient where its images' ids are used as strings: types-docker declares
# Model.id `str | None`, but the engine always gives an image an id (and save(named=None) is fine).
_ImageClient = Any

PINS_PATH = images_state.PATH
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
CAP_XATTR = "SCHILY.xattr.security.capability"


class ImageError(Exception):
    """Building or verifying the image failed; the message says why and what to do."""


@dataclass(frozen=True)
class Lock:
    path: Path
    base_ref: str
    base_digest: str
    base_archive: str
    file_capabilities: tuple[str, ...]
    raw: dict[str, Any]


def load_lock(path: Path | str) -> Lock:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ImageError(f"{path}: cannot read the image lock: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("base"), dict):
        raise ImageError(f"{path}: not an image lock (no 'base' mapping)")
    base = raw["base"]
    for key in ("ref", "digest"):
        if not isinstance(base.get(key), str) or not base[key]:
            raise ImageError(f"{path}: base.{key} is missing")
    if not DIGEST_RE.match(base["digest"]):
        raise ImageError(f"{path}: base.digest {base['digest']!r} is not sha256:<64 hex>")
    apt = raw.get("apt") or {}
    packages = apt.get("packages") or {} if isinstance(apt, dict) else None
    sources = apt.get("sources") or [] if isinstance(apt, dict) else None
    from .variants import PACKAGE_RE, SOURCE_RE, VERSION_RE

    # They go into the build's shell lines as they are (reviews 49, 50).
    if not isinstance(packages, dict) or not all(
            PACKAGE_RE.match(str(k)) and VERSION_RE.match(str(v)) for k, v in packages.items()):
        raise ImageError(f"{path}: apt.packages must map Debian package names to Debian versions")
    if not isinstance(sources, list) or not all(isinstance(x, str) and SOURCE_RE.match(x) for x in sources):
        raise ImageError(f"{path}: apt.sources must be one-line apt sources (deb URI SUITE COMPONENT...)")
    caps = raw.get("file_capabilities") or []
    if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
        raise ImageError(f"{path}: file_capabilities must be a list of 'PATH CAPS' strings")
    return Lock(path, base["ref"], base["digest"], str(base.get("archive") or ""), tuple(caps), raw)


def inputs_hash(context: Path, base_digest: str) -> str:
    """sha256 over every file of the build context (path, mode, content) and the base."""
    h = hashlib.sha256()
    h.update(f"base {base_digest}\n".encode())
    for p in sorted(context.rglob("*")):
        rel = p.relative_to(context).as_posix()
        if p.is_symlink():
            h.update(f"link {rel} {os.readlink(p)}\n".encode())
        elif p.is_file():
            h.update(f"file {rel} {p.stat().st_mode & 0o7777:o}\n".encode())
            with p.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        elif p.is_dir():
            h.update(f"dir {rel}\n".encode())
    return h.hexdigest()


class _ChunkReader:
    """A file-like over an iterator of byte chunks (docker's export stream)."""

    def __init__(self, chunks: Iterator[bytes]):
        self._chunks = chunks
        self._buf = b""

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buf) < n:
            try:
                self._buf += next(self._chunks)
            except StopIteration:
                break
        if n < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        return out


def scan_filesystem(stream: IO[bytes] | _ChunkReader, declared_caps: tuple[str, ...] = ()) -> list[str]:
    """Offenders in an image filesystem tar: setuid/setgid entries and file capabilities.

    A declared capability is named by path ("PATH CAPS" in the lock); any capability
    on a path that is not declared is an offender.
    """
    declared_paths = {c.split(" ", 1)[0] for c in declared_caps}
    offenders = []
    # The stream mode ("r|") only reads: _ChunkReader has read() but not the write/seek/tell/close tarfile's stubs want.
    with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
        for m in tar:
            path = "/" + m.name.lstrip("./")
            if not m.issym() and m.mode & 0o6000:
                kind = "setuid" if m.mode & 0o4000 else "setgid"
                offenders.append(f"{kind} {oct(m.mode & 0o7777)} {path}")
            if CAP_XATTR in m.pax_headers and path not in declared_paths:
                offenders.append(f"file capability {path}")
    return offenders


def scan_image(client: docker.DockerClient, image_id: str, declared_caps: tuple[str, ...] = ()) -> list[str]:
    """Export the image's filesystem (a created, never started container) and scan it."""
    c = client.api.create_container(image_id, command=["/nonexistent"], network_disabled=True,
                                    labels={labels.SCAN: "1"})
    import docker.errors

    try:
        raw = client.api.export(c["Id"])
        return scan_filesystem(_ChunkReader(iter(raw)), declared_caps)
    finally:
        try:
            client.api.remove_container(c["Id"], force=True)
        except docker.errors.NotFound:
            pass  # gone already (an operator's prune): what this wanted


def default_user_is_root(attrs: dict[str, Any]) -> bool:
    user = (attrs.get("Config") or {}).get("User") or ""
    return user.split(":", 1)[0] in ("", "0", "root")


def verify_image(client: docker.DockerClient, image_id: str, lock: Lock) -> list[str]:
    """Everything kooi demands of a runner image; an empty list means it passes."""
    problems = []
    img = client.images.get(image_id)
    base = client.images.get(lock.base_digest)
    base_layers = base.attrs["RootFS"].get("Layers") or []
    layers = img.attrs["RootFS"].get("Layers") or []
    if layers[: len(base_layers)] != base_layers:
        problems.append(f"image {image_id} is not built on the pinned base {lock.base_digest}")
    if default_user_is_root(img.attrs):
        problems.append("the image's default user is root; the runner image must set USER to a non-root uid")
    problems += scan_image(client, image_id, lock.file_capabilities)
    return problems


def ensure_base(client: _ImageClient, lock: Lock, archive_dir: Path | None, log: Callable[[str], None]) -> bool:
    """Make the engine hold the pinned base under lock.base_ref; True if it changed anything."""
    import docker.errors

    changed = False
    try:
        client.images.get(lock.base_digest)
    except docker.errors.ImageNotFound:
        archive = Path(lock.base_archive)
        if archive_dir is not None and not archive.is_absolute():
            archive = archive_dir / archive
        if not lock.base_archive or not archive.is_file():
            raise ImageError(
                f"the engine does not have the pinned base {lock.base_ref} ({lock.base_digest}) and "
                f"no archive to load it from ({archive}); copy the base archive there "
                "(docker save of the pinned image) or pull the pinned digest") from None
        log(f"loading base image from {archive}")
        with archive.open("rb") as f:
            loaded = client.images.load(f.read())
        ids = sorted({i.id for i in loaded})
        if lock.base_digest not in ids:
            raise ImageError(
                f"refusing base archive {archive}: it holds {', '.join(ids) or 'no image'}, but the lock "
                f"{lock.path} pins {lock.base_digest}. If this base is the one you mean, pin it: "
                f"kooi image lock --pin-base {lock.base_ref} {lock.path}") from None
        changed = True
    base = client.images.get(lock.base_digest)
    repo, _, tag = lock.base_ref.rpartition(":")
    if not repo:
        repo, tag = lock.base_ref, "latest"
    if lock.base_ref not in base.tags:
        base.tag(repo, tag)  # the Containerfile builds FROM the ref; the result is checked
        changed = True
    return changed


def read_pins(path: Path = PINS_PATH) -> dict[str, Pin]:
    try:
        return images_state.load(path)
    except HostStateError as exc:
        raise ImageError(str(exc)) from None


def write_pins(pins: dict[str, Pin], path: Path = PINS_PATH) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".images.")
    with os.fdopen(fd, "w") as f:
        f.write(images_state.dump(pins))
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def load_prebuilt(client: _ImageClient, archive: Path, inputs: str, log: Callable[[str], None]) -> Any:
    """Load a runner image built elsewhere (`kooi image save`) and return the one built from
    INPUTS; an archive without it is refused and what it brought is removed again."""
    import docker.errors

    if not archive.is_file():
        raise ImageError(f"the prebuilt image archive {archive} does not exist; copy it there "
                         "(kooi image save on the host that built it) or leave kooi_runner_image_prebuilt empty")
    before = {i.id for i in client.images.list(all=True)}
    log(f"loading prebuilt image from {archive}")
    with archive.open("rb") as f:
        loaded = client.images.load(f)  # streamed, not read into memory
    match = [i for i in loaded if (i.labels or {}).get(labels.INPUTS) == inputs]
    if match:
        return match[0]
    for i in loaded:
        if i.id not in before:
            try:
                client.images.remove(i.id)
            except docker.errors.APIError:
                pass
    found = ", ".join(f"{i.id[:19]} (inputs {(i.labels or {}).get(labels.INPUTS, 'none')[:12]})" for i in loaded)
    raise ImageError(
        f"refusing the prebuilt archive {archive}: it holds {found or 'no image'}, none built from this "
        f"host's inputs {inputs[:12]} (lock, rendered Containerfile, CA files, Maven seeds). Build it from "
        "the same lock and variables, or leave kooi_runner_image_prebuilt empty to build here")


def save(client: _ImageClient, pin: Pin, out: IO[bytes]) -> str:
    """Write the pinned image (with its tag) as a `docker save` archive to OUT, a binary
    file; returns the tag. What `load_prebuilt` reads on another host."""
    img = client.images.get(pin.id)
    tag = pin.tag or img.id
    for chunk in img.save(named=tag if tag in img.tags else None):
        out.write(chunk)
    return tag


def build(client: _ImageClient, context: Path, lock: Lock, name: str = "runner", repo: str = "kooi-runner",
          check: bool = False, pins_path: Path = PINS_PATH, archive_dir: Path | None = None,
          log: Callable[[str], None] = lambda s: None, buildargs: dict[str, str] | None = None,
          prebuilt: Path | None = None, network_mode: str | None = None) -> dict[str, Any]:
    """Build (if an input changed), verify and pin. Returns a result for Ansible.
    BUILDARGS: the egress proxy (Docker's predefined proxy arguments), if any;
    NETWORK_MODE: where the build's steps run (the rootless engine: its own namespace,
    "host", since its bridges reach the host only for runs: run.runnet).
    PREBUILT: a `kooi image save` archive to load instead of building, when no image of
    these inputs is on the engine; its image must be built from the same inputs, and is
    verified like a fresh build."""
    h = inputs_hash(context, lock.base_digest)
    tag = f"{repo}:{h[:12]}"
    pins = read_pins(pins_path)
    # Only an image kooi pinned (built or loaded, and verified) counts as already built:
    # the inputs' label is a string anyone can write, and an image built FROM the runner
    # image inherits it (a workload can pull one through the broker; kooi took the first
    # labelled image for the runner image and pinned it unverified).
    mine = {p.id for p in pins.values()}
    existing = [img for img in client.images.list(filters={"label": f"{labels.INPUTS}={h}"}) if img.id in mine]
    want_pin = None
    if existing:
        img = existing[0]
        want_pin = Pin(id=img.id, tag=tag, inputs=h, base=lock.base_digest)
    result: dict[str, Any] = {"changed": False, "name": name, "tag": tag, "inputs": h, "built": False, "loaded": False}
    if check:
        current = pins.get(name)
        result["changed"] = not existing or current is None or want_pin is None or \
            dataclasses.replace(current, built_at="") != want_pin
        result["id"] = existing[0].id if existing else None
        return result
    if ensure_base(client, lock, archive_dir, log):
        result["changed"] = True
    if not existing and prebuilt is not None:
        img = load_prebuilt(client, prebuilt, h, log)
        problems = verify_image(client, img.id, lock)
        if problems:
            client.images.remove(img.id, force=True)
            raise ImageError(f"refusing the prebuilt image from {prebuilt} (removed it):\n  " + "\n  ".join(problems))
        if tag not in img.tags:
            img.tag(repo, h[:12])
        result.update(changed=True, loaded=True)
        want_pin = Pin(id=img.id, tag=tag, inputs=h, base=lock.base_digest)
    elif not existing:
        log(f"building {tag} from {context}")
        image_id = None
        for chunk in client.api.build(path=str(context), dockerfile="Containerfile", tag=tag, rm=True,
                                      forcerm=True, pull=False, decode=True, buildargs=buildargs or None,
                                      network_mode=network_mode,
                                      labels={labels.INPUTS: h, labels.IMAGE: name}):
            if "stream" in chunk:
                for line in chunk["stream"].splitlines():
                    if line.strip():
                        log(line)
            if "error" in chunk:
                raise ImageError(f"build of {tag} failed: {chunk['error'].strip()}")
            if "aux" in chunk and "ID" in chunk["aux"]:
                image_id = chunk["aux"]["ID"]
        img = client.images.get(image_id or tag)
        problems = verify_image(client, img.id, lock)
        if problems:
            client.images.remove(img.id, force=True)
            raise ImageError("refusing the built image (removed it):\n  " + "\n  ".join(problems))
        result.update(changed=True, built=True)
        want_pin = Pin(id=img.id, tag=tag, inputs=h, base=lock.base_digest)
    else:
        img = existing[0]
        if tag not in img.tags:
            img.tag(repo, h[:12])
            result["changed"] = True
    assert want_pin is not None
    prev = pins.get(name)
    if result["built"]:
        built_at = datetime.now(UTC).isoformat(timespec="seconds")
    elif prev is not None and prev.id == img.id and prev.built_at:
        built_at = prev.built_at
    else:  # found or loaded: when it was built, wherever that was
        built_at = datetime.fromisoformat(img.attrs["Created"][:19]).replace(
            tzinfo=UTC).isoformat(timespec="seconds")
    want_pin = dataclasses.replace(want_pin, built_at=built_at)
    if prev != want_pin:
        old = prev.id if prev is not None else None
        pins[name] = want_pin
        write_pins(pins, pins_path)
        result["changed"] = True
        if old and old != img.id and old not in {p.id for p in pins.values()}:
            _remove_superseded(client, old, log)
    result["id"] = img.id
    return result


def _remove_superseded(client: docker.DockerClient, image_id: str, log: Callable[[str], None]) -> None:
    """Drop the image a new pin replaced (kept if a container still uses it)."""
    import docker.errors

    try:
        client.images.remove(image_id)
        log(f"removed superseded image {image_id}")
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.APIError as exc:
        log(f"kept superseded image {image_id}: {exc.explanation or exc}")


def pin_base(lock_path: Path, image_id: str, out: Path | None = None) -> str:
    """Write IMAGE's id as base.digest into the lock (keeps comments and layout)."""
    if not DIGEST_RE.match(image_id):
        raise ImageError(f"{image_id!r} is not an image id (sha256:<64 hex>)")
    text = lock_path.read_text()
    new, n = re.subn(r"(?m)^(  digest: )sha256:[0-9a-f]{64}$", rf"\g<1>{image_id}", text, count=1)
    if n != 1:
        raise ImageError(f"{lock_path}: no 'base.digest: sha256:...' line to replace")
    (out or lock_path).write_text(new)
    return image_id


def refresh_packages(lock_path: Path, versions: dict[str, str], out: Path | None = None) -> dict[str, tuple[str, str]]:
    """Replace pinned Debian package versions in the lock; returns {name: (old, new)}."""
    lock = load_lock(lock_path)
    pinned = (lock.raw.get("apt") or {}).get("packages") or {}
    text = lock_path.read_text()
    changes: dict[str, tuple[str, str]] = {}
    for name, old in pinned.items():
        new = versions.get(name)
        if not new or str(old) == new:
            continue
        text, n = re.subn(rf"(?m)^(    {re.escape(name)}: ).*$", rf'\g<1>"{new}"', text, count=1)
        if n:
            changes[name] = (str(old), new)
    (out or lock_path).write_text(text)
    return changes


def candidate_versions(client: docker.DockerClient, lock: Lock) -> dict[str, str]:
    """The versions apt would install now from the lock's sources, in the pinned base."""
    sources = (lock.raw.get("apt") or {}).get("sources") or []
    names = sorted(((lock.raw.get("apt") or {}).get("packages") or {}).keys())
    script = ("printf '%s\\n' " + " ".join(f"'{s}'" for s in sources) + " > /etc/apt/sources.list && "
              "apt-get update -qq >/dev/null && for p in " + " ".join(names) + "; do "
              "echo \"$p $(apt-cache policy $p | sed -n 's/ *Candidate: //p')\"; done")
    out = client.containers.run(lock.base_digest, ["sh", "-c", script], remove=True, user="0")
    versions = {}
    for line in out.decode().splitlines():
        name, _, version = line.partition(" ")
        if version and version != "(none)":
            versions[name] = version
    return versions
