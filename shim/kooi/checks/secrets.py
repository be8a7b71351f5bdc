"""HOST-SECRETS-*: the secrets store and the injector (roles/secrets; docs/agents.md).

The store must be root's alone: neither the runner nor its subordinate uids (the
workloads' host ids) may list or read it. Where the host holds secrets, the injector
must answer, run as its own unprivileged user with no_new_privs and no capabilities,
and the description it serves from must be root-owned."""

from __future__ import annotations

import json
import shlex

from ..hoststate import paths
from ..hoststate.secrets import parse
from .core import FAIL, NA, PASS, Context, Host, Outcome, check

STORE = paths.SECRETS_DIR
DESCRIPTION = paths.SECRETS


def _mode(f: Host) -> int:
    return int(f.mode) & 0o7777


@check("HOST-SECRETS-STORE", "the secrets store is root's alone: the runner and its subordinate uids can neither "
       "list nor read it", "a workload (or the runner) reads an API key or password it was only meant to use "
       "through the injector")
def secrets_store(host: Host, ctx: Context) -> Outcome:
    d = host.file(STORE)
    if not d.exists:
        return FAIL, f"{STORE} is missing: role secrets has not run on this host (re-run site.yml)"
    bad = []
    if not d.is_directory or d.user != "root" or _mode(d) & 0o077:
        bad.append(f"{STORE} is {d.user}:{d.group} {_mode(d):04o} (want a root directory, 0700)")
    listing = host.run(f"find {shlex.quote(STORE)} -mindepth 1 -maxdepth 1")
    names = [p for p in listing.stdout.split() if p]
    for p in names:
        f = host.file(p)
        if f.user != "root" or _mode(f) & 0o077 or not f.is_file:
            bad.append(f"{p} is {f.user}:{f.group} {_mode(f):04o} (want a root file, 0600)")
    script = f"ls {shlex.quote(STORE)} >/dev/null 2>&1 && echo LISTED; " + " ".join(
        f"cat {shlex.quote(p)} >/dev/null 2>&1 && echo READ;" for p in names)
    for who, prefix in (("the runner", ""), ("a subordinate uid", "unshare --user --map-auto --setuid 0 --setgid 0 ")):
        out = host.run(ctx.as_runner(f"{prefix}sh -c {shlex.quote(script)}")).stdout
        if "LISTED" in out or "READ" in out:
            bad.append(f"{who} can {'read a secret in' if 'READ' in out else 'list'} {STORE}")
    if bad:
        return FAIL, "; ".join(bad)
    return PASS, (f"{STORE} root 0700 with {len(names)} secret(s), each root 0600; the runner and a subordinate uid "
                  "can neither list nor read it")


@check("HOST-SECRETS-INJECTOR", "where the host holds secrets, the injector answers, runs as its own unprivileged "
       "user with no_new_privs and no capabilities, from a root-owned description",
       "a missing injector (agents fail or operators fall back to keys in the environment); an injector running "
       "as root or with capabilities")
def secrets_injector(host: Host, ctx: Context) -> Outcome:
    f = host.file(DESCRIPTION)
    if not f.exists:
        return NA, f"no {DESCRIPTION}: this host holds no secrets (kooi_secrets is empty)"
    if f.user != "root" or _mode(f) & 0o022:
        return FAIL, f"{DESCRIPTION} is {f.user} {_mode(f):04o} (want root, not group/world-writable)"
    cfg = parse(f.content_string, DESCRIPTION)
    kooi = ctx.engine.kooi_bin
    res = host.run(f"{shlex.quote(kooi)} secrets status --json")
    try:
        st = json.loads(res.stdout)
    except ValueError:
        return FAIL, f"kooi secrets status failed: {res.stderr.strip()[-200:]}"
    if not st.get("up"):
        return FAIL, f"the injector is down ({st.get('detail', '')}); kooi secrets start (root) or re-run site.yml"
    status = host.file(f"/proc/{int(st['pid'])}/status").content_string
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    uids = fields.get("Uid", "").split()
    bad = []
    if not uids or "0" in uids:
        bad.append(f"it runs with uids {uids}")
    if fields.get("NoNewPrivs", "").strip() != "1":
        bad.append("no_new_privs is not set")
    if int(fields.get("CapEff", "0").strip() or "0", 16) or int(fields.get("CapPrm", "0").strip() or "0", 16):
        bad.append(f"it holds capabilities (CapEff {fields.get('CapEff', '').strip()})")
    user = host.run(f"id -un {uids[0] if uids else 0}").stdout.strip()
    if user != cfg.injector.user:
        bad.append(f"it runs as {user}, not {cfg.injector.user}")
    sock = host.file(cfg.injector.control)
    if sock.exists and (_mode(sock) & 0o007):
        bad.append(f"{cfg.injector.control} is {_mode(sock):04o} (others may connect)")
    if bad:
        return FAIL, "; ".join(bad)
    return PASS, (f"pid {st['pid']} as {user} (no_new_privs, no capabilities) on {st['listen']}, serving "
                  f"{', '.join(st['secrets'])}")
