"""One request policy for every engine a workload can reach (issue 4's core).

`decide()` is a pure function of an Engine API request (method, URI, body) and a
`Policy` (the run's workspace); the authorization plugin and the socket broker both
call it. Every refusal names its reason. What it refuses:
- container creates with Privileged, CapAdd, Devices/DeviceRequests/DeviceCgroupRules,
  host PID/IPC/UTS/network/userns/cgroup namespaces (or another container's PID/IPC),
  SecurityOpt entries other than no-new-privileges, MaskedPaths/ReadonlyPaths given at
  all (`systempaths=unconfined` arrives as `MaskedPaths: []`), Sysctls, VolumesFrom,
  bind mounts whose symlink-resolved source lies outside the workspace, any socket
  mount, and volume mounts with driver options;
- volume creates with a driver other than local or with driver options (`o=bind`);
- plugin management, swarm, build and session endpoints (bodies it cannot inspect);
- exec creates that are privileged or ask for root;
- requests that must carry a JSON body but arrive without one (oversized, empty or
  chunked bodies reach an authorization plugin empty: CVE-2024-41110, CVE-2026-34040),
  bodies over the limit, bodies that are not a JSON object, percent-encoded paths.
Docker decodes JSON field names case-insensitively; a duplicate field replaces scalars
and lists but *merges* objects (`{"HostConfig": {"Privileged": true}, "HostConfig": {}}`
creates a privileged container), so bodies with duplicate keys, compared
case-insensitively, are refused outright.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any, Callable

MAX_BODY = 1 << 20  # what dockerd forwards to authorization plugins
VERSION_RE = re.compile(r"^/v[0-9]+(\.[0-9]+)?(?=/)")
NS_KEYS = ("PidMode", "IpcMode", "UTSMode", "NetworkMode", "UsernsMode", "CgroupnsMode")
SOCKET_NAMES = re.compile(r"(docker|containerd|podman|buildkit|kooi)[^/]*\.sock$|\.sock$")


@dataclass(frozen=True)
class Decision:
    allow: bool
    reason: str

    def __bool__(self) -> bool:
        return self.allow


ALLOW = Decision(True, "allowed")


def deny(reason: str) -> Decision:
    return Decision(False, reason)


@dataclass(frozen=True)
class Policy:
    """The run's limits: bind sources must resolve below `workspace` (None: no binds);
    `engine_socket` is the one socket that may be mounted (a broker's own);
    `socket_dir` a directory whose sockets may be mounted (kooi run's brokers)."""

    workspace: str | None = None
    engine_socket: str | None = None
    socket_dir: str | None = None  # sockets directly in here may be mounted (kooi run's brokers)
    extra_workspaces: tuple[str, ...] = ()  # further roots for bind sources (the plugin's)
    apparmor_profiles: tuple[str, ...] = ()  # SecurityOpt apparmor=NAME allowed for these (kooi's own)
    max_body: int = MAX_BODY
    resolve: Callable[[str], str] = field(default=os.path.realpath, compare=False)
    is_socket: Callable[[str], bool] = field(default=None, compare=False)  # type: ignore[assignment]

    def socket(self, path: str) -> bool:
        if self.is_socket is not None:
            return self.is_socket(path)
        try:
            return stat.S_ISSOCK(os.stat(path).st_mode)
        except OSError:
            return False


class DuplicateKey(ValueError):
    pass


class CIDict:
    """A JSON object read the way Go's encoding/json fills a struct: keys match
    case-insensitively. Duplicates raise DuplicateKey (Go would merge them)."""

    def __init__(self, pairs: list[tuple[str, Any]]):
        self._d: dict[str, Any] = {}
        for k, v in pairs:
            if k.lower() in self._d:
                raise DuplicateKey(k)
            self._d[k.lower()] = v

    def get(self, key: str, default: Any = None) -> Any:
        return self._d.get(key.lower(), default)

    def has(self, key: str) -> bool:
        return key.lower() in self._d

    def keys(self):
        return self._d.keys()


def _parse(body: bytes) -> CIDict | str:
    """The body as a CIDict, or why it cannot be read."""
    try:
        doc = json.loads(body, object_pairs_hook=CIDict)
    except DuplicateKey as exc:
        return f"duplicate key {str(exc)!r} (compared case-insensitively; Docker would merge them)"
    except (ValueError, UnicodeDecodeError, RecursionError):
        return "body is not a JSON object"
    return doc if isinstance(doc, CIDict) else "body is not a JSON object"


def normalize(uri: str) -> tuple[str, str | None]:
    """(path without API version and query, error)."""
    path = uri.split("?", 1)[0]
    if "%" in path:
        return path, "percent-encoded request paths are refused"
    path = re.sub(r"/{2,}", "/", path)
    path = VERSION_RE.sub("", path)
    if path != "/" and path.endswith("/"):
        path = path.rstrip("/")
    if "/../" in path + "/" or "/./" in path + "/":
        return path, "dot segments in request paths are refused"
    return path, None


def _truthy(v: Any) -> bool:
    return bool(v) and v is not None


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
    real = policy.resolve(src)
    roots = [policy.resolve(w) for w in (policy.workspace, *policy.extra_workspaces)]
    if not any(real == ws or real.startswith(ws.rstrip("/") + "/") for ws in roots):
        return deny(f"{what}: bind source {src} resolves to {real}, outside the workspace {' or '.join(roots)}")
    if policy.socket(real):
        return deny(f"{what}: socket mount {src} refused")
    return None


def _check_host_config(hc: CIDict, policy: Policy) -> Decision:
    if _truthy(hc.get("Privileged")):
        return deny("privileged containers are refused")
    if hc.get("CapAdd"):
        return deny(f"added capabilities are refused: {hc.get('CapAdd')}")
    for key in ("Devices", "DeviceRequests", "DeviceCgroupRules"):
        if hc.get(key):
            return deny(f"{key} are refused (no host devices)")
    for key in NS_KEYS:
        mode = hc.get(key)
        if not isinstance(mode, (str, type(None))):
            return deny(f"{key} must be a string")
        if mode and (mode.lower() == "host" or (key in ("PidMode", "IpcMode") and mode.lower().startswith("container:"))):
            return deny(f"{key}={mode} refused (host or shared namespaces)")
    for opt in hc.get("SecurityOpt") or []:
        norm = str(opt).replace(":", "=").replace(" ", "").lower()
        if norm in ("no-new-privileges", "no-new-privileges=true"):
            continue
        if norm.startswith("apparmor=") and norm[len("apparmor="):] in policy.apparmor_profiles:
            continue
        return deny(f"SecurityOpt {opt!r} refused (only no-new-privileges"
                    + "".join(f", apparmor={n}" for n in policy.apparmor_profiles) + " may be set)")
    for key in ("MaskedPaths", "ReadonlyPaths"):
        if hc.has(key) and hc.get(key) is not None:
            return deny(f"{key} refused (systempaths=unconfined and custom masks weaken confinement)")
    if hc.get("Sysctls"):
        return deny("Sysctls are refused")
    if hc.get("VolumesFrom"):
        return deny("VolumesFrom is refused")
    runtime = hc.get("Runtime")
    if runtime and str(runtime) not in ("runc", "io.containerd.runc.v2"):
        return deny(f"runtime {runtime!r} refused")
    binds = hc.get("Binds") or []
    if not isinstance(binds, list):
        return deny("Binds must be a list")
    for b in binds:
        if not isinstance(b, str):
            return deny("Binds entries must be strings")
        src = b.split(":", 1)[0]
        if (d := _check_bind_source(src, policy, "Binds")) is not None:
            return d
    mounts = hc.get("Mounts") or []
    if not isinstance(mounts, list):
        return deny("Mounts must be a list")
    for m in mounts:
        if not isinstance(m, CIDict):
            return deny("Mounts entries must be objects")
        mtype = str(m.get("Type") or "volume").lower()
        src = m.get("Source") or ""
        if not isinstance(src, str):
            return deny("Mounts Source must be a string")
        if mtype == "bind":
            if not src.startswith("/"):
                return deny(f"Mounts: bind source {src!r} is not absolute")
            if (d := _check_bind_source(src, policy, "Mounts")) is not None:
                return d
        elif mtype == "volume":
            vo = m.get("VolumeOptions")
            dc = vo.get("DriverConfig") if isinstance(vo, CIDict) else None
            if isinstance(dc, CIDict) and (dc.get("Options") or (dc.get("Name") not in (None, "", "local"))):
                return deny("Mounts: volume driver options are refused (o=bind reaches host paths)")
        elif mtype != "tmpfs":
            return deny(f"Mounts: type {mtype!r} refused")
    return ALLOW


def check_body(body: bytes | None, policy: Policy, what: str) -> tuple[CIDict | None, Decision | None]:
    """Read a body that must be a JSON object: (document, None) or (None, refusal)."""
    if not body:
        return None, deny(f"{what}: the request arrived without a body (oversized, empty or chunked "
                          "bodies reach the policy empty), refused")
    if len(body) > policy.max_body:
        return None, deny(f"{what}: body of {len(body)} bytes exceeds {policy.max_body}, refused")
    doc = _parse(body)
    if isinstance(doc, str):
        return None, deny(f"{what}: {doc}, refused")
    return doc, None


DENY_PREFIXES = {
    "/plugins": "plugin management is refused",
    "/swarm": "swarm endpoints are refused",
    "/services": "swarm endpoints are refused",
    "/nodes": "swarm endpoints are refused",
    "/secrets": "swarm endpoints are refused",
    "/configs": "swarm endpoints are refused",
    "/tasks": "swarm endpoints are refused",
    "/build": "image builds are refused (their context cannot be inspected)",
    "/session": "session endpoints are refused (they carry builds the policy cannot inspect)",
    "/grpc": "gRPC endpoints are refused (the policy cannot inspect them)",
}
CONTAINER_CREATE = re.compile(r"^/containers/create$")
EXEC_CREATE = re.compile(r"^/containers/[^/]+/exec$")
VOLUME_CREATE = re.compile(r"^/volumes/create$")
CONTAINER_UPDATE = re.compile(r"^/containers/[^/]+/update$")


def decide(method: str, uri: str, body: bytes | None, policy: Policy) -> Decision:
    """Allow or refuse one Engine API request. Never raises."""
    try:
        return _decide(method.upper(), uri, body, policy)
    except Exception as exc:  # noqa: BLE001 - fail closed on anything unexpected
        return deny(f"policy error ({exc.__class__.__name__}), refused")


def _decide(method: str, uri: str, body: bytes | None, policy: Policy) -> Decision:
    path, err = normalize(uri)
    if err:
        return deny(err)
    for prefix, why in DENY_PREFIXES.items():
        if path == prefix or path.startswith(prefix + "/"):
            if method in ("GET", "HEAD") and prefix not in ("/session", "/grpc", "/build"):
                return ALLOW
            return deny(why)
    if method in ("GET", "HEAD"):
        return ALLOW
    if method == "POST" and CONTAINER_CREATE.match(path):
        doc, d = check_body(body, policy, "container create")
        if d is not None:
            return d
        assert doc is not None
        hc = doc.get("HostConfig")
        if hc is None:
            return ALLOW
        if not isinstance(hc, CIDict):
            return deny("container create: HostConfig must be an object")
        return _check_host_config(hc, policy)
    if method == "POST" and EXEC_CREATE.match(path):
        doc, d = check_body(body, policy, "exec create")
        if d is not None:
            return d
        assert doc is not None
        if _truthy(doc.get("Privileged")):
            return deny("privileged exec is refused")
        user = str(doc.get("User") or "").strip()
        if user.split(":", 1)[0] in ("root", "0"):
            return deny(f"exec as {user} is refused")
        return ALLOW
    if method == "POST" and VOLUME_CREATE.match(path):
        doc, d = check_body(body, policy, "volume create")
        if d is not None:
            return d
        assert doc is not None
        driver = doc.get("Driver") or "local"
        if driver != "local":
            return deny(f"volume driver {driver!r} refused")
        if doc.get("DriverOpts"):
            return deny("volume driver options are refused (o=bind,device=... reaches host paths)")
        return ALLOW
    if method == "POST" and CONTAINER_UPDATE.match(path):
        doc, d = check_body(body, policy, "container update")
        if d is not None:
            return d
        assert doc is not None
        for key in ("Devices", "DeviceRequests", "DeviceCgroupRules"):
            if doc.get(key):
                return deny(f"container update: {key} are refused")
        return ALLOW
    return ALLOW
