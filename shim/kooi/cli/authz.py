"""`kooi authz serve|health`: the Docker authorization plugin (owner: kooi.authz)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ..hoststate import HostStateError, paths
from ..hoststate import limits as limits_state
from .exits import EXIT_FAIL, EXIT_OK, EXIT_USAGE, fail


def register(sub: Any) -> None:
    a = sub.add_parser("authz", help="serve or check the Docker authorization plugin (kooi's request policy)",
                       description="serve: the plugin, until interrupted. health: exit 0 if the plugin "
                       "answers as dockerd expects, 1 (with the reason) if not.")
    a.add_argument("action", choices=("serve", "health"))
    a.add_argument("--socket", default=paths.AUTHZ_SOCKET,
                   help="plugin socket; dockerd finds it by name in /run/docker/plugins (default: %(default)s)")
    a.add_argument("--workspace-root", action="append", default=None,
                   help="bind mounts must resolve below this directory (repeatable; default: no bind mounts)")
    a.add_argument("--socket-dir", default=None,
                   help="sockets directly in this directory may be mounted (kooi run's brokers)")
    a.add_argument("--socket-group", default=None,
                   help="group that may connect (the engine socket's group: health checks as the runner)")
    a.add_argument("--runtime", action="append", default=[], metavar="NAME",
                   help="a further OCI runtime containers may name, besides runc (repeatable; roles/gvisor: runsc)")
    a.add_argument("--token-file", default=None,
                   help="root-only file with the operator token: requests carrying it (header "
                   "X-Kooi-Token; site.yml's image builds) are allowed")
    a.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from .. import apparmor, authz
    from ..policy import Policy
    from ..run.limits import host_ceilings

    if args.action == "health":
        ok, why = authz.health(Path(args.socket))
        print(f"kooi authz: {'healthy' if ok else why}", file=sys.stdout if ok else sys.stderr)
        return EXIT_OK if ok else EXIT_FAIL
    roots = args.workspace_root or []
    for name, value in [("--workspace-root", r) for r in roots] + [("--socket-dir", args.socket_dir)]:
        if value and not os.path.isabs(value):
            return fail("kooi authz", f"{name} must be an absolute path", EXIT_USAGE)
    try:
        token = authz.read_token(Path(args.token_file) if args.token_file else None)
    except OSError as exc:
        return fail("kooi authz", f"cannot use the token file: {exc}")
    try:
        ceilings = host_ceilings(limits_state.load())
    except HostStateError as exc:
        return fail("kooi authz", exc)
    try:
        policy = Policy(workspace=roots[0] if roots else None, extra_workspaces=tuple(roots[1:]),
                        socket_dir=args.socket_dir,
                        apparmor_profiles=apparmor.host_profiles(lambda m: fail("kooi", m)),
                        limits=ceilings,
                        runtimes=tuple(dict.fromkeys(("runc", "io.containerd.runc.v2", *args.runtime))),
                        limits_are="this host's maximum (kooi_workflow_max_limits)")
        authz.serve(Path(args.socket), policy, token=token, group=args.socket_group)
    except KeyboardInterrupt:
        pass
    except (OSError, KeyError) as exc:
        return fail("kooi authz", f"cannot serve on {args.socket}: {exc}")
    return EXIT_OK
