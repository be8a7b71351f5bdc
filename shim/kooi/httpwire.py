"""HTTP/1.1 on the wire, for a proxy that must read a request exactly as a server would.

Reads one request head (strictly: one request line, at most MAX_HEADERS headers, no
folding, exactly one way of framing the body), reads or relays the body as framed
(Content-Length or chunked, nothing past it), writes the request on to an upstream
with `Connection: close`, answers with a short response, and relays bytes both ways
for connections the upstream hijacks (upgrades). It knows nothing of what the requests
mean: that is for its callers (kooi.broker).
"""

from __future__ import annotations

import http
import re
import selectors
import socket
import time
from dataclasses import dataclass

MAX_HEAD = 64 << 10
MAX_HEADERS = 100
MAX_CHUNK_LINE = 4096
BLOCK = 65536
# Headers about this hop's connection and framing: never forwarded as received (the
# forwarded request is framed anew and closes its connection).
HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "expect",
               "transfer-encoding", "content-length"}
# After an answer to a request whose body is still arriving: how much more of it, and
# for how long, is read and dropped so that the client sees the answer, not EPIPE.
LINGER_BYTES = 1 << 30
LINGER_SECONDS = 30.0

_METHOD = re.compile(r"[A-Z]{3,10}")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_CHUNK_SIZE = re.compile(r"[0-9a-fA-F]{1,15}")


class BadRequest(Exception):
    """The bytes are not one unambiguous HTTP/1.1 request (answer 400 and close)."""


class NoRequest(BadRequest):
    """The client closed the connection without sending a byte (a connection pool's
    probe): nothing to answer or record."""


@dataclass
class Request:
    method: str
    uri: str
    version: str
    headers: list[tuple[str, str]]
    body: bytes | None = None       # read whole (to inspect it)
    chunked: bool = False           # streamed through in chunks
    length: int = 0                 # streamed through, Content-Length

    def header(self, name: str) -> str | None:
        name = name.lower()
        found = [v for k, v in self.headers if k.lower() == name]
        return found[-1] if found else None


class Reader:
    """Buffered reads from a socket that can hand back what it buffered."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.started = False  # any byte received

    def _fill(self) -> bool:
        data = self.sock.recv(BLOCK)
        if not data:
            return False
        self.buf += data
        self.started = True
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
                if not self.buf and not self.started:
                    raise NoRequest("connection closed before a request")
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
    """The request line and headers; the body is left in R, its framing noted."""
    line = r.readline(MAX_HEAD).decode("latin-1").rstrip("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(f"malformed request line {line[:80]!r}")
    method, uri, version = parts
    if not _METHOD.fullmatch(method) or not uri.startswith("/"):
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
        if not _TOKEN.fullmatch(k):
            raise BadRequest("malformed header name")
        headers.append((k, v.strip()))
    req = Request(method, uri, version, headers)
    _framing(req)
    return req


def _framing(req: Request) -> None:
    """Note how REQ's body (or an answer's) is framed: one Content-Length or chunked."""
    lengths = {v for k, v in req.headers if k.lower() == "content-length"}
    te = [v.lower() for k, v in req.headers if k.lower() == "transfer-encoding"]
    if te:
        if lengths or te != ["chunked"]:
            raise BadRequest("ambiguous or unsupported Transfer-Encoding")
        req.chunked = True
    elif lengths:
        if len(lengths) != 1 or not next(iter(lengths)).isdigit():
            raise BadRequest("ambiguous Content-Length")
        req.length = int(next(iter(lengths)))


def read_chunk_header(r: Reader) -> int:
    line = r.readline(MAX_CHUNK_LINE).decode("latin-1").strip()
    size = line.split(";", 1)[0].strip()
    if not _CHUNK_SIZE.fullmatch(size):
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
            while r.readline(MAX_CHUNK_LINE) not in (b"\r\n", b"\n"):  # trailers
                pass
            return bytes(out)
        if len(out) + n > limit:
            return None
        out += r.read(n)
        r.read(2)


def _relay(r: Reader, n: int, out: socket.socket) -> None:
    while n:
        data = r.read(min(n, BLOCK))
        out.sendall(data)
        n -= len(data)


def stream_body(r: Reader, req: Request, out: socket.socket) -> None:
    """Relay a body that is not read whole, exactly as framed, no further."""
    if not req.chunked:
        _relay(r, req.length, out)
        return
    while True:
        n = read_chunk_header(r)
        out.sendall(b"%x\r\n" % n)
        if n == 0:
            while True:
                line = r.readline(MAX_CHUNK_LINE)
                out.sendall(line)
                if line in (b"\r\n", b"\n"):
                    return
        _relay(r, n, out)
        out.sendall(r.read(2))


def continue_if_expected(sock: socket.socket, req: Request) -> None:
    """Answer `Expect: 100-continue` (the body is read, or refused, next)."""
    if (req.header("expect") or "").lower() == "100-continue":
        sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")


def forward_head(req: Request, upgrade: bool) -> bytes:
    """REQ's head as sent upstream: framed for the body as it will be sent (read whole
    or streamed), `Connection: close` unless the connection is to be UPGRADEd (hijacked),
    in which case the client's Connection and Upgrade headers go along."""
    head = [f"{req.method} {req.uri} HTTP/1.1"]
    for k, v in req.headers:
        if k.lower() in HOP_HEADERS and not (upgrade and k.lower() in ("connection", "upgrade")):
            continue
        head.append(f"{k}: {v}")
    if not upgrade:
        head.append("Connection: close")
    if req.body is not None:
        head.append(f"Content-Length: {len(req.body)}")
    elif req.chunked:
        head.append("Transfer-Encoding: chunked")
    elif req.length:
        head.append(f"Content-Length: {req.length}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")


def forward(r: Reader, req: Request, client: socket.socket, up: socket.socket, upgrade: bool) -> None:
    """Send REQ (its body read whole or streamed from R) to UP and relay the answer to
    CLIENT until UP closes. On a route the upstream may hijack (UPGRADE), the client's
    further bytes go up only once the upstream's answer says it took the connection
    over (101, or 200 with a raw stream and no framing); any other answer (a detached
    exec start, an error) is relayed as framed and the connection closed, since the
    upstream would read what follows as further requests that nobody inspected."""
    up.sendall(forward_head(req, upgrade))
    if req.body is not None:
        up.sendall(req.body)
    else:
        stream_body(r, req, up)
    if not upgrade:
        pump(client, up, both=False)
        return
    ur = Reader(up)
    try:
        status, headers, head = read_response_head(ur)
    except BadRequest:
        return
    client.sendall(head)
    if not hijacked(status, headers):
        answer = Request("", "", "", headers)
        try:
            _framing(answer)
        except BadRequest:
            return
        if answer.chunked or answer.length:
            stream_body(ur, answer, client)
        elif not any(k.lower() == "content-length" for k, _ in headers):
            client.sendall(ur.take())
            pump(client, up, both=False)  # framed by the upstream's close
        return
    if rest := ur.take():
        client.sendall(rest)
    if pending := r.take():
        up.sendall(pending)
    pump(client, up, both=True)


RAW_STREAMS = ("application/vnd.docker.raw-stream", "application/vnd.docker.multiplexed-stream")


def read_response_head(r: Reader) -> tuple[int, list[tuple[str, str]], bytes]:
    """An upstream's status line and headers: (status, headers, the head's bytes)."""
    raw = bytearray(r.readline(MAX_HEAD))
    parts = raw.decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise BadRequest("malformed response")
    headers: list[tuple[str, str]] = []
    while True:
        line = r.readline(MAX_HEAD)
        raw += line
        if len(raw) > MAX_HEAD or len(headers) > MAX_HEADERS:
            raise BadRequest("response head too large")
        text = line.decode("latin-1").rstrip("\r\n")
        if not text:
            return int(parts[1]), headers, bytes(raw)
        k, _, v = text.partition(":")
        headers.append((k.strip(), v.strip()))


def hijacked(status: int, headers: list[tuple[str, str]]) -> bool:
    """The engine took the connection over: 101 (the client asked for an upgrade), or
    200 with a raw or multiplexed stream and no framing (it did not)."""
    h = {k.lower(): v for k, v in headers}
    return status == 101 or (status == 200 and "content-length" not in h and "transfer-encoding" not in h
                             and h.get("content-type", "").split(";")[0].strip().lower() in RAW_STREAMS)


def respond(sock: socket.socket, status: int, body: bytes, content_type: str = "application/json") -> None:
    """Answer with STATUS and BODY, then keep reading (and discarding) what the client
    still sends until it closes: a client that is still writing a body (a build context,
    a large create) would otherwise get EPIPE instead of the answer."""
    head = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    try:
        sock.sendall(head + body)
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
            chunk = sock.recv(BLOCK)
            if not chunk:
                return
            seen += len(chunk)
    except OSError:
        return


def pump(client: socket.socket, up: socket.socket, both: bool) -> None:
    """Relay the response (and, BOTH ways, the client's bytes: hijacked streams) until
    UP closes. Without BOTH, anything the client sends after its request is dropped."""
    client.settimeout(None)
    sel = selectors.DefaultSelector()
    sel.register(up, selectors.EVENT_READ)
    sel.register(client, selectors.EVENT_READ)
    try:
        while True:
            for key, _ in sel.select():
                s = up if key.fileobj is up else client
                try:
                    data = s.recv(BLOCK)
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
    finally:
        sel.close()
