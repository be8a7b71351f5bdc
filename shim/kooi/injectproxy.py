"""The injector's reverse proxy: a request that carries a live placeholder and a method
and path its secret allows is forwarded over TLS to the secret's upstream, its own
credential headers replaced by the real one and the answer streamed back; anything else
is refused and recorded for the run.
"""

from __future__ import annotations

import http.client
import http.server
import io
import json
import os
import socket
import ssl
import threading
import time
from typing import Any

from .egress import RUN_CONNECTIONS
from .hoststate.secrets import SecretDef, SecretsConfig
from .injectbody import body_refusal, parse_cost
from .injectcontrol import MAX_PER_RUN, MAX_RUNS, PLACEHOLDER_PREFIX, Registry, RunRecord

MAX_BODY = 32 << 20  # the Messages API's own request limit
# Requests forwarded at once (issue 29, finding 4): a run's first RESERVED_PER_RUN are
# its own (no other run's requests take them), the rest up to MAX_PER_RUN
# (kooi.injectcontrol) come from SHARED_SLOTS that all runs share. A slot is taken only
# once the whole body is in, read within BODY_DEADLINE seconds: a run that trickles its
# bodies holds none.
RESERVED_PER_RUN = 4
SHARED_SLOTS = 256
BODY_DEADLINE = 60.0
# The upstream's TCP connection (its answer may then take up to 600 s).
CONNECT_TIMEOUT = 30.0
# Memory for request bodies, read and parsed, at once (review 25: 48 bodies of
# `[{},{},...]` took the injector to 22 GB and the host's OOM killer took it): a body's
# bytes are taken as they arrive (review 28: declared lengths, taken and allocated before
# a byte came, let three runs that sent one byte hold all of it), and what parsing it
# costs (PARSE_COST per JSON separator or bracket: the objects it makes; review 28: 64
# was half of what a key and its value make) before it is parsed. A run's first
# RUN_RESERVED_BYTES are its own (no other run's bodies take them), the rest up to
# RUN_BODY_BYTES come from BODY_BYTES that all runs share: past a run's share its request
# is refused (429); past the shared, a request waits for a body to go, up to
# BODY_DEADLINE, then 503. In all at most MAX_RUNS x RUN_RESERVED_BYTES + BODY_BYTES
# (3 GiB; the unit's MemoryMax is 4G). A run's own share covers a realistic request
# (review 29: 16 MiB was a 1.5 MiB body with one emoji, its text then 4 bytes a
# character); four runs, not three, fill the shared. A released run's requests in
# flight end with it (injectcontrol.Registry._drop).
RUN_BODY_BYTES = 256 << 20
RUN_RESERVED_BYTES = 32 << 20
BODY_BYTES = 1024 << 20
# The access log (review 28: one run's refused requests wrote about 1 MB a second):
# every forwarded request, a run's first LOG_PER_RUN refusals, then a count in its record
# (`not_logged`); requests of no live run at LOG_UNKNOWN_RATE a second with bursts of
# LOG_UNKNOWN_BURST (review 31: at 2 a second they alone turned the log over in a day).
LOG_PER_RUN = 2000
LOG_UNKNOWN_RATE = 0.5
LOG_UNKNOWN_BURST = 200
# Past LOG_MAX_BYTES the log moves to access.log.prev and a new one begins (review 29: a
# runner registering run after run wrote 1.4 MiB a second; logrotate runs daily).
LOG_MAX_BYTES = 64 << 20
# A request's head (its line, then its headers) is read within these bounds before
# anything else (review 27: 96 headers of 64 KiB on each of 256 connections, no
# placeholder needed, took the injector to 6 GB; with 1024, the OOM killer took it).
MAX_HEAD_BYTES = 16 << 10
MAX_HEAD_LINES = 64
# Connections open at once (each a thread and a descriptor): every registered run's
# whole share (the egress rules and jailfwd let a run hold RUN_CONNECTIONS to the proxy
# and the injector together) and some for the host's own clients; past it a connection
# is answered 503 and closed. inject.serve raises the descriptor limit to match.
MAX_CONNECTIONS = RUN_CONNECTIONS * MAX_RUNS + 64
THREAD_STACK = 512 << 10
# Hop-by-hop headers (RFC 9110 7.6.1) and every header that may carry a credential or
# route the request: never forwarded as the client sent them.
DROP_REQUEST = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te",
                "trailer", "transfer-encoding", "upgrade", "host", "content-length", "x-api-key", "authorization",
                "cookie", "forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-real-ip"}
# Request headers a client may send more than once (their values are lists).
REPEATABLE = {"accept", "accept-encoding", "accept-language", "anthropic-beta", "cache-control", "via"}
DROP_RESPONSE = {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "te", "trailer",
                 "transfer-encoding", "upgrade", "content-length", "set-cookie"}


def tls_context(s: SecretDef) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=s.ca_file or None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


# --- the reverse proxy ----------------------------------------------------------------


def _error_body(kind: str, message: str) -> bytes:
    return json.dumps({"type": "error", "error": {"type": kind, "message": f"kooi injector: {message}"}}).encode()


class ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "kooi-inject"
    sys_version = ""
    disable_nagle_algorithm = True
    # A client that sends nothing (or reads nothing) for this long is dropped.
    timeout = 60
    server: ProxyServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the access log is JSON, written by _log

    def parse_request(self) -> bool:
        """The request's headers, read within MAX_HEAD_BYTES and MAX_HEAD_LINES (the
        standard library takes 100 lines of 64 KiB), then parsed as the standard
        library does; past them 431 and the connection closed."""
        sock_file, head, lines = self.rfile, bytearray(), 0
        # For send_error (the standard parse_request sets them).
        self.command, self.request_version = "", "HTTP/1.1"
        self.requestline = str(getattr(self, "raw_requestline", b""), "iso-8859-1").rstrip("\r\n")
        while True:
            line = sock_file.readline(MAX_HEAD_BYTES + 1 - len(head))
            head += line
            lines += 1
            if line in (b"\r\n", b"\n", b""):
                break
            if len(head) > MAX_HEAD_BYTES or lines > MAX_HEAD_LINES or not line.endswith(b"\n"):
                self.close_connection = True
                self.send_error(431, f"request headers past {MAX_HEAD_BYTES >> 10} KiB or {MAX_HEAD_LINES} lines")
                return False
        self.rfile = io.BytesIO(bytes(head))
        try:
            return super().parse_request()
        finally:
            self.rfile = sock_file

    def _log(self, rec: RunRecord | None, secret: str, status: int, verdict: str, **extra: Any) -> dict[str, Any]:
        entry = {"time": round(time.time(), 3), "run": rec.run if rec else "-", "secret": secret,
                 "method": self.command, "path": self.path.split("?", 1)[0][:512], "status": status,
                 "verdict": verdict, **extra}
        self.server.write_log(entry, rec, bounded=verdict != "forwarded")
        return entry

    def _refuse(self, status: int, kind: str, message: str, rec: RunRecord | None, secret: str) -> None:
        # Recorded before the answer goes out: a run released right after it has it.
        entry = self._log(rec, secret, status, "refused", reason=message)
        if rec is not None:
            self.server.registry.refused(rec, {k: entry[k] for k in ("time", "method", "path", "status", "reason")})
        self._answer_error(status, kind, message)

    def _credential(self) -> str:
        """The placeholder the request carries, in x-api-key or as a bearer token
        (clients that send both, like Claude Code's apiKeyHelper, send it twice)."""
        auth = self.headers.get("authorization", "")
        for value in (self.headers.get("x-api-key", ""), auth[7:] if auth.lower().startswith("bearer ") else ""):
            if value.strip().startswith(PLACEHOLDER_PREFIX):
                return value.strip()
        return ""

    def _handle(self) -> None:
        reg = self.server.registry
        token = self._credential()
        hit = reg.lookup(token) if token else None
        if hit is None:
            # Close: the body (if any) was not read.
            self.close_connection = True
            self._refuse(401, "authentication_error", "no live kooi placeholder in x-api-key or Authorization",
                         None, "-")
            return
        rec, name = hit
        if not reg.enter(rec, self.connection):
            self.close_connection = True
            self._refuse(401, "authentication_error", "the placeholder's run was released", None, "-")
            return
        try:
            self._handle_run(rec, name)
        finally:
            reg.leave(rec, self.connection)

    def _handle_run(self, rec: RunRecord, name: str) -> None:
        sdef = self.server.cfg.secrets.get(name)
        if sdef is None or rec.keys.get(name, name) not in self.server.values:
            # A run kept from before a restart whose secret the host no longer holds.
            self.close_connection = True
            self._refuse(403, "permission_error", f"this host no longer holds secret {name}", rec, name)
            return
        path, _, query = self.path.partition("?")
        if any(not 0x21 <= ord(c) <= 0x7E for c in self.path):
            # Review 31: such a path made the upstream request fail after it was recorded as sent.
            self.close_connection = True
            self._refuse(400, "invalid_request_error", "the path holds a character that is not visible ASCII "
                         "(percent-encode it)", rec, name)
            return
        if not path.startswith("/") or not sdef.allows(self.command, path):
            self.close_connection = True
            self._refuse(403, "permission_error", f"{self.command} {path[:200]} is not allowed "
                         f"for secret {name}", rec, name)
            return
        if not sdef.allows_query(query):
            self.close_connection = True
            self._refuse(403, "permission_error", f"the query {query[:200]!r} is not allowed for secret {name} "
                         f"(its route's query: {', '.join(sdef.query) or 'none'})", rec, name)
            return
        if (odd := self._odd_header()) is not None:
            self.close_connection = True
            self._refuse(400, "invalid_request_error", odd, rec, name)
            return
        if "transfer-encoding" in self.headers:
            self.close_connection = True
            self._refuse(411, "invalid_request_error", "chunked request bodies are not forwarded; "
                         "send Content-Length", rec, name)
            return
        try:
            length = int(self.headers.get("content-length", "0"))
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self.close_connection = True
            self._refuse(413, "invalid_request_error", "missing, malformed or too large Content-Length", rec, name)
            return
        if self.headers.get("content-encoding", "identity").strip(" \t").lower() != "identity":
            self.close_connection = True
            self._refuse(415, "invalid_request_error", "Content-Encoding is not forwarded: send the body as it is",
                         rec, name)
            return
        held = [0]  # of the run's body memory, taken (take_bytes) and given back at the end
        try:
            body = self._read_body(rec, length, held)
            if isinstance(body, tuple):
                self.close_connection = True
                self._refuse(body[0], body[1], body[2], rec, name)
                return
            cost = parse_cost(body)
            if (short := self.server.take_bytes(rec, cost)) is not None:
                self.close_connection = True
                self._refuse(short[0], "rate_limit_error" if short[0] == 429 else "overloaded_error",
                             f"{short[1]} (parsing this body takes about {cost >> 20} MiB)", rec, name)
                return
            held[0] += cost
            why = body_refusal(sdef, body)
            self.server.give_bytes(rec, cost)
            held[0] -= cost
            if why is not None:
                self._refuse(why[0], "permission_error" if why[0] == 403 else "invalid_request_error", why[1], rec,
                             name)
                return
            if (busy := self.server.take_slot(rec)) is not None:
                self.close_connection = True
                self._refuse(429, "rate_limit_error", busy, rec, name)
                return
            try:
                if rec.released:  # while its body came in (review 29): never forwarded after
                    self.close_connection = True
                    self._refuse(401, "authentication_error", "the placeholder's run was released", rec, name)
                    return
                self._forward(rec, name, sdef, body)
            finally:
                self.server.give_slot(rec)
        finally:
            self.server.give_bytes(rec, held[0])

    def _odd_header(self) -> str | None:
        """Why the request's headers could mean one thing here and another upstream:
        a header that routes or frames the body named twice (review 25: the check read
        the first Content-Encoding, the forwarded request carried the last), or a value
        with a line break or NUL (a folded line went upstream as it was)."""
        seen: set[str] = set()
        for k, v in self.headers.items():
            key = k.lower()
            if any(c in v for c in "\r\n\0") or any(c in k for c in "\r\n\0 \t"):
                return f"the header {k[:60]!r} holds a line break or NUL (folded lines are not forwarded)"
            if key in seen and key not in REPEATABLE:
                return f"the header {k[:60]!r} is sent twice: send each once"
            seen.add(key)
        return None

    def _read_body(self, rec: RunRecord, length: int, held: list[int]) -> bytearray | tuple[int, str, str]:
        """LENGTH bytes within BODY_DEADLINE seconds, each piece's memory taken from the
        run's share before it is read (HELD[0]: how much), into one buffer that grows
        as they come (no second copy of the body); or why not (status, kind, message)."""
        deadline = time.monotonic() + BODY_DEADLINE
        late = (408, "invalid_request_error", f"the body did not arrive within {BODY_DEADLINE:g} s")
        body = bytearray()
        try:
            while len(body) < length:
                want = min(1 << 16, length - len(body))
                if (short := self.server.take_bytes(rec, want, deadline)) is not None:
                    return short[0], "rate_limit_error" if short[0] == 429 else "overloaded_error", short[1]
                held[0] += want
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return late
                self.connection.settimeout(remaining)
                piece = self.rfile.read1(want)
                if not piece:
                    return late
                body += piece
                if len(piece) < want:
                    self.server.give_bytes(rec, want - len(piece))
                    held[0] -= want - len(piece)
        except (TimeoutError, OSError):
            return late
        finally:
            try:
                self.connection.settimeout(self.timeout)
            except OSError:
                pass
        return body

    def _forward(self, rec: RunRecord, name: str, sdef: SecretDef, body: bytes | bytearray) -> None:
        conn_tokens = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        # Compared with `_` as `-` (review 27: `x_api_key` went upstream beside the key).
        headers = {k: v for k, v in self.headers.items()
                   if (n := k.lower().replace("_", "-")) not in DROP_REQUEST and n not in conn_tokens
                   and n != sdef.header.lower()}
        port = sdef.upstream_port
        headers["Host"] = sdef.upstream_host if port == 443 else f"{sdef.upstream_host}:{port}"
        reg, path = self.server.registry, self.path.split("?", 1)[0][:512]
        t0 = time.monotonic()
        up = http.client.HTTPSConnection(sdef.upstream_host, port, context=self.server.tls[name], timeout=600)
        handle: socket.socket | None = None
        entry: dict[str, Any] | None = None
        status, sent, ended = 0, 0, ""
        try:
            try:
                raw = socket.create_connection((sdef.upstream_host, port), timeout=CONNECT_TIMEOUT)
            except OSError as exc:
                self.close_connection = True
                self._refuse(502, "api_error", f"upstream {sdef.upstream} failed: {exc.__class__.__name__}",
                             rec, name)
                return
            # From here a release shuts the upstream connection down (the TLS handshake too).
            if (handle := reg.begin_upstream(rec, raw)) is None:
                raw.close()
                self.close_connection = True
                self._refuse(401, "authentication_error", "the placeholder's run was released", rec, name)
                return
            try:
                raw.settimeout(600)
                up.sock = self.server.tls[name].wrap_socket(raw, server_hostname=sdef.upstream_host)
            except OSError as exc:
                raw.close()
                self.close_connection = True
                self._refuse(502, "api_error", f"upstream {sdef.upstream} failed: {exc.__class__.__name__}"
                             + (" (the run was released)" if rec.released else ""), rec, name)
                return
            if (entry := reg.sending(rec, self.command, path)) is None:
                self.close_connection = True
                self._refuse(401, "authentication_error", "the placeholder's run was released", rec, name)
                return
            value = self.server.values[rec.keys.get(name, name)].decode()
            headers[sdef.header] = f"{sdef.scheme} {value}" if sdef.scheme else value
            try:
                up.request(self.command, self.path, body=body if body or self.command in ("POST", "PUT", "PATCH")
                           else None, headers=headers)
                resp = up.getresponse()
            except (OSError, ValueError, http.client.HTTPException) as exc:
                status, ended = 502, self._cut(rec, "upstream", exc)
                self.close_connection = True
                self._answer_error(502, "api_error", f"upstream {sdef.upstream} failed: {exc.__class__.__name__}")
                return
            status = resp.status
            reg.answered(entry, status)
            sent, ended = self._relay(rec, resp)
        finally:
            up.close()
            if entry is not None:
                if ended:
                    reg.answered(entry, status, ended)
                # Logged before the release may go on (end_upstream), whatever happened.
                self._log(rec, name, status, "forwarded", bytes_in=len(body), bytes_out=sent,
                          ms=round((time.monotonic() - t0) * 1000, 1), **({"ended": ended} if ended else {}))
            if handle is not None:
                reg.end_upstream(rec, handle)

    def _relay(self, rec: RunRecord, resp: http.client.HTTPResponse) -> tuple[int, str]:
        """RESP to the client as it comes (server-sent events): the bytes sent, and why it
        ended early ("" when it did not)."""
        self.send_response_only(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in DROP_RESPONSE:
                self.send_header(k, v)
        no_body = self.command == "HEAD" or resp.status in (204, 304) or 100 <= resp.status < 200
        clen = resp.getheader("content-length")
        chunked = not no_body and (clen is None or resp.chunked)
        if no_body:
            self.send_header("Content-Length", clen or "0")
        elif chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(clen))
        sent = 0
        try:
            self.end_headers()
            while not no_body:
                try:
                    piece = resp.read1(65536)
                except (OSError, http.client.HTTPException) as exc:
                    self.close_connection = True
                    return sent, self._cut(rec, "upstream", exc)
                if not piece:
                    # http.client ends an answer whose connection closed early with b"" (review
                    # 31: recorded as whole, and the client waited 60 s for the rest); a
                    # release's shutdown looks the same to TLS.
                    if resp.length or rec.released:
                        self.close_connection = True
                        return sent, ("the run was released" if rec.released else
                                      f"the upstream's answer ended early ({sent} of {clen} bytes)")
                    if chunked:
                        self.wfile.write(b"0\r\n\r\n")
                        self.wfile.flush()
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                self.wfile.flush()
                sent += len(piece)
        except OSError as exc:
            self.close_connection = True
            return sent, self._cut(rec, "client", exc)
        return sent, ""

    @staticmethod
    def _cut(rec: RunRecord, side: str, exc: BaseException) -> str:
        if rec.released:
            return "the run was released"
        return f"the {side} connection failed: {exc.__class__.__name__}"

    def _answer_error(self, status: int, kind: str, message: str) -> None:
        body = _error_body(kind, message)
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("x-should-retry", "false")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError:
            self.close_connection = True  # the client is gone; the refusal is recorded

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET


class ProxyServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, addr: tuple[str, int], cfg: SecretsConfig, values: dict[str, bytes],
                 registry: Registry) -> None:
        self.cfg, self.values, self.registry = cfg, values, registry
        self.tls = {n: tls_context(s) for n, s in cfg.injected.items()}
        self.slot_lock = threading.Lock()
        self.shared = 0  # SHARED_SLOTS taken
        self.body_bytes = 0  # taken by every run (take_bytes)
        self.shared_bytes = 0  # of BODY_BYTES, taken beyond the runs' own
        self.unknown_tokens, self.unknown_at = float(LOG_UNKNOWN_BURST), time.monotonic()
        self.bytes_freed = threading.Condition(self.slot_lock)
        self.connections = 0
        self.log_lock = threading.Lock()
        self.log_file: Any = None
        self.log_path = ""  # where log_file is: it moves past LOG_MAX_BYTES
        super().__init__(addr, ProxyHandler)

    # slots -------------------------------------------------------------------------
    def take_slot(self, rec: RunRecord) -> str | None:
        """Take a forwarding slot for REC's run: None, or why not (429)."""
        with self.slot_lock:
            if rec.active >= MAX_PER_RUN:
                return f"more than {MAX_PER_RUN} requests of this run at once"
            if rec.active >= RESERVED_PER_RUN:
                if self.shared >= SHARED_SLOTS:
                    return (f"the injector forwards {SHARED_SLOTS} requests beyond each run's first "
                            f"{RESERVED_PER_RUN} at once, all taken")
                self.shared += 1
            rec.active += 1
            return None

    def take_bytes(self, rec: RunRecord, n: int, deadline: float | None = None) -> tuple[int, str] | None:
        """Take N bytes of body memory for REC's run (its own first, then the shared),
        waiting for the shared up to DEADLINE: None, or (status, why not)."""
        deadline = time.monotonic() + BODY_DEADLINE if deadline is None else deadline
        with self.slot_lock:
            if rec.released:
                return 401, "the placeholder's run was released"
            if rec.body_bytes + n > RUN_BODY_BYTES:
                return 429, (f"this run's request bodies would hold more than {RUN_BODY_BYTES >> 20} MiB of the "
                             "injector's memory at once")
            while self.shared_bytes + _beyond(rec.body_bytes + n) - rec.shared_bytes > BODY_BYTES:
                if rec.released:
                    return 401, "the placeholder's run was released"
                left = deadline - time.monotonic()
                # Woken at least every half second to see a release (review 31).
                if left <= 0 or (not self.bytes_freed.wait(min(left, 0.5)) and left <= 0.5):
                    return 503, (f"the injector's {BODY_BYTES >> 20} MiB of request body memory that runs share "
                                 f"(beyond each run's own {RUN_RESERVED_BYTES >> 20} MiB) are taken")
            more = max(0, _beyond(rec.body_bytes + n) - rec.shared_bytes)
            self.shared_bytes += more
            rec.shared_bytes += more
            rec.body_bytes += n
            self.body_bytes += n
            return None

    def give_bytes(self, rec: RunRecord, n: int) -> None:
        if n:
            with self.slot_lock:
                # What the run held of the shared is kept with it: the sum over the runs
                # is the shared total whatever the bounds were when it was taken.
                less = rec.shared_bytes - min(rec.shared_bytes, _beyond(rec.body_bytes - n))
                self.shared_bytes -= less
                rec.shared_bytes -= less
                rec.body_bytes -= n
                self.body_bytes -= n
                self.bytes_freed.notify_all()

    def give_slot(self, rec: RunRecord) -> None:
        with self.slot_lock:
            rec.active -= 1
            if rec.active >= RESERVED_PER_RUN:
                self.shared -= 1

    # connections -------------------------------------------------------------------
    def process_request(self, request: Any, client_address: Any) -> None:
        with self.slot_lock:
            over = self.connections >= MAX_CONNECTIONS
            if not over:
                self.connections += 1
        if over:
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                                b"x-should-retry: true\r\nConnection: close\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            with self.slot_lock:
                self.connections -= 1
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.slot_lock:
                self.connections -= 1

    def write_log(self, entry: dict[str, Any], rec: RunRecord | None = None, bounded: bool = True) -> None:
        """ENTRY to the access log: a request the key went upstream with always (review
        31: a run spent its bound on refusals, then its forwarded requests went unlogged;
        each is a round trip upstream), a refusal within REC's run's LOG_PER_RUN (then
        counted in its record) or, of no live run, LOG_UNKNOWN_RATE."""
        if self.log_file is None:
            return
        with self.log_lock:
            if rec is not None and bounded:
                if rec.logged >= LOG_PER_RUN:
                    rec.not_logged += 1
                    return
                rec.logged += 1
                if rec.logged == LOG_PER_RUN:
                    entry = {**entry, "note": f"the run's {LOG_PER_RUN}th refusal: its further refusals are not "
                                              "logged, counted in its record (not_logged)"}
            else:
                now = time.monotonic()
                self.unknown_tokens = min(float(LOG_UNKNOWN_BURST),
                                          self.unknown_tokens + (now - self.unknown_at) * LOG_UNKNOWN_RATE)
                self.unknown_at = now
                if self.unknown_tokens < 1:
                    return
                self.unknown_tokens -= 1
            self.log_file.write(json.dumps(entry) + "\n")
            self.log_file.flush()
            if self.log_path and self.log_file.tell() > LOG_MAX_BYTES:
                try:
                    os.replace(self.log_path, self.log_path + ".prev")
                    self.log_file.close()
                    self.log_file = open(self.log_path, "a", buffering=1)
                except OSError:
                    pass  # kept writing where it was


def _beyond(held: int) -> int:
    """Of a run's HELD body memory, what is beyond its own share (from the shared)."""
    return max(0, held - RUN_RESERVED_BYTES)
