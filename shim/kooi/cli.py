"""The `kooi` command line."""

from __future__ import annotations

import argparse
import sys

from . import __version__, engine, hostconfig

# Exit codes shared by every subcommand (documented in docs/cli.md).
EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_NOT_RUNNING = 3


def _engine(args: argparse.Namespace) -> int:
    try:
        cfg = hostconfig.load(args.config)
    except hostconfig.ConfigError as exc:
        print(f"kooi engine: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.action == "start":
            st = engine.start(cfg, timeout=args.timeout)
        elif args.action == "stop":
            st = engine.stop(cfg)
        else:
            st = engine.status(cfg)
    except engine.EngineError as exc:
        print(f"kooi engine {args.action}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    print(engine.render(st, args.json))
    if args.action == "stop":
        return EXIT_OK if not st.running else EXIT_FAIL
    return EXIT_OK if st.running else EXIT_NOT_RUNNING


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kooi", description=__doc__)
    p.add_argument("--version", action="version", version=f"kooi {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("engine", help="start, stop or show the runner's container engine")
    e.add_argument("action", choices=("start", "stop", "status"))
    e.add_argument("--config", default=str(hostconfig.DEFAULT_PATH),
                   help="host description written by site.yml (default: %(default)s)")
    e.add_argument("--json", action="store_true", help="print the status as JSON")
    e.add_argument("--timeout", type=float, default=engine.START_TIMEOUT,
                   help="seconds to wait for the engine to answer (start)")
    e.set_defaults(func=_engine)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
