"""`kooi broker serve`: one run's policed engine socket, for debugging and tests
(owner: kooi.broker; `kooi run` starts its own)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..hoststate import HostStateError
from ..hoststate import engine as engine_state
from .exits import EXIT_OK, EXIT_USAGE, fail


def register(sub: Any) -> None:
    b = sub.add_parser("broker", help="serve a policed engine socket for one run (kooi run does this itself)",
                       description="Serve the request policy, labels and ownership rules of one run on a unix "
                       "socket in front of the runner's engine until SIGTERM. `kooi run` starts one per "
                       "testcontainers workflow; this command is for debugging and tests.")
    b.add_argument("action", choices=("serve",))
    b.add_argument("--socket", required=True, help="the socket to serve (created 0660 unless --mode)")
    b.add_argument("--workspace", required=True, help="bind mounts must resolve below this directory")
    b.add_argument("--run-id", required=True, help="label value for everything created through the broker")
    b.add_argument("--upstream", help="the engine's socket (default: the runner's, from --config)")
    b.add_argument("--network", help="network for containers that name none (default: the engine's)")
    b.add_argument("--map-workspace", action="store_true",
                   help="translate bind sources under /workspace to --workspace (as in a run)")
    b.add_argument("--mode", default="660", help="socket permissions, octal (default: %(default)s)")
    b.add_argument("--cleanup", action="store_true",
                   help="on exit, remove everything labelled with the run id and print a JSON summary")
    b.add_argument("--limits", metavar="JSON", help="the run's limits, as a workflow's `limits` (the rest: the "
                   "host's defaults): forced on containers that name none, refused above")
    b.add_argument("--config", default=str(engine_state.PATH), help=argparse.SUPPRESS)
    b.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    import signal
    import threading
    from pathlib import Path

    from .. import broker, labels
    from ..policy import Policy
    from ..run.limits import broker_ceilings

    for name, value in (("--workspace", args.workspace), ("--socket", args.socket)):
        if not os.path.isabs(value):
            return fail("kooi broker", f"{name} must be an absolute path", EXIT_USAGE)
    upstream = args.upstream
    if not upstream:
        try:
            upstream = engine_state.load(Path(args.config)).socket
        except HostStateError as exc:
            return fail("kooi broker", f"{exc}; or pass --upstream", EXIT_USAGE)
    ceilings: dict[str, int] = {}
    if args.limits is not None:
        try:
            ceilings = broker_ceilings(args.limits, upstream)
        except (ValueError, OSError) as exc:
            return fail("kooi broker", f"--limits: {exc}", EXIT_USAGE)
    scope = broker.RunScope(args.run_id, labels.nested_labels(args.run_id), network=args.network,
                            path_map={"/workspace": args.workspace} if args.map_workspace else {},
                            limits=dict(ceilings))
    b = broker.Broker(args.socket, upstream, Policy(workspace=args.workspace, limits=dict(ceilings), whole_roots=True),
                      scope,
                      log=lambda m: print(f"kooi broker: {m}", file=sys.stderr, flush=True))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        b.start(mode=int(args.mode, 8))
    except OSError as exc:
        return fail("kooi broker", f"cannot serve on {args.socket}: {exc}")
    print(f"kooi broker: serving {args.socket} -> {upstream} (run {args.run_id}, workspace {args.workspace})",
          file=sys.stderr, flush=True)
    stop.wait()
    b.stop()
    if args.cleanup:
        removed = broker.cleanup(upstream, args.run_id)
        print(json.dumps({"broker": b.summary(), "cleanup": removed}), flush=True)
    return EXIT_OK
