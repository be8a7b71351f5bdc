"""kooi's credential injector: the host adds a secret to a workload's API requests, so
the secret never enters the sandbox.

One daemon per host (`kooi secrets serve`; kooi-inject.service, or `kooi secrets
start` on hosts without systemd). It starts as root, reads the secrets description
(/etc/kooi/secrets.json) and the values from the root-only store, opens its two
sockets, and drops to its own user (no groups, no_new_privs) before it serves:

- a control socket (unix, root and the runner's group) where `kooi run` registers a
  run: the injector reads the workflow itself from the root-owned workflow directory,
  and answers with a fresh placeholder per inject secret the workflow names (and the
  values of its environment secrets), valid until the run releases it or its timeout
  has passed; the release answers with the run's record (requests forwarded, requests
  refused). A placeholder identifies its run: concurrent runs never mix.
- a plain-HTTP reverse proxy on the run's proxy path (host loopback, reached as
  10.0.2.2 from the rootless engine; every address on userns_remap hosts, where the
  nftables input chain admits only Docker bridges). A request must carry a live
  placeholder (x-api-key or Authorization: Bearer), a method and path the secret
  allows; then the injector removes every credential header the request carried,
  adds the real one, and forwards it over TLS (verified) to the secret's upstream,
  streaming the answer back unbuffered. Anything else is refused (401/403) and
  recorded for the run. The workload can therefore use the API host neither with a
  key of its own (the header is always replaced) nor for other paths.

The access log (JSON lines) records run, secret, method, path, status and bytes; never
a header value.
"""

from __future__ import annotations

import ctypes
import http.client
import http.server
import json
import os
import re
import secrets as pysecrets
import signal
import socket
import socketserver
import ssl
import stat
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .hoststate.secrets import SecretDef, SecretsConfig, value_path

PLACEHOLDER_PREFIX = "kooi-placeholder-"
RUN_RE = re.compile(r"^[A-Za-z0-9._-]{1,160}$")
MAX_BODY = 32 << 20  # the Messages API's own request limit
# Requests forwarded at once: per run (one run cannot take the others' share) and over
# all runs. A slot is taken only once the whole body is in, read within BODY_DEADLINE
# seconds: a run that trickles its bodies holds no slot (issue 29, finding 4).
MAX_PER_RUN = 16
MAX_CONCURRENT = 256
BODY_DEADLINE = 60.0
# Anthropic-defined tools the client runs (the API only describes them to the model);
# every other typed tool runs on the API's side, reaching hosts the request names.
CLIENT_TOOL_TYPES = ("custom", "bash_", "text_editor_", "computer_", "memory_")
MAX_RECORDED = 200
# Hop-by-hop headers (RFC 9110 7.6.1) and every header that may carry a credential or
# route the request: never forwarded as the client sent them.
DROP_REQUEST = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te",
                "trailer", "transfer-encoding", "upgrade", "host", "content-length", "x-api-key", "authorization",
                "cookie", "forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-real-ip"}
DROP_RESPONSE = {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "te", "trailer",
                 "transfer-encoding", "upgrade", "content-length", "set-cookie"}


class InjectError(Exception):
    """The injector is missing, down or refused; the message says what to do."""


# --- the daemon's state ----------------------------------------------------------------


@dataclass
class RunRecord:
    run: str
    workflow: str
    expires: float
    tokens: dict[str, str] = field(default_factory=dict)  # secret -> placeholder
    forwarded: int = 0
    refused: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    slots: threading.BoundedSemaphore = field(default_factory=lambda: threading.BoundedSemaphore(MAX_PER_RUN))

    def as_dict(self) -> dict[str, Any]:
        return {"run": self.run, "workflow": self.workflow, "secrets": sorted(self.tokens),
                "forwarded": self.forwarded, "refused": self.refused, "requests": self.requests}


class Registry:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: dict[str, RunRecord] = {}
        self.tokens: dict[str, tuple[str, str]] = {}  # placeholder -> (run, secret)

    def _prune(self) -> None:
        now = time.time()
        for run in [r for r, rec in self.runs.items() if rec.expires < now]:
            self._drop(run)

    def _drop(self, run: str) -> RunRecord | None:
        rec = self.runs.pop(run, None)
        if rec:
            for tok in rec.tokens.values():
                self.tokens.pop(tok, None)
        return rec

    def add(self, run: str, workflow: str, names: list[str], ttl: float) -> dict[str, str]:
        with self.lock:
            self._prune()
            if run in self.runs:
                raise InjectError(f"run {run} is registered already")
            rec = RunRecord(run, workflow, time.time() + ttl)
            for n in names:
                tok = PLACEHOLDER_PREFIX + pysecrets.token_urlsafe(24)
                rec.tokens[n] = tok
                self.tokens[tok] = (run, n)
            self.runs[run] = rec
            return dict(rec.tokens)

    def lookup(self, token: str) -> tuple[RunRecord, str] | None:
        with self.lock:
            self._prune()
            hit = self.tokens.get(token)
            if hit is None:
                return None
            return self.runs[hit[0]], hit[1]

    def note(self, rec: RunRecord, entry: dict[str, Any], refused: bool) -> None:
        with self.lock:
            if refused:
                if len(rec.refused) < MAX_RECORDED:
                    rec.refused.append(entry)
            else:
                rec.forwarded += 1
                if len(rec.requests) < MAX_RECORDED:
                    rec.requests.append(entry)

    def release(self, run: str) -> dict[str, Any] | None:
        with self.lock:
            rec = self._drop(run)
            return rec.as_dict() if rec else None


def read_values(cfg: SecretsConfig) -> dict[str, bytes]:
    """Root: every secret's value from the store, which must be root's alone."""
    store = Path(cfg.store)
    st = store.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o077:
        raise InjectError(f"{store}: the secrets store must be a directory owned by root, mode 0700; re-run site.yml")
    out = {}
    for name in cfg.secrets:
        p = value_path(cfg, name)
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise InjectError(f"{p}: cannot read secret {name!r} ({exc.strerror}); re-run site.yml") from None
        with os.fdopen(fd, "rb") as f:
            fst = os.fstat(f.fileno())
            if fst.st_uid != 0 or stat.S_IMODE(fst.st_mode) & 0o077 or not stat.S_ISREG(fst.st_mode):
                raise InjectError(f"{p}: a secret must be a regular file owned by root, mode 0600; re-run site.yml")
            value = f.read().rstrip(b"\r\n")
        if not value or b"\n" in value or b"\r" in value:
            raise InjectError(f"{p}: secret {name!r} is empty or spans lines; re-run site.yml")
        out[name] = value
    return out


def tls_context(s: SecretDef) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=s.ca_file or None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


# --- the reverse proxy ----------------------------------------------------------------


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for k, v in pairs:
        if k in seen:
            raise _Duplicate(k)
        seen[k] = v
    return seen


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def body_refusal(sdef: SecretDef, body: bytes) -> tuple[int, str] | None:
    """Why the route SDEF does not forward BODY (status, message), or None. With body
    anthropic-messages: a JSON object (no key twice anywhere: the API's parser and
    this one must not see different requests) without the MCP connector
    (mcp_servers) and without server-side tools (web fetch and search, code
    execution, any typed tool but the client's own) unless server_tools names them."""
    if sdef.body != "anthropic-messages":
        return None
    try:
        doc = json.loads(body.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _Duplicate as exc:
        return 400, f"the request body names {str(exc)[:80]!r} twice in one object"
    except (ValueError, UnicodeDecodeError):
        return 400, "the request body is not JSON (UTF-8)"
    if not isinstance(doc, dict):
        return 400, "the request body is not a JSON object"
    if doc.get("mcp_servers") and "mcp" not in sdef.server_tools:
        return 403, (f"mcp_servers is not allowed for secret {sdef.name} (the API's MCP connector reaches the "
                     "servers the request names); the operator allows it with server_tools: [mcp]")
    tools = doc.get("tools") or []
    if not isinstance(tools, list):
        return 400, "tools is not a list"
    for t in tools:
        if not isinstance(t, dict):
            return 400, "a tool is not a JSON object"
        kind = t.get("type")
        if kind is None or isinstance(kind, str) and (kind == "custom" or kind.startswith(CLIENT_TOOL_TYPES[1:])):
            continue
        if not isinstance(kind, str):
            return 400, "a tool's type is not a string"
        if any(kind == a or kind.startswith(a + "_") for a in sdef.server_tools):
            continue
        return 403, (f"the server tool {kind[:80]} is not allowed for secret {sdef.name} (the API runs it, reaching "
                     "hosts the request names); the operator allows it with server_tools")
    return None


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

    def _log(self, run: str, secret: str, status: int, verdict: str, **extra: Any) -> dict[str, Any]:
        entry = {"time": round(time.time(), 3), "run": run, "secret": secret, "method": self.command,
                 "path": self.path.split("?", 1)[0][:512], "status": status, "verdict": verdict, **extra}
        self.server.write_log(entry)
        return entry

    def _refuse(self, status: int, kind: str, message: str, rec: RunRecord | None, secret: str) -> None:
        # Recorded before the answer goes out: a run released right after it has it.
        entry = self._log(rec.run if rec else "-", secret, status, "refused", reason=message)
        if rec is not None:
            self.server.registry.note(rec, {k: entry[k] for k in ("time", "method", "path", "status", "reason")},
                                      refused=True)
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
        sdef = self.server.cfg.secrets[name]
        path = self.path
        if not path.startswith("/") or not sdef.allows(self.command, path.split("?", 1)[0]):
            self.close_connection = True
            self._refuse(403, "permission_error", f"{self.command} {path.split('?', 1)[0][:200]} is not allowed "
                         f"for secret {name}", rec, name)
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
        if self.headers.get("content-encoding", "identity").strip().lower() != "identity":
            self.close_connection = True
            self._refuse(415, "invalid_request_error", "Content-Encoding is not forwarded: send the body as it is",
                         rec, name)
            return
        body = self._read_body(length)
        if body is None:
            self.close_connection = True
            self._refuse(408, "invalid_request_error", f"the body did not arrive within {BODY_DEADLINE:g} s",
                         rec, name)
            return
        if (why := body_refusal(sdef, body)) is not None:
            self._refuse(why[0], "permission_error" if why[0] == 403 else "invalid_request_error", why[1], rec, name)
            return
        if not rec.slots.acquire(blocking=False):
            self.close_connection = True
            self._refuse(429, "rate_limit_error", f"more than {MAX_PER_RUN} requests of this run at once", rec, name)
            return
        try:
            if not self.server.slots.acquire(blocking=False):
                self.close_connection = True
                self._refuse(429, "rate_limit_error", f"more than {MAX_CONCURRENT} requests at once", rec, name)
                return
            try:
                self._forward(rec, name, sdef, body)
            finally:
                self.server.slots.release()
        finally:
            rec.slots.release()

    def _read_body(self, length: int) -> bytes | None:
        """LENGTH bytes within BODY_DEADLINE seconds, or None."""
        deadline = time.monotonic() + BODY_DEADLINE
        chunks, left = [], length
        try:
            while left:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.connection.settimeout(remaining)
                chunk = self.rfile.read1(min(left, 1 << 16))
                if not chunk:
                    return None
                chunks.append(chunk)
                left -= len(chunk)
        except (TimeoutError, OSError):
            return None
        finally:
            try:
                self.connection.settimeout(self.timeout)
            except OSError:
                pass
        return b"".join(chunks)

    def _forward(self, rec: RunRecord, name: str, sdef: SecretDef, body: bytes) -> None:
        conn_tokens = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() not in DROP_REQUEST and k.lower() not in conn_tokens and k.lower() != sdef.header.lower()}
        port = sdef.upstream_port
        headers["Host"] = sdef.upstream_host if port == 443 else f"{sdef.upstream_host}:{port}"
        value = self.server.values[name].decode()
        headers[sdef.header] = f"{sdef.scheme} {value}" if sdef.scheme else value
        t0 = time.monotonic()
        up = http.client.HTTPSConnection(sdef.upstream_host, port, context=self.server.tls[name], timeout=600)
        sent = 0
        try:
            try:
                up.request(self.command, self.path, body=body if body or self.command in ("POST", "PUT", "PATCH")
                           else None, headers=headers)
                resp = up.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                self.close_connection = True
                self._refuse(502, "api_error", f"upstream {sdef.upstream} failed: {exc.__class__.__name__}",
                             rec, name)
                return
            # Recorded before the answer goes out: a run released right after it has it.
            self.server.registry.note(rec, {"time": round(time.time(), 3), "method": self.command,
                                            "path": self.path.split("?", 1)[0][:512], "status": resp.status},
                                      refused=False)
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
            self.end_headers()
            if not no_body:
                while True:
                    piece = resp.read1(65536)
                    if not piece:
                        break
                    sent += len(piece)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                    self.wfile.flush()
                if chunked:
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
            self._log(rec.run, name, resp.status, "forwarded", bytes_in=len(body), bytes_out=sent,
                      ms=round((time.monotonic() - t0) * 1000, 1))
        finally:
            up.close()

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
        self.slots = threading.BoundedSemaphore(MAX_CONCURRENT)
        self.log_lock = threading.Lock()
        self.log_file: Any = None
        super().__init__(addr, ProxyHandler)

    def write_log(self, entry: dict[str, Any]) -> None:
        if self.log_file is None:
            return
        with self.log_lock:
            self.log_file.write(json.dumps(entry) + "\n")
            self.log_file.flush()


# --- the control socket ---------------------------------------------------------------


class ControlHandler(socketserver.StreamRequestHandler):
    server: ControlServer

    def handle(self) -> None:
        try:
            creds = self.request.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _pid, uid, gid = struct.unpack("3i", creds)
            if uid != 0 and gid != self.server.group and self.server.group not in _groups_of(uid):
                return self._answer({"ok": False, "error": "not allowed"})
            line = self.rfile.readline(65536)
            req = json.loads(line)
            if not isinstance(req, dict):
                raise ValueError("not an object")
            self._answer(self.server.dispatch(req))
        except InjectError as exc:
            self._answer({"ok": False, "error": str(exc)})
        except (ValueError, OSError) as exc:
            self._answer({"ok": False, "error": f"bad request: {exc}"})

    def _answer(self, doc: dict[str, Any]) -> None:
        try:
            self.wfile.write(json.dumps(doc).encode() + b"\n")
        except OSError:
            pass


class ControlServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, group: int, cfg: SecretsConfig, values: dict[str, bytes],
                 registry: Registry, workflow_dir: Path | None = None) -> None:
        self.group, self.cfg, self.values, self.registry = group, cfg, values, registry
        self.workflow_dir = workflow_dir
        super().__init__(path, ControlHandler)

    def dispatch(self, req: dict[str, Any]) -> dict[str, Any]:
        from . import workflow

        op = req.get("op")
        if op == "status":
            return {"ok": True, "pid": os.getpid(), "uid": os.getuid(), "runs": len(self.registry.runs),
                    "secrets": sorted(self.cfg.secrets)}
        run = req.get("run")
        if not isinstance(run, str) or not RUN_RE.match(run):
            raise InjectError("run: not a run id")
        if op == "register":
            name = req.get("workflow")
            if not isinstance(name, str):
                raise InjectError("workflow: not a workflow name")
            # The directory kooi run read it from (its KOOI_WORKFLOW_DIR), held to the
            # same rule: root-owned and writable by nobody else.
            directory = req.get("directory")
            if not isinstance(directory, str) or not directory.startswith("/"):
                directory = str(self.workflow_dir or workflow.WORKFLOW_DIR)
            try:
                wf = workflow.load(name, Path(directory))
            except workflow.WorkflowError as exc:
                raise InjectError(str(exc)) from None
            unknown = [n for n in wf.secrets if n not in self.cfg.secrets]
            if unknown:
                raise InjectError(f"workflow {name} names secrets this host does not hold: {', '.join(unknown)}")
            injected = [n for n in wf.secrets if self.cfg.secrets[n].mode == "inject"]
            tokens = self.registry.add(run, name, injected, ttl=wf.timeout + 600)
            env = {self.cfg.secrets[n].env: self.values[n].decode() for n in wf.secrets
                   if self.cfg.secrets[n].mode == "environment"}
            return {"ok": True, "placeholders": tokens, "environment": env}
        if op == "release":
            return {"ok": True, "record": self.registry.release(run)}
        raise InjectError(f"unknown op {op!r}")


def _groups_of(uid: int) -> list[int]:
    import pwd

    try:
        pw = pwd.getpwuid(uid)
        return os.getgrouplist(pw.pw_name, pw.pw_gid)
    except (KeyError, OSError):
        return []


# --- serve (root, then its own user) --------------------------------------------------


def _drop_to(user: str) -> None:
    import pwd

    pw = pwd.getpwnam(user)
    if pw.pw_uid == 0:
        raise InjectError(f"the injector's user {user} is root; it must be an unprivileged account")
    os.setgroups([])
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise InjectError("prctl(PR_SET_NO_NEW_PRIVS) failed")
    if os.getuid() == 0 or os.geteuid() == 0:
        raise InjectError("could not drop root")


def serve(cfg: SecretsConfig, workflow_dir: Path | None = None) -> int:
    """Root: read the values, open the sockets, drop to the injector's user, serve until
    SIGTERM/SIGINT."""
    if os.geteuid() != 0:
        raise InjectError("kooi secrets serve must start as root (it reads the root-only store, then drops)")
    os.umask(0o077)
    inj = cfg.injector
    values = read_values(cfg)
    registry = Registry()
    run_dir = Path(inj.control).parent
    run_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(run_dir, 0o755)
    Path(inj.control).unlink(missing_ok=True)
    control = ControlServer(inj.control, inj.control_group, cfg, values, registry, workflow_dir)
    os.chown(inj.control, 0, inj.control_group)
    os.chmod(inj.control, 0o660)
    proxy = ProxyServer((inj.listen, inj.port), cfg, values, registry)
    Path(inj.pid_file).write_text(f"{os.getpid()}\n")
    os.chmod(inj.pid_file, 0o644)
    _drop_to(inj.user)
    try:
        proxy.log_file = open(inj.access_log, "a", buffering=1)
    except OSError as exc:
        raise InjectError(f"cannot open the access log {inj.access_log} as {inj.user} ({exc.strerror}): its "
                          f"directory must belong to {inj.user} and every parent be open to it (re-run "
                          "site.yml, role secrets)") from None
    threading.Thread(target=control.serve_forever, daemon=True).start()

    def stop(_signum: int, _frame: Any) -> None:
        threading.Thread(target=proxy.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"kooi injector: serving {', '.join(sorted(cfg.injected)) or 'no inject secrets'} on "
          f"{inj.listen}:{inj.port} as {inj.user}", flush=True)
    proxy.serve_forever(poll_interval=0.5)
    control.server_close()
    return 0


# --- clients (kooi run, kooi secrets, the checks) ----------------------------------------


def call(cfg: SecretsConfig, req: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(cfg.injector.control)
        s.sendall(json.dumps(req).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            piece = s.recv(65536)
            if not piece:
                break
            buf += piece
    except OSError as exc:
        raise InjectError(f"the injector does not answer on {cfg.injector.control} ({exc.strerror or exc}); "
                          "start it: kooi secrets start (root), or re-run site.yml") from None
    finally:
        s.close()
    try:
        doc: dict[str, Any] = json.loads(buf)
    except ValueError:
        raise InjectError(f"the injector answered {buf[:200]!r}") from None
    if not doc.get("ok"):
        raise InjectError(f"the injector refused: {doc.get('error')}")
    return doc


def status(cfg: SecretsConfig) -> dict[str, Any]:
    try:
        st = call(cfg, {"op": "status"}, timeout=3)
        return {"up": True, "pid": st["pid"], "uid": st["uid"], "runs": st["runs"], "secrets": st["secrets"],
                "listen": f"{cfg.injector.listen}:{cfg.injector.port}", "systemd_unit": cfg.injector.systemd_unit}
    except InjectError as exc:
        return {"up": False, "detail": str(exc), "listen": f"{cfg.injector.listen}:{cfg.injector.port}",
                "systemd_unit": cfg.injector.systemd_unit}


def start(cfg: SecretsConfig, timeout: float = 20.0) -> bool:
    """Root: start the injector where it is down (hosts without systemd; on systemd
    hosts the unit). True when it was started."""
    if os.geteuid() != 0:
        raise InjectError("kooi secrets start needs root")
    if status(cfg)["up"]:
        return False
    unit = cfg.injector.systemd_unit
    if unit and Path("/run/systemd/system").is_dir():
        res = subprocess.run(["systemctl", "start", unit], capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise InjectError(f"systemctl start {unit} failed: {res.stderr.strip()}")
    else:
        log_path = Path(cfg.injector.access_log).with_name("injector.log")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as logf:
            lib = str(Path(__file__).resolve().parents[1])
            code = f"import sys; sys.path.insert(0, {lib!r}); from kooi.cli import main; sys.exit(main())"
            subprocess.Popen([sys.executable, "-I", "-c", code, "secrets", "serve"], stdin=subprocess.DEVNULL,
                             stdout=logf, stderr=logf, start_new_session=True, close_fds=True,
                             cwd="/", env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if status(cfg)["up"]:
            return True
        time.sleep(0.2)
    raise InjectError(f"the injector did not answer within {timeout:.0f} s; see "
                      f"{Path(cfg.injector.access_log).with_name('injector.log')}")


def stop(cfg: SecretsConfig, timeout: float = 10.0) -> bool:
    if os.geteuid() != 0:
        raise InjectError("kooi secrets stop needs root")
    try:
        pid = int(Path(cfg.injector.pid_file).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    if not status(cfg)["up"]:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    return True
