"""POL-*: the request policy in front of the engine (roles/authz on userns_remap)."""

from __future__ import annotations

import json
import shlex

from ..hoststate import paths
from ..hoststate.engine import Authz
from .core import FAIL, NA, PASS, Context, Host, Outcome, check


def _authz(ctx: Context) -> Authz | None:
    return ctx.engine.authz


NOT_ENABLED = ("kooi_authz_enabled is false: the runner's socket is guarded by userns-remap only "
               "(the runner could ask for --userns=host); workloads get kooi brokers, never this socket")


@check("POL-AUTHZ-PLUGIN", "the authorization plugin runs, dockerd uses it and it answers",
       "a daemon without its policy: any caller of the socket may ask for host root", modes=("userns_remap",))
def authz_plugin(host: Host, ctx: Context) -> Outcome:
    a = _authz(ctx)
    if not a:
        return NA, NOT_ENABLED
    unit = a.unit or "kooi-authz.service"
    svc = host.service(unit)
    if not (svc.is_running and svc.is_enabled):
        return FAIL, f"{unit}: running={svc.is_running} enabled={svc.is_enabled}"
    cfg = json.loads(host.file(ctx.engine.daemon_config).content_string)
    if a.plugin not in (cfg.get("authorization-plugins") or []):
        return FAIL, f"{ctx.engine.daemon_config} authorization-plugins={cfg.get('authorization-plugins')}"
    res = host.run(f"{shlex.quote(ctx.engine.kooi_bin)} authz health --socket {shlex.quote(a.socket)}")
    if res.rc != 0:
        return FAIL, f"kooi authz health: {(res.stderr or res.stdout).strip()[-300:]}"
    token = host.file(a.token_file or paths.AUTHZ_TOKEN)
    if not token.exists or token.user != "root" or token.mode & 0o077:
        return FAIL, f"operator token {token.path}: exists={token.exists} owner={token.user if token.exists else '-'}"
    return PASS, f"{unit} running and enabled; dockerd uses {a.plugin}; plugin healthy; token root-only"


@check("POL-AUTHZ-REFUSES", "the daemon refuses privileged, host-namespace and host-mount requests from the runner",
       "--privileged, --userns=host or -v /:/host through the runner's socket: host root",
       modes=("userns_remap",))
def authz_refuses(host: Host, ctx: Context) -> Outcome:
    if not _authz(ctx):
        return NA, NOT_ENABLED
    img = shlex.quote(ctx.probe_image)
    problems, seen = [], []
    for flags in ("--privileged", "--userns=host", "-v /:/host", "--pid=host"):
        res = host.run(ctx.as_runner(f"docker run --rm --network none {flags} {img} true"))
        seen.append(f"{flags}: rc={res.rc}")
        if res.rc == 0 or "kooi-authz" not in res.stderr:
            problems.append(f"{flags} was not refused by kooi-authz (rc={res.rc}, {res.stderr.strip()[-160:]})")
    ok = host.run(ctx.as_runner(f"docker run --rm --network none {img} true"))
    if ok.rc != 0:
        problems.append(f"an ordinary run failed: {ok.stderr.strip()[-200:]}")
    if problems:
        return FAIL, "; ".join(problems)
    return PASS, "refused with kooi-authz's reason: " + ", ".join(seen) + "; an ordinary run works"
