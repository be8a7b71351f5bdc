"""`kooi verify`: the check catalogue against a host (owner: kooi.verify)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from .exits import EXIT_FAIL, EXIT_OK, EXIT_USAGE, fail

FORMAT_HELP = {"text": "per check", "json": "docs/verify.schema.json", "junit": "JUnit XML",
               "cis": "per CIS Docker Benchmark item"}


def register(sub: Any) -> None:
    v = sub.add_parser("verify", help="run kooi's check catalogue against a host and report",
                       description="Exit 0 when no check fails, 1 when one does, 2 on usage errors.")
    v.add_argument("--hosts", default="local://", help="testinfra host spec: local://, ssh://user@host, docker://NAME")
    v.add_argument("--format", choices=tuple(FORMAT_HELP), default="text",
                   help=", ".join(f"{k} ({d})" for k, d in FORMAT_HELP.items()))
    v.add_argument("--output", help="write the report here (stdout gets the summary line)")
    v.add_argument("--probe-image", help="image for the ESC-* probes (default: the pinned runner image)")
    v.add_argument("--check", action="append", metavar="ID", help="run only this check (repeatable)")
    v.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from .. import verify
    from ..outputs import Output, OutputError

    unknown = sorted(set(args.check or []) - set(verify.known_ids()))
    if unknown:
        return fail("kooi verify", f"unknown check id(s) {', '.join(unknown)}; known: {', '.join(verify.known_ids())}",
                    EXIT_USAGE)
    try:
        # Before the checks (they take a while), not after.
        dest = Output(args.output, "--output") if args.output else None
    except OutputError as exc:
        return fail("kooi verify", exc, EXIT_USAGE)
    with dest or contextlib.nullcontext():
        try:
            report = verify.run(args.hosts, args.probe_image, args.check)
        except ImportError:
            return fail("kooi verify", "testinfra is missing (Debian: apt-get install python3-testinfra; "
                        "site.yml installs it)", EXIT_USAGE)
        except RuntimeError as exc:  # host not provisioned, unreachable backend
            return fail("kooi verify", exc, EXIT_USAGE)
        out = verify.FORMATS[args.format](report)
        if not dest:
            sys.stdout.write(out)
            return EXIT_OK if report["ok"] else EXIT_FAIL
        try:
            dest.write(out)
        except OutputError as exc:
            return fail("kooi verify", exc, EXIT_USAGE)
    print(verify.render_text(report).splitlines()[-1])
    return EXIT_OK if report["ok"] else EXIT_FAIL
