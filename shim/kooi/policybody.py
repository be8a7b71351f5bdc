"""What an Engine API request body may ask for: the request policy's checks of a
container create (its HostConfig: bounds, limits, namespaces, binds, mounts, tmpfs),
an exec create, a container update and a volume or network create.

A check answers with a Decision (ALLOW, or deny with the reason), as kooi.policy's
decide() does; kooi.policy's table (`API`) names which check reads which body.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import verdicts
from .engineapi import BRIDGE_NAME
from .gojson import field, fold

if TYPE_CHECKING:
    from .policy import Policy

# The fields of the engine's HostConfig (kooi.verdicts, from the specification) and the
# legacy wrapper's own "Cpuset": what a create body may set only inside HostConfig.
# Docker reads them at the top level when HostConfig is absent and merges some of them
# (Memory, MemorySwap, CpuShares, CpusetCpus, VolumeDriver; "Cpuset") into one.
_HOST_CONFIG_FOLDED = verdicts.known("ContainerCreate", "HostConfig.") | {"cpuset"}
NS_KEYS = ("PidMode", "IpcMode", "UTSMode", "NetworkMode", "UsernsMode", "CgroupnsMode")
SOCKET_NAMES = re.compile(r"(docker|containerd|podman|buildkit|kooi)[^/]*\.sock$|\.sock$")
DEVICE_KEYS = ("Devices", "DeviceRequests", "DeviceCgroupRules")


@dataclass(frozen=True)
class Decision:
    allow: bool
    reason: str

    def __bool__(self) -> bool:
        return self.allow


ALLOW = Decision(True, "allowed")


def deny(reason: str) -> Decision:
    return Decision(False, reason)


def security_opt(opt: Any) -> str:
    """A SecurityOpt entry as the engine reads it: `key=value` and `key:value` alike,
    spaces and case ignored (`no-new-privileges:true`, `apparmor=NAME`)."""
    return str(opt).replace(":", "=").replace(" ", "").lower()


def _truthy(v: Any) -> bool:
    return bool(v) and v is not None


# --- what the bodies may ask for ------------------------------------------------------


def _check_bind_source(src: str, policy: Policy, what: str) -> Decision | None:
    if not src.startswith("/"):
        return None  # a named volume
    if policy.engine_socket and src == policy.engine_socket:
        return None  # the broker's own socket: it applies this same policy
    if policy.socket_dir and os.path.dirname(policy.resolve(src)) == policy.resolve(policy.socket_dir):
        return None  # a kooi broker's socket (only kooi run, as the runner, creates them there)
    if SOCKET_NAMES.search(src.rstrip("/")) or policy.socket(src):
        return deny(f"{what}: socket mount {src} refused (no engine or other socket may enter a container)")
    if policy.workspace is None:
        return deny(f"{what}: bind mount of {src} refused (this run has no workspace binds)")
    if policy.whole_roots:
        return _check_whole_root(src, policy, what)
    real = policy.resolve(src)
    roots = [policy.resolve(w) for w in (policy.workspace, *policy.extra_workspaces)]
    if not any(real == ws or real.startswith(ws.rstrip("/") + "/") for ws in roots):
        return deny(f"{what}: bind source {src} resolves to {real}, outside the workspace {' or '.join(roots)}")
    if policy.socket(real):
        return deny(f"{what}: socket mount {src} refused")
    return None


def _check_whole_root(src: str, policy: Policy, what: str) -> Decision | None:
    """Policy.whole_roots: SRC must be a root itself (string equality: the engine gets
    exactly this string) whose path has no symlink, or one of kooi's fixed sources."""
    path = src.rstrip("/") or "/"
    if path in policy.fixed_sources:
        return None
    roots = [r.rstrip("/") for r in (policy.workspace, *policy.extra_workspaces) if r]
    if path in roots:
        if policy.resolve(path) != path:
            return deny(f"{what}: bind source {src} is reached through a symlink ({policy.resolve(path)}), refused")
        return None
    if not any(path.startswith(r + "/") for r in roots):
        return deny(f"{what}: bind source {src} is outside the workspace {' or '.join(roots)}")
    return deny(f"{what}: bind source {src} is below the workspace root, refused (the engine resolves a bind's "
                "source again when the container starts, and below the root the workload can swap any part of "
                "it for a symlink in between): bind the whole workspace, or copy files into the "
                "container (Java withCopyFileToContainer, Node withCopyFilesToContainer, docker-py put_archive: "
                "PUT /containers/{id}/archive)")


BIND_PROPAGATION = ("shared", "rshared", "slave", "rslave")


def _bind_options(opts: str, what: str) -> Decision | None:
    """A Binds entry's options (after the target): no propagation that shares mounts
    between the container and the host in either direction."""
    for opt in opts.split(","):
        if opt.strip().lower() in BIND_PROPAGATION:
            return deny(f"{what}: bind propagation {opt!r} refused (mounts would cross between the container "
                        "and the host)")
    return None


def _check_mounts(mounts: list[Any], policy: Policy) -> Decision | None:
    for m in mounts:
        if not isinstance(m, dict):
            return deny("Mounts entries must be objects")
        mtype = str(field(m, "Type") or "volume").lower()
        src = field(m, "Source") or ""
        if not isinstance(src, str):
            return deny("Mounts Source must be a string")
        if mtype == "bind":
            if not src.startswith("/"):
                return deny(f"Mounts: bind source {src!r} is not absolute")
            if (d := _check_bind_source(src, policy, "Mounts")) is not None:
                return d
            bo = field(m, "BindOptions")
            prop = field(bo, "Propagation") if isinstance(bo, dict) else None
            if bo is not None and not isinstance(bo, dict):
                return deny("Mounts: BindOptions must be an object")
            if isinstance(prop, str) and (d := _bind_options(prop, "Mounts")) is not None:
                return d
        elif mtype == "volume":
            vo = field(m, "VolumeOptions")
            dc = field(vo, "DriverConfig") if isinstance(vo, dict) else None
            if isinstance(dc, dict) and (field(dc, "Options") or (field(dc, "Name") not in (None, "", "local"))):
                return deny("Mounts: volume driver options are refused (o=bind reaches host paths)")
            if isinstance(vo, dict) and field(vo, "Subpath"):
                return deny("Mounts: volume Subpath refused (a path inside a volume the workload writes is "
                            "resolved again at start)")
        elif mtype == "tmpfs":
            to = field(m, "TmpfsOptions")
            if to is not None and not isinstance(to, dict):
                return deny("Mounts: TmpfsOptions must be an object")
            extra = [k for k in to or {} if fold(k) not in ("sizebytes", "mode")]
            if extra:
                return deny(f"Mounts: TmpfsOptions {', '.join(extra)} refused (only SizeBytes and Mode)")
        else:
            return deny(f"Mounts: type {mtype!r} refused")
    return None


# What a tmpfs may be mounted with (HostConfig.Tmpfs options; the kernel parses the
# rest): size only as a plain decimal number with a k/m/g suffix, since the kernel reads
# `size=0` and `nr_blocks=0` as unlimited, `size=50%` as a share of the host's memory, and
# a leading 0 or 0x as octal or hex.
TMPFS_FLAGS = frozenset({"rw", "ro", "exec", "noexec", "suid", "nosuid", "dev", "nodev", "atime", "noatime",
                         "relatime", "norelatime", "strictatime", "nostrictatime", "diratime", "nodiratime",
                         "tmpcopyup", "notmpcopyup", "private", "rprivate"})
TMPFS_VALUES = frozenset({"size", "mode", "uid", "gid"})
TMPFS_SIZE = re.compile(r"[1-9][0-9]{0,15}([kmg]?)", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def tmpfs_bytes(text: str) -> int | None:
    """A tmpfs size= value in bytes, or None where it is not one kooi accepts."""
    m = TMPFS_SIZE.fullmatch(text.strip())
    return int(m.group(0)[: len(m.group(0)) - len(m.group(1))]) * _UNITS[m.group(1).lower()] if m else None


TMPFS_TOTAL = "tmpfs:total"  # Policy.limits key: what all tmpfs of one container may hold together


def tmpfs_sizes(hc: dict[str, Any]) -> tuple[list[tuple[str, int | None]], str | None]:
    """Every tmpfs of a create's HostConfig HC (the Tmpfs map, Mounts of type tmpfs, an
    explicit ShmSize) as (what, size in bytes or None where none is named), or why one
    cannot be read."""
    out: list[tuple[str, int | None]] = []
    tmpfs = field(hc, "Tmpfs")
    if tmpfs is not None and not isinstance(tmpfs, dict):
        return out, "Tmpfs must be an object"
    for target, opts in (tmpfs or {}).items():
        if not isinstance(opts, str):
            return out, f"Tmpfs {target}: options must be a string"
        sizes: list[int | None] = []
        for opt in (o.strip() for o in opts.split(",") if o.strip()):
            key, eq, value = opt.partition("=")
            if key.lower() == "size" and eq:
                sizes.append(tmpfs_bytes(value))
            elif not (key.lower() in TMPFS_VALUES and eq and value) and opt.lower() not in TMPFS_FLAGS:
                return out, (f"Tmpfs {target}: option {opt!r} refused (allowed: size, mode, uid, gid and the mount "
                             "flags)")
        if len(sizes) > 1 or None in sizes:
            return out, f"Tmpfs {target}: size must be given once, as a decimal number with k, m or g"
        out.append((f"Tmpfs {target}", sizes[0] if sizes else None))
    for m in field(hc, "Mounts") or []:
        if isinstance(m, dict) and str(field(m, "Type") or "").lower() == "tmpfs":
            to = field(m, "TmpfsOptions")
            size = field(to, "SizeBytes") if isinstance(to, dict) else None
            if size is not None and ((n := _int(size)) is None or n < 0):
                return out, f"Mounts: tmpfs size {size!r} refused"
            out.append((f"Mounts: tmpfs at {field(m, 'Target')}", size or None))
    shm = field(hc, "ShmSize")
    if shm not in (None, 0):
        if (n := _int(shm)) is None or n < 0:
            return out, f"ShmSize {shm!r} refused"
        out.append(("ShmSize", n))
    return out, None


def _check_tmpfs(hc: dict[str, Any], policy: Policy) -> Decision | None:
    """Every tmpfs of the container has a size, and together they stay within the
    run's memory (memory in a tmpfs is held by no process: no per-process limit sees
    it, and without a memory cgroup nothing else does)."""
    found, err = tmpfs_sizes(hc)
    if err:
        return deny(err)
    top = policy.limits.get(TMPFS_TOTAL)
    if top is None:
        return None
    for what, size in found:
        if size is None:
            return deny(f"{what}: a tmpfs without a size refused (the kernel gives it half the host's memory)")
    total = sum(size or 0 for _, size in found)
    if total > top:
        return deny(f"tmpfs sizes of {total} bytes together refused ({', '.join(w for w, _ in found)}; above "
                    f"{policy.limits_are} of {top} bytes of memory)")
    return None


LOG_DRIVERS = ("", "json-file", "local", "none")


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _check_limits(doc: dict[str, Any], what: str, limits: dict[str, int], whose: str) -> Decision | None:
    """Values above LIMITS (the run's; absent or 0 is "not set": a broker forces the
    run's own on create, an update keeps the container's)."""
    for key, top in limits.items():
        if ":" in key:  # ulimit:NAME, tmpfs:total
            continue
        v = field(doc, key)
        if v is None or v == 0:
            continue
        if (n := _int(v)) is None or n < 0 or n > top:
            return deny(f"{what}: {key} {v!r} refused (above {whose} of {top})")
    if "NanoCpus" in limits:
        quota, period = _int(field(doc, "CpuQuota")), _int(field(doc, "CpuPeriod")) or 100000
        # -1 lifts the quota: refused like any value above the run's.
        if quota and (quota < 0 or quota * 1e9 / period > limits["NanoCpus"]):
            return deny(f"{what}: CpuQuota {quota} per {period} refused (above {whose} of "
                        f"{limits['NanoCpus'] / 1e9:g} CPUs)")
    for u in field(doc, "Ulimits") or []:
        if not isinstance(u, dict):
            return deny(f"{what}: Ulimits entries must be objects")
        # The engine upper-cases the name (RLIMIT_NPROC): `NPROC` is `nproc`.
        ceiling = limits.get(f"ulimit:{str(field(u, 'Name')).strip().lower()}")
        for key in ("Soft", "Hard"):
            v = field(u, key)
            if ceiling is not None and v is not None and ((n := _int(v)) is None or n > ceiling):
                return deny(f"{what}: Ulimits {field(u, 'Name')!r} {key}={v!r} refused (above {whose} "
                            f"of {ceiling})")
    return None


def _check_bounds(doc: dict[str, Any], what: str, policy: Policy | None = None) -> Decision | None:
    """Fields that let a container escape the bounds of the run that made it (its cgroup,
    the OOM killer, process and realtime limits, its lifetime, the daemon's logging).
    DOC: a create's HostConfig or an update's body (the same resource fields); POLICY's
    limits: the most it may ask for."""
    if policy and policy.limits and (d := _check_limits(doc, what, policy.limits, policy.limits_are)) is not None:
        return d
    if field(doc, "CgroupParent"):
        return deny(f"{what}: CgroupParent refused (another parent cgroup escapes the run's limits)")
    if field(doc, "Cgroup"):
        return deny(f"{what}: Cgroup refused (another container's cgroup)")
    if _truthy(field(doc, "OomKillDisable")):
        return deny(f"{what}: OomKillDisable refused (a container the OOM killer may not end takes the host's memory)")
    # 0 is "not set": the docker CLI sends it on every create. -1 asks to lift a limit.
    pids = field(doc, "PidsLimit")
    if pids is not None and ((n := _int(pids)) is None or n < 0):
        return deny(f"{what}: PidsLimit {pids!r} refused (-1 lifts the limit: a fork bomb takes the host)")
    adj = field(doc, "OomScoreAdj")
    if adj is not None and ((n := _int(adj)) is None or n < 0):
        return deny(f"{what}: OomScoreAdj {adj!r} refused (below 0 the OOM killer ends others first)")
    for key in ("CpuRealtimeRuntime", "CpuRealtimePeriod"):
        if field(doc, key):
            return deny(f"{what}: {key} refused (realtime scheduling can starve the host)")
    for u in field(doc, "Ulimits") or []:
        if not isinstance(u, dict):
            return deny(f"{what}: Ulimits entries must be objects")
        for key in ("Soft", "Hard"):
            v = field(u, key)
            if v is not None and ((n := _int(v)) is None or n < 0):
                return deny(f"{what}: Ulimits {field(u, 'Name')!r} {key}={v!r} refused (unlimited)")
    restart = field(doc, "RestartPolicy")
    if restart is not None:
        name = field(restart, "Name") if isinstance(restart, dict) else restart
        if name not in (None, "", "no"):
            return deny(f"{what}: RestartPolicy {name!r} refused (a container that restarts outlives its run)")
    log = field(doc, "LogConfig")
    if log is not None:
        driver = field(log, "Type") if isinstance(log, dict) else log
        if driver not in (None, *LOG_DRIVERS):
            return deny(f"{what}: log driver {driver!r} refused (the daemon would send the logs where the "
                        "workload says, past the egress rules)")
        opts = field(log, "Config") if isinstance(log, dict) else None
        if opts:
            return deny(f"{what}: log options {sorted(opts) if isinstance(opts, dict) else opts!r} refused (the "
                        "engine's own bound the log's size: kooi_docker_log_max_size)")
    if field(doc, "Annotations"):
        return deny(f"{what}: Annotations refused (they reach the OCI runtime)")
    driver = field(doc, "VolumeDriver")
    if driver not in (None, "", "local"):
        return deny(f"{what}: volume driver {driver!r} refused")
    return None


def _check_host_config(hc: dict[str, Any], policy: Policy) -> Decision:
    if (d := _check_bounds(hc, "container create", policy)) is not None:
        return d
    if _truthy(field(hc, "Privileged")):
        return deny("privileged containers are refused")
    if field(hc, "CapAdd"):
        return deny(f"added capabilities are refused: {field(hc, 'CapAdd')}")
    for key in DEVICE_KEYS:
        if field(hc, key):
            return deny(f"{key} are refused (no host devices)")
    for key in NS_KEYS:
        mode = field(hc, key)
        if not isinstance(mode, (str, type(None))):
            return deny(f"{key} must be a string")
        if mode and (mode.lower() == "host" or (key in ("PidMode", "IpcMode") and mode.lower().startswith("container:"))):
            return deny(f"{key}={mode} refused (host or shared namespaces)")
    for opt in field(hc, "SecurityOpt") or []:
        norm = security_opt(opt)
        if norm in ("no-new-privileges", "no-new-privileges=true"):
            continue
        if norm.startswith("apparmor=") and norm[len("apparmor="):] in policy.apparmor_profiles:
            continue
        return deny(f"SecurityOpt {opt!r} refused (only no-new-privileges"
                    + "".join(f", apparmor={n}" for n in policy.apparmor_profiles) + " may be set)")
    for key in ("MaskedPaths", "ReadonlyPaths"):
        if field(hc, key) is not None:
            return deny(f"{key} refused (systempaths=unconfined and custom masks weaken confinement)")
    if field(hc, "Sysctls"):
        return deny("Sysctls are refused")
    if field(hc, "VolumesFrom"):
        return deny("VolumesFrom is refused")
    runtime = field(hc, "Runtime")
    if runtime is not None and not isinstance(runtime, str):
        return deny("Runtime must be a string")
    if runtime and runtime not in policy.runtimes:
        return deny(f"runtime {runtime!r} refused (allowed: {', '.join(policy.runtimes)})")
    if field(hc, "Links"):
        return deny("Links refused (legacy links name other containers, resolved again at start)")
    if (d := _check_tmpfs(hc, policy)) is not None:
        return d
    binds = field(hc, "Binds") or []
    if not isinstance(binds, list):
        return deny("Binds must be a list")
    for b in binds:
        if not isinstance(b, str):
            return deny("Binds entries must be strings")
        src, _, rest = b.partition(":")
        if (d := _check_bind_source(src, policy, "Binds")) is not None:
            return d
        if (d := _bind_options(rest.partition(":")[2], "Binds")) is not None:
            return d
    mounts = field(hc, "Mounts") or []
    if not isinstance(mounts, list):
        return deny("Mounts must be a list")
    d = _check_mounts(mounts, policy)
    return ALLOW if d is None else d  # (a refusal is falsy: no `or` here)


def _unset(v: Any) -> bool:
    """What the engine reads as "not set" in every host field: JSON null, false, 0, "".
    An empty list is not: `MaskedPaths: []` unmasks /proc (nil keeps the defaults)."""
    return v is None or v is False or (not isinstance(v, bool) and v in (0, ""))


def is_unset(v: Any) -> bool:
    """Not set at all: null, false, 0, "", an empty object or list (fields where empty
    means the engine's default)."""
    return _unset(v) or v == {} or v == []


def unknown_field(doc: dict[str, Any], body: str, what: str, prefix: str = "",
                  also: frozenset[str] = frozenset()) -> Decision | None:
    """A field of DOC that is set although kooi.verdicts gives BODY's fields at PREFIX
    (and ALSO) no verdict: refused, since nobody looked at what the engine does with it."""
    names = verdicts.known(body, prefix) | also
    for key, value in doc.items():
        if fold(key) not in names and not is_unset(value):
            return deny(f"{what}: field {prefix}{key} refused (kooi's policy has no verdict on it: a field nobody "
                        "looked at is refused)")
    return None


_CREATE_TOP = verdicts.known("ContainerCreate")
_CREATE_HOST = _HOST_CONFIG_FOLDED


def _container_create(doc: dict[str, Any], policy: Policy) -> Decision:
    hc = field(doc, "HostConfig")
    if hc is not None:
        # With a HostConfig the engine still merges top-level Memory, MemorySwap,
        # CpuShares, Cpuset(Cpus) and VolumeDriver into it: no host field may be set there.
        for key, value in doc.items():
            if fold(key) in _HOST_CONFIG_FOLDED and not _unset(value):
                return deny(f"container create: {key} at the top level of the body refused (the engine reads "
                            "host settings there, past HostConfig; send them in HostConfig)")
    if (d := unknown_field(doc, "ContainerCreate", "container create",
                           also=_CREATE_HOST if hc is None else frozenset())) is not None:
        return d
    if isinstance(hc, dict) and (d := unknown_field(hc, "ContainerCreate", "container create",
                                                    "HostConfig.")) is not None:
        return d
    if hc is None:
        # No HostConfig (absent or null): the engine takes the top level of the body as
        # the HostConfig (its legacy config wrapper), so the top level is checked as one.
        return _check_host_config(doc, policy)
    if not isinstance(hc, dict):
        return deny("container create: HostConfig must be an object")
    return _check_host_config(hc, policy)


def _exec_create(doc: dict[str, Any], policy: Policy) -> Decision:
    if (d := unknown_field(doc, "ContainerExec", "exec create")) is not None:
        return d
    if _truthy(field(doc, "Privileged")):
        return deny("privileged exec is refused")
    user = field(doc, "User")
    if user is not None and not isinstance(user, str):
        return deny("exec create: User must be a string")
    if is_root_user(user or ""):
        return deny(f"exec as {user} is refused")
    return ALLOW


NUMERIC_ID = re.compile(r"\s*[+-]?[0-9]+\s*")


def is_root_user(user: str) -> bool:
    """USER (`name`, `uid`, `name:group`, `uid:gid`) names root as the engine reads it:
    a number as Go's strconv.Atoi parses it (`00`, `+0`, `-0` are 0), the group too."""
    for part in user.split(":", 1):
        p = part.strip()
        if p == "root" or (NUMERIC_ID.fullmatch(p) and int(p) == 0):
            return True
    return False


def _volume_create(doc: dict[str, Any], policy: Policy) -> Decision:
    if (d := unknown_field(doc, "VolumeCreate", "volume create")) is not None:
        return d
    driver = field(doc, "Driver") or "local"
    if driver != "local":
        return deny(f"volume driver {driver!r} refused")
    if field(doc, "DriverOpts"):
        return deny("volume driver options are refused (o=bind,device=... reaches host paths)")
    return ALLOW


# The bridge names kooi gives a run's networks (kooi.run.runnet, whose names a unit
# test holds to this): rootless kr<8 hex><n>, userns-remap kp<port>n<n>. The host's
# egress rules know these, docker0 and br-*.
KOOI_BRIDGE = re.compile(r"kr[0-9a-f]{8}[0-9]|kp[0-9]{1,5}n[0-9]")


def _network_create(doc: dict[str, Any], policy: Policy) -> Decision:
    """Every engine (the plugin too, whose clients are the runner's): bridge networks
    only, named by the engine or by kooi, from the engine's address pool. Another
    driver (macvlan, ipvlan) or a bridge of another name sits outside the host's egress
    rules, which know docker0, br-* and kooi's run bridges (measured on userns-remap
    with the plugin: a bridge the runner named reached a listener past the host)."""
    if (d := unknown_field(doc, "NetworkCreate", "network create")) is not None:
        return d
    driver = field(doc, "Driver") or "bridge"
    if driver != "bridge":
        return deny(f"network driver {driver!r} refused (only bridge networks: another driver puts containers "
                    "past the host's egress rules)")
    opts = field(doc, "Options")
    if not is_unset(opts):
        if not isinstance(opts, dict) or set(opts) != {BRIDGE_NAME} or \
                not KOOI_BRIDGE.fullmatch(str(opts[BRIDGE_NAME])):
            return deny("network create: Options refused (the engine names the bridge, or kooi names a run's; "
                        "a bridge of another name is outside the host's egress rules)")
    ipam = field(doc, "IPAM")
    if isinstance(ipam, dict) and any(not is_unset(field(ipam, k)) for k in ("Config", "Options")) or \
            isinstance(ipam, dict) and (field(ipam, "Driver") or "default") != "default":
        return deny("network create: IPAM refused (the subnet comes from the engine's pool: one of the "
                    "caller's choosing can shadow the host's own networks or kooi's addresses)")
    for key in ("ConfigFrom", "ConfigOnly", "Ingress", "EnableIPv6"):
        if not is_unset(field(doc, key)):
            return deny(f"network create: {key} refused (the engine's own settings only)")
    return ALLOW


def _container_update(doc: dict[str, Any], policy: Policy) -> Decision:
    if (d := unknown_field(doc, "ContainerUpdate", "container update")) is not None:
        return d
    for key in DEVICE_KEYS:
        if field(doc, key):
            return deny(f"container update: {key} are refused")
    d = _check_bounds(doc, "container update", policy)
    return ALLOW if d is None else d
