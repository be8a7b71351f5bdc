"""`kooi engine start|stop|status`: the runner's container engine (owner: kooi.engine)."""

from __future__ import annotations

import argparse
from typing import Any

from ..hoststate import HostStateError
from ..hoststate import engine as engine_state
from .exits import EXIT_FAIL, EXIT_NOT_RUNNING, EXIT_OK, EXIT_USAGE, fail


def register(sub: Any) -> None:
    e = sub.add_parser("engine", help="start, stop or show the runner's container engine")
    e.add_argument("action", choices=("start", "stop", "status"))
    e.add_argument("--config", default=str(engine_state.PATH),
                   help="host description written by site.yml (default: %(default)s)")
    e.add_argument("--json", action="store_true", help="print the status as JSON")
    e.add_argument("--timeout", type=float, default=90.0,
                   help="seconds to wait for the engine to answer (start)")
    e.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from .. import engine

    try:
        cfg = engine_state.load(args.config)
    except HostStateError as exc:
        return fail("kooi engine", exc, EXIT_USAGE)
    try:
        if args.action == "start":
            st = engine.start(cfg, timeout=args.timeout)
        elif args.action == "stop":
            st = engine.stop(cfg)
        else:
            st = engine.status(cfg)
    except engine.EngineError as exc:
        return fail(f"kooi engine {args.action}", exc)
    print(engine.render(st, args.json))
    if args.action == "stop":
        return EXIT_OK if not st.running else EXIT_FAIL
    if st.running and st.drift:
        return EXIT_FAIL
    return EXIT_OK if st.running else EXIT_NOT_RUNNING
