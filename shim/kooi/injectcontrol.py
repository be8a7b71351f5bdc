"""The injector's registration of runs: the registry (a run's placeholders, its record
of requests forwarded and refused, its slots) and the control socket where `kooi run`
registers a run (the injector reads the workflow itself) and releases it.
"""

from __future__ import annotations

import json
import os
import re
import secrets as pysecrets
import socket
import socketserver
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .hoststate.errors import HostStateError
from .hoststate.secrets import SecretsConfig, value_key
from .inject import InjectError

PLACEHOLDER_PREFIX = "kooi-placeholder-"
RUN_RE = re.compile(r"^[A-Za-z0-9._-]{1,160}\Z")
# Requests of one run forwarded at once (its slots; kooi.injectproxy takes them).
MAX_PER_RUN = 16
# Runs registered at once: the injector's connection bound (injectproxy.MAX_CONNECTIONS)
# holds this many runs' whole share of connections (egress.RUN_CONNECTIONS each).
MAX_RUNS = 64
MAX_RECORDED = 200
# How long a release waits for its run's requests in flight to end (their upstream
# connections are shut down at once; this bounds a thread stuck elsewhere).
RELEASE_WAIT = 5.0


# --- the daemon's state ----------------------------------------------------------------


@dataclass
class RunRecord:
    run: str
    workflow: str
    expires: float
    tokens: dict[str, str] = field(default_factory=dict)  # secret -> placeholder
    keys: dict[str, str] = field(default_factory=dict)  # secret -> the store key of its value (a person's)
    forwarded: int = 0
    refused: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    active: int = 0  # requests of the run being forwarded now (injectproxy.ProxyServer.take_slot)
    body_bytes: int = 0  # memory its request bodies hold now (injectproxy.ProxyServer.take_bytes)
    shared_bytes: int = 0  # of body_bytes, what comes from the memory all runs share
    logged: int = 0  # its entries in the access log (injectproxy.ProxyServer.write_log)
    not_logged: int = 0  # its requests past LOG_PER_RUN
    released: bool = False
    conns: set[Any] = field(default_factory=set)  # the connections of its requests in flight
    upstreams: set[socket.socket] = field(default_factory=set)  # theirs upstream (begin_upstream)

    def as_dict(self) -> dict[str, Any]:
        return {"run": self.run, "workflow": self.workflow, "secrets": sorted(self.tokens),
                "forwarded": self.forwarded, "refused": [dict(e) for e in self.refused],
                "requests": [dict(e) for e in self.requests], "not_logged": self.not_logged}

    def kept(self) -> dict[str, Any]:
        """What a restarted injector needs to go on serving the run (review 30: the whole
        record, rewritten at each registration, was 54 MB with 63 runs); its requests
        before a restart are in the access log."""
        return {"run": self.run, "workflow": self.workflow, "expires": self.expires, "tokens": self.tokens,
                "keys": self.keys, "forwarded": self.forwarded, "logged": self.logged,
                "not_logged": self.not_logged}


class Registry:
    """The live runs. With PATH (a file of the injector's own user, 0600), kept there at
    each registration and release and read back when the injector starts (review 25:
    an injector restarted after it was killed had forgotten every live run, and their
    requests were refused for the rest of their lifetime)."""

    def __init__(self, path: Path | None = None) -> None:
        self.lock = threading.Lock()
        self.ended = threading.Condition(self.lock)  # a request's upstream connection ended
        self.runs: dict[str, RunRecord] = {}
        self.tokens: dict[str, tuple[str, str]] = {}  # placeholder -> (run, secret)
        self.path = path
        # Saving happens outside the lock (review 30: 0.5 to 0.8 s stalls of every
        # request): each change takes a generation; an older one never overwrites a newer.
        self.save_lock = threading.Lock()
        self.generation = self.saved = 0

    def load(self) -> int:
        """The runs PATH holds that are still live (how many); an unreadable file is
        none (runs then register again)."""
        if self.path is None:
            return 0
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                doc = json.loads(f.read(64 << 20))
            now = time.time()
            with self.lock:
                for r in doc["runs"]:
                    rec = RunRecord(str(r["run"]), str(r["workflow"]), float(r["expires"]),
                                    {str(k): str(v) for k, v in r["tokens"].items()},
                                    {str(k): str(v) for k, v in r["keys"].items()}, int(r["forwarded"]),
                                    logged=int(r.get("logged", 0)),
                                    not_logged=int(r.get("not_logged", 0)))
                    if rec.expires < now or not RUN_RE.match(rec.run) or len(self.runs) >= MAX_RUNS \
                            or not all(t.startswith(PLACEHOLDER_PREFIX) for t in rec.tokens.values()):
                        continue
                    self.runs[rec.run] = rec
                    for n, tok in rec.tokens.items():
                        self.tokens[tok] = (rec.run, n)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return 0
        return len(self.runs)

    def _changed(self) -> tuple[int, dict[str, Any]]:
        """Under the lock: a new generation and what PATH is to hold (see save)."""
        self.generation += 1
        return self.generation, {"runs": [r.kept() for r in self.runs.values()]}

    def save(self, change: tuple[int, dict[str, Any]] | None) -> None:
        """Outside the lock: CHANGE (from _changed) to PATH unless a newer one is there."""
        if change is None or self.path is None:
            return
        with self.save_lock:
            if change[0] <= self.saved:
                return
            self._write(change[1])
            self.saved = change[0]

    def _write(self, doc: dict[str, Any]) -> None:
        assert self.path is not None
        tmp = self.path.with_name(self.path.name + ".new")
        try:
            tmp.unlink(missing_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, self.path)
        except OSError:
            pass  # kept in memory; a restart then forgets them (as before)

    def _prune(self) -> tuple[int, dict[str, Any]] | None:
        now = time.time()
        gone = [r for r, rec in self.runs.items() if rec.expires < now]
        for run in gone:
            self._drop(run)
        return self._changed() if gone else None

    def _drop(self, run: str) -> RunRecord | None:
        """Under the lock: RUN gone, and its requests in flight ended (review 29: one
        released while its body came in kept its memory, then went upstream with the
        real key, in no record)."""
        rec = self.runs.pop(run, None)
        if rec:
            rec.released = True
            for tok in rec.tokens.values():
                self.tokens.pop(tok, None)
            for conn in (*rec.conns, *rec.upstreams):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        return rec

    def enter(self, rec: RunRecord, conn: Any) -> bool:
        """A request of REC's run on CONN begins (False: the run is released)."""
        with self.lock:
            if rec.released:
                return False
            rec.conns.add(conn)
            return True

    def leave(self, rec: RunRecord, conn: Any) -> None:
        with self.lock:
            rec.conns.discard(conn)

    # A forwarded request (review 30: the released check came before the upstream
    # connection, so a release while it connected still sent the key, in no record):
    # begin_upstream when connected (the release shuts the connection down from then),
    # sending just before the key goes (recorded from then), end_upstream at the end.
    def begin_upstream(self, rec: RunRecord, sock: socket.socket) -> socket.socket | None:
        """A handle on SOCK (the upstream connection of a request of REC's run) that a
        release shuts down; None: the run is released."""
        with self.lock:
            if rec.released:
                return None
            handle = socket.socket(fileno=os.dup(sock.fileno()))  # survives wrap_socket's detach
            rec.upstreams.add(handle)
            return handle

    def sending(self, rec: RunRecord, method: str, path: str) -> dict[str, Any] | None:
        """The request's entry in REC's record, as its key goes upstream; None: released."""
        with self.lock:
            if rec.released:
                return None
            entry: dict[str, Any] = {"time": round(time.time(), 3), "method": method, "path": path, "status": 0}
            rec.forwarded += 1
            if len(rec.requests) < MAX_RECORDED:
                rec.requests.append(entry)
            return entry

    def answered(self, entry: dict[str, Any], status: int, ended: str = "") -> None:
        with self.lock:
            entry["status"] = status
            if ended:
                entry["ended"] = ended

    def end_upstream(self, rec: RunRecord, handle: socket.socket) -> None:
        with self.lock:
            rec.upstreams.discard(handle)
            handle.close()
            self.ended.notify_all()

    def add(self, run: str, workflow: str, names: list[str], ttl: float,
            keys: dict[str, str] | None = None) -> dict[str, str]:
        """Placeholders for the secrets NAMES of RUN; KEYS: which value each gets (by
        default the secret's own)."""
        with self.lock:
            self._prune()
            if run in self.runs:
                raise InjectError(f"run {run} is registered already")
            if len(self.runs) >= MAX_RUNS:
                raise InjectError(f"the injector serves at most {MAX_RUNS} runs at once (each may hold "
                                  "its share of connections and slots); wait for one to end")
            rec = RunRecord(run, workflow, time.time() + ttl, keys={n: (keys or {}).get(n, n) for n in names})
            for n in names:
                tok = PLACEHOLDER_PREFIX + pysecrets.token_urlsafe(24)
                rec.tokens[n] = tok
                self.tokens[tok] = (run, n)
            self.runs[run] = rec
            change = self._changed()
            tokens = dict(rec.tokens)
        self.save(change)
        return tokens

    def lookup(self, token: str) -> tuple[RunRecord, str] | None:
        with self.lock:
            change = self._prune()
            hit = self.tokens.get(token)
            found = (self.runs[hit[0]], hit[1]) if hit else None
        self.save(change)
        return found

    def refused(self, rec: RunRecord, entry: dict[str, Any]) -> None:
        """A request of REC's run refused (a forwarded one is recorded by `sending`)."""
        with self.lock:
            if len(rec.refused) < MAX_RECORDED:
                rec.refused.append(entry)

    def release(self, run: str) -> dict[str, Any] | None:
        """RUN's record, once its requests in flight have ended (up to RELEASE_WAIT: what
        went upstream is in it, and nothing goes after)."""
        with self.lock:
            rec = self._drop(run)
            deadline = time.monotonic() + RELEASE_WAIT
            while rec is not None and rec.upstreams and (left := deadline - time.monotonic()) > 0:
                self.ended.wait(left)
            record = rec.as_dict() if rec else None
            change = self._changed()
        self.save(change)
        return record


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
    # Runs ending together each release at once (review 31: the default queue of 5
    # refused 14 of 32; kooi.inject.call also waits for room in it).
    request_queue_size = 4 * MAX_RUNS

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
            # A session's person (kooi session, as root or the runner): secrets held per
            # person give that person's value, and none to a run without one.
            person = req.get("person")
            if person is not None and not isinstance(person, str):
                raise InjectError("person: not a person's name")
            try:
                keys = {n: value_key(self.cfg.secrets[n], person) for n in wf.secrets}
            except HostStateError as exc:
                raise InjectError(str(exc)) from None
            injected = [n for n in wf.secrets if self.cfg.secrets[n].mode == "inject"]
            tokens = self.registry.add(run, name, injected, ttl=wf.timeout + 600, keys=keys)
            env = {self.cfg.secrets[n].env: self.values[keys[n]].decode() for n in wf.secrets
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
