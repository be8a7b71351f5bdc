"""`kooi authz`: a Docker authorization plugin (legacy socket plugin) applying kooi's
request policy (kooi.policy) to every Engine API call of the daemon it guards.

Protocol (docs.docker.com, "Access authorization plugin"): the daemon POSTs JSON to
  /Plugin.Activate           -> {"Implements": ["authz"]}
  /AuthZPlugin.AuthZReq      -> {"Allow": bool, "Msg": reason}   (request phase)
  /AuthZPlugin.AuthZRes      -> {"Allow": true}                  (response phase)
The request carries RequestMethod, RequestUri and RequestBody (base64). Bodies over
1 MiB and chunked/empty bodies arrive empty; the policy refuses creates without one.
Fail closed: if this process is down, dockerd refuses (and stalls) every call.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import os
import socketserver
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from .hoststate.engine import Authz
from .policy import Policy, decide

PLUGIN_NAME = "kooi-authz"
SOCKET_DIR = Path("/run/docker/plugins")
TOKEN_HEADER = "X-Kooi-Token"
MAX_MESSAGE = 8 << 20  # the daemon's message wraps a body of at most 1 MiB, base64-encoded


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, policy: Policy, log: Callable[[str], None], token: str | None = None):
        self.policy = policy
        self.token = token
        self.log = log
        self.decisions = 0
        self.lock = threading.Lock()
        super().__init__(path, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet; decisions are logged explicitly
        pass

    def address_string(self) -> str:  # unix sockets have no peer address
        return "unix"

    def _reply(self, doc: dict[str, Any], status: int = 200) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.docker.plugins.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_MESSAGE:
            self._reply({"Allow": False, "Msg": "kooi-authz: message too large, refused"})
            return
        raw = self.rfile.read(length) if length else b""
        if self.path == "/Plugin.Activate":
            self._reply({"Implements": ["authz"]})
            return
        if self.path == "/AuthZPlugin.AuthZRes":
            self._reply({"Allow": True})
            return
        if self.path != "/AuthZPlugin.AuthZReq":
            self._reply({"Err": f"unknown endpoint {self.path}"}, 404)
            return
        allow, msg = self.decide(raw)
        with self.server.lock:
            self.server.decisions += 1
        self._reply({"Allow": allow, "Msg": "" if allow else f"kooi-authz: {msg}"})

    def decide(self, raw: bytes) -> tuple[bool, str]:
        try:
            req = json.loads(raw or b"{}")
            method = str(req.get("RequestMethod") or "")
            uri = str(req.get("RequestUri") or req.get("RequestURI") or "")
            body_b64 = req.get("RequestBody")
            body = base64.b64decode(body_b64, validate=True) if body_b64 else b""
            headers = req.get("RequestHeaders") or {}
        except (ValueError, binascii.Error, AttributeError) as exc:
            return False, f"unreadable authorization request ({exc.__class__.__name__}), refused"
        if self.server.token and isinstance(headers, dict):
            sent = next((str(v) for k, v in headers.items() if str(k).lower() == TOKEN_HEADER.lower()), "")
            if sent and hmac.compare_digest(sent.encode(), self.server.token.encode()):
                return True, "operator token (site.yml maintenance)"
        d = decide(method, uri, body, self.server.policy)
        if not d.allow:
            self.server.log(f"DENY {method} {uri}: {d.reason}")
        return d.allow, d.reason


def read_token(path: Path | None) -> str | None:
    """The operator token (roles/authz writes it root-only); None without one."""
    if path is None:
        return None
    st = path.stat()
    if st.st_mode & 0o077:
        raise OSError(f"{path} is readable by group or others (mode {st.st_mode & 0o777:04o}); "
                      "the token must be root-only")
    token = path.read_text().strip()
    if len(token) < 32:
        raise OSError(f"{path} holds no usable token (at least 32 characters)")
    return token


def health(socket_path: Path, timeout: float = 3.0) -> tuple[bool, str]:
    """Ask the plugin to activate, as dockerd does: (healthy, what is wrong)."""
    import http.client
    import socket as sk

    s = sk.socket(sk.AF_UNIX, sk.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(str(socket_path))
        conn = http.client.HTTPConnection("localhost", timeout=timeout)
        conn.sock = s
        conn.request("POST", "/Plugin.Activate", body=b"{}",
                     headers={"Content-Type": "application/vnd.docker.plugins.v1+json"})
        doc = json.loads(conn.getresponse().read() or b"{}")
    except FileNotFoundError:
        return False, f"{socket_path} does not exist: the plugin is not running"
    except (OSError, ValueError) as exc:
        return False, f"{socket_path} does not answer ({exc.__class__.__name__}: {exc})"
    finally:
        s.close()
    if "authz" not in (doc.get("Implements") or []):
        return False, f"{socket_path} answers but does not implement authz: {doc}"
    return True, ""


def down_message(cfg_authz: Authz, why: str) -> str:
    unit = cfg_authz.unit or "kooi-authz.service"
    return (f"the authorization plugin {cfg_authz.plugin or PLUGIN_NAME} is down ({why}): dockerd refuses "
            f"every API call, each after a ~30 s wait, until it is back; start it with `systemctl start {unit}` "
            f"(why it stopped: `journalctl -u {unit}`); dockerd picks it up without a restart")


def plugin_down(cfg_authz: Authz | None) -> str | None:
    """Why the plugin an engine is configured with (engine.json's `authz`) is down, as
    an operator message; None when it answers or none is configured. Asked before any
    engine call: while the plugin is down dockerd stalls every call ~30 s."""
    if not cfg_authz:
        return None
    ok, why = health(Path(cfg_authz.socket or SOCKET_DIR / f"{PLUGIN_NAME}.sock"))
    return None if ok else down_message(cfg_authz, why)


def serve(socket_path: Path, policy: Policy, log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
          ready: threading.Event | None = None, token: str | None = None, group: str | None = None) -> None:
    """Serve the plugin on SOCKET_PATH (root-owned, 0600; 0660 for GROUP, the engine
    socket's group, whose members reach dockerd anyway and may check the plugin's
    health) until interrupted."""
    socket_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        socket_path.unlink()
    except FileNotFoundError:
        pass
    old = os.umask(0o177)
    try:
        srv = _Server(str(socket_path), policy, log, token)
    finally:
        os.umask(old)
    if group:
        import grp

        os.chown(socket_path, 0, grp.getgrnam(group).gr_gid)
        os.chmod(socket_path, 0o660)
    roots = ", ".join(r for r in (policy.workspace, *policy.extra_workspaces) if r) or "none: no binds"
    log(f"kooi-authz: serving on {socket_path} (workspace roots {roots}; "
        f"operator token {'set' if token else 'not set'})")
    if ready:
        ready.set()
    try:
        srv.serve_forever(poll_interval=0.5)
    finally:
        srv.server_close()
        try:
            socket_path.unlink()
        except FileNotFoundError:
            pass
