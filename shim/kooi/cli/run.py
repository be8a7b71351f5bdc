"""`kooi run WORKFLOW` and `kooi gc`: runs on this host (owner: kooi.run)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ..hoststate import HostStateError
from ..hoststate import engine as engine_state
from .exits import EXIT_FAIL, EXIT_OK, EXIT_USAGE, fail


def register(sub: Any) -> None:
    r = sub.add_parser("run", help="run a workflow on this host (for cron and pipelines)",
                       description="Run workflow NAME from /etc/kooi/workflows on a project. Exit code: the "
                       "workload's, or 2 invalid, 75 busy, 124 timeout, 125 engine/image unavailable, "
                       "126 refused by policy, 70 internal error; --json says which (reason).")
    r.add_argument("workflow", help="workflow name (a file NAME.yml in the root-owned workflow directory)")
    r.add_argument("--project", default=os.getcwd(), help="project directory (default: the current one)")
    r.add_argument("--json", metavar="FILE", help="write the JSON result to FILE")
    r.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="wait this long for a running run of the same workflow on the project (default: fail at once)")
    r.add_argument("--quiet", action="store_true", help="do not echo the workload's output (the log file has it)")
    r.add_argument("--config", default=str(engine_state.PATH), help=argparse.SUPPRESS)
    r.set_defaults(func=run_command)

    g = sub.add_parser("gc", help="remove containers, logs and results that runs left behind")
    g.add_argument("--dry-run", action="store_true")
    g.add_argument("--keep-days", type=float, default=14.0, help="keep logs and results this long")
    g.add_argument("--config", default=str(engine_state.PATH), help=argparse.SUPPRESS)
    g.set_defaults(func=gc_command)


def run_command(args: argparse.Namespace) -> int:
    from .. import run

    res = run.execute(args.workflow, Path(args.project), Path(args.json) if args.json else None,
                      wait=args.wait, echo=None if args.quiet else sys.stdout,
                      engine_config=Path(args.config))
    if res.reason not in ("ok", "failed"):
        print(f"kooi run: {res.message}", file=sys.stderr)
    return res.exit_code


def gc_command(args: argparse.Namespace) -> int:
    from .. import run

    try:
        removed = run.gc(engine_config=Path(args.config), dry_run=args.dry_run, keep_days=args.keep_days)
    except HostStateError as exc:
        return fail("kooi gc", exc, EXIT_USAGE)
    except Exception as exc:  # noqa: BLE001 - engine unreachable and the like
        return fail("kooi gc", f"{exc.__class__.__name__}: {exc}", EXIT_FAIL)
    from ..neutral import one_line
    from ..run.deadrun import DEAD
    from ..run.leftovers import WARNING

    verb = "would remove" if args.dry_run else "removed"
    # Names and messages come from what runs made (a workload named its network with
    # terminal escapes): shown, never obeyed, in root's terminal.
    for r in map(one_line, removed):
        if r.startswith(WARNING):
            print(f"kooi gc: {r}", file=sys.stderr)
        elif r.startswith(DEAD):
            print(f"kooi gc: {r}")  # a dead run's check (run.deadrun)
        else:
            print(f"{verb} {r}")
    print(f"kooi gc: {verb} {sum(1 for r in removed if not r.startswith((WARNING, *DEAD)))} item(s)")
    return EXIT_OK
