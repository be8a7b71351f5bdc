"""The Docker Engine API over the engine's unix socket, with the standard library only.

What `kooi run` needs on its path: ping, image and container inspection, create, start,
wait, logs, kill, remove, and the run network of a `testcontainers: true` run. The Docker
SDK (Debian's python3-docker) costs about 275 ms of imports on every run, longer than a
no-op container takes; kooi's other commands (image builds, engine status, verify) keep
using it. Bodies are the Engine API's own JSON (docs.docker.com/reference/api/engine),
so what kooi asks for is what the engine (and the authorization plugin) reads.

Each request opens its own connection (a unix socket: no handshake to save), so a wait
that times out never leaves a half-read response behind for the next request.
"""

from __future__ import annotations

import json
import re
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from . import httpwire

if TYPE_CHECKING:
    from .hoststate.engine import EngineConfig

API = "/v1.41"  # Docker 20.10 (Debian 12); later engines serve it unchanged
# The bridge driver's option naming a network's bridge (kooi's own networks: run.runnet).
BRIDGE_NAME = "com.docker.network.bridge.name"


def _segment(ref: str) -> str:
    """REF in a request path the way the Docker SDK spells it: ':', '@' and '/' as they
    are (an image id, a tag, a digest, a registry path). kooi's authorization plugin
    refuses percent-encoded paths, so `sha256%3A...` would be refused on a
    userns_remap host; anything that still needs encoding is refused there too."""
    return quote(ref, safe="/:@")


class EngineError(Exception):
    """The engine could not be started, stopped or reached; the message says why."""


class APIError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


class NotFound(APIError):
    pass


class ProtocolError(OSError):
    """The engine's answer is not HTTP/1.1 as framed (or the connection ended inside it)."""


class _Response:
    """One HTTP/1.1 response read from the engine's socket: the status line and headers
    at once, the body as framed (Content-Length, chunked, or up to the close). The
    standard library's http.client would do, at ~22 ms of imports on every run."""

    def __init__(self, sock: socket.socket):
        self.sock, self.r = sock, httpwire.Reader(sock)
        try:
            line = self.r.readline(httpwire.MAX_HEAD).decode("latin-1").rstrip("\r\n")
            version, _, rest = line.partition(" ")
            code, _, self.reason = rest.partition(" ")
            if not version.startswith("HTTP/1.") or not code.isdigit():
                raise ProtocolError(f"not an HTTP/1.1 status line: {line[:80]!r}")
            self.status = int(code)
            headers: dict[str, str] = {}
            while (h := self.r.readline(httpwire.MAX_HEAD).decode("latin-1").rstrip("\r\n")):
                k, _, v = h.partition(":")
                headers[k.strip().lower()] = v.strip()
        except httpwire.BadRequest as exc:
            raise ProtocolError(str(exc)) from None
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        if length is not None and not length.isdigit():
            raise ProtocolError(f"malformed Content-Length: {length[:40]!r}")
        self.left: int | None = None if self.chunked or length is None else int(length)
        if self.status in (204, 304) or 100 <= self.status < 200:
            self.left = 0
        self.chunk_left, self.done = 0, self.left == 0

    def _piece(self, want: int) -> bytes:
        """Up to WANT bytes of the body, b"" at its end."""
        r = self.r
        if self.done:
            return b""
        if self.chunked:
            if self.chunk_left == 0:
                self.chunk_left = httpwire.read_chunk_header(r)
                if self.chunk_left == 0:
                    while r.readline(httpwire.MAX_CHUNK_LINE) not in (b"\r\n", b"\n"):  # trailers
                        pass
                    self.done = True
                    return b""
            data = r.read(min(want, self.chunk_left))
            self.chunk_left -= len(data)
            if self.chunk_left == 0:
                r.read(2)
            return data
        if self.left is not None:
            data = r.read(min(want, self.left))
            self.left -= len(data)
            self.done = self.left == 0
            return data
        if not r.buf and not r._fill():  # framed by the close
            self.done = True
            return b""
        n = min(want, len(r.buf))
        data = bytes(r.buf[:n])
        del r.buf[:n]
        return data

    def read(self, n: int | None = None) -> bytes:
        """N bytes of the body (fewer only at its end), or all of it."""
        out = bytearray()
        try:
            while n is None or len(out) < n:
                piece = self._piece(httpwire.BLOCK if n is None else n - len(out))
                if not piece:
                    break
                out += piece
        except httpwire.BadRequest as exc:
            raise ProtocolError(str(exc)) from None
        return bytes(out)

    def close(self) -> None:
        self.sock.close()


class Engine:
    """A client of one engine socket. HEADERS go with every request (the operator token
    of the authorization plugin, when kooi's own builds need it)."""

    def __init__(self, path: str, timeout: float = 30, headers: dict[str, str] | None = None):
        self.path, self.timeout, self.headers = path, timeout, dict(headers or {})

    def connect(self, timeout: float | None = None) -> socket.socket:
        """A raw connection to the engine (the broker's hijacked streams)."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout if timeout is None else timeout)
        try:
            s.connect(self.path)
        except OSError:
            s.close()
            raise
        return s

    def hard_rlimits(self) -> dict[str, int]:
        """The hard process and open-file limits of the process serving the socket (the
        daemon; SO_PEERCRED): what the containers it starts can be given at most. Empty
        where they cannot be read."""
        try:
            with self.connect(timeout=5) as s:
                pid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
            text = Path(f"/proc/{pid}/limits").read_text()
        except OSError:
            return {}
        rows = {"Max processes": "nproc", "Max open files": "nofile"}
        out: dict[str, int] = {}
        for line in text.splitlines():
            cols = re.split(r"\s{2,}", line.strip())
            if cols[0] in rows and len(cols) >= 3 and cols[2].isdigit():
                out[rows[cols[0]]] = int(cols[2])
        return out

    def _exchange(self, method: str, url: str, body: Any, timeout: float | None,
                  upgrade: bool = False) -> _Response:
        """Send one request (its own connection, closed after the answer) and read the
        answer's head. UPGRADE: ask for the raw stream (attach), not a closed answer."""
        data = json.dumps(body).encode() if body is not None else b""
        head = [f"{method} {url} HTTP/1.1", "Host: docker",
                *(["Connection: Upgrade", "Upgrade: tcp"] if upgrade else ["Connection: close"]),
                *(f"{k}: {v}" for k, v in self.headers.items())]
        if body is not None:
            head.append("Content-Type: application/json")
        if body is not None or method in ("POST", "PUT"):
            head.append(f"Content-Length: {len(data)}")
        s = self.connect(timeout)
        try:
            s.sendall("\r\n".join(head).encode("latin-1") + b"\r\n\r\n" + data)
            return _Response(s)
        except BaseException:
            s.close()
            raise

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """PATH as given (the client's API version kept) and the answer's status and
        decoded JSON (None if it is not JSON), whatever the status: the broker's lookups."""
        resp = self._exchange(method, path, body, None)
        try:
            raw = resp.read()
        finally:
            resp.close()
        try:
            return resp.status, json.loads(raw) if raw else None
        except ValueError:
            return resp.status, None

    def _open(self, method: str, url: str, body: Any = None, timeout: float | None = None,
              upgrade: bool = False) -> _Response:
        resp = self._exchange(method, url, body, timeout, upgrade)
        if resp.status >= 400:
            try:
                raw = resp.read()
            finally:
                resp.close()
            try:
                msg = str(json.loads(raw).get("message", ""))
            except (ValueError, AttributeError):
                msg = raw.decode("utf-8", "replace").strip()
            raise (NotFound if resp.status == 404 else APIError)(resp.status, msg or resp.reason)
        return resp

    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
                timeout: float | None = None, versioned: bool = True) -> Any:
        """The decoded JSON answer (None when empty); APIError/NotFound for 4xx and 5xx,
        OSError (TimeoutError among them) when the engine does not answer."""
        url = (API if versioned else "") + path + ("?" + urlencode(query) if query else "")
        resp = self._open(method, url, body, timeout)
        try:
            raw = resp.read()
        finally:
            resp.close()
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode("utf-8", "replace")

    # --- system -------------------------------------------------------------------
    def ping(self) -> bool:
        return bool(self.request("GET", "/_ping", versioned=False) == "OK")

    def info(self) -> dict[str, Any]:
        return dict(self.request("GET", "/info"))

    # --- images and networks ------------------------------------------------------
    def image(self, ref: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/images/{_segment(ref)}/json"))

    def network(self, name: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/networks/{_segment(name)}"))

    def create_network(self, name: str, labels: dict[str, str], driver: str = "bridge",
                       options: dict[str, str] | None = None) -> dict[str, Any]:
        """Create NAME and return its inspection (with its IPAM gateway)."""
        body: dict[str, Any] = {"Name": name, "Driver": driver, "Labels": labels, "CheckDuplicate": True}
        if options:
            body["Options"] = options
        made = self.request("POST", "/networks/create", body)
        return self.network(made["Id"])

    # --- containers ---------------------------------------------------------------
    def create(self, body: dict[str, Any], name: str | None = None) -> str:
        """The id of a container created from BODY (an Engine API ContainerCreate body)."""
        made = self.request("POST", "/containers/create", body, {"name": name} if name else None)
        return str(made["Id"])

    def inspect(self, cid: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/containers/{cid}/json"))

    def start(self, cid: str) -> None:
        self.request("POST", f"/containers/{cid}/start")

    def wait(self, cid: str, timeout: float) -> dict[str, Any] | None:
        """The container's exit ({"StatusCode": n}), or None if it still runs after TIMEOUT s."""
        try:
            return dict(self.request("POST", f"/containers/{cid}/wait", query={"condition": "not-running"},
                                     timeout=timeout))
        except TimeoutError:
            return None

    def kill(self, cid: str) -> None:
        self.request("POST", f"/containers/{cid}/kill")

    def remove(self, cid: str, wait: float = 60.0) -> None:
        """Remove the container (forced) with its anonymous volumes. Where another client
        is removing it already (409), wait up to WAIT seconds until it is gone: the
        caller goes on only once nothing of it runs."""
        import time

        try:
            self.request("DELETE", f"/containers/{cid}", query={"force": "1", "v": "1"})
            return
        except NotFound:
            raise
        except APIError as exc:
            if exc.status != 409 or "in progress" not in exc.message:
                raise
            first = exc
        end = time.monotonic() + wait
        while time.monotonic() < end:
            try:
                self.inspect(cid)
            except NotFound:
                return
            time.sleep(0.5)
        raise first

    def attach(self, cid: str) -> Iterator[bytes]:
        """The container's stdout and stderr from an attached stream, opened now (call it
        before the container starts, so nothing is missed), read as the caller iterates.
        The engine hands an attached client every byte and waits for it (a buffer of
        about 1 MiB, then the container's writes block), where a follower of the log
        file (logs()) loses what the json-file driver rotated away while it lagged
        (measured: 118k of 500k lines of a 50 MB burst, and the last line, with
        max-size 10m, max-file 3)."""
        resp = self._open("POST", f"{API}/containers/{cid}/attach?stream=1&stdout=1&stderr=1", upgrade=True)
        if resp.status not in (101, 200):
            resp.close()
            raise APIError(resp.status, f"attach answered {resp.status} {resp.reason}")
        resp.sock.settimeout(None)
        return self._frames(resp, raw=True)

    @staticmethod
    def _frames(resp: _Response, raw: bool = False) -> Iterator[bytes]:
        """The chunks of a multiplexed stream (a container without a TTY: each framed
        by an 8-byte header naming the stream and the size), from the body (RAW: the
        hijacked connection after the head) until it ends."""
        def read(n: int) -> bytes:
            if not raw:
                return resp.read(n)
            r = resp.r
            while len(r.buf) < n and r._fill():
                pass
            data = bytes(r.buf[:n])
            del r.buf[:n]
            return data

        try:
            while True:
                head = read(8)
                if len(head) < 8:
                    return
                size = struct.unpack(">I", head[4:])[0]
                chunk = read(size)
                if chunk:
                    yield chunk
                if len(chunk) < size:
                    return
        finally:
            resp.close()

    def logs(self, cid: str) -> Iterator[bytes]:
        """Follow the container's stdout and stderr until it ends (a container without a
        TTY: the engine frames each chunk with an 8-byte header naming the stream)."""
        resp = self._open("GET", f"{API}/containers/{cid}/logs?follow=1&stdout=1&stderr=1")
        # The head within the client's timeout; the body for as long as the container
        # runs, however long it stays silent (the run's deadline is the supervisor's).
        resp.sock.settimeout(None)
        yield from self._frames(resp)


def connect(cfg: EngineConfig, timeout: float = 30) -> Engine:
    """A client of the runner's engine that has answered a ping; EngineError says why
    not (the authorization plugin down, the engine not running) and what to do."""
    if cfg.authz is not None:  # the plugin's client (and the policy) only where there is one
        from . import authz

        if (down := authz.plugin_down(cfg.authz)) is not None:
            raise EngineError(down)
    eng = Engine(cfg.socket, timeout)
    try:
        eng.ping()
    except (OSError, APIError) as exc:
        raise EngineError(f"the runner's engine at {cfg.socket} does not answer ({exc.__class__.__name__}); "
                          "start it with `kooi engine start` (as root) or check `kooi engine status`") from None
    return eng
