"""ESC-* checks: a real container started by the runner user on its engine."""

from __future__ import annotations

import shlex
from typing import Any

from .core import FAIL, PASS, Context, Host, Outcome, check

# Opening for write (without writing: `: >` truncates, which procfs ignores) is the
# permission check the kernel makes before any sysctl write.
PROCSYS_PROBE = (
    "for f in /proc/sys/kernel/core_pattern /proc/sys/kernel/modprobe /proc/sys/vm/drop_caches "
    "/proc/sysrq-trigger; do if ( : > $f ) 2>/dev/null; then echo WRITABLE:$f; "
    "else echo DENIED:$f; fi; done"
)


def _run(host: Host, ctx: Context, args: str, cmd: str) -> Any:
    line = (f"docker run --rm --pull=never --network none --user 0 {args} "
            f"{shlex.quote(ctx.probe_image)} sh -c {shlex.quote(cmd)}")
    res = host.run(ctx.as_runner(line))
    if res.rc == 0 and not res.stdout.strip():
        # Every probe prints; an attached `docker run` of a container that ends at once
        # can lose its output (seen once on a loaded CI machine): ask once more.
        res = host.run(ctx.as_runner(line))
    return res


def _probe_ready(host: Host, ctx: Context) -> str | None:
    res = host.run(ctx.as_runner(f"docker image inspect {shlex.quote(ctx.probe_image)} >/dev/null"))
    if res.rc != 0:
        return f"probe image {ctx.probe_image} is not on the runner's engine: {res.stderr.strip()[-200:]}"
    return None


@check("ESC-USERNS-MAP", "container root maps to an unprivileged host uid",
       "container root being host root", scope="workload")
def userns_map(host: Host, ctx: Context) -> Outcome:
    if (why := _probe_ready(host, ctx)):
        return FAIL, why
    res = _run(host, ctx, "", "cat /proc/self/uid_map; id -u")
    if res.rc != 0:
        return FAIL, f"container as {ctx.runner} failed: {res.stderr.strip()[-300:]}"
    lines = [l.split() for l in res.stdout.splitlines() if len(l.split()) == 3]
    if not lines:
        return FAIL, f"no uid_map read: {res.stdout!r}"
    zero = [l for l in lines if l[0] == "0"]
    if not zero or zero[0][1] == "0":
        return FAIL, f"uid_map is the identity: {res.stdout.strip()!r}"
    return PASS, "uid_map " + " | ".join(" ".join(l) for l in lines)


@check("ESC-PROCSYS-WRITE", "container (also --privileged on rootless) cannot open global /proc/sys files for writing",
       "a container rewriting kernel settings such as core_pattern (host code execution)", scope="workload")
def procsys_write(host: Host, ctx: Context) -> Outcome:
    if (why := _probe_ready(host, ctx)):
        return FAIL, why
    variants = {"default": ""}
    if ctx.mode == "rootless":
        # rootless --privileged is still confined by the user namespace: prove it.
        variants["privileged"] = "--privileged"
    ev = []
    for name, args in variants.items():
        res = _run(host, ctx, args, PROCSYS_PROBE)
        if name == "privileged" and res.rc == 125 and "operation not permitted" in res.stderr:
            # The engine could not even create the privileged container (e.g. sysfs
            # cannot be mounted in this user namespace): nothing ran, nothing wrote.
            ev.append("privileged: the engine refused to create it ("
                      + res.stderr.strip().splitlines()[-1][-120:] + ")")
            continue
        if res.rc != 0 or "DENIED:" not in res.stdout:
            return FAIL, f"{name}: probe failed rc={res.rc}: {res.stderr.strip()[-300:]}"
        writable = [l for l in res.stdout.split() if l.startswith("WRITABLE:")]
        if writable:
            return FAIL, f"{name}: {', '.join(writable)}"
        ev.append(f"{name}: all denied")
    return PASS, "; ".join(ev)
