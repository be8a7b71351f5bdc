"""NET-* and POL-EGRESS: host-side egress control (roles/egress). Nothing here sends
traffic off the host: the probes target closed loopback ports and the proxy itself,
which refuses the names and addresses they ask for before any lookup."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from typing import Any

from ..hoststate import subids
from ..hoststate.egress import EgressConfig, missing_message
from .core import FAIL, NA, PASS, Context, Host, Outcome, check

DISABLED = ("egress control is off by intent (kooi_egress_enabled=false, recorded in engine.json): workflows with "
            "network: proxy are refused; testcontainers workloads reach anything their engine's NAT reaches")

PROBE = ("import socket,errno\ns=socket.socket()\ns.settimeout(5)\ntry:\n s.connect(('127.0.0.1',{port}))\n"
         " print('connected')\nexcept OSError as e:\n print(errno.errorcode.get(e.errno,str(e)))\n")

PROXY_ASK = ("import socket\ns=socket.create_connection(('127.0.0.1',{port}),timeout=10)\n"
             "s.sendall(b'{req} HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n')\n"
             "print(s.recv(200).split(b'\\r\\n')[0].decode())\n")


EgressCheckFunc = Callable[[Host, Context, EgressConfig], Outcome]


def egress_check(id: str, title: str, threat: str) -> Callable[[EgressCheckFunc], EgressCheckFunc]:
    """A check that applies where egress control is meant to be on (engine.json's
    `egress`, from kooi_egress_enabled); it gets the host's egress description as a
    third argument. Meant to be on but not described is a failure, not "n/a"."""
    def deco(func: EgressCheckFunc) -> EgressCheckFunc:
        def run(host: Host, ctx: Context) -> Outcome:
            if not ctx.engine.egress:
                return NA, DISABLED
            eg = ctx.described(host, "egress")
            if eg is None or not eg.enabled:
                return FAIL, missing_message()
            return func(host, ctx, eg)
        run.__name__ = func.__name__
        check(id, title, threat)(run)
        return func
    return deco


def _subuid_ranges(host: Host, user: str) -> list[tuple[int, int]]:
    return subids.ranges_of(host.file("/etc/subuid").content_string, user, "/etc/subuid")


def _probe(host: Host, prefix: str = "", port: int = 9) -> str:
    code = shlex.quote(PROBE.format(port=port))
    res = host.run(f"{prefix} python3 -I -c {code}")
    return res.stdout.strip() or f"(no result: rc={res.rc} {res.stderr.strip()[-160:]})"


@egress_check("NET-EGRESS-RULES", "kooi's nftables table is loaded and confines the runner and its subordinate uids",
       "a runner workload (or a subordinate uid) connects anywhere: exfiltration, lateral movement, metadata")
def egress_rules(host: Host, ctx: Context, eg: EgressConfig) -> Outcome:
    table = eg.table
    res = host.run(f"nft -j list table inet {shlex.quote(table)}")
    if res.rc != 0:
        return FAIL, f"table inet {table} is not loaded ({res.stderr.strip()[:200]}); run kooi egress start or site.yml"
    items = json.loads(res.stdout).get("nftables", [])
    elems: list[Any] = next((i["set"].get("elem", []) for i in items if "set" in i and i["set"].get("name") == "runner_uids"), [])
    have: list[tuple[int, int]] = []
    for e in elems:
        if isinstance(e, int):
            have.append((e, e))
        elif isinstance(e, dict) and "range" in e:
            have.append((int(e["range"][0]), int(e["range"][1])))
    uid = int(ctx.engine.runner_uid)
    want = [(uid, uid)] + _subuid_ranges(host, ctx.runner)
    missing = [w for w in want if not any(lo <= w[0] and w[1] <= hi for lo, hi in have)]
    if missing:
        return FAIL, f"runner_uids {have} does not cover {missing} (the runner and its /etc/subuid ranges)"
    chains = {i["chain"]["name"] for i in items if "chain" in i}
    need = {"output"} | ({"forward", "input"} if ctx.mode == "userns_remap" else set())
    if not need <= chains:
        return FAIL, f"chains {sorted(chains)} lack {sorted(need - chains)}"
    return PASS, f"table inet {table}: runner_uids {have}; chains {sorted(chains)}"


@egress_check("NET-EGRESS-CONFINED", "the runner and a subordinate uid are rejected off the proxy port; root is not",
       "rules that exist but do not apply (wrong uid, a subuid bypass via unshare --map-auto)")
def egress_confined(host: Host, ctx: Context, eg: EgressConfig) -> Outcome:
    as_runner = _probe(host, ctx.runner_prefix)
    if host.run("command -v newuidmap").rc == 0:
        as_subuid = _probe(host, f"{ctx.runner_prefix} unshare --user --map-auto --setuid 0 --setgid 0")
    else:
        # Without the setuid helper nobody can map subordinate ids: no such bypass.
        as_subuid = "EHOSTUNREACH (no newuidmap: the runner cannot switch to a subordinate uid)"
    as_root = _probe(host)
    to_proxy = _probe(host, ctx.runner_prefix, port=eg.port)
    seen = f"runner: {as_runner}, subordinate uid: {as_subuid}, root: {as_root}, runner to the proxy: {to_proxy}"
    if as_runner != "EHOSTUNREACH" or not as_subuid.startswith("EHOSTUNREACH"):
        return FAIL, seen
    if as_root == "EHOSTUNREACH":
        return FAIL, seen + " (root is confined too: the rules match more than the runner)"
    if to_proxy != "connected":
        return FAIL, seen + " (the proxy is down or not reachable for the runner)"
    return PASS, seen


@egress_check("NET-EGRESS-PROXY", "the proxy runs with kooi's configuration and refuses unlisted names and IP literals",
       "an open proxy, or one that forwards to any name or address")
def egress_proxy(host: Host, ctx: Context, eg: EgressConfig) -> Outcome:
    port = eg.port
    problems = []
    for path in (eg.squid_config, eg.allowlist):
        f = host.file(path)
        if not f.exists or f.user != "root" or f.mode & 0o027:
            problems.append(f"{path}: exists={f.exists} owner={f.user if f.exists else '-'} "
                            f"mode={oct(f.mode) if f.exists else '-'} (want root, no group write, no access for others)")
    answers = {}
    for req in ("GET http://kooi-verify.invalid/", "CONNECT 127.0.0.1:443", "CONNECT kooi-verify.invalid:8443"):
        code = shlex.quote(PROXY_ASK.format(port=port, req=req))
        res = host.run(f"python3 -I -c {code}")
        answers[req] = res.stdout.strip() if res.rc == 0 else f"error: {res.stderr.strip()[-120:]}"
        if " 403 " not in answers[req] + " ":
            problems.append(f"{req}: {answers[req]} (want 403)")
    if problems:
        return FAIL, "; ".join(problems)
    return PASS, "; ".join(f"{k} -> {v}" for k, v in answers.items())


@egress_check("POL-EGRESS", "the runner can neither read nor change the egress rules or the allowlist",
       "a workload widens its own egress or learns what it may reach")
def egress_policy(host: Host, ctx: Context, eg: EgressConfig) -> Outcome:
    problems = []
    for cmd in (f"cat {shlex.quote(eg.allowlist)}", "nft list ruleset",
                f"nft delete table inet {shlex.quote(eg.table)}",
                f"touch {shlex.quote(eg.allowlist)}"):
        res = host.run(f"{ctx.runner_prefix} {cmd}")
        if res.rc == 0:
            problems.append(f"the runner could: {cmd}")
    if problems:
        return FAIL, "; ".join(problems)
    return PASS, "the runner cannot read the allowlist, list or delete the rules, or write the allowlist"
