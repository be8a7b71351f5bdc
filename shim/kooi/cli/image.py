"""`kooi image build|verify|lock|save|variants`: the pinned runner image and its variants
(owners: kooi.image, kooi.variants)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..hoststate import HostStateError
from ..hoststate import egress as egress_state
from ..hoststate import engine as engine_state
from .exits import EXIT_FAIL, EXIT_NOT_RUNNING, EXIT_OK, EXIT_USAGE, fail


def register(sub: Any) -> None:
    i = sub.add_parser("image", help="build, verify and pin the runner image")
    i.add_argument("action", choices=("build", "verify", "lock", "save", "variants"))
    i.add_argument("--lock", help="the image lock file (build, verify, lock)")
    i.add_argument("--context", help="rendered build context (build)")
    i.add_argument("--name", default="runner", help="pin name in /etc/kooi/images.json")
    i.add_argument("--archive-dir", help="where the base archive named in the lock lies (build)")
    i.add_argument("--check", action="store_true", help="report whether a build is needed, change nothing")
    i.add_argument("--pin-base", metavar="IMAGE", help="lock: pin IMAGE's id as the base")
    i.add_argument("--refresh-packages", action="store_true",
                   help="lock: pin the Debian versions the pinned base's sources offer now")
    i.add_argument("--prebuilt", metavar="ARCHIVE",
                   help="build: load this `kooi image save` archive instead of building, when the engine has "
                        "no image of these inputs (it must be built from the same inputs; verified as a build)")
    i.add_argument("--out", help="lock: write the updated lock here instead of in place; save: the archive")
    i.add_argument("--declared", metavar="JSON",
                   help="variants: the inventory's kooi_runner_images (JSON); checked, and what the lock lacks "
                        "pinned from the archive (the lock is written unless --check)")
    i.add_argument("--base-lock", metavar="LOCK", help="variants: the runner image lock (its apt sources)")
    i.add_argument("--arch", default="amd64", help="variants: the hosts' Debian architecture")
    i.add_argument("--config", default=str(engine_state.PATH), help=argparse.SUPPRESS)
    i.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    import docker.errors
    import requests.exceptions

    from .. import image
    from ..variants import VariantError

    where = f"kooi image {args.action}"
    if args.action != "save" and not args.lock:
        return fail(where, "--lock LOCK is required", EXIT_USAGE)
    try:
        return {"build": _build, "save": _save, "verify": _verify, "lock": _lock,
                "variants": _variants}[args.action](args, where)
    except (image.ImageError, HostStateError, VariantError) as exc:
        return fail(where, exc)
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        # The engine's own refusal (a full disk during a load or build, among others):
        # said in one line, not as a traceback that Ansible shows as "no JSON".
        why = getattr(exc, "explanation", None) or str(exc) or exc.__class__.__name__
        return fail(where, f"the runner's engine failed: {why}")


def _variants(args: argparse.Namespace, where: str) -> int:
    """The controller's step (roles/preflight): check kooi_runner_images, pin what the
    variants' lock lacks (kooi.variants)."""
    from .. import variants

    if not args.declared or not args.base_lock:
        return fail(where, "--declared JSON and --base-lock LOCK are required", EXIT_USAGE)
    try:
        declared = json.loads(args.declared)
    except ValueError as exc:
        return fail(where, f"--declared: not JSON ({exc})", EXIT_USAGE)
    res = variants.check(declared, Path(args.lock), Path(args.base_lock), args.arch, write=not args.check)
    print(json.dumps(res))
    return EXIT_OK


def _build(args: argparse.Namespace, where: str) -> int:
    from .. import egress, engine, image

    cfg = engine_state.load(args.config)
    lock = image.load_lock(args.lock)
    ok, why = engine.ping(cfg)
    if not ok:
        return fail(where, f"the runner's engine at {cfg.socket} does not answer ({why}); "
                    "start it with `kooi engine start`", EXIT_NOT_RUNNING)
    client = engine.client(cfg, timeout=3600, operator=True)
    eg = egress_state.load_for(cfg)
    buildargs = egress.build_args(eg, cfg.mode, client) if eg and not args.check else None
    repo = "kooi-runner" if args.name == "runner" else f"kooi-runner-{args.name}"
    res = image.build(client, Path(args.context), lock, name=args.name, repo=repo, check=args.check,
                      archive_dir=Path(args.archive_dir) if args.archive_dir else None,
                      log=lambda line: print(line, file=sys.stderr), buildargs=buildargs,
                      prebuilt=Path(args.prebuilt) if args.prebuilt else None,
                      network_mode="host" if buildargs and cfg.mode == "rootless" else None)
    print(json.dumps(res))
    return EXIT_OK


def _save(args: argparse.Namespace, where: str) -> int:
    from .. import engine, image
    from ..outputs import Output, OutputError

    if not args.out:
        return fail(where, "--out FILE is required", EXIT_USAGE)
    try:
        dest = Output(args.out, "--out", binary=True)
    except OutputError as exc:
        return fail(where, exc, EXIT_USAGE)
    with dest:
        cfg = engine_state.load(args.config)
        pin = image.read_pins().get(args.name)
        if pin is None:
            return fail(where, f"no pin {args.name!r} in {image.PINS_PATH}")
        tag = image.save(engine.client(cfg, timeout=3600, operator=True), pin, dest.stream())
        dest.commit()
    print(f"{where}: {tag} ({pin.id}) -> {args.out}")
    return EXIT_OK


def _verify(args: argparse.Namespace, where: str) -> int:
    from .. import engine, image

    cfg = engine_state.load(args.config)
    lock = image.load_lock(args.lock)
    client = engine.client(cfg, timeout=600, operator=True)
    pin = image.read_pins().get(args.name)
    if pin is None:
        return fail(where, f"no pin {args.name!r} in {image.PINS_PATH}")
    problems = image.verify_image(client, pin.id, lock)
    for p in problems:
        print(f"FAIL {p}")
    print(f"{where}: {pin.id}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
    return EXIT_FAIL if problems else EXIT_OK


def _lock(args: argparse.Namespace, where: str) -> int:
    from .. import image
    from ..outputs import Output, OutputError

    lock_path = Path(args.lock)
    out = Path(args.out) if args.out else None
    try:
        Output(out or lock_path, "--out" if out else "--lock").abandon()  # writable, before any work
    except OutputError as exc:
        return fail(where, exc, EXIT_USAGE)
    if args.pin_base:
        import docker

        client = docker.from_env()
        # Any: types-docker declares an image's id `str | None`; the engine always sets it.
        img: Any = client.images.get(args.pin_base)
        image.pin_base(lock_path, img.id, out)
        print(f"pinned base {args.pin_base} = {img.id} in {out or lock_path}")
        return EXIT_OK
    if args.refresh_packages:
        import docker

        lock = image.load_lock(lock_path)
        versions = image.candidate_versions(docker.from_env(timeout=600), lock)
        changes = image.refresh_packages(lock_path, versions, out)
        for name, (old, new) in sorted(changes.items()):
            print(f"{name}: {old} -> {new}")
        print(f"{where}: {len(changes)} package pin(s) changed in {out or lock_path}")
        return EXIT_OK
    return fail(where, "nothing to do (give --pin-base IMAGE or --refresh-packages)", EXIT_USAGE)
