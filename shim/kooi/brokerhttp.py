"""The broker's socket server: one request per client connection, read, decided on by
the Broker (refusals answered in the engine's error format) and relayed to the engine
on a fresh connection; attach and exec-start connections relayed both ways.
"""

from __future__ import annotations

import json
import re
import socket
import socketserver
from typing import TYPE_CHECKING, Any

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
from .policy import Created, normalize, route
from .policybody import deny

if TYPE_CHECKING:
    from .broker import Broker

CONTAINER_JSON = re.compile(r"/containers/[^/]+/json")
# How long a client has to send a request's head and body.
READ_TIMEOUT = 120.0


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
        if not broker.admit(client):
            _reply(client, 503, "kooi broker: the run is ending")
            return
        try:
            # A request's head and body arrive within READ_TIMEOUT (a client that holds
            # its last bytes back holds a thread, never a decision past the run's end).
            client.settimeout(READ_TIMEOUT)
            self._handle(client, broker)
        finally:
            broker.done(client)

    def _handle(self, client: socket.socket, broker: Broker) -> None:
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
        asked_uri = req.uri  # before the run's filters (Rules.default_bridge reads the client's)
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
        # From here on the engine acts on it: never once the run is ending (review 48).
        writes = req.method != "GET" and not (hit and hit.route.hijack) and not path.endswith("/wait")
        if not broker.begin_forward(client, writes):
            _reply(client, 503, "kooi broker: the run is ending")
            return
        client.settimeout(None)  # streams (attach, logs) last as long as they last
        if broker.scope.attach:
            try:
                if hit and hit.route.run == Created("network"):
                    status, doc = broker.create_attached_network(req)
                    _reply(client, status, doc=doc)
                    return
                # The path as decided (the network's id, not a name the run holds
                # under a name of its own).
                broker.before_network_removal(req.method, normalize(req.uri)[0])
            except OSError as exc:
                _reply(client, 502, f"kooi broker: the engine does not answer ({exc})")
                return
        if req.method == "GET" and broker.scope.network and (
                path == "/networks" or path == "/containers/json" or CONTAINER_JSON.fullmatch(path)):
            # The run's network shown as the engine's default bridge (Rules.default_bridge,
            # Rules.containers_on_bridge).
            try:
                status, doc = broker.upstream.call("GET", req.uri)
            except OSError as exc:
                _reply(client, 502, f"kooi broker: the engine does not answer ({exc})")
                return
            if status == 200:
                doc = (broker.rules.default_bridge(asked_uri, doc) if path == "/networks"
                       else broker.rules.containers_on_bridge(doc))
            _reply(client, status, doc=doc)
            return
        try:
            up = broker.upstream.connect()
        except OSError as exc:
            _reply(client, 502, f"kooi broker: the engine does not answer ({exc})")
            return
        up.settimeout(None)
        if not broker.upstream_of(client, up):
            up.close()
            return
        try:
            forward(r, req, client, up, upgrade=bool(hit and hit.route.hijack))
        except (OSError, BadRequest):
            pass
        finally:
            up.close()
