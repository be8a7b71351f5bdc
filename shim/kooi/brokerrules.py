"""A run's rules in its broker (the run column of kooi.policy.API): which containers,
execs, networks and volumes are the run's, and how its requests are rewritten: labels,
workspace paths, networks pinned to the ids decided on, the run's limits, its volumes,
and listings narrowed to its own objects."""

from __future__ import annotations

import json
import re
import secrets
import threading
import urllib.parse
from typing import TYPE_CHECKING, Any

from . import engineapi, gojson, labels
from .engineapi import Engine
from .httpwire import BadRequest
from .policy import Owned
from .policybody import TMPFS_TOTAL, Decision, deny, is_unset, security_opt, tmpfs_sizes

if TYPE_CHECKING:
    from .broker import RunScope

ENGINE_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")
# NetworkCreate fields a run may set (folded); every other must be unset (null, false,
# 0, "", {} or []); IPAM only as {"Driver": "default"} with nothing else set.
NETWORK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
NETWORK_FIELDS = frozenset({"name", "driver", "internal", "attachable", "labels", "checkduplicate"})
BUILTIN_NETWORKS = {"bridge", "default", ""}


def _matches(pattern: str, name: str) -> bool:
    """The engine's name filter: a regular expression searched in the name."""
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return False


def _lists_bridge(key: str, value: str) -> bool:
    """A network listing's filter KEY=VALUE lists the engine's default bridge."""
    if key == "name":
        return _matches(value, "bridge")
    return (key, value) in {("driver", "bridge"), ("type", "builtin"), ("scope", "local")}


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


class Rules:
    """Ownership, rewrites and list filters for one run (the run column of policy.API)."""

    def __init__(self, scope: RunScope, upstream: Engine) -> None:
        self.scope = scope
        self.up = upstream
        self.owned_ids: set[str] = set()
        self.networks = 0  # networks this run created
        self.lock = threading.Lock()
        # Names are the engine's, one for all runs: where another's object holds a name
        # the workload creates (Testcontainers' `reaper_default`, a compose project's
        # network), the run's object gets a name of its own (NAME.<8 hex>) and the run
        # reaches it by NAME: (kind, NAME) -> the name the engine knows it by.
        self.aliases: dict[tuple[str, str], str] = {}
        if scope.network:
            # The engine's default bridge, as the run sees it: its own network (where a
            # container that names `bridge` runs). testcontainers-go looks for it by name
            # (default_bridge) and otherwise makes `reaper_default`, whose published
            # ports the run network's gateway does not reach.
            self.aliases[("network", "bridge")] = scope.network

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
        asked = ref
        ref = self.real_name(kind, ref)
        key = f"{kind}:{ref}"
        with self.lock:
            if key in self.owned_ids:
                return None, ref
        ident, found = self._labels_of(kind, urllib.parse.quote(ref, safe=""))
        ref = asked
        if ident is None or found.get(labels.RUN) != self.scope.run_id:
            # One answer for both: a run must not learn what others have (probing ids).
            return deny(f"{kind} {ref!r} does not exist or is not this run's"), ref
        if ident in self.scope.protected:
            return deny(f"{kind} {ref!r} is the workload's own container, out of the broker's reach"), ref
        with self.lock:
            # Only ids are remembered: a name can later belong to someone else's object.
            self.owned_ids.add(f"{kind}:{ident}")
        return None, ident

    def real_name(self, kind: str, ref: str) -> str:
        """The engine's name of what the run calls REF (its own name where another's
        object held REF when the run made it)."""
        with self.lock:
            return self.aliases.get((kind, ref.lstrip("/") if kind == "container" else ref), ref)

    def name_of_its_own(self, kind: str, name: str) -> tuple[Decision | None, str]:
        """A create of KIND named NAME: (None, the name to hand the engine), or a refusal.
        NAME itself where no object holds it; where another's does, a name of the run's
        own that it reaches by NAME (NAME.<8 hex>). Where the run's own object holds it:
        a network is refused (a second network of a name makes every use of it
        ambiguous; engines before API 1.44 make one), a container or volume goes to the
        engine under the name the run's object has, which answers as it does (409 for a
        container, the volume itself for a volume: clients rely on both)."""
        key = (kind, name.lstrip("/") if kind == "container" else name)
        with self.lock:
            had = self.aliases.get(key)
        own = None
        if had is not None and self._labels_of(kind, urllib.parse.quote(had, safe=""))[0] is not None:
            own = had
        else:
            ident, found = self._labels_of(kind, urllib.parse.quote(key[1], safe=""))
            if ident is None:
                with self.lock:
                    self.aliases.pop(key, None)
                return None, name
            if found.get(labels.RUN) == self.scope.run_id:
                own = name
        if own is not None:
            if kind == "network":
                return deny(f"{kind} create: a {kind} named {name!r} of this run's exists, refused"), name
            return None, own
        if len(key[1]) > 119:
            return deny(f"{kind} create: the name {name[:80]!r}... is taken and too long for a name of the "
                        "run's own (at most 119 characters)"), name
        for _ in range(4):
            real = f"{key[1]}.{secrets.token_hex(4)}"
            if self._labels_of(kind, urllib.parse.quote(real, safe=""))[0] is None:
                with self.lock:
                    self.aliases[key] = real
                return None, real
        return deny(f"{kind} create: no free name for {name!r}"), name

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
            # (No route names its object in the query now; one that does must get the id
            # decided on into the query, as pinned_uri does for the path.)
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
        # kooi's labels are kooi's (gc reads which run owns an object and whether it lives
        # from them): the workload's go, the run's are set; keys matched exactly, as gc does.
        found = {k: v for k, v in found.items() if not (isinstance(k, str) and k.startswith(labels.PREFIX + "."))}
        found.update({k: "" for k in (labels.SESSION, labels.PERSON, labels.HOME, labels.SCAN)},  # set: no image's
                     **self.scope.labels)  # label fills them (review 45: a nested container passed for a session)
        gojson.set_field(doc, "Labels", found)

    def ensure_volume(self, name: str) -> tuple[Decision | None, str]:
        """A named volume the run mounts must be its own: (None, the engine's name of it)
        or a refusal; a new one is created labelled (Docker would create it unlabelled,
        out of the run's cleanup), named its own where another's volume holds NAME."""
        if name.startswith(labels.HOME_VOLUME_PREFIX):
            return deny(f"volume {name[:80]!r}: names {labels.HOME_VOLUME_PREFIX}* are kooi's sessions' kept "
                        "homes"), name
        real = self.real_name("volume", name)
        status, _ = self.up.call("GET", f"/volumes/{urllib.parse.quote(real, safe='')}")
        if status == 200:
            ident, found = self._labels_of("volume", urllib.parse.quote(real, safe=""))
            if found.get(labels.RUN) == self.scope.run_id:
                return None, real
        d, real = self.name_of_its_own("volume", name)
        if d is not None:
            return d, name
        status, _ = self.up.call("POST", "/volumes/create",
                                    {"Name": real, "Labels": dict(self.scope.labels)})
        if status not in (200, 201):
            return deny(f"volume {name!r} could not be created ({status})"), name
        return None, real

    def created(self, kind: str, doc: dict[str, Any]) -> Decision | None:
        """Make what a create of KIND makes the run's (DOC rewritten), or refuse it."""
        if kind == "container":
            return self.container_create(doc)
        if kind == "network" and (d := self.network_create(doc)) is not None:
            return d
        if kind == "volume" and (d := self.volume_create(doc)) is not None:
            return d
        self.add_labels(doc)
        return None

    def volume_create(self, doc: dict[str, Any]) -> Decision | None:
        """A named volume: the engine answers a create of a name that exists with that
        volume (another's): a name of the run's own instead (name_of_its_own)."""
        name = gojson.field(doc, "Name")
        if not isinstance(name, str) or not name:
            return None  # the engine names it
        if name.startswith(labels.HOME_VOLUME_PREFIX):
            # A person's home made before their session (review 14): the broker's rule, not kooi-authz's
            return deny(f"volume {name[:80]!r}: names {labels.HOME_VOLUME_PREFIX}* are kooi's sessions' kept homes")
        d, real = self.name_of_its_own("volume", name)
        if d is None:
            gojson.set_field(doc, "Name", real)
        return d

    def container_name(self, uri: str) -> tuple[Decision | None, str]:
        """A container create's `name`: (None, URI with the name the engine gets) or a
        refusal (name_of_its_own)."""
        query = dict(urllib.parse.parse_qsl(uri.partition("?")[2], keep_blank_values=True))
        name = query.get("name", "")
        if not name:
            return None, uri
        d, real = self.name_of_its_own("container", name)
        return (d, uri) if d is not None else (None, with_query(uri, "name", real) if real != name else uri)

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
        for key, value in doc.items():
            field = gojson.fold(key)
            if field in NETWORK_FIELDS or is_unset(value):
                continue
            if field == "ipam" and isinstance(value, dict) and all(
                    is_unset(v) or (gojson.fold(k) == "driver" and v == "default") for k, v in value.items()):
                continue
            return deny(f"network create: {key} refused (the engine chooses the bridge, its options and the "
                        "subnet; only Name, Driver bridge, Internal, Attachable, Labels and CheckDuplicate may be "
                        "set)")
        # A second network of a name the run holds makes every use of the name
        # ambiguous: refused; one another's network holds: a name of the run's own.
        d, real = self.name_of_its_own("network", name)
        if d is not None:
            return d
        gojson.set_field(doc, "Name", real)
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
                # the engine's name of it where the run holds it under a name of its own
                real = self.real_name("network", mode)
                if real != mode:
                    gojson.set_field(hc, "NetworkMode", real)
                pins[real] = pinned
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
                    real = self.real_name("network", net)
                    if real != net:
                        eps[real] = eps.pop(net)
                    pins[real] = pinned
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
                elif src:
                    d, src = self.ensure_volume(src)
                    if d is not None:
                        return d
                out.append(f"{src}:{rest}" if rest else src)
            gojson.set_field(hc, "Binds", out)
        mounts = gojson.field(hc, "Mounts")
        if isinstance(mounts, list):
            for m in mounts:
                if not isinstance(m, dict):
                    return None
                mtype = str(gojson.field(m, "Type") or "volume").lower()
                if mtype == "volume" and isinstance(vo := gojson.field(m, "VolumeOptions"), dict):
                    self.add_labels(vo)  # the volume the engine makes for it: the run's (review 45)
                src = gojson.field(m, "Source")
                if not isinstance(src, str):
                    continue
                if mtype == "bind":
                    gojson.set_field(m, "Source", self.host_path(src))
                    if self.is_workspace(self.host_path(src)) and isinstance(gojson.field(m, "Target"), str):
                        shadowed.append((gojson.field(m, "Target"), bool(gojson.field(m, "ReadOnly"))))
                elif mtype == "volume" and src:
                    d, real = self.ensure_volume(src)
                    if d is not None:
                        return d
                    gojson.set_field(m, "Source", real)
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

    def default_bridge(self, uri: str, listed: Any) -> Any:
        """A network listing (LISTED, the engine's answer to URI, the run's filters added)
        with the run's network also listed as `bridge`, the engine's default bridge as the
        run has it; where the client's own filters would not list the default bridge (a
        label, an id, another name or driver), as it is."""
        if not self.scope.network or not isinstance(listed, list):
            return listed
        for k, v in urllib.parse.parse_qsl(uri.partition("?")[2], keep_blank_values=True):
            if k != "filters":
                continue
            try:
                asked = json.loads(v) if v else {}
            except ValueError:
                return listed
            if not isinstance(asked, dict):
                return listed
            for key, values in asked.items():
                vals = [x for x, on in values.items() if on] if isinstance(values, dict) else values
                if key == "label" and vals == [f"{labels.RUN}={self.scope.run_id}"]:
                    continue  # the run's own, added by filter_query
                if not isinstance(vals, list) or not all(isinstance(x, str) and _lists_bridge(key, x) for x in vals):
                    return listed
        if any(isinstance(n, dict) and n.get("Name") == "bridge" for n in listed):
            return listed
        own = [n for n in listed if isinstance(n, dict) and n.get("Name") == self.scope.network]
        if not own:
            status, doc = self.up.call("GET", f"/networks/{urllib.parse.quote(self.scope.network, safe='')}")
            own = [doc] if status == 200 and isinstance(doc, dict) else []
        return listed + [{**own[0], "Name": "bridge"}] if own else listed

    def containers_on_bridge(self, doc: Any) -> Any:
        """A container inspection or listing (DOC, the engine's) with the run's network
        also under `bridge` in NetworkSettings.Networks: the default bridge as the run
        has it (testcontainers-python 4.0 reads a container's gateway there)."""
        if not self.scope.network:
            return doc
        for c in doc if isinstance(doc, list) else [doc]:
            settings = c.get("NetworkSettings") if isinstance(c, dict) else None
            nets = settings.get("Networks") if isinstance(settings, dict) else None
            if isinstance(nets, dict) and self.scope.network in nets and "bridge" not in nets:
                nets["bridge"] = nets[self.scope.network]
        return doc

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
