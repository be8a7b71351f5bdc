"""`kooi broker`: a per-run unix-socket proxy in front of the runner's engine.

A workload that needs a container engine (Testcontainers) gets this socket, never the
daemon's. Every request passes kooi's request policy (kooi.policy, the same as the
authorization plugin) plus what only a per-run proxy can do:
- everything the run creates (containers, networks, volumes) is labelled with the run,
  and the run removes it all when it ends (`cleanup`), so Ryuk is not needed;
- containers, execs, networks and volumes the run did not create are out of reach
  (inspect, logs, exec, attach, archive, stop, remove ...), and listings show only the
  run's own objects; prunes and image removal are refused;
- bind sources under the workload's /workspace are translated to the project on the
  host (then checked by the policy, symlinks resolved); a mount of the engine socket
  (Ryuk's) is answered with this broker's socket, never the daemon's;
- containers that name no network join the run's network, where the workload reaches
  their published ports at the network's gateway (TESTCONTAINERS_HOST_OVERRIDE).

Each client connection carries one request; the broker forwards it on a fresh
upstream connection with `Connection: close` and relays the response verbatim, so no
second, uninspected request can follow on the same connection. Attach and exec-start
connections are hijacked by the daemon and relayed both ways.

Which endpoint gets which of these is the `run` column of kooi.policy.API (the table the
request policy reads too); `Rules` carries it out. The HTTP/1.1 framing is kooi.httpwire.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import socketserver
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import engineapi, gojson, labels
from .engineapi import Engine
from .httpwire import (
    BadRequest,
    NoRequest,
    Reader,
    Request,
    continue_if_expected,
    forward,
    read_body,
    read_head,
    respond,
)
from .policy import (
    MAX_BODY,
    TMPFS_TOTAL,
    Created,
    Decision,
    Owned,
    Policy,
    Refuse,
    RefuseWith,
    Scoped,
    check_body,
    decide,
    deny,
    is_unset,
    normalize,
    route,
    security_opt,
    tmpfs_sizes,
)
from .routes import compile_path

ENGINE_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")
# NetworkCreate fields a run may set (folded); every other must be unset (null, false,
# 0, "", {} or []); IPAM only as {"Driver": "default"} with nothing else set.
NETWORK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
NETWORK_FIELDS = frozenset({"name", "driver", "internal", "attachable", "labels", "checkduplicate"})
BUILTIN_NETWORKS = {"bridge", "default", ""}
NETWORK = compile_path("/networks/{id}")
CONTAINER = compile_path("/containers/{id}")


def with_query(uri: str, key: str, value: str) -> str:
    """URI with the query parameter KEY set to VALUE (every other one kept)."""
    path, _, query = uri.partition("?")
    params = [(k, v) for k, v in urllib.parse.parse_qsl(query, keep_blank_values=True) if k != key]
    return path + "?" + urllib.parse.urlencode([*params, (key, value)])


def pin_endpoint(ep: dict[str, Any], ident: str | None) -> None:
    """An endpoint's config with NetworkID IDENT (None: without one), whatever the
    workload wrote there: the engine connects to the network the NetworkID names (an
    id or a name, any network's: measured, a NetworkID of another network's joined it,
    "bridge" the default bridge), before and instead of the one the key names."""
    for k in [k for k in ep if gojson.fold(k) == gojson.fold("NetworkID")]:
        del ep[k]
    if ident is not None:
        ep["NetworkID"] = ident


def pinned_uri(uri: str, ref: str, ident: str) -> str | None:
    """URI with the object it names (REF, the path segment after the kind's) as IDENT,
    the id the broker decided on; None where the path does not hold REF so."""
    path, sep, query = uri.partition("?")
    parts = path.split("/")
    for i in range(1, len(parts)):
        if parts[i - 1] in ("containers", "networks", "volumes", "exec") and urllib.parse.unquote(parts[i]) == ref:
            parts[i] = urllib.parse.quote(ident, safe="")
            return "/".join(parts) + sep + query
    return None


@dataclass
class RunScope:
    """What the broker knows about its run."""

    run_id: str
    labels: dict[str, str]
    network: str | None = None                      # the run's network (name)
    socket_host_path: str = ""                      # this broker's socket, as the daemon sees it
    socket_aliases: tuple[str, ...] = ("/run/kooi/docker.sock",)  # its path inside containers
    path_map: dict[str, str] = field(default_factory=dict)        # container path -> host path
    protected: set[str] = field(default_factory=set)              # ids out of reach (the workload's own)
    # The workload's container, attached to every network the run creates so that it
    # reaches what it starts there directly (the engine isolates bridges
    # from each other, published ports included); None: no attaching.
    attach: str | None = None
    # The AppArmor profile every container the run creates gets (kooi's runner profile
    # where the engine applies AppArmor); None: the engine's default.
    apparmor: str | None = None
    # The run's limits (run.limits.Plan.ceilings): forced on every container the run
    # creates where it names none; the policy refuses values above them.
    limits: dict[str, int] = field(default_factory=dict)
    # The OCI runtime every container the run creates runs under (isolation gvisor:
    # runsc, so the nested database is as contained as the build); None: the engine's
    # default. A request naming any other is refused, not rewritten.
    runtime: str | None = None
    # The guard's shadows (path in the project, throwaway copy on the host): mounted over
    # the same paths wherever a container of the run binds the workspace, so that it sees
    # the project as the workload does (run.guard).
    shadows: tuple[tuple[str, str], ...] = ()
    # How many networks the run may create (each takes a subnet from the engine's pool,
    # which all runs share).
    max_networks: int = 8
    # The names of the bridges of the networks the workload creates, in order (run.runnet:
    # the rules of the run's way to the host go by them); empty: the engine names them.
    bridges: tuple[str, ...] = ()


class Rules:
    """Ownership, rewrites and list filters for one run (the run column of policy.API)."""

    def __init__(self, scope: RunScope, upstream: Engine) -> None:
        self.scope = scope
        self.up = upstream
        self.owned_ids: set[str] = set()
        self.networks = 0  # networks this run created
        self.lock = threading.Lock()

    # ownership ------------------------------------------------------------------------
    def _labels_of(self, kind: str, ref: str) -> tuple[str | None, dict[str, str]]:
        path = {"container": f"/containers/{ref}/json", "network": f"/networks/{ref}",
                "volume": f"/volumes/{ref}"}[kind]
        status, doc = self.up.call("GET", path)
        if status != 200 or not isinstance(doc, dict):
            return None, {}
        found = (doc.get("Config") or {}).get("Labels") if kind == "container" else doc.get("Labels")
        ident = doc.get("Id") or doc.get("Name")
        return ident, found or {}

    def owns(self, kind: str, ref: str) -> Decision | None:
        """None if the run owns it; a refusal otherwise (also when it does not exist:
        the run must not learn what others have)."""
        return self.pin(kind, ref)[0]

    def pin(self, kind: str, ref: str) -> tuple[Decision | None, str]:
        """(None, its id) if the run owns what REF names; (a refusal, REF) otherwise. The
        engine resolves a name (or an id's prefix) again when it acts on it, and a name
        can by then be another's (a network the run removed, made again under its name
        by another run or the host): what the broker forwards names the id it decided on."""
        key = f"{kind}:{ref}"
        with self.lock:
            if key in self.owned_ids:
                return None, ref
        ident, found = self._labels_of(kind, urllib.parse.quote(ref, safe=""))
        if ident is None or found.get(labels.RUN) != self.scope.run_id:
            # One answer for both: a run must not learn what others have (probing ids).
            return deny(f"{kind} {ref!r} does not exist or is not this run's"), ref
        if ident in self.scope.protected:
            return deny(f"{kind} {ref!r} is the workload's own container, out of the broker's reach"), ref
        with self.lock:
            # Only ids are remembered: a name can later belong to someone else's object.
            self.owned_ids.add(f"{kind}:{ident}")
        return None, ident

    def owns_exec(self, exec_id: str) -> Decision | None:
        status, doc = self.up.call("GET", f"/exec/{urllib.parse.quote(exec_id, safe='')}/json")
        if status != 200 or not isinstance(doc, dict) or not doc.get("ContainerID"):
            return deny(f"exec {exec_id!r} does not exist or is not this run's")
        return self.owns("container", doc["ContainerID"])

    def owned(self, rule: Owned, params: dict[str, str], uri: str, doc: dict[str, Any] | None) -> Decision | None:
        """None if what the request names (RULE, on the path's PARAMS, the query of URI or
        the body DOC) is the run's; a refusal otherwise. PARAMS["id"] and DOC's container
        field become the ids decided on (pin)."""
        if rule.query is not None:
            query = dict(urllib.parse.parse_qsl(uri.partition("?")[2]))
            return self.owns(rule.kind, query.get(rule.query, ""))
        ref = params["id"]
        if rule.kind == "exec":
            d, ident = self.owns_exec(ref), ref
        else:
            d, ident = self.pin(rule.kind, ref)
        if d is not None:
            return d
        params["id"] = ident
        if rule.container_field is not None and doc is not None:
            c = gojson.field(doc, rule.container_field)
            d, cid = self.pin("container", c) if isinstance(c, str) else (deny(""), "")
            if d is not None:
                # (also said of a container that is not the run's, as it always was)
                return deny("network connect: Container must be a string")
            gojson.set_field(doc, rule.container_field, cid)
            ep = gojson.field(doc, "EndpointConfig")
            if isinstance(ep, dict):
                pin_endpoint(ep, ident)
            elif uri.partition("?")[0].endswith("/connect"):
                gojson.set_field(doc, "EndpointConfig", {"NetworkID": ident})
        return None

    def network_ok(self, name: str) -> Decision | None:
        return self.pin_network(name)[0]

    def user_network(self, name: str) -> bool:
        """NAME is a network of the workload's (not none, a builtin, kooi's run network
        or another container's namespace)."""
        return not (name == "none" or name == self.scope.network or name in BUILTIN_NETWORKS
                    or name.startswith("container:"))

    def pin_network(self, name: str) -> tuple[Decision | None, str]:
        """A create's network (NetworkMode, an EndpointsConfig key): (None, what to hand
        the engine: an id where the name is the workload's) or (a refusal, NAME)."""
        if name == "none" or name == self.scope.network or (name in BUILTIN_NETWORKS and not self.scope.network):
            return None, name
        if name.startswith("container:"):
            d, ident = self.pin("container", name.split(":", 1)[1])
            return d, f"container:{ident}"
        return self.pin("network", name)

    # rewrites -------------------------------------------------------------------------
    def host_path(self, src: str) -> str:
        if src in self.scope.socket_aliases or src in ENGINE_SOCKETS:
            return self.scope.socket_host_path or src
        for cpath, hpath in self.scope.path_map.items():
            if src == cpath or src.startswith(cpath.rstrip("/") + "/"):
                return hpath.rstrip("/") + src[len(cpath.rstrip("/")):]
        return src

    def add_labels(self, doc: dict[str, Any]) -> None:
        found = gojson.field(doc, "Labels") or {}
        if not isinstance(found, dict):
            raise BadRequest("Labels must be an object")
        found.update(self.scope.labels)  # a map: its keys are matched exactly
        gojson.set_field(doc, "Labels", found)

    def ensure_volume(self, name: str) -> Decision | None:
        """A named volume the run mounts must be its own; a new one is created labelled
        (Docker would create it unlabelled, out of the run's cleanup)."""
        status, _ = self.up.call("GET", f"/volumes/{urllib.parse.quote(name, safe='')}")
        if status == 200:
            return self.owns("volume", name)
        status, _ = self.up.call("POST", "/volumes/create",
                                    {"Name": name, "Labels": dict(self.scope.labels)})
        if status not in (200, 201):
            return deny(f"volume {name!r} could not be created ({status})")
        return None

    def created(self, kind: str, doc: dict[str, Any]) -> Decision | None:
        """Make what a create of KIND makes the run's (DOC rewritten), or refuse it."""
        if kind == "container":
            return self.container_create(doc)
        if kind == "network" and (d := self.network_create(doc)) is not None:
            return d
        self.add_labels(doc)
        return None

    def network_create(self, doc: dict[str, Any]) -> Decision | None:
        """Only bridge networks with kooi's own settings: the engine names the bridge
        (outside the host's rules for docker0/br-*, or an existing bridge taken over,
        with driver options) and takes the subnet from its pool (an IPAM subnet of the
        workload's choosing can shadow kooi's own addresses); a bounded number per run."""
        drv = gojson.field(doc, "Driver") or "bridge"
        if drv != "bridge":
            return deny(f"network driver {drv!r} refused (only bridge networks)")
        name = gojson.field(doc, "Name")
        if not isinstance(name, str) or not name:
            return deny("network create: Name must be a non-empty string")
        if not NETWORK_NAME.fullmatch(name):
            # The engine takes any string; names end up in root's `kooi gc` output and
            # every listing (a workload's name carried terminal escapes).
            return deny("network create: Name refused (letters, digits and _.- only, at most 128, as the engine's "
                        "container names)")
        if name.lower().startswith("kooi-"):
            return deny(f"network create: name {name!r} refused (kooi- names are kooi's own run networks)")
        status, _ = self.up.call("GET", f"/networks/{urllib.parse.quote(name, safe='')}")
        if status != 404:
            # A second network of an existing name makes every use of the name
            # ambiguous, the other run's included.
            return deny(f"network create: a network named {name!r} exists, refused")
        for key, value in doc.items():
            name = gojson.fold(key)
            if name in NETWORK_FIELDS or is_unset(value):
                continue
            if name == "ipam" and isinstance(value, dict) and all(
                    is_unset(v) or (gojson.fold(k) == "driver" and v == "default") for k, v in value.items()):
                continue
            return deny(f"network create: {key} refused (the engine chooses the bridge, its options and the "
                        "subnet; only Name, Driver bridge, Internal, Attachable, Labels and CheckDuplicate may be "
                        "set)")
        with self.lock:
            if self.networks >= self.scope.max_networks:
                return deny(f"network create refused: this run created {self.networks} networks, the most a run "
                            "may (their subnets come from one pool that every run shares)")
            self.networks += 1
            n = self.networks
        if self.scope.bridges:
            # kooi's own option, after the check: the bridge is named after the run.
            gojson.set_field(doc, "Options", {engineapi.BRIDGE_NAME: self.scope.bridges[(n - 1) % len(self.scope.bridges)]})
        return None

    def container_create(self, doc: dict[str, Any]) -> Decision | None:
        self.add_labels(doc)
        hc = gojson.field(doc, "HostConfig")
        if hc is None:
            hc = {}
            gojson.set_field(doc, "HostConfig", hc)
        if not isinstance(hc, dict):
            return None  # the policy refuses it
        self.force_limits(hc)
        if self.scope.runtime:
            asked = gojson.field(hc, "Runtime")
            if asked not in (None, "", self.scope.runtime):
                return deny(f"runtime {asked!r} refused: every container of this run runs under "
                            f"{self.scope.runtime} (isolation gvisor)")
            gojson.set_field(hc, "Runtime", self.scope.runtime)
        if self.scope.apparmor:
            opts = gojson.field(hc, "SecurityOpt") or []
            if not isinstance(opts, list):
                return None
            keep = [o for o in opts if not security_opt(o).startswith("apparmor=")]
            gojson.set_field(hc, "SecurityOpt", keep + [f"apparmor={self.scope.apparmor}"])
        mode = gojson.field(hc, "NetworkMode")
        if not isinstance(mode, (str, type(None))):
            return None
        if (mode or "") in BUILTIN_NETWORKS and self.scope.network:
            gojson.set_field(hc, "NetworkMode", self.scope.network)
        # The engine keeps a network by its name at create and looks it up at start by
        # the endpoint's NetworkID where there is one, else by that name again: every
        # network of the workload's gets the id the broker decided on, and no NetworkID
        # of the workload's (any network, by id or by name) reaches the engine.
        pins: dict[str, str] = {}
        if mode and mode.lower() != "host" and not ((mode or "") in BUILTIN_NETWORKS and self.scope.network):
            d, pinned = self.pin_network(mode)
            if d is not None:
                return d
            if mode.startswith("container:"):
                gojson.set_field(hc, "NetworkMode", pinned)  # resolved again at start too
            elif self.user_network(mode):
                pins[mode] = pinned
        nc = gojson.field(doc, "NetworkingConfig")
        eps = gojson.field(nc, "EndpointsConfig") if isinstance(nc, dict) else None
        if isinstance(eps, dict):
            for net in list(eps):
                if net in BUILTIN_NETWORKS and self.scope.network:
                    eps[self.scope.network] = eps.pop(net)
                    continue
                d, pinned = self.pin_network(net)
                if d is not None:
                    return d
                if self.user_network(net):
                    pins[net] = pinned
            for ep in eps.values():
                if isinstance(ep, dict):
                    pin_endpoint(ep, None)
        if pins:
            if not isinstance(nc, dict):
                nc = {}
                gojson.set_field(doc, "NetworkingConfig", nc)
            if not isinstance(eps, dict):
                eps = {}
                gojson.set_field(nc, "EndpointsConfig", eps)
            for net, ident in pins.items():
                ep = eps.get(net)
                if not isinstance(ep, dict):
                    ep = eps[net] = {}
                pin_endpoint(ep, ident)
        shadowed: list[tuple[str, bool]] = []  # (target, read-only) of every bind of the workspace
        binds = gojson.field(hc, "Binds")
        if isinstance(binds, list):
            out: list[str] = []
            for b in binds:
                if not isinstance(b, str):
                    return None
                src, _, rest = b.partition(":")
                if src.startswith("/"):
                    src = self.host_path(src)
                    if self.is_workspace(src):
                        target, _, opts = rest.partition(":")
                        shadowed.append((target, "ro" in opts.lower().split(",")))
                elif src and (d := self.ensure_volume(src)) is not None:
                    return d
                out.append(f"{src}:{rest}" if rest else src)
            gojson.set_field(hc, "Binds", out)
        mounts = gojson.field(hc, "Mounts")
        if isinstance(mounts, list):
            for m in mounts:
                if not isinstance(m, dict):
                    return None
                mtype = str(gojson.field(m, "Type") or "volume").lower()
                src = gojson.field(m, "Source")
                if not isinstance(src, str):
                    continue
                if mtype == "bind":
                    gojson.set_field(m, "Source", self.host_path(src))
                    if self.is_workspace(self.host_path(src)) and isinstance(gojson.field(m, "Target"), str):
                        shadowed.append((gojson.field(m, "Target"), bool(gojson.field(m, "ReadOnly"))))
                elif mtype == "volume" and src and (d := self.ensure_volume(src)) is not None:
                    return d
        if shadowed and self.scope.shadows:
            if mounts is None:
                gojson.set_field(hc, "Mounts", mounts := [])
            if not isinstance(mounts, list):
                return None
            for target, ro in shadowed:
                mounts.extend({"Type": "bind", "Source": copy, "Target": f"{target.rstrip('/')}/{rel}", "ReadOnly": ro}
                              for rel, copy in self.scope.shadows)
        return None

    def is_workspace(self, host_src: str) -> bool:
        """HOST_SRC (a translated bind source) is the workspace itself."""
        root = self.scope.path_map.get("/workspace")
        return root is not None and host_src.rstrip("/") == root.rstrip("/")

    def force_limits(self, hc: dict[str, Any]) -> None:
        """The run's limits on a container that names none (0 is the docker CLI's "not
        set"); values it names are the policy's to check against the run's."""
        lim = self.scope.limits
        for key in ("Memory", "PidsLimit"):
            if key in lim and not gojson.field(hc, key):
                gojson.set_field(hc, key, lim[key])
        if "Memory" in lim and not gojson.field(hc, "MemorySwap"):
            gojson.set_field(hc, "MemorySwap", gojson.field(hc, "Memory"))  # no swap beyond it
        if "NanoCpus" in lim and not gojson.field(hc, "NanoCpus") and not gojson.field(hc, "CpuQuota"):
            gojson.set_field(hc, "NanoCpus", lim["NanoCpus"])
        ulimits = gojson.field(hc, "Ulimits") or []
        if not isinstance(ulimits, list):
            return  # the policy refuses it
        named = {str(gojson.field(u, "Name")).strip().lower() for u in ulimits if isinstance(u, dict)}
        for key, value in lim.items():
            if key.startswith("ulimit:") and key[len("ulimit:"):] not in named:
                ulimits.append({"Name": key[len("ulimit:"):], "Soft": value, "Hard": value})
        if ulimits:
            gojson.set_field(hc, "Ulimits", ulimits)
        if TMPFS_TOTAL in lim:
            self.force_tmpfs_sizes(hc, lim[TMPFS_TOTAL])

    @staticmethod
    def force_tmpfs_sizes(hc: dict[str, Any], total: int) -> None:
        """Each tmpfs that names no size gets an equal share of what the named ones
        leave of TOTAL (the run's memory; the kernel's default is half the host's
        memory); the policy checks the sum."""
        found, err = tmpfs_sizes(hc)
        unsized = sum(1 for _, size in found if size is None)
        if err or not unsized:
            return
        share = max((total - sum(size or 0 for _, size in found)) // unsized, 1 << 20)
        tmpfs = gojson.field(hc, "Tmpfs")
        if isinstance(tmpfs, dict):
            for target, opts in tmpfs.items():
                if isinstance(opts, str) and not any(o.strip().lower().startswith("size=") for o in opts.split(",")):
                    tmpfs[target] = ",".join(o for o in (opts, f"size={share}") if o)
        for m in gojson.field(hc, "Mounts") or []:
            if isinstance(m, dict) and str(gojson.field(m, "Type") or "").lower() == "tmpfs":
                to = gojson.field(m, "TmpfsOptions")
                if to is None:
                    gojson.set_field(m, "TmpfsOptions", to := {})
                if isinstance(to, dict) and not gojson.field(to, "SizeBytes"):
                    gojson.set_field(to, "SizeBytes", share)

    def filter_query(self, uri: str) -> str:
        """Add the run's label to a listing's filters (both filter encodings)."""
        path, _, query = uri.partition("?")
        params = urllib.parse.parse_qsl(query, keep_blank_values=True)
        want = f"{labels.RUN}={self.scope.run_id}"
        filters: dict[str, Any] = {}
        rest: list[tuple[str, str]] = []
        for k, v in params:
            if k == "filters":
                try:
                    parsed = json.loads(v) if v else {}
                except ValueError:
                    raise BadRequest("filters is not JSON") from None
                if not isinstance(parsed, dict):
                    raise BadRequest("filters is not a JSON object")
                filters.update(parsed)
            else:
                rest.append((k, v))
        label = filters.get("label")
        if isinstance(label, dict):
            label = [k for k, on in label.items() if on]
        label = list(label or []) if isinstance(label, (list, dict)) or label is None else None
        if label is None:
            raise BadRequest("label filter must be a list")
        filters["label"] = label + [want]
        rest.append(("filters", json.dumps(filters)))
        return path + "?" + urllib.parse.urlencode(rest)


# --- the proxy ----------------------------------------------------------------------


class Broker:
    """Serve the broker socket in background threads until `stop()`."""

    def __init__(self, listen: str, upstream: str, policy: Policy, scope: RunScope,
                 log: Callable[[str], None] | None = None, max_body: int = MAX_BODY) -> None:
        self.listen = listen
        self.upstream = Engine(upstream)
        scope.socket_host_path = scope.socket_host_path or listen
        self.scope = scope
        self.policy = dataclasses.replace(policy, engine_socket=scope.socket_host_path)
        self.rules = Rules(scope, self.upstream)
        self.log: Callable[[str], None] = log or (lambda _m: None)
        self.max_body = max_body
        self.allowed = 0
        self.refusals: list[str] = []
        self.attached: set[str] = set()  # networks the workload was attached to
        self.lock = threading.Lock()
        self.server: _Server | None = None
        self.thread: threading.Thread | None = None

    def start(self, mode: int = 0o666) -> None:
        try:
            os.unlink(self.listen)
        except FileNotFoundError:
            pass
        old = os.umask(0o777 ^ mode)
        try:
            self.server = _Server(self.listen, self)
        finally:
            os.umask(old)
        os.chmod(self.listen, mode)
        self.thread = threading.Thread(target=self.server.serve_forever, name="kooi-broker", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        try:
            os.unlink(self.listen)
        except FileNotFoundError:
            pass

    def summary(self) -> dict[str, Any]:
        with self.lock:
            # The first refusals and the last (a flood of harmless ones cannot push the
            # attempt that mattered out of the record); the count is whole.
            shown = self.refusals if len(self.refusals) <= 100 else [
                *self.refusals[:50], f"... {len(self.refusals) - 100} more ...", *self.refusals[-50:]]
            return {"allowed": self.allowed, "refused": len(self.refusals), "refusals": shown}

    # one request --------------------------------------------------------------------
    def decide(self, req: Request) -> tuple[Decision, Request]:
        """Decide on REQ (its body read if its row of policy.API reads it): the run's
        refusals, its rewrites (list filters, labels, a container's config), the request
        policy on the rewritten request, then ownership of what it names."""
        path, err = normalize(req.uri)
        if err:
            return deny(err), req
        hit = route(req.method, path)
        run = hit.route.run if hit else None
        if isinstance(run, Refuse):
            return deny(run.reason), req
        if isinstance(run, RefuseWith) and run.param in dict(
                urllib.parse.parse_qsl(req.uri.partition("?")[2], keep_blank_values=True)):
            return deny(run.reason), req
        if isinstance(run, Scoped):
            # Listings show the run's objects only; Testcontainers prunes its session's
            # objects when Ryuk is off: only the run's.
            req.uri = self.rules.filter_query(req.uri)
        body = req.body
        doc = None
        if hit and hit.route.body:
            # The policy's reading of the body first (no body, oversized, not an object,
            # duplicate keys: refused); rewrites then work on the accepted document.
            doc, d = check_body(body, self.policy, path.rsplit("/", 1)[-1])
            if d is not None:
                return d, req
            assert doc is not None
            if isinstance(run, Created):
                if (d := self.rules.created(run.kind, doc)) is not None:
                    return d, req
                body = json.dumps(doc).encode()
        d = decide(req.method, req.uri, body, self.policy)
        if not d.allow:
            return d, req
        req.body = body
        if hit and isinstance(run, Owned):
            asked = dict(hit.params)
            if (o := self.rules.owned(run, hit.params, req.uri, doc)) is not None:
                return o, req
            if hit.params.get("id") != asked.get("id"):
                pinned = pinned_uri(req.uri, asked["id"], hit.params["id"])
                if pinned is None:
                    return deny(f"{req.uri[:200]!r}: the broker cannot hand the engine the id it decided on"), req
                req.uri = pinned
            if run.container_field is not None and doc is not None:
                req.body = json.dumps(doc).encode()
        if req.method == "DELETE" and CONTAINER.fullmatch(path):
            # With its anonymous volumes (`Volumes`, a volume mount without a name): the
            # engine labels none of them, so nothing would find them after the run.
            req.uri = with_query(req.uri, "v", "1")
        return d, req

    # the workload on the run's networks (scope.attach) ---------------------------------
    def create_attached_network(self, req: Request) -> tuple[int, Any]:
        """Create the network (body already decided on) and attach the workload to it;
        a network the workload cannot join is removed again and the create fails."""
        status, doc = self.upstream.call("POST", req.uri, json.loads(req.body or b"{}"))
        ident = doc.get("Id") if isinstance(doc, dict) else None
        if status != 201 or not ident:
            return status, doc if doc is not None else {"message": f"network create failed ({status})"}
        st, err = self.upstream.call("POST", f"/networks/{ident}/connect", {"Container": self.scope.attach})
        if st != 200:
            self.upstream.call("DELETE", f"/networks/{ident}")
            why = err.get("message") if isinstance(err, dict) else st
            self.log(f"broker: could not attach the workload to network {ident[:12]}: {why}")
            return 500, {"message": f"kooi broker: could not attach the workload to the new network: {why}"}
        with self.lock:
            self.attached.add(ident)
        return status, doc

    def before_network_removal(self, method: str, path: str) -> None:
        """Detach the workload from a network the run removes (a network with an
        endpoint cannot be removed); on a network prune, from the networks where it is
        the last endpoint."""
        with self.lock:
            attached = set(self.attached)
        if not attached:
            return
        if method == "DELETE" and (m := NETWORK.fullmatch(path)):
            status, doc = self.upstream.call("GET", f"/networks/{urllib.parse.quote(m['id'], safe='')}")
            targets = [doc["Id"]] if status == 200 and isinstance(doc, dict) and doc.get("Id") in attached else []
        elif method == "POST" and path == "/networks/prune":
            targets = []
            for ident in attached:
                status, doc = self.upstream.call("GET", f"/networks/{ident}")
                if status == 200 and isinstance(doc, dict) and set(doc.get("Containers") or {}) <= {self.scope.attach}:
                    targets.append(ident)
        else:
            return
        for ident in targets:
            self.upstream.call("POST", f"/networks/{ident}/disconnect",
                                  {"Container": self.scope.attach, "Force": True})
            with self.lock:
                self.attached.discard(ident)

    def record(self, req: Request, d: Decision) -> None:
        with self.lock:
            if d.allow:
                self.allowed += 1
            else:
                self.refusals.append(f"{req.method} {req.uri.split('?', 1)[0]}: {d.reason}")
        if not d.allow:
            self.log(f"broker refused {req.method} {req.uri.split('?', 1)[0]}: {d.reason}")


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, broker: Broker) -> None:
        self.broker = broker
        super().__init__(path, _Handler)


def _reply(sock: socket.socket, status: int, message: str | None = None, doc: Any = None) -> None:
    """Answer with an error (MESSAGE, the engine's error format) or a document the
    broker produced (DOC)."""
    respond(sock, status, json.dumps({"message": message} if doc is None else doc).encode())


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        client: socket.socket = self.request
        broker = self.server.broker
        r = Reader(client)
        try:
            req = read_head(r)
        except NoRequest:
            return
        except (BadRequest, OSError) as exc:
            broker.record(Request("?", "(a malformed request)", "", []), deny(f"malformed request: {exc}"))
            _reply(client, 400, f"kooi broker: {exc}")
            return
        path, _ = normalize(req.uri)
        hit = route(req.method, path)
        try:
            continue_if_expected(client, req)
            if hit and hit.route.body:
                req.body = read_body(r, req, broker.max_body)
                if req.body is None:
                    d = deny(f"body exceeds {broker.max_body} bytes, refused")
                    broker.record(req, d)
                    _reply(client, 403, f"kooi broker: {d.reason}")
                    return
            d, req = broker.decide(req)
        except BadRequest as exc:
            broker.record(req, deny(f"malformed request: {exc}"))
            _reply(client, 400, f"kooi broker: {exc}")
            return
        except OSError as exc:
            _reply(client, 502, f"kooi broker: the engine does not answer ({exc})")
            return
        broker.record(req, d)
        if not d.allow:
            _reply(client, 403, f"kooi broker: {d.reason}")
            return
        if broker.scope.attach:
            try:
                if hit and hit.route.run == Created("network"):
                    status, doc = broker.create_attached_network(req)
                    _reply(client, status, doc=doc)
                    return
                broker.before_network_removal(req.method, path)
            except OSError as exc:
                _reply(client, 502, f"kooi broker: the engine does not answer ({exc})")
                return
        try:
            up = broker.upstream.connect()
        except OSError as exc:
            _reply(client, 502, f"kooi broker: the engine does not answer ({exc})")
            return
        up.settimeout(None)
        try:
            forward(r, req, client, up, upgrade=bool(hit and hit.route.hijack))
        except (OSError, BadRequest):
            pass
        finally:
            up.close()


def cleanup(upstream: str, run_id: str, keep: set[str] | None = None) -> dict[str, list[str]]:
    """Remove every container, network and volume labelled with RUN_ID (except the ids
    in KEEP); returns what was removed and what could not be."""
    up = Engine(upstream, timeout=120)
    flt = urllib.parse.quote(json.dumps({"label": [f"{labels.RUN}={run_id}"]}))
    out: dict[str, list[str]] = {"containers": [], "networks": [], "volumes": [], "failed": []}
    keep = keep or set()
    status, doc = up.call("GET", f"/containers/json?all=1&filters={flt}")
    for c in doc or [] if status == 200 else []:
        if c["Id"] in keep:
            continue
        st, _ = up.call("DELETE", f"/containers/{c['Id']}?force=1&v=1")
        (out["containers"] if st in (204, 404) else out["failed"]).append(
            (c.get("Names") or [c["Id"][:12]])[0].lstrip("/"))
    status, doc = up.call("GET", f"/networks?filters={flt}")
    for n in doc or [] if status == 200 else []:
        if n["Id"] in keep or n.get("Name") in keep:
            continue
        st, _ = up.call("DELETE", f"/networks/{n['Id']}")
        (out["networks"] if st in (204, 404) else out["failed"]).append(n.get("Name") or n["Id"][:12])
    status, doc = up.call("GET", f"/volumes?filters={flt}")
    for v in (doc or {}).get("Volumes") or [] if status == 200 else []:
        st, _ = up.call("DELETE", f"/volumes/{urllib.parse.quote(v['Name'], safe='')}?force=1")
        (out["volumes"] if st in (204, 404) else out["failed"]).append(v["Name"])
    return out
