"""`kooi workflow check`: validate workflow files and inline definitions (owner:
kooi.workflow)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..hoststate import HostStateError
from ..hoststate import limits as limits_state
from ..hoststate import secrets as secrets_state
from .exits import EXIT_OK, EXIT_USAGE, fail


def register(sub: Any) -> None:
    w = sub.add_parser("workflow", help="validate workflow files")
    wsub = w.add_subparsers(dest="action", required=True)
    wc = wsub.add_parser("check", help="validate workflow files and inline definitions; change nothing")
    wc.add_argument("files", nargs="*", help="workflow files (NAME.yml)")
    wc.add_argument("--name", help="the name a single file will be installed under (default: its file name)")
    wc.add_argument("--inline", metavar="JSON", help="also check a JSON mapping of name to workflow definition")
    wc.add_argument("--source", default="kooi_workflows", help="what to call the --inline mapping in errors")
    wc.add_argument("--secrets", metavar="JSON", help="check secret names against this secrets description "
                    "(the form of /etc/kooi/secrets.json) instead of the host's")
    wc.add_argument("--limits", metavar="JSON", help="check limits against this limits description "
                    "(the form of /etc/kooi/limits.json) instead of the host's")
    wc.set_defaults(func=check_command)


def check_command(args: argparse.Namespace) -> int:
    from .. import workflow

    try:
        # The secrets the workflows may name: the description the roles are about to
        # write (--secrets, from kooi_secrets) or the host's own.
        store = (secrets_state.parse(args.secrets, "--secrets") if args.secrets is not None
                 else secrets_state.load())
        # The most a workflow may ask for: likewise (--limits, from kooi_workflow_*_limits).
        host_limits = (limits_state.parse(args.limits, "--limits") if args.limits is not None
                       else limits_state.load())
    except HostStateError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    bad = 0
    if args.inline is not None:
        try:
            flows = json.loads(args.inline)
        except ValueError as exc:
            return fail("--inline", f"not JSON: {exc}", EXIT_USAGE)
        if not isinstance(flows, dict):
            return fail("--inline", "expected a mapping of workflow name to definition", EXIT_USAGE)
        for name, data in flows.items():
            errors = workflow.inline_errors(name, data, f"{args.source}: {name}", store, host_limits)
            for e in errors:
                print(e, file=sys.stderr)
            bad += bool(errors)
    for f in args.files:
        try:
            wf = workflow.parse(Path(f), args.name)
            errors = workflow.secret_errors_of(wf, store) + workflow.limit_errors_of(wf, host_limits)
            if errors:
                raise workflow.WorkflowError("\n".join(errors))
            print(f"{f}: ok ({wf.name}, {wf.mode})")
        except workflow.WorkflowError as exc:
            print(exc, file=sys.stderr)
            bad += 1
    return EXIT_USAGE if bad else EXIT_OK
