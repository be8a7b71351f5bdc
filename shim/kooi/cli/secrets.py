"""`kooi secrets list|status|start|stop|serve`: the secrets a workflow may name and
the injector outside the sandbox (owner: kooi.inject)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..hoststate import HostStateError
from ..hoststate import secrets as secrets_state
from .exits import EXIT_NOT_RUNNING, EXIT_OK, EXIT_USAGE, fail


def register(sub: Any) -> None:
    sc = sub.add_parser("secrets", help="the secrets a workflow may name and the injector that adds them "
                        "to requests outside the sandbox: list, status, start, stop, serve")
    sc.add_argument("action", choices=("list", "status", "start", "stop", "serve"),
                    help="serve: run the injector in the foreground (root; it drops to its own user)")
    sc.add_argument("--secrets-config", default=str(secrets_state.PATH),
                    help="secrets description written by site.yml (default: %(default)s)")
    sc.add_argument("--json", action="store_true")
    sc.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from .. import inject

    try:
        cfg = secrets_state.load(args.secrets_config)
    except HostStateError as exc:
        return fail("kooi secrets", exc, EXIT_USAGE)
    if cfg is None:
        return fail("kooi secrets", f"{args.secrets_config} not found: this host holds no secrets "
                    "(role secrets, kooi_secrets)", EXIT_USAGE if args.action != "status" else EXIT_NOT_RUNNING)
    try:
        if args.action == "serve":
            return inject.serve(cfg)
        if args.action == "list":
            out: dict[str, Any] = {n: {"mode": s.mode, "env": s.env, "upstream": s.upstream or None,
                                       "paths": list(s.paths) or None, "persons": list(s.persons) or None}
                                   for n, s in cfg.secrets.items()}
        elif args.action == "start":
            out = {"started": inject.start(cfg)}
        elif args.action == "stop":
            out = {"stopped": inject.stop(cfg)}
        else:
            out = inject.status(cfg)
    except inject.InjectError as exc:
        return fail(f"kooi secrets {args.action}", exc)
    if args.json or args.action in ("start", "stop"):
        print(json.dumps(out, indent=2 if args.action in ("status", "list") else None))
    elif args.action == "list":
        for n, d in out.items():
            print(f"{n}: {d['mode']} as ${d['env']}" + (f", to {d['upstream']} {' '.join(d['paths'])}"
                                                      if d["mode"] == "inject" else "")
                  + (f"; one value per person: {', '.join(d['persons'])}" if d["persons"] else ""))
    elif out["up"]:
        print(f"injector: up (pid {out['pid']}, uid {out['uid']}, {out['listen']}, {out['runs']} run(s) "
              f"registered; secrets {', '.join(out['secrets']) or 'none'})")
    else:
        print(f"injector: DOWN ({out['detail']})")
    if args.action == "status":
        return EXIT_OK if out["up"] else EXIT_NOT_RUNNING
    return EXIT_OK
