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
"""

from __future__ import annotations

import dataclasses
import http
import http.client
import json
import os
import re
import selectors
import socket
import socketserver
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .policy import MAX_BODY, Decision, Policy, check_body, decide, deny, normalize

MAX_HEAD = 64 << 10
MAX_HEADERS = 100
RUN_LABEL = "org.kooi.run"
ENGINE_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")

CONTAINER_CREATE = re.compile(r"^/containers/create$")
NETWORK_CREATE = re.compile(r"^/networks/create$")
VOLUME_CREATE = re.compile(r"^/volumes/create$")
EXEC_CREATE = re.compile(r"^/containers/([^/]+)/exec$")
CONTAINER_UPDATE = re.compile(r"^/containers/([^/]+)/update$")
NETWORK_CONNECT = re.compile(r"^/networks/([^/]+)/(connect|disconnect)$")
CONTAINER_OBJ = re.compile(r"^/containers/([^/]+)(/.*)?$")
EXEC_OBJ = re.compile(r"^/exec/([^/]+)(/.*)?$")
NETWORK_OBJ = re.compile(r"^/networks/([^/]+)(/.*)?$")
VOLUME_OBJ = re.compile(r"^/volumes/([^/]+)$")
HIJACK = re.compile(r"^/(containers/[^/]+/attach|exec/[^/]+/start)$")
LISTS = {"/containers/json", "/networks", "/volumes", "/events"}
PRUNE = re.compile(r"^/(containers|images|volumes|networks|build|system)/prune$|^/system/prune$")
# Endpoints whose bodies the broker reads (and may rewrite) before deciding.
INSPECTED = (CONTAINER_CREATE, NETWORK_CREATE, VOLUME_CREATE, EXEC_CREATE, CONTAINER_UPDATE,
             NETWORK_CONNECT)
HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "expect",
               "transfer-encoding", "content-length"}
BUILTIN_NETWORKS = {"bridge", "default", ""}


class BadRequest(Exception):
    pass


@dataclass
class Request:
    method: str
    uri: str
    version: str
    headers: list[tuple[str, str]]
    body: bytes | None = None       # read and inspected
    chunked: bool = False           # streamed through in chunks
    length: int = 0                 # streamed through, Content-Length

    def header(self, name: str) -> str | None:
        name = name.lower()
        found = [v for k, v in self.headers if k.lower() == name]
        return found[-1] if found else None


class Reader:
    """Buffered reads from a socket that can hand back what it buffered."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = bytearray()

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        if not data:
            return False
        self.buf += data
        return True

    def readline(self, limit: int) -> bytes:
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i + 1])
                del self.buf[:i + 1]
                return line
            if len(self.buf) > limit:
                raise BadRequest("request head too large")
            if not self._fill():
                raise BadRequest("connection closed mid-request")

    def read(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise BadRequest("connection closed mid-body")
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def take(self) -> bytes:
        data = bytes(self.buf)
        self.buf.clear()
        return data


def read_head(r: Reader) -> Request:
    line = r.readline(MAX_HEAD).decode("latin-1").rstrip("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(f"malformed request line {line[:80]!r}")
    method, uri, version = parts
    if not re.fullmatch(r"[A-Z]{3,10}", method) or not uri.startswith("/"):
        raise BadRequest("malformed request line")
    headers: list[tuple[str, str]] = []
    size = len(line)
    while True:
        raw = r.readline(MAX_HEAD)
        size += len(raw)
        if size > MAX_HEAD or len(headers) > MAX_HEADERS:
            raise BadRequest("request head too large")
        text = raw.decode("latin-1").rstrip("\r\n")
        if not text:
            break
        if ":" not in text or text[0] in " \t":
            raise BadRequest("malformed header")
        k, v = text.split(":", 1)
        if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", k):
            raise BadRequest("malformed header name")
        headers.append((k, v.strip()))
    req = Request(method, uri, version, headers)
    lengths = {v for k, v in headers if k.lower() == "content-length"}
    te = [v.lower() for k, v in headers if k.lower() == "transfer-encoding"]
    if te:
        if lengths or te != ["chunked"]:
            raise BadRequest("ambiguous or unsupported Transfer-Encoding")
        req.chunked = True
    elif lengths:
        if len(lengths) != 1 or not next(iter(lengths)).isdigit():
            raise BadRequest("ambiguous Content-Length")
        req.length = int(next(iter(lengths)))
    return req


def read_chunk_header(r: Reader) -> int:
    line = r.readline(4096).decode("latin-1").strip()
    size = line.split(";", 1)[0].strip()
    if not re.fullmatch(r"[0-9a-fA-F]{1,15}", size):
        raise BadRequest("malformed chunk")
    return int(size, 16)


def read_body(r: Reader, req: Request, limit: int) -> bytes | None:
    """The whole body, or None if it exceeds LIMIT (the rest is left unread)."""
    if not req.chunked:
        if req.length > limit:
            return None
        return r.read(req.length) if req.length else b""
    out = bytearray()
    while True:
        n = read_chunk_header(r)
        if n == 0:
            while r.readline(4096) not in (b"\r\n", b"\n"):  # trailers
                pass
            return bytes(out)
        if len(out) + n > limit:
            return None
        out += r.read(n)
        r.read(2)


def stream_body(r: Reader, req: Request, out: socket.socket) -> None:
    """Relay a body the broker does not inspect, exactly as framed, no further."""
    if not req.chunked:
        left = req.length
        while left:
            data = r.read(min(left, 65536))
            out.sendall(data)
            left -= len(data)
        return
    while True:
        n = read_chunk_header(r)
        out.sendall(b"%x\r\n" % n)
        if n == 0:
            while True:
                line = r.readline(4096)
                out.sendall(line)
                if line in (b"\r\n", b"\n"):
                    return
        left = n
        while left:
            data = r.read(min(left, 65536))
            out.sendall(data)
            left -= len(data)
        out.sendall(r.read(2))


# --- the per-run rules ----------------------------------------------------------------


def ci_key(d: dict, key: str) -> str | None:
    """The key of D that Docker would read as KEY (case-insensitive)."""
    low = key.lower()
    for k in d:
        if k.lower() == low:
            return k
    return None


def ci_get(d: dict, key: str, default: Any = None) -> Any:
    k = ci_key(d, key)
    return d[k] if k is not None else default


def ci_set(d: dict, key: str, value: Any) -> None:
    d[ci_key(d, key) or key] = value


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
    # reaches what it starts there directly (the userns-remap engine isolates bridges
    # from each other, published ports included); None: no attaching (rootless).
    attach: str | None = None
    # The AppArmor profile every container the run creates gets (kooi's runner profile
    # where the engine applies AppArmor); None: the engine's default.
    apparmor: str | None = None


class Upstream:
    """Plain HTTP requests to the daemon for the broker's own lookups."""

    def __init__(self, path: str, timeout: float = 30):
        self.path = path
        self.timeout = timeout

    def connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.path)
        return s

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("localhost", timeout=self.timeout)
        conn.sock = self.connect()
        try:
            data = json.dumps(body).encode() if body is not None else None
            hdrs = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            raw = resp.read()
            try:
                doc = json.loads(raw) if raw else None
            except ValueError:
                doc = None
            return resp.status, doc
        finally:
            conn.close()


class Rules:
    """Ownership, rewrites and list filters for one run."""

    def __init__(self, scope: RunScope, upstream: Upstream):
        self.scope = scope
        self.up = upstream
        self.owned_ids: set[str] = set()
        self.lock = threading.Lock()

    # ownership ------------------------------------------------------------------------
    def _labels_of(self, kind: str, ref: str) -> tuple[str | None, dict]:
        path = {"container": f"/containers/{ref}/json", "network": f"/networks/{ref}",
                "volume": f"/volumes/{ref}"}[kind]
        status, doc = self.up.request("GET", path)
        if status != 200 or not isinstance(doc, dict):
            return None, {}
        labels = (doc.get("Config") or {}).get("Labels") if kind == "container" else doc.get("Labels")
        ident = doc.get("Id") or doc.get("Name")
        return ident, labels or {}

    def owns(self, kind: str, ref: str) -> Decision | None:
        """None if the run owns it; a refusal otherwise (also when it does not exist:
        the run must not learn what others have)."""
        key = f"{kind}:{ref}"
        with self.lock:
            if key in self.owned_ids:
                return None
        ident, labels = self._labels_of(kind, urllib.parse.quote(ref, safe=""))
        if ident is None:
            return deny(f"{kind} {ref!r} does not exist or is not this run's")
        if labels.get(RUN_LABEL) != self.scope.run_id:
            return deny(f"{kind} {ref!r} was not created by this run")
        if ident in self.scope.protected:
            return deny(f"{kind} {ref!r} is the workload's own container, out of the broker's reach")
        with self.lock:
            # Only ids are remembered: a name can later belong to someone else's object.
            self.owned_ids.add(f"{kind}:{ident}")
        return None

    def owns_exec(self, exec_id: str) -> Decision | None:
        status, doc = self.up.request("GET", f"/exec/{urllib.parse.quote(exec_id, safe='')}/json")
        if status != 200 or not isinstance(doc, dict) or not doc.get("ContainerID"):
            return deny(f"exec {exec_id!r} does not exist or is not this run's")
        return self.owns("container", doc["ContainerID"])

    def network_ok(self, name: str) -> Decision | None:
        if name == "none" or name == self.scope.network or (name in BUILTIN_NETWORKS and not self.scope.network):
            return None
        if name.startswith("container:"):
            return self.owns("container", name.split(":", 1)[1])
        return self.owns("network", name)

    # rewrites -------------------------------------------------------------------------
    def host_path(self, src: str) -> str:
        if src in self.scope.socket_aliases or src in ENGINE_SOCKETS:
            return self.scope.socket_host_path or src
        for cpath, hpath in self.scope.path_map.items():
            if src == cpath or src.startswith(cpath.rstrip("/") + "/"):
                return hpath.rstrip("/") + src[len(cpath.rstrip("/")):]
        return src

    def add_labels(self, doc: dict) -> None:
        labels = ci_get(doc, "Labels") or {}
        if not isinstance(labels, dict):
            raise BadRequest("Labels must be an object")
        labels.update(self.scope.labels)
        ci_set(doc, "Labels", labels)

    def ensure_volume(self, name: str) -> Decision | None:
        """A named volume the run mounts must be its own; a new one is created labelled
        (Docker would create it unlabelled, out of the run's cleanup)."""
        status, doc = self.up.request("GET", f"/volumes/{urllib.parse.quote(name, safe='')}")
        if status == 200:
            return self.owns("volume", name)
        status, doc = self.up.request("POST", "/volumes/create",
                                      {"Name": name, "Labels": dict(self.scope.labels)})
        if status not in (200, 201):
            return deny(f"volume {name!r} could not be created ({status})")
        return None

    def container_create(self, doc: dict) -> Decision | None:
        self.add_labels(doc)
        hc = ci_get(doc, "HostConfig")
        if hc is None:
            hc = {}
            ci_set(doc, "HostConfig", hc)
        if not isinstance(hc, dict):
            return None  # the policy refuses it
        if self.scope.apparmor:
            opts = ci_get(hc, "SecurityOpt") or []
            if not isinstance(opts, list):
                return None
            keep = [o for o in opts if not str(o).replace(":", "=").replace(" ", "").lower().startswith("apparmor=")]
            ci_set(hc, "SecurityOpt", keep + [f"apparmor={self.scope.apparmor}"])
        mode = ci_get(hc, "NetworkMode")
        if not isinstance(mode, (str, type(None))):
            return None
        if (mode or "") in BUILTIN_NETWORKS and self.scope.network:
            ci_set(hc, "NetworkMode", self.scope.network)
        elif mode and mode.lower() != "host":
            if (d := self.network_ok(mode)) is not None:
                return d
        nc = ci_get(doc, "NetworkingConfig")
        eps = ci_get(nc, "EndpointsConfig") if isinstance(nc, dict) else None
        if isinstance(eps, dict):
            for net in list(eps):
                if net in BUILTIN_NETWORKS and self.scope.network:
                    eps[self.scope.network] = eps.pop(net)
                elif (d := self.network_ok(net)) is not None:
                    return d
        binds = ci_get(hc, "Binds")
        if isinstance(binds, list):
            out = []
            for b in binds:
                if not isinstance(b, str):
                    return None
                src, _, rest = b.partition(":")
                if src.startswith("/"):
                    src = self.host_path(src)
                elif src and (d := self.ensure_volume(src)) is not None:
                    return d
                out.append(f"{src}:{rest}" if rest else src)
            ci_set(hc, "Binds", out)
        mounts = ci_get(hc, "Mounts")
        if isinstance(mounts, list):
            for m in mounts:
                if not isinstance(m, dict):
                    return None
                mtype = str(ci_get(m, "Type") or "volume").lower()
                src = ci_get(m, "Source")
                if not isinstance(src, str):
                    continue
                if mtype == "bind":
                    ci_set(m, "Source", self.host_path(src))
                elif mtype == "volume" and src and (d := self.ensure_volume(src)) is not None:
                    return d
        return None

    def filter_query(self, uri: str) -> str:
        """Add the run's label to a listing's filters (both filter encodings)."""
        path, _, query = uri.partition("?")
        params = urllib.parse.parse_qsl(query, keep_blank_values=True)
        want = f"{RUN_LABEL}={self.scope.run_id}"
        filters: dict = {}
        rest = []
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
                 log: Callable[[str], None] | None = None, max_body: int = MAX_BODY):
        self.listen = listen
        self.upstream = Upstream(upstream)
        scope.socket_host_path = scope.socket_host_path or listen
        self.scope = scope
        self.policy = dataclasses.replace(policy, engine_socket=scope.socket_host_path)
        self.rules = Rules(scope, self.upstream)
        self.log = log or (lambda _m: None)
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

    def summary(self) -> dict:
        with self.lock:
            return {"allowed": self.allowed, "refused": len(self.refusals), "refusals": self.refusals[:50]}

    # one request --------------------------------------------------------------------
    def decide(self, req: Request) -> tuple[Decision, Request]:
        """Decide on REQ (its body read if inspected); may rewrite it."""
        path, err = normalize(req.uri)
        if err:
            return deny(err), req
        if PRUNE.match(path):
            if not re.match(r"^/(containers|networks|volumes|images)/prune$", path):
                return deny("this prune endpoint is refused (it reaches other runs' objects)"), req
            # Testcontainers prunes its session's objects when Ryuk is off: only the run's.
            req.uri = self.rules.filter_query(req.uri)
        if req.method == "DELETE" and path.startswith("/images/"):
            return deny("removing images is refused (the pinned images are shared)"), req
        if path == "/commit" and req.method == "POST":
            q = dict(urllib.parse.parse_qsl(req.uri.partition("?")[2]))
            if (d := self.rules.owns("container", q.get("container", ""))) is not None:
                return d, req
        if req.method == "GET" and path in LISTS:
            req.uri = self.rules.filter_query(req.uri)
        body = req.body
        doc = None
        if req.method == "POST" and any(p.match(path) for p in INSPECTED):
            # The policy's reading of the body first (no body, oversized, not an object,
            # duplicate keys: refused); rewrites then work on the accepted document.
            _, d = check_body(body, self.policy, path.rsplit("/", 1)[-1])
            if d is not None:
                return d, req
            doc = json.loads(body or b"")
        if req.method == "POST" and CONTAINER_CREATE.match(path):
            if (d := self.rules.container_create(doc)) is not None:
                return d, req
            body = json.dumps(doc).encode()
        elif req.method == "POST" and (NETWORK_CREATE.match(path) or VOLUME_CREATE.match(path)):
            if isinstance(doc, dict):
                if NETWORK_CREATE.match(path):
                    drv = ci_get(doc, "Driver") or "bridge"
                    if drv != "bridge":
                        return deny(f"network driver {drv!r} refused (only bridge networks)"), req
                self.rules.add_labels(doc)
                body = json.dumps(doc).encode()
        d = decide(req.method, req.uri, body, self.policy)
        if not d.allow:
            return d, req
        req.body = body
        if PRUNE.match(path):
            return d, req  # filtered to the run's objects above
        # ownership of the object a request names
        if (m := EXEC_CREATE.match(path)) or (m := CONTAINER_UPDATE.match(path)):
            if (o := self.rules.owns("container", urllib.parse.unquote(m.group(1)))) is not None:
                return o, req
        elif path not in ("/containers/create", "/containers/json") and \
                (m := CONTAINER_OBJ.match(path)):
            if (o := self.rules.owns("container", m.group(1))) is not None:
                return o, req
        elif m := EXEC_OBJ.match(path):
            if (o := self.rules.owns_exec(m.group(1))) is not None:
                return o, req
        elif path not in ("/networks/create",) and (m := NETWORK_OBJ.match(path)):
            if (o := self.rules.owns("network", m.group(1))) is not None:
                return o, req
            if NETWORK_CONNECT.match(path) and isinstance(doc, dict):
                c = ci_get(doc, "Container")
                if not isinstance(c, str) or (o := self.rules.owns("container", c)) is not None:
                    return o or deny("network connect: Container must be a string"), req
        elif path != "/volumes/create" and (m := VOLUME_OBJ.match(path)):
            if (o := self.rules.owns("volume", m.group(1))) is not None:
                return o, req
        return d, req

    # the workload on the run's networks (scope.attach) ---------------------------------
    def create_attached_network(self, req: Request) -> tuple[int, Any]:
        """Create the network (body already decided on) and attach the workload to it;
        a network the workload cannot join is removed again and the create fails."""
        status, doc = self.upstream.request("POST", req.uri, json.loads(req.body or b"{}"))
        ident = doc.get("Id") if isinstance(doc, dict) else None
        if status != 201 or not ident:
            return status, doc if doc is not None else {"message": f"network create failed ({status})"}
        st, err = self.upstream.request("POST", f"/networks/{ident}/connect", {"Container": self.scope.attach})
        if st != 200:
            self.upstream.request("DELETE", f"/networks/{ident}")
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
        if method == "DELETE" and (m := NETWORK_OBJ.match(path)) and not m.group(2):
            status, doc = self.upstream.request("GET", f"/networks/{urllib.parse.quote(m.group(1), safe='')}")
            targets = [doc["Id"]] if status == 200 and isinstance(doc, dict) and doc.get("Id") in attached else []
        elif method == "POST" and path == "/networks/prune":
            targets = []
            for ident in attached:
                status, doc = self.upstream.request("GET", f"/networks/{ident}")
                if status == 200 and isinstance(doc, dict) and set(doc.get("Containers") or {}) <= {self.scope.attach}:
                    targets.append(ident)
        else:
            return
        for ident in targets:
            self.upstream.request("POST", f"/networks/{ident}/disconnect",
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

    def __init__(self, path: str, broker: Broker):
        self.broker = broker
        super().__init__(path, _Handler)


LINGER_BYTES = 1 << 30
LINGER_SECONDS = 30.0


def _reply(sock: socket.socket, status: int, message: str | None = None, doc: Any = None) -> None:
    """Answer with an error (MESSAGE) or a document the broker produced (DOC), then keep
    reading (and discarding) what the client still sends until it closes: a client
    that is still writing a body (a build context, a large create) would otherwise get
    EPIPE instead of the refusal and its reason."""
    data = json.dumps({"message": message} if doc is None else doc).encode()
    head = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
    try:
        sock.sendall(head + data)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        return
    deadline = time.monotonic() + LINGER_SECONDS
    seen = 0
    try:
        while seen < LINGER_BYTES:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            sock.settimeout(min(left, 5.0))
            chunk = sock.recv(65536)
            if not chunk:
                return
            seen += len(chunk)
    except OSError:
        return


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        client: socket.socket = self.request
        broker = self.server.broker
        r = Reader(client)
        try:
            req = read_head(r)
        except (BadRequest, OSError) as exc:
            _reply(client, 400, f"kooi broker: {exc}")
            return
        path, _ = normalize(req.uri)
        inspected = req.method == "POST" and any(p.match(path) for p in INSPECTED)
        try:
            if (req.header("expect") or "").lower() == "100-continue":
                client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            if inspected:
                req.body = read_body(r, req, broker.max_body)
                if req.body is None:
                    d = deny(f"body exceeds {broker.max_body} bytes, refused")
                    broker.record(req, d)
                    _reply(client, 403, f"kooi broker: {d.reason}")
                    return
            d, req = broker.decide(req)
        except BadRequest as exc:
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
                if req.method == "POST" and NETWORK_CREATE.match(path):
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
        hijack = bool(HIJACK.match(path)) and req.method == "POST"
        try:
            head = [f"{req.method} {req.uri} HTTP/1.1"]
            for k, v in req.headers:
                if k.lower() in HOP_HEADERS and not (hijack and k.lower() in ("connection", "upgrade")):
                    continue
                head.append(f"{k}: {v}")
            if not hijack:
                head.append("Connection: close")
            if req.body is not None:
                head.append(f"Content-Length: {len(req.body)}")
            elif req.chunked:
                head.append("Transfer-Encoding: chunked")
            elif req.length:
                head.append(f"Content-Length: {req.length}")
            up.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
            if req.body is not None:
                up.sendall(req.body)
            else:
                stream_body(r, req, up)
            if hijack:
                rest = r.take()
                if rest:
                    up.sendall(rest)
            pump(client, up, both=hijack)
        except (OSError, BadRequest):
            pass
        finally:
            up.close()


def pump(client: socket.socket, up: socket.socket, both: bool) -> None:
    """Relay the response (and, for hijacked streams, the client's bytes) until the
    daemon closes."""
    client.settimeout(None)
    sel = selectors.DefaultSelector()
    sel.register(up, selectors.EVENT_READ)
    sel.register(client, selectors.EVENT_READ)
    try:
        while True:
            for key, _ in sel.select():
                s = key.fileobj
                try:
                    data = s.recv(65536)  # type: ignore[union-attr]
                except ConnectionResetError:
                    data = b""
                if s is up:
                    if not data:
                        return
                    client.sendall(data)
                elif not data:
                    sel.unregister(client)
                    if both:
                        try:
                            up.shutdown(socket.SHUT_WR)
                        except OSError:
                            pass
                elif both:
                    up.sendall(data)
                # anything else a client sends after its request is dropped
    finally:
        sel.close()


def cleanup(upstream: str, run_id: str, keep: set[str] | None = None) -> dict[str, list[str]]:
    """Remove every container, network and volume labelled with RUN_ID (except the ids
    in KEEP); returns what was removed and what could not be."""
    up = Upstream(upstream, timeout=120)
    flt = urllib.parse.quote(json.dumps({"label": [f"{RUN_LABEL}={run_id}"]}))
    out: dict[str, list[str]] = {"containers": [], "networks": [], "volumes": [], "failed": []}
    keep = keep or set()
    status, doc = up.request("GET", f"/containers/json?all=1&filters={flt}")
    for c in doc or [] if status == 200 else []:
        if c["Id"] in keep:
            continue
        st, _ = up.request("DELETE", f"/containers/{c['Id']}?force=1&v=1")
        (out["containers"] if st in (204, 404) else out["failed"]).append(
            (c.get("Names") or [c["Id"][:12]])[0].lstrip("/"))
    status, doc = up.request("GET", f"/networks?filters={flt}")
    for n in doc or [] if status == 200 else []:
        if n["Id"] in keep or n.get("Name") in keep:
            continue
        st, _ = up.request("DELETE", f"/networks/{n['Id']}")
        (out["networks"] if st in (204, 404) else out["failed"]).append(n.get("Name") or n["Id"][:12])
    status, doc = up.request("GET", f"/volumes?filters={flt}")
    for v in (doc or {}).get("Volumes") or [] if status == 200 else []:
        st, _ = up.request("DELETE", f"/volumes/{urllib.parse.quote(v['Name'], safe='')}?force=1")
        (out["volumes"] if st in (204, 404) else out["failed"]).append(v["Name"])
    return out
