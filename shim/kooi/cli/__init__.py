"""The `kooi` command line: one module per command group, each of which parses its
arguments, calls one owner function and renders the answer (the owners live outside
this package: kooi.engine, kooi.run, kooi.verify, ...)."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from . import authz, broker, egress, engine, image, run, secrets, session, verify, workflow
from .exits import EXIT_FAIL, EXIT_NOT_RUNNING, EXIT_OK, EXIT_USAGE, Neutral

__all__ = ["EXIT_FAIL", "EXIT_NOT_RUNNING", "EXIT_OK", "EXIT_USAGE", "build_parser", "main"]

# In the order `kooi --help` lists them.
GROUPS = (engine, egress, secrets, run, session, workflow, image, verify, authz, broker)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kooi", description="kooi: run AI coding agents and their builds in a cage.")
    p.add_argument("--version", action="version", version=f"kooi {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # A command that runs another (`kooi session exec WORKFLOW -- COMMAND...`) takes
    # everything after the first `--` as it is, options of kooi's included.
    if "--" in argv:
        at = argv.index("--")
        args = parser.parse_args(argv[:at])
        if getattr(args, "tail", None) is not None:
            args.tail = argv[at + 1:]
        else:
            args = parser.parse_args(argv)
    else:
        args = parser.parse_args(argv)
    # What a command prints goes to a person's terminal, often root's: no control
    # character from anything it reports (an engine's answer, a file's name) acts there.
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Neutral(out), Neutral(err)
    try:
        rc: int = args.func(args)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = out, err
    return rc


if __name__ == "__main__":
    sys.exit(main())
