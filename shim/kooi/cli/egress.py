"""`kooi egress start|stop|reload|status|log|proxy-url`: the egress proxy and rules
(owner: kooi.egress)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from ..hoststate import HostStateError
from ..hoststate import egress as egress_state
from ..hoststate import engine as engine_state
from .exits import EXIT_NOT_RUNNING, EXIT_OK, EXIT_USAGE, fail


def register(sub: Any) -> None:
    eg = sub.add_parser("egress", help="the egress proxy and rules: start, stop, reload, status, log")
    eg.add_argument("action", choices=("start", "stop", "reload", "status", "log", "proxy-url"),
                    help="proxy-url: the proxy as a container on the engine's default bridge reaches it")
    eg.add_argument("--config", default=str(engine_state.PATH),
                    help="host description written by site.yml (proxy-url; default: %(default)s)")
    eg.add_argument("--egress-config", default=str(egress_state.PATH),
                    help="egress description written by site.yml (default: %(default)s)")
    eg.add_argument("--json", action="store_true", help="JSON output (log: one object per line)")
    eg.add_argument("--denied", action="store_true", help="log: only refused requests")
    eg.add_argument("--follow", "-f", action="store_true", help="log: keep printing new entries")
    eg.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from .. import egress

    try:
        cfg = egress_state.load(args.egress_config)
    except HostStateError as exc:
        return fail("kooi egress", exc, EXIT_USAGE)
    if cfg is None:
        return fail("kooi egress", f"{args.egress_config} not found: egress control is not configured on this "
                    "host (roles/egress, kooi_egress_enabled)", EXIT_USAGE)
    try:
        if args.action == "log":
            return _log(egress, cfg, args)
        if args.action == "proxy-url":
            from .. import engine

            ecfg = engine_state.load(args.config)
            host = egress.container_proxy_host(ecfg.mode, engine.client(ecfg, timeout=30))
            print(f"http://{host}:{cfg.port}")
            return EXIT_OK
        if args.action == "start":
            out: dict[str, Any] = egress.start(cfg)
        elif args.action == "stop":
            out = {"stopped": egress.stop(cfg)}
        elif args.action == "reload":
            egress.reload(cfg)
            out = {"reloaded": True}
        else:
            out = egress.status(cfg)
    except (egress.EgressError, HostStateError) as exc:
        return fail(f"kooi egress {args.action}", exc)
    if args.action != "status":
        print(json.dumps(out))
        return EXIT_OK
    out["rules"]["enforced_for_caller"], out["rules"]["probe"] = egress.rules_enforced(cfg)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        p, r = out["proxy"], out["rules"]
        print(f"proxy: {'up' if p['up'] else 'DOWN'} ({p['detail']})")
        if "loaded" in r:
            print(f"rules: table {r['table']} {'loaded' if r['loaded'] else 'MISSING'} (from {r['file']})")
        print(f"rules for uid {os.geteuid()}: {'enforced' if r['enforced_for_caller'] else 'not enforced'} "
              f"({r['probe']})")
    return EXIT_OK if out["proxy"]["up"] and out["rules"].get("loaded", True) else EXIT_NOT_RUNNING


def _log(egress: Any, cfg: Any, args: argparse.Namespace) -> int:
    try:
        for entry in egress.read_log(cfg, denied_only=args.denied, follow=args.follow):
            print(json.dumps(entry) if args.json else egress.format_entry(entry), flush=True)
    except PermissionError as exc:
        return fail("kooi egress log", f"{exc}; the log is readable by root and the proxy's group")
    except KeyboardInterrupt:
        pass
    return EXIT_OK
