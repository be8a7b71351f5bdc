"""One request policy for every engine a workload can reach (issue 4's core).

`decide()` is a pure function of an Engine API request (method, URI, body) and a
`Policy` (the run's workspace); the authorization plugin and the socket broker both
call it. Every refusal names its reason. What it refuses:
- container creates and updates that escape the run's bounds: CgroupParent, Cgroup,
  OomKillDisable, PidsLimit < 0, OomScoreAdj < 0, realtime CPU, unlimited Ulimits,
  a RestartPolicy, a log driver that ships logs elsewhere, Annotations, a volume driver;
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
  bodies over the limit, bodies that are not a JSON object, percent-encoded paths;
- Engine API versions below 1.24 (`/v1.23/...`): Docker 20.10 (Debian 12) still applies
  a HostConfig sent in the body of such a container *start*, after a create the policy
  passed (measured: Binds of /etc and CapAdd ALL took effect); from 1.24 the engine
  refuses a start body itself;
- host settings at the top level of a create body: when `HostConfig` is absent (or
  null) the engine reads them there (its legacy ContainerConfigWrapper; measured on
  20.10: top-level Privileged, Binds and CapAdd took effect), so the top level is then
  checked as the HostConfig; with a HostConfig it still merges top-level Memory,
  MemorySwap, CpuShares, Cpuset(Cpus) and VolumeDriver, so no host field may be set
  at the top level next to one;
- request targets that are not a path (absolute-form `http://host/...`: dockerd hands a
  plugin the raw target and routes on its path).
Docker decodes JSON field names case-insensitively; a duplicate field replaces scalars
and lists but *merges* objects (`{"HostConfig": {"Privileged": true}, "HostConfig": {}}`
creates a privileged container), so bodies with duplicate keys, compared
case-insensitively, are refused outright (kooi.gojson reads bodies as the engine does).

`API` at the end is the table of endpoints this means, in one place for the policy and
for what a per-run broker adds (kooi.broker): per endpoint, the `policy` column is what
every engine refuses, the `run` column what a run may reach of the engine. What each
body may ask for (the checks the table's Body rows name) is kooi.policybody.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .gojson import parse
from .policybody import (
    ALLOW,
    Decision,
    _container_create,
    _container_update,
    _exec_create,
    _network_create,
    _volume_create,
    deny,
)
from .routes import ANY, DELETE, GET, POST, READ, Match, Table

MAX_BODY = 1 << 20  # what dockerd forwards to authorization plugins
# The engine's router takes `/v{version:[0-9.]+}/...` and compares versions numerically
# per dot-separated part (moby api/types/versions: a part that is not a number is 0).
VERSION_RE = re.compile(r"^/v([0-9.]+)(?=/)")
MIN_API_VERSION = (1, 24)


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
    # OCI runtimes a container may name, exactly (the engine does not fold them, and from
    # Docker 23 it also accepts any io.containerd.<x>.<vN> shim: an allowlist, never a
    # denylist); "" (the daemon's default) is always allowed. roles/gvisor adds runsc.
    runtimes: tuple[str, ...] = ("runc", "io.containerd.runc.v2")
    # The most a container may ask for: HostConfig fields (Memory, MemorySwap, PidsLimit,
    # NanoCpus) and rlimits ("ulimit:nproc", ...); a broker's are its run's limits.
    limits: dict[str, int] = dataclasses.field(default_factory=dict, compare=False)
    limits_are: str = "the run's limit"  # what refusals call them
    max_body: int = MAX_BODY
    # Bind sources may be only the roots themselves (the workspace and the further roots)
    # and FIXED_SOURCES, never a path below a root: a broker's policy. The engine records
    # a bind's source at create and resolves it again, following symlinks, at every start;
    # below the workspace root the workload can swap any part of the path for a symlink
    # in between (measured: the runner's home and the engine's own socket), above it
    # it can change nothing.
    whole_roots: bool = False
    fixed_sources: tuple[str, ...] = ()  # kooi's own copies (the guard's shadows), exactly
    resolve: Callable[[str], str] = dataclasses.field(default=os.path.realpath, compare=False)
    is_socket: Callable[[str], bool] | None = dataclasses.field(default=None, compare=False)

    def socket(self, path: str) -> bool:
        if self.is_socket is not None:
            return self.is_socket(path)
        try:
            return stat.S_ISSOCK(os.stat(path).st_mode)
        except OSError:
            return False


def normalize(uri: str) -> tuple[str, str | None]:
    """(path without API version and query, error)."""
    path = uri.split("?", 1)[0]
    if not path.startswith("/"):
        # dockerd hands a plugin the raw request target and routes on its path: an
        # absolute-form target (`POST http://d/v1.41/containers/create`) would match no
        # rule here while the engine serves it.
        return path, "request targets other than a path (absolute-form URLs) are refused"
    if "%" in path:
        return path, "percent-encoded request paths are refused"
    path = re.sub(r"/{2,}", "/", path)
    if (m := VERSION_RE.match(path)) is not None:
        if api_version(m.group(1)) < MIN_API_VERSION:
            return path, (f"Engine API version {m.group(1)} refused (below 1.24 a container start may carry host "
                          "settings no create policy saw; clients negotiate a newer version)")
        path = path[m.end():]
    if path != "/" and path.endswith("/"):
        path = path.rstrip("/")
    if "/../" in path + "/" or "/./" in path + "/":
        return path, "dot segments in request paths are refused"
    return path, None


def api_version(text: str) -> tuple[int, ...]:
    """A version as the engine compares it: per dot-separated part, a number; an empty
    part is 0 and one beyond Go's int is its maximum (strconv.Atoi, error ignored)."""
    parts = [min(int(p), (1 << 63) - 1) if p.isdigit() else 0 for p in text.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()  # 1.24.0 == 1.24
    return tuple(parts)


def check_body(body: bytes | None, policy: Policy, what: str) -> tuple[dict[str, Any] | None, Decision | None]:
    """Read a body that must be a JSON object: (document, None) or (None, refusal)."""
    if not body:
        return None, deny(f"{what}: the request arrived without a body (oversized, empty or chunked "
                          "bodies reach the policy empty), refused")
    if len(body) > policy.max_body:
        return None, deny(f"{what}: body of {len(body)} bytes exceeds {policy.max_body}, refused")
    doc = parse(body)
    if isinstance(doc, str):
        return None, deny(f"{what}: {doc}, refused")
    return doc, None


# --- the table ----------------------------------------------------------------------
# The policy column (every engine: kooi authz and the broker):


@dataclass(frozen=True)
class Refuse:
    """Refused, for REASON (in the run column: by the broker only)."""

    reason: str

    def __call__(self, body: bytes | None, policy: Policy) -> Decision:
        return deny(self.reason)


@dataclass(frozen=True)
class Body:
    """The request must carry a JSON object (no body, oversized, not an object, duplicate
    keys: refused, as WHAT); CHECK decides on what it asks for."""

    what: str
    check: Callable[[dict[str, Any], Policy], Decision]

    def __call__(self, body: bytes | None, policy: Policy) -> Decision:
        doc, d = check_body(body, policy, self.what)
        if d is not None:
            return d
        assert doc is not None
        return self.check(doc, policy)


# The run column (what a per-run broker adds; kooi.broker carries it out):


@dataclass(frozen=True)
class Scoped:
    """A listing or prune: narrowed to the run's own objects (a label filter)."""


@dataclass(frozen=True)
class Created:
    """Creates a KIND (container, network, volume), labelled as the run's; its body is
    read, and rewritten where the run needs it (a container's networks, workspace
    paths, volumes and AppArmor profile)."""

    kind: str


@dataclass(frozen=True)
class Owned:
    """Reaches an object that must be the run's: the KIND that the path's {id} names (or
    the query parameter QUERY); with CONTAINER_FIELD, also the container that this
    field of the body names."""

    kind: str
    query: str | None = None
    container_field: str | None = None


@dataclass(frozen=True)
class RefuseWith:
    """Refused (by the broker) when the query carries PARAM, for REASON."""

    param: str
    reason: str


SCOPED = Scoped()


@dataclass(frozen=True)
class Route:
    methods: tuple[str, ...]                          # () for any
    path: str                                         # a kooi.routes template
    policy: Refuse | Body | None = None               # None: allowed
    run: Refuse | RefuseWith | Scoped | Created | Owned | None = None  # None: nothing the run must own
    hijack: bool = False                              # the engine takes the connection over

    @property
    def body(self) -> bool:
        """The request carries a JSON object that is read before deciding."""
        return isinstance(self.policy, Body) or isinstance(self.run, Created) or \
            (isinstance(self.run, Owned) and self.run.container_field is not None)


PLUGINS = "plugin management is refused"
SWARM = "swarm endpoints are refused"
BUILDS = "image builds are refused (their context cannot be inspected)"
SESSIONS = "session endpoints are refused (they carry builds the policy cannot inspect)"
GRPC = "gRPC endpoints are refused (the policy cannot inspect them)"
PRUNES = "this prune endpoint is refused (it reaches other runs' objects)"
IMAGE_REMOVAL = "removing images is refused (the pinned images are shared)"
# Images are the engine's, shared by every run and outliving each: a run may use them
# and pull (the registry decides what a name holds), not make or re-point one.
IMAGES_OUTLIVE = ("is refused (an image outlives the run, and a tag re-pointed here would change what every later "
                  "run's Testcontainers starts)")

# The first row whose methods and path match a request decides, for both columns; a
# request no row matches is allowed and reaches nothing the run must own. Paths are
# normalised first (no API version, no query; percent-encoding and dot segments are
# refused before any row is looked at).
API: Table[Route] = Table([
    # never, on any engine: what the policy cannot see into, or what disarms it
    Route(READ, "/{plugins|swarm|services|nodes|secrets|configs|tasks}/**"),  # looking is harmless
    Route(ANY, "/plugins/**", policy=Refuse(PLUGINS)),
    Route(ANY, "/{swarm|services|nodes|secrets|configs|tasks}/**", policy=Refuse(SWARM)),
    Route(ANY, "/build/prune", policy=Refuse(BUILDS), run=Refuse(PRUNES)),
    Route(ANY, "/build/**", policy=Refuse(BUILDS)),
    Route(ANY, "/session/**", policy=Refuse(SESSIONS)),
    Route(ANY, "/grpc/**", policy=Refuse(GRPC)),
    # the bodies that are read
    Route(POST, "/containers/create", policy=Body("container create", _container_create),
          run=Created("container")),
    Route(POST, "/containers/{id}/exec", policy=Body("exec create", _exec_create), run=Owned("container")),
    Route(POST, "/containers/{id}/update", policy=Body("container update", _container_update),
          run=Owned("container")),
    Route(POST, "/volumes/create", policy=Body("volume create", _volume_create), run=Created("volume")),
    Route(POST, "/networks/create", policy=Body("network create", _network_create), run=Created("network")),
    Route(POST, "/networks/{id}/{connect|disconnect}", run=Owned("network", container_field="Container")),
    # what a run reaches: its own objects, and listings of them
    Route(ANY, "/system/prune", run=Refuse(PRUNES)),
    Route(DELETE, "/images/{name}/**", run=Refuse(IMAGE_REMOVAL)),
    # Each with its own method: any other (`DELETE /containers/prune`, `.../json`,
    # `.../create`) names an object of that *name*, and goes to the ownership rows.
    Route(POST, "/{containers|images|volumes|networks}/prune", run=SCOPED),
    Route(READ, "/containers/json", run=SCOPED),
    Route(READ, "/{networks|volumes|events}", run=SCOPED),
    Route(POST, "/containers/{id}/attach", run=Owned("container"), hijack=True),
    Route(ANY, "/containers/{id}/**", run=Owned("container")),
    Route(ANY, "/commit", run=Refuse(f"committing a container {IMAGES_OUTLIVE}")),
    Route(ANY, "/images/load", run=Refuse(f"loading images {IMAGES_OUTLIVE}")),
    Route(ANY, "/images/create", run=RefuseWith("fromSrc", f"importing an image {IMAGES_OUTLIVE}")),
    Route(POST, "/images/{name}/**", run=Refuse(f"tagging or pushing an image {IMAGES_OUTLIVE}")),
    Route(POST, "/exec/{id}/start", run=Owned("exec"), hijack=True),
    Route(ANY, "/exec/{id}/**", run=Owned("exec")),
    Route(ANY, "/networks/{id}/**", run=Owned("network")),
    Route(ANY, "/volumes/{id}", run=Owned("volume")),
    # the engine's and the images' descriptions (images are shared and read-only to a
    # run), registry look-ups and credential checks
    Route(READ, "/{_ping|info|version}"),
    Route(GET, "/system/df", run=Refuse("the disk usage listing is refused (it shows every run's objects)")),
    Route(READ, "/images/**"),
    Route(READ, "/distribution/**"),
    Route(POST, "/auth"),
], methods=lambda r: r.methods, path=lambda r: r.path)


def route(method: str, path: str) -> Match[Route] | None:
    """The row of `API` for a request (PATH normalised)."""
    return API.match(method, path)


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
    hit = route(method, path)
    if hit is None or hit.route.policy is None:
        return ALLOW
    return hit.route.policy(body, policy)
