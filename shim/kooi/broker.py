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
request policy reads too); `Rules` (kooi.brokerrules) carries it out. The socket server
is kooi.brokerhttp, the HTTP/1.1 framing kooi.httpwire.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import labels
from .brokerhttp import _Server
from .brokerrules import Rules, pinned_uri, with_query
from .engineapi import Engine
from .httpwire import Request
from .policy import (
    MAX_BODY,
    Created,
    Owned,
    Policy,
    Refuse,
    RefuseWith,
    Scoped,
    check_body,
    decide,
    normalize,
    route,
)
from .policybody import Decision, deny
from .routes import compile_path

NETWORK = compile_path("/networks/{id}")
CONTAINER = compile_path("/containers/{id}")


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


# --- the proxy ----------------------------------------------------------------------


# How long a run's end waits for requests already on their way to the engine.
STOP_GRACE = 30.0


def _cut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


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
        # The run's end (review 48: a request held back mid-head until the broker had
        # stopped was still decided and forwarded, and created a container after the
        # cleanup's listing): requests not yet decided when it stops are cut off; those
        # on their way to the engine are waited for (then cut off) before stop() returns,
        # so the cleanup that follows sees everything they made.
        self.closing = False
        self._reading: set[socket.socket] = set()
        # client -> [its engine connection (once made), whether the request changes
        # anything, whether the run's end cut it]
        self._forwarding: dict[socket.socket, list[Any]] = {}
        self._idle = threading.Condition(self.lock)

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

    def admit(self, client: socket.socket) -> bool:
        """A new connection, unless the run is ending."""
        with self.lock:
            if self.closing:
                return False
            self._reading.add(client)
            return True

    def begin_forward(self, client: socket.socket, writes: bool) -> bool:
        """CLIENT's request, decided, goes to the engine (WRITES: it may make or change
        something there): unless the run is ending."""
        with self.lock:
            self._reading.discard(client)
            if self.closing:
                return False
            self._forwarding[client] = [None, writes, False]
            return True

    def upstream_of(self, client: socket.socket, up: socket.socket) -> bool:
        """UP carries CLIENT's request to the engine; False (UP cut) when the run ended meanwhile."""
        with self.lock:
            entry = self._forwarding.get(client)
            if entry is None or entry[2]:  # cut at the run's end (review 49: past the grace)
                _cut(up)
                return False
            entry[0] = up
            return True

    def done(self, client: socket.socket) -> None:
        with self.lock:
            self._reading.discard(client)
            self._forwarding.pop(client, None)
            self._idle.notify_all()

    def _mark_cut(self, writes: bool | None) -> list[socket.socket]:
        """Mark the requests being forwarded (those that WRITES or not; None: all) cut,
        and return their connections (client and engine). The lock is held."""
        out: list[socket.socket] = []
        for c, entry in self._forwarding.items():
            if writes is None or entry[1] == writes:
                entry[2] = True
                out += [s for s in (c, entry[0]) if s is not None]
        return out

    def stop(self, grace: float = STOP_GRACE) -> None:
        """No request reaches the engine once this returns: connections still being read
        are cut off, and so are streams and waits (attach, logs, events, wait); requests
        that change something and are already on their way (a create, a start) are let
        finish for up to GRACE seconds, so the cleanup after this sees what they made."""
        if self.server:
            self.server.shutdown()  # no new connections
        with self.lock:
            self.closing = True
            cut = [*self._reading, *self._mark_cut(writes=False)]
        for c in cut:
            _cut(c)
        deadline = time.monotonic() + grace
        with self.lock:
            while self._forwarding and (left := deadline - time.monotonic()) > 0:
                self._idle.wait(left)
            cut = self._mark_cut(writes=None)
        for c in cut:
            _cut(c)
        # (a request still being read or decided, say on an ownership look-up, can no
        # longer be forwarded: begin_forward refuses it)
        with self.lock:
            end = time.monotonic() + 10
            while self._forwarding and (left := end - time.monotonic()) > 0:
                self._idle.wait(left)
        if self.server:
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
                if run.kind == "container":
                    d, req.uri = self.rules.container_name(req.uri)
                    if d is not None:
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


def cleanup(upstream: str, run_id: str, keep: set[str] | None = None, passes: int = 5) -> dict[str, list[str]]:
    """Remove every container, network and volume labelled with RUN_ID (except the ids
    in KEEP); returns what was removed and what could not be. Listed again until a
    listing finds nothing (review 48: what a request in flight made after the first
    listing stayed, and the result said nothing was left), at most PASSES times; what
    the last finds is failed."""
    up = Engine(upstream, timeout=120)
    flt = urllib.parse.quote(json.dumps({"label": [f"{labels.RUN}={run_id}"]}))
    out: dict[str, list[str]] = {"containers": [], "networks": [], "volumes": [], "failed": []}
    keep = keep or set()
    for n in range(passes):
        found = False
        status, doc = up.call("GET", f"/containers/json?all=1&filters={flt}")
        for c in doc or [] if status == 200 else []:
            if c["Id"] in keep:
                continue
            found = True
            st, _ = up.call("DELETE", f"/containers/{c['Id']}?force=1&v=1")
            (out["containers"] if st in (204, 404) else out["failed"]).append(
                (c.get("Names") or [c["Id"][:12]])[0].lstrip("/"))
        status, doc = up.call("GET", f"/networks?filters={flt}")
        for net in doc or [] if status == 200 else []:
            if net["Id"] in keep or net.get("Name") in keep:
                continue
            found = True
            st, _ = up.call("DELETE", f"/networks/{net['Id']}")
            (out["networks"] if st in (204, 404) else out["failed"]).append(net.get("Name") or net["Id"][:12])
        status, doc = up.call("GET", f"/volumes?filters={flt}")
        for v in (doc or {}).get("Volumes") or [] if status == 200 else []:
            found = True
            st, _ = up.call("DELETE", f"/volumes/{urllib.parse.quote(v['Name'], safe='')}?force=1")
            (out["volumes"] if st in (204, 404) else out["failed"]).append(v["Name"])
        if not found or out["failed"]:
            return out
        if n == passes - 1:
            out["failed"].append(f"objects of the run still appear after {passes} listings")
    return out
