"""IMG-* checks: the pinned runner image on the runner's engine.

Not applicable where the host pins no runner image (kooi_runner_image_build: false).
IMG-NOSUID enumerates the filesystem from inside a container (find), independently of
the export scan that `kooi image build` makes before it pins an image.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import yaml

from ..hoststate import paths
from ..hoststate.images import Pin
from .core import FAIL, NA, PASS, Context, Host, Outcome, check

PINS = paths.IMAGES
LOCK = paths.IMAGE_LOCK


def runner_pin(host: Host, ctx: Context) -> tuple[Pin | None, dict[str, Any] | None]:
    if "image_pin" not in ctx.cache:
        pin = (ctx.described(host, "images") or {}).get("runner")
        lock = yaml.safe_load(host.file(LOCK).content_string) if host.file(LOCK).exists else None
        ctx.cache["image_pin"] = (pin, lock)
    pinned: tuple[Pin | None, dict[str, Any] | None] = ctx.cache["image_pin"]
    return pinned


def _inspect(host: Host, ctx: Context, ref: str) -> dict[str, Any] | None:
    res = host.run(ctx.as_runner(f"docker image inspect {shlex.quote(ref)}"))
    return json.loads(res.stdout)[0] if res.rc == 0 else None


def _in_image(host: Host, ctx: Context, image_id: str, cmd: str) -> Any:
    return host.run(ctx.as_runner(
        f"docker run --rm --pull=never --network none --user 0 --entrypoint sh {shlex.quote(image_id)} "
        f"-c {shlex.quote(cmd)}"))


@check("IMG-DIGEST-PIN", "the runner image is the pinned one, built on the base the lock pins",
       "an unpinned or swapped image or base (supply chain)")
def digest_pin(host: Host, ctx: Context) -> Outcome:
    pin, lock = runner_pin(host, ctx)
    if not pin:
        return NA, f"no runner image pinned in {PINS}"
    if not lock:
        return FAIL, f"{PINS} pins {pin.id} but the lock {LOCK} is missing"
    want_base = lock["base"]["digest"]
    img = _inspect(host, ctx, pin.id)
    if img is None:
        return FAIL, f"pinned image {pin.id} is not on the runner's engine"
    base = _inspect(host, ctx, want_base)
    if base is None:
        return FAIL, f"pinned base {want_base} is not on the runner's engine"
    layers, base_layers = img["RootFS"]["Layers"], base["RootFS"]["Layers"]
    problems = []
    if pin.base != want_base:
        problems.append(f"pin records base {pin.base}, lock pins {want_base}")
    if layers[: len(base_layers)] != base_layers:
        problems.append("image layers do not start with the pinned base's layers")
    if (img["Config"].get("Labels") or {}).get("org.kooi.base") != want_base:
        problems.append("image label org.kooi.base differs from the lock")
    if problems:
        return FAIL, "; ".join(problems)
    return PASS, f"{pin.id[:19]} on base {want_base[:19]} ({len(base_layers)} of {len(layers)} layers)"


@check("IMG-NOSUID", "the runner image contains no setuid or setgid file",
       "privilege gain through a setuid binary inside the workload", scope="image")
def nosuid(host: Host, ctx: Context) -> Outcome:
    pin, _ = runner_pin(host, ctx)
    if not pin:
        return NA, f"no runner image pinned in {PINS}"
    res = _in_image(host, ctx, pin.id,
                    "find / -xdev ! -type l -perm /6000 -print 2>/dev/null; echo END-OF-SCAN; "
                    "find / -xdev -type f | wc -l")
    if res.rc != 0 or "END-OF-SCAN" not in res.stdout:
        return FAIL, f"could not enumerate the image: rc={res.rc} {res.stderr.strip()[-200:]}"
    found, _, count = res.stdout.partition("END-OF-SCAN")
    offenders = found.split()
    if offenders:
        return FAIL, "setuid/setgid: " + ", ".join(offenders[:20])
    return PASS, f"no setuid/setgid among {count.strip()} files"


@check("IMG-FILECAPS", "file capabilities only where the lock declares them",
       "privilege gain through a file capability inside the workload", scope="image")
def filecaps(host: Host, ctx: Context) -> Outcome:
    pin, lock = runner_pin(host, ctx)
    if not pin:
        return NA, f"no runner image pinned in {PINS}"
    declared = {c.split(" ", 1)[0] for c in (lock or {}).get("file_capabilities") or []}
    res = _in_image(host, ctx, pin.id, "command -v getcap >/dev/null || exit 3; getcap -r / 2>/dev/null; true")
    if res.rc == 3:
        return FAIL, "getcap is not in the image (libcap2-bin is pinned in the lock)"
    if res.rc != 0:
        return FAIL, f"could not enumerate capabilities: {res.stderr.strip()[-200:]}"
    extra = [l for l in res.stdout.splitlines() if l.strip() and l.split()[0] not in declared]
    if extra:
        return FAIL, "undeclared: " + "; ".join(extra[:10])
    return PASS, f"file capabilities: {len(res.stdout.splitlines())} (declared: {len(declared)})"


@check("IMG-NONROOT", "the runner image runs as a non-root user by default",
       "a workload starting as (namespaced) root")
def nonroot(host: Host, ctx: Context) -> Outcome:
    pin, _ = runner_pin(host, ctx)
    if not pin:
        return NA, f"no runner image pinned in {PINS}"
    img = _inspect(host, ctx, pin.id)
    if img is None:
        return FAIL, f"pinned image {pin.id} is not on the runner's engine"
    user = img["Config"].get("User") or ""
    if user.split(":", 1)[0] in ("", "0", "root"):
        return FAIL, f"default user is {user or 'root (unset)'}"
    return PASS, f"default user {user}"
