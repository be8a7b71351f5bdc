"""HOST-* checks: the runner user, subordinate ids, the engine and its files."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any

from ..hoststate import paths, subids
from .core import FAIL, NA, PASS, Context, Host, Outcome, check

SUDO_GROUPS = ("sudo", "admin", "wheel", "root")
MIN_SUBIDS = 65536


def _groups(host: Host, user: str) -> list[str]:
    groups: list[str] = host.user(user).groups
    return groups


@check("HOST-RUNNER-USER", "runner user exists and is not root",
       "a workload running as uid 0 on the host")
def runner_user(host: Host, ctx: Context) -> Outcome:
    u = host.user(ctx.runner)
    if not u.exists:
        return FAIL, f"user {ctx.runner} does not exist"
    if u.uid == 0 or u.gid == 0:
        return FAIL, f"{ctx.runner} has uid {u.uid} gid {u.gid}"
    if u.uid != ctx.engine.runner_uid:
        return FAIL, f"{ctx.runner} has uid {u.uid}, host description says {ctx.engine.runner_uid}"
    return PASS, f"{ctx.runner} uid={u.uid} gid={u.gid} home={u.home}"


@check("HOST-RUNNER-NOSUDO", "runner user has no sudo rights",
       "the workload escalating to host root through sudo")
def runner_nosudo(host: Host, ctx: Context) -> Outcome:
    bad = sorted(set(_groups(host, ctx.runner)) & set(SUDO_GROUPS))
    if bad:
        return FAIL, f"{ctx.runner} is in group(s) {', '.join(bad)}"
    if not host.exists("sudo"):
        return PASS, "sudo is not installed; no admin group membership"
    res = host.run(f"sudo -n -l -U {shlex.quote(ctx.runner)}")
    out = (res.stdout + res.stderr).strip()
    if "not allowed to run sudo" in out:
        return PASS, out.splitlines()[-1]
    return FAIL, f"sudo -l -U {ctx.runner} lists rights: {out[-300:]}"


@check("HOST-RUNNER-NODOCKER", "runner user is not in group docker",
       "group docker reaches the rootful daemon: host root")
def runner_nodocker(host: Host, ctx: Context) -> Outcome:
    groups = _groups(host, ctx.runner)
    if "docker" in groups:
        return FAIL, f"{ctx.runner} is in group docker (groups: {', '.join(groups)})"
    return PASS, f"groups of {ctx.runner}: {', '.join(groups)}"


def _parse_subids(text: str, path: str) -> list[tuple[str, int, int]]:
    return subids.entries(text, path)


@check("HOST-SUBID-RANGES", "managed users have exactly one large enough subuid/subgid range",
       "a too small or duplicated range lets container ids fall outside the mapping or collide")
def subid_ranges(host: Host, ctx: Context) -> Outcome:
    ev = []
    for path in ("/etc/subuid", "/etc/subgid"):
        entries = _parse_subids(host.file(path).content_string, path)
        for user in ctx.managed_subid_users:
            mine = [e for e in entries if e[0] == user]
            if len(mine) != 1:
                return FAIL, f"{path}: {user} has {len(mine)} ranges {mine}"
            if mine[0][2] < MIN_SUBIDS:
                return FAIL, f"{path}: {user} has only {mine[0][2]} ids (< {MIN_SUBIDS})"
            ev.append(f"{path} {user}:{mine[0][1]}:{mine[0][2]}")
    return PASS, "; ".join(ev)


@check("HOST-SUBID-NOOVERLAP", "subordinate id ranges overlap neither each other nor real accounts",
       "two users' containers sharing host ids, or container root mapping onto a real account")
def subid_nooverlap(host: Host, ctx: Context) -> Outcome:
    uids = {int(l.split(":")[2]): l.split(":")[0]
            for l in host.file("/etc/passwd").content_string.splitlines() if l.count(":") >= 6}
    gids = {int(l.split(":")[2]): l.split(":")[0]
            for l in host.file("/etc/group").content_string.splitlines() if l.count(":") >= 3}
    # By design: the workload's gid on the remapped engine has a host group with gVisor
    # (kooi_gvisor_group: gVisor ignores ACLs, so a gVisor run's project is given to it).
    by_design = ctx.engine.gvisor.group if ctx.engine.gvisor else 0
    note = f"; {gids.pop(by_design)} (gid {by_design}) is gVisor's workload gid by design" \
        if by_design and by_design in gids else ""
    for path, ids in (("/etc/subuid", uids), ("/etc/subgid", gids)):
        entries = sorted(_parse_subids(host.file(path).content_string, path), key=lambda e: e[1])
        for a, b in zip(entries, entries[1:]):
            if a[1] + a[2] > b[1]:
                return FAIL, f"{path}: {a[0]}:{a[1]}:{a[2]} overlaps {b[0]}:{b[1]}:{b[2]}"
        for name, start, count in entries:
            hit = sorted(i for i in ids if start <= i < start + count)
            if hit:
                return FAIL, (f"{path}: {name}:{start}:{count} contains the id {hit[0]} of "
                              f"account {ids[hit[0]]}")
    return PASS, "no overlapping ranges; no range contains an account's id" + note


def _engine_info(host: Host, ctx: Context) -> dict[str, Any]:
    if "info" not in ctx.cache:
        res = host.run(ctx.as_runner("docker info --format '{{json .}}'"))
        if res.rc != 0:
            raise RuntimeError(f"docker info as {ctx.runner} failed: {res.stderr.strip()[-300:]}")
        ctx.cache["info"] = json.loads(res.stdout)
    info: dict[str, Any] = ctx.cache["info"]
    return info


@check("HOST-ENGINE-ROOTLESS", "the rootless daemon runs as the runner user",
       "a daemon running as root: container root would be host root", modes=("rootless",))
def engine_rootless(host: Host, ctx: Context) -> Outcome:
    res = host.run("ps -ww -eo user:32=,args= | grep -E '[d]ockerd( |$)'")
    procs = [l.split(None, 1) for l in res.stdout.splitlines()]
    mine = [p for p in procs if p[0] == ctx.runner]
    if not mine:
        return FAIL, f"no dockerd owned by {ctx.runner}; processes: {procs}"
    info = _engine_info(host, ctx)
    opts = info.get("SecurityOptions") or []
    if not any("rootless" in o for o in opts):
        return FAIL, f"daemon on {ctx.engine.socket} does not report rootless: {opts}"
    if f"--config-file {ctx.engine.daemon_config}" not in mine[0][1]:
        return FAIL, f"dockerd does not run with the root-owned config: {mine[0][1]}"
    return PASS, f"dockerd as {ctx.runner}: {mine[0][1][:160]}; security options {opts}"


@check("HOST-ENGINE-USERNS-REMAP", "the rootful daemon remaps container root",
       "container root being host root", modes=("userns_remap",))
def engine_remap(host: Host, ctx: Context) -> Outcome:
    info = _engine_info(host, ctx)
    opts = info.get("SecurityOptions") or []
    if not any(o.startswith("name=userns") for o in opts):
        return FAIL, f"daemon security options lack userns: {opts}"
    return PASS, f"security options {opts}; docker root {info.get('DockerRootDir')}"


def daemon_json(host: Host, ctx: Context) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads(host.file(ctx.engine.daemon_config).content_string)
    return cfg


@check("HOST-DAEMON-SETTINGS", "daemon settings: no-new-privileges, icc off, no userland proxy, log rotation (+ remap: live-restore)",
       "containers gaining privileges through setuid files, talking to each other, filling the disk")
def daemon_settings(host: Host, ctx: Context) -> Outcome:
    cfg = daemon_json(host, ctx)
    want = {"no-new-privileges": True, "icc": False, "userland-proxy": False}
    if ctx.mode == "userns_remap":
        want["live-restore"] = True
    wrong = {k: cfg.get(k) for k, v in want.items() if cfg.get(k) != v}
    logopts = cfg.get("log-opts") or {}
    if cfg.get("log-driver", "json-file") in ("json-file", "local") and "max-size" not in logopts:
        wrong["log-opts.max-size"] = None
    if ctx.mode == "userns_remap" and not cfg.get("userns-remap"):
        wrong["userns-remap"] = cfg.get("userns-remap")
    if wrong:
        return FAIL, f"{ctx.engine.daemon_config}: wrong or missing {wrong}"
    return PASS, f"{ctx.engine.daemon_config}: " + json.dumps({k: cfg.get(k) for k in sorted(cfg)})


@check("HOST-ENGINE-DRIFT", "the running daemon runs as configured: engine mode (userns-remap or rootless), default "
       "seccomp profile, storage driver, authorization plugins",
       "a mode switch or a changed daemon.json that never reached the running daemon: the host claims a confinement "
       "its engine does not apply")
def engine_drift(host: Host, ctx: Context) -> Outcome:
    from ..drift import drift

    info = _engine_info(host, ctx)
    try:
        cfg = daemon_json(host, ctx)
    except (ValueError, OSError) as exc:
        return FAIL, f"{ctx.engine.daemon_config}: cannot read it: {exc}"
    found = drift(ctx.engine, info, cfg)
    if found:
        return FAIL, "; ".join(found) + ": `kooi engine start` restarts it with its configuration (or re-run site.yml)"
    sec = [o for o in info.get("SecurityOptions") or [] if not o.startswith("name=cgroupns")]
    return PASS, f"as configured: {', '.join(sec)}; storage driver {info.get('Driver')}; authorization plugins " \
                 f"{((info.get('Plugins') or {}).get('Authorization')) or 'none'}"


def _stat_tree(host: Host, paths: Sequence[str]) -> dict[str, tuple[bool, bool, int, int]]:
    """(exists, is a symlink, uid, mode) of each path and of every parent directory, in one
    command on the host (one stat per path, not one round trip per property)."""
    every = []
    for path in paths:
        p = path
        while p not in ("", "/"):
            every.append(p)
            p = p.rsplit("/", 1)[0]
    every = list(dict.fromkeys(every))
    script = ('for p in "$@"; do e=0; l=0; [ -e "$p" ] && e=1; [ -L "$p" ] && l=1; '
              'printf "%s|%s|%s|%s\\n" "$p" "$e" "$l" "$(stat -c "%u %a" -- "$p" 2>/dev/null)"; done')
    out = host.run("sh -c " + shlex.quote(script) + " kooi " + " ".join(map(shlex.quote, every))).stdout
    info = {}
    for line in out.splitlines():
        path, exists, link, ids = line.rsplit("|", 3)
        uid, _, mode = ids.partition(" ")
        info[path] = (exists == "1", link == "1", int(uid or -1), int(mode or "0", 8))
    return info


@check("HOST-ENGINE-FILES", "engine configuration, unit and binaries are root-owned and not writable by others",
       "the runner (or a workload as the runner) restarting its engine with weaker settings")
def engine_files(host: Host, ctx: Context) -> Outcome:
    bad, seen = [], []
    paths = ctx.engine.managed_files
    info = _stat_tree(host, paths)
    for path in paths:
        if not info[path][0]:
            bad.append(f"{path} missing")
            continue
        p = path
        while p not in ("", "/"):
            exists, link, uid, mode = info[p]
            if exists and not link:
                if uid != 0 or mode & 0o022:
                    bad.append(f"{p} owner uid {uid} mode {oct(mode)}")
            p = p.rsplit("/", 1)[0]
        seen.append(path)
    if not seen and not bad:
        return FAIL, "the host description lists no managed files"
    if bad:
        return FAIL, "; ".join(sorted(set(bad)))
    return PASS, "root-owned, not group/world-writable: " + ", ".join(seen)


@check("HOST-ENGINE-SOCKET", "engine socket owned and moded correctly",
       "other local users reaching the engine API")
def engine_socket(host: Host, ctx: Context) -> Outcome:
    sock = host.file(ctx.engine.socket)
    if not sock.exists or not sock.is_socket:
        return FAIL, f"{ctx.engine.socket} is not a socket (engine not running?)"
    if ctx.mode == "rootless":
        d = host.file(ctx.engine.socket.rsplit("/", 1)[0])
        if d.uid != ctx.engine.runner_uid or d.mode & 0o077:
            return FAIL, f"{d.path} uid {d.uid} mode {oct(d.mode)}: must be the runner's, 0700"
        return PASS, f"{sock.path} in {d.path} (uid {d.uid}, mode {oct(d.mode)})"
    group = ctx.engine.socket_group or "docker"
    if sock.uid != 0 or sock.group != group or sock.mode & 0o007:
        return FAIL, f"{sock.path}: uid {sock.uid} group {sock.group} mode {oct(sock.mode)}"
    return PASS, f"{sock.path}: root:{sock.group} {oct(sock.mode)}"


CONNECT = ("python3 -I -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); "
           "s.connect(sys.argv[1]); print(\"CONNECTED\")' {}")


@check("HOST-ROOTFUL-SOCKET", "no rootful engine socket is reachable by the runner user",
       "the runner (or a jailed build) becoming host root through a rootful daemon")
def rootful_socket(host: Host, ctx: Context) -> Outcome:
    ev = []
    for path in ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock",
                 "/run/podman/podman.sock"):
        if not host.file(path).exists:
            continue
        res = host.run(f"{ctx.runner_prefix} " + CONNECT.format(shlex.quote(path)))
        if "CONNECTED" in res.stdout:
            if ctx.mode == "userns_remap" and path.endswith("docker.sock") and \
                    host.file(path).group == ctx.engine.socket_group:
                ev.append(f"{path} reachable by design (userns-remap engine; requests are remapped"
                          " — the authz policy closes --userns=host)")
                continue
            return FAIL, f"{ctx.runner} can connect to {path}"
        ev.append(f"{path}: refused ({(res.stderr.strip().splitlines() or ['?'])[-1][-80:]})")
    return PASS, "; ".join(ev) or "no rootful socket present"


@check("HOST-STORAGE-DRIVER", "storage driver is the one chosen from host facts (overlay preferred)",
       "silent vfs fallback (10x slower), or fuse-overlayfs without the operator's opt-in")
def storage_driver(host: Host, ctx: Context) -> Outcome:
    info = _engine_info(host, ctx)
    got, want = info.get("Driver"), ctx.engine.storage_driver
    if got != want:
        return FAIL, f"engine uses {got}, the role chose {want}"
    if got == "vfs":
        return PASS, "vfs (last resort chosen by the role: slow and disk-hungry)"
    return PASS, f"storage driver {got}, backing {dict(info.get('DriverStatus') or [])}"


FUSE_OPEN = ("python3 -I -c 'import os,errno\ntry:\n os.close(os.open(\"/dev/fuse\", os.O_RDWR)); print(\"OPENED\")\n"
             "except OSError as e:\n print(errno.errorcode.get(e.errno, str(e)))'")


@check("HOST-FUSE", "/dev/fuse is usable by the runner only when the operator opted in (kooi_fuse_enabled)",
       "FUSE mounts by the runner or a workload: kernel attack surface (race windows, crafted metadata)")
def fuse_device(host: Host, ctx: Context) -> Outcome:
    state = ctx.described(host, "fuse")
    if state is None:
        return FAIL, f"{paths.FUSE} is missing: role fuse has not run on this host (re-run site.yml)"
    enabled = state.enabled
    dev = host.file("/dev/fuse")
    opened = host.run(f"{ctx.runner_prefix} {FUSE_OPEN}").stdout.strip() \
        if dev.exists else "ENOENT"
    driver = ctx.engine.storage_driver
    if not enabled:
        if opened == "OPENED":
            return FAIL, f"not opted in, but {ctx.runner} can open /dev/fuse (mode {oct(dev.mode)}): re-run site.yml"
        if driver == "fuse-overlayfs":
            return FAIL, "not opted in, but the engine uses fuse-overlayfs"
        return PASS, f"not opted in: {ctx.runner} cannot open /dev/fuse ({opened})"
    if opened != "OPENED":
        return FAIL, f"opted in, but {ctx.runner} cannot open /dev/fuse ({opened}): fuse-overlayfs would fail"
    if not (host.exists("fuse-overlayfs") or host.file("/usr/bin/fuse-overlayfs").exists):
        return FAIL, "opted in, but fuse-overlayfs is not installed"
    return PASS, f"opted in: {ctx.runner} can open /dev/fuse; fuse-overlayfs installed; engine storage {driver}"


@check("HOST-GVISOR", "gVisor's runsc is a runtime of the engine as described (kooi_gvisor_enabled): root-owned, "
       "registered with kooi's arguments, the version and platform recorded",
       "a runtime binary or wrapper others can replace runs as root for every gVisor container")
def gvisor_runtime(host: Host, ctx: Context) -> Outcome:
    g = ctx.engine.gvisor
    if g is None:
        return NA, "gVisor is not a runtime of this engine (kooi_gvisor_enabled is false)"
    for path in dict.fromkeys((g.runsc, g.path)):
        f = host.file(path)
        if not f.exists:
            return FAIL, f"{path} is missing: re-run site.yml (role gvisor)"
        if f.user != "root" or f.mode & 0o022:
            return FAIL, f"{path} is {f.user}-owned, mode {oct(f.mode)}: only root may change it"
    registered = (_engine_info(host, ctx).get("Runtimes") or {}).get(g.runtime)
    if not registered:
        return FAIL, f"the engine has no runtime {g.runtime!r}: re-run site.yml, restart the engine"
    args = tuple(registered.get("runtimeArgs") or ())
    if registered.get("path") != g.path or args != g.args:
        return FAIL, (f"runtime {g.runtime!r} is {registered.get('path')} {' '.join(args)}, described as "
                      f"{g.path} {' '.join(g.args)}: re-run site.yml, restart the engine")
    res = host.run(f"{shlex.quote(g.runsc)} --version && echo -- && {shlex.quote(g.runsc)} help platforms")
    head, _, platforms = res.stdout.partition("\n--\n")
    if res.rc != 0 or g.version not in head:
        return FAIL, f"{g.runsc} --version says {head.strip()[:80]!r}, described as {g.version}: re-run site.yml"
    if g.platform not in platforms.split():
        return FAIL, f"{g.runsc} has no platform {g.platform} (it has {platforms.split()})"
    return PASS, (f"{g.runtime}: {g.path} {' '.join(args)}; runsc {g.version}, platform {g.platform}, "
                  f"network {g.network}{', netns workaround' if g.netns_workaround else ''}")
