"""Secrets: the description's parser, the workflow checks, the role's filter, and the
injector's proxy in-process against a real HTTPS upstream on loopback (a certificate
from a CA made here): the credential header is always replaced, only the secret's
paths and methods pass, answers stream through, nothing is attributed to another run."""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kooi import inject, injectbody, injectcontrol, injectproxy, workflow
from kooi.hoststate import HostStateError
from kooi.hoststate import secrets as secrets_state

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "roles/kooi_defaults/filter_plugins"))
sys.path.insert(0, str(REPO / "tests/e2e"))
from kooi_secrets import AnsibleFilterError, kooi_secrets_description, kooi_secrets_values  # noqa: E402
from testca import make_ca  # noqa: E402

PRESETS = {"anthropic": {"mode": "inject", "env": "ANTHROPIC_API_KEY", "base_url_env": "ANTHROPIC_BASE_URL",
                         "upstream": "https://api.anthropic.com", "header": "x-api-key",
                         "paths": ["/v1/messages", "/v1/messages/count_tokens"], "methods": ["POST"],
                         "body": "anthropic-messages", "query": ["beta=true"]}}


def desc(**secrets: dict) -> secrets_state.SecretsConfig:
    return secrets_state.parse(json.dumps({"injector": {"port": 3129}, "secrets": secrets}))


def test_the_description_parses_and_refuses_bad_routes():
    cfg = desc(anthropic=PRESETS["anthropic"], token={"mode": "environment", "env": "TOKEN"})
    a = cfg.secrets["anthropic"]
    assert (a.upstream_host, a.upstream_port, a.name) == ("api.anthropic.com", 443, "anthropic")
    assert list(cfg.injected) == ["anthropic"]
    for bad, word in (({"mode": "inject", "env": "X", "upstream": "http://h", "paths": ["/"]}, "upstream"),
                      ({"mode": "magic", "env": "X"}, "mode"),
                      ({"mode": "environment", "env": "1X"}, "env"),
                      ({"mode": "inject", "env": "X", "upstream": "https://h", "paths": []}, "paths"),
                      ({"mode": "environment", "env": "X", "value": "v"}, "unknown keys")):
        with pytest.raises(HostStateError, match=word):
            desc(s=bad)
    with pytest.raises(HostStateError, match="not a secret name"):
        desc(**{"Bad": {"mode": "environment", "env": "X"}})


def test_a_secret_allows_only_its_methods_and_paths():
    a = desc(anthropic=PRESETS["anthropic"]).secrets["anthropic"]
    assert a.allows("POST", "/v1/messages") and a.allows("POST", "/v1/messages/count_tokens")
    for method, path in (("GET", "/v1/messages"), ("POST", "/v1/messagesX"), ("POST", "/v1/files"),
                         ("POST", "/v1/messages/../files"), ("POST", "/v1/messages/%2F..%2Ffiles"),
                         ("POST", "//v1/messages"), ("POST", "/v1/messages/%2e%2e/models"),
                         ("POST", "/v1/messages/.%2E/x"), ("POST", "/v1/messages/..;/x"), ("POST", "/v1/messages/./x"),
                         ("POST", "/v1/messages\\..\\x"), ("POST", "/v1/messages/%252e")):
        assert not a.allows(method, path), (method, path)


def test_workflows_naming_secrets_are_checked_against_the_store():
    store = desc(anthropic=PRESETS["anthropic"], token={"mode": "environment", "env": "TOKEN"})
    ok = workflow.secret_errors(["anthropic", "token"], "container", True, {}, "wf", store)
    assert ok == []
    assert "unknown secret 'nope'" in workflow.secret_errors(["nope"], "container", True, {}, "wf", store)[0]
    assert "no secrets store" in workflow.secret_errors(["anthropic"], "container", True, {}, "wf", None)[0]
    assert "set network: proxy" in workflow.secret_errors(["anthropic"], "container", False, {}, "wf", store)[0]
    assert "jails get no secrets" in workflow.secret_errors(["token"], "jail", False, {}, "wf", store)[0]
    assert "environment.ANTHROPIC_BASE_URL" in workflow.secret_errors(
        ["anthropic"], "container", True, {"ANTHROPIC_BASE_URL": "http://x"}, "wf", store)[0]
    assert workflow.secret_errors([], "jail", False, {}, "wf", None) == []


def test_the_roles_filter_builds_the_description_and_never_shows_a_value():
    value = "sk-ant-never-shown-0123456789"
    doc = kooi_secrets_description({"anthropic": {"value": value, "preset": "anthropic", "ca_file": "/ca.pem"}},
                                   PRESETS, {"port": 3129})
    assert value not in json.dumps(doc)
    assert doc["secrets"]["anthropic"]["ca_file"] == "/ca.pem"
    assert doc["secrets"]["anthropic"]["header"] == "x-api-key"
    for entry, word in (({"value": value, "preset": "nope"}, "preset"),
                        ({"value": value, "preset": "anthropic", "colour": "red"}, "unknown key"),
                        ({"value": "", "preset": "anthropic"}, "value"),
                        ({"value": "two\nlines", "preset": "anthropic"}, "value"),
                        ({"value": value, "mode": "inject", "env": "X", "upstream": "ftp://x", "paths": ["/"]},
                         "upstream"),
                        ({"value": value}, "env")):
        with pytest.raises(AnsibleFilterError, match=word) as exc:
            kooi_secrets_description({"s": entry}, PRESETS, {"port": 3129})
        assert value not in str(exc.value) and "two\nlines" not in str(exc.value)


def test_placeholders_belong_to_one_run_and_die_with_it():
    reg = injectcontrol.Registry()
    a = reg.add("run-a", "wf", ["anthropic"], ttl=60)["anthropic"]
    b = reg.add("run-b", "wf", ["anthropic"], ttl=60)["anthropic"]
    assert a != b and a.startswith(injectcontrol.PLACEHOLDER_PREFIX)
    hit = reg.lookup(a)
    assert hit is not None and hit[0].run == "run-a"
    with pytest.raises(inject.InjectError, match="registered already"):
        reg.add("run-a", "wf", [], ttl=60)
    assert reg.release("run-a")["run"] == "run-a"
    assert reg.lookup(a) is None and reg.lookup(b) is not None
    reg.add("run-c", "wf", ["anthropic"], ttl=-1)  # expired at once
    assert "run-c" not in reg.runs or reg.lookup("x") is None
    assert "run-c" not in reg.runs


# --- the proxy against a real HTTPS upstream --------------------------------------------


class Upstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[dict] = []

    def log_message(self, *args) -> None:
        pass

    # A request whose body says "hold" waits for this (a long answer of the model's).
    release = threading.Event()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        Upstream.seen.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                              "body": body})
        if b'"hold"' in body:
            Upstream.release.wait(30)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(3):
            piece = f"event: ping\ndata: {i}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    d = tmp_path_factory.mktemp("inject")

    make_ca(d, ["localhost"], days=1)
    up = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(d / "server.pem"), str(d / "server.key"))
    up.socket = ctx.wrap_socket(up.socket, server_side=True)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    cfg = desc(api={**PRESETS["anthropic"], "upstream": f"https://localhost:{up.server_address[1]}",
                    "ca_file": str(d / "ca.pem")},
               bearer={"mode": "inject", "env": "T", "upstream": f"https://localhost:{up.server_address[1]}",
                       "ca_file": str(d / "ca.pem"), "header": "authorization", "scheme": "Bearer",
                       "paths": ["/api/*"]},
               oauth={**PRESETS["anthropic"], "upstream": f"https://localhost:{up.server_address[1]}",
                      "ca_file": str(d / "ca.pem"), "env": "CLAUDE_CODE_OAUTH_TOKEN", "header": "authorization",
                      "scheme": "Bearer", "persons": ["alice", "bob"]})
    reg = injectcontrol.Registry()
    srv = injectproxy.ProxyServer(("127.0.0.1", 0), cfg, {"api": b"REAL-KEY", "bearer": b"REAL-TOKEN",
                                                          "oauth@alice": b"ALICE-TOKEN", "oauth@bob": b"BOB-TOKEN"},
                                  reg)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv, reg
    srv.shutdown()
    up.shutdown()


def _post(port: int, path: str, headers: dict[str, str], body: bytes = b"{}") -> tuple[int, bytes, dict]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("POST", path, body=body, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data, dict(r.getheaders())


def test_the_injector_replaces_every_credential_and_streams_the_answer(proxy):
    srv, reg = proxy
    port = srv.server_address[1]
    tok = reg.add("run-1", "wf", ["api", "bearer"], ttl=60)
    Upstream.seen.clear()
    status, data, headers = _post(port, "/v1/messages?beta=true",
                                  {"x-api-key": tok["api"], "Authorization": "Bearer my-own", "Cookie": "c=1",
                                   "anthropic-version": "2023-06-01", "Content-Type": "application/json"},
                                  b'{"stream": true}')
    assert status == 200 and data == b"".join(f"event: ping\ndata: {i}\n\n".encode() for i in range(3))
    assert headers.get("Transfer-Encoding") == "chunked"
    h = Upstream.seen[-1]["headers"]
    assert h["x-api-key"] == "REAL-KEY" and "authorization" not in h and "cookie" not in h
    assert h["anthropic-version"] == "2023-06-01" and Upstream.seen[-1]["body"] == b'{"stream": true}'
    assert Upstream.seen[-1]["path"] == "/v1/messages?beta=true"
    # The bearer secret: the placeholder as a bearer token, the real one as Authorization.
    status, _, _ = _post(port, "/api/x", {"Authorization": f"Bearer {tok['bearer']}", "x-api-key": "mine",
                                          "X-Custom": "kept"})
    h = Upstream.seen[-1]["headers"]
    assert status == 200 and h["authorization"] == "Bearer REAL-TOKEN" and "x-api-key" not in h
    assert h["x-custom"] == "kept"


def test_the_injector_refuses_what_the_route_does_not_allow(proxy):
    srv, reg = proxy
    port = srv.server_address[1]
    tok = reg.add("run-2", "wf", ["api"], ttl=60)["api"]
    other = reg.add("run-3", "wf", ["api"], ttl=60)["api"]
    n = len(Upstream.seen)
    assert _post(port, "/v1/files", {"x-api-key": tok})[0] == 403
    assert _post(port, "/v1/messages/../files", {"x-api-key": tok})[0] == 403
    assert _post(port, "/v1/messages", {"x-api-key": "sk-ant-my-own"})[0] == 401
    assert _post(port, "/v1/messages", {})[0] == 401
    assert len(Upstream.seen) == n  # nothing reached the upstream
    rec = reg.release("run-2")
    assert [(r["path"], r["status"]) for r in rec["refused"]] == [("/v1/files", 403), ("/v1/messages/../files", 403)]
    assert reg.release("run-3")["refused"] == []  # never another run's
    assert _post(port, "/v1/messages", {"x-api-key": tok})[0] == 401  # released: the placeholder is dead
    del other


def test_a_raw_request_cannot_smuggle_a_second_request(proxy):
    srv, reg = proxy
    port = srv.server_address[1]
    tok = reg.add("run-4", "wf", ["api"], ttl=60)["api"]
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {tok}\r\nTransfer-Encoding: chunked\r\n\r\n"
              "0\r\n\r\n".encode())
    time.sleep(0.2)
    answer = s.recv(4096).decode()
    s.close()
    assert answer.startswith("HTTP/1.1 411"), answer
    reg.release("run-4")


# --- issue 29, findings 4 and 5: one run cannot starve the others, and the route is the
# Messages API as the operator allowed it, not the API's server-side reach ----------------


def test_a_secret_path_is_exact_unless_it_ends_in_a_star():
    a = desc(anthropic=PRESETS["anthropic"]).secrets["anthropic"]
    assert a.allows("POST", "/v1/messages") and a.allows("POST", "/v1/messages/count_tokens")
    for path in ("/v1/messages/batches", "/v1/messages/batches/x/results", "/v1/messages/count_tokens/x"):
        assert not a.allows("POST", path), path
    b = desc(b={"mode": "inject", "env": "T", "upstream": "https://h", "paths": ["/api/*"]}).secrets["b"]
    assert b.allows("POST", "/api/x") and b.allows("POST", "/api/x/y") and not b.allows("POST", "/apix")


def test_one_run_trickling_bodies_does_not_starve_another(proxy, monkeypatch):
    """Finding 4: 64 global slots, taken before the body was read: one run that sends
    its bodies a byte at a time held them all, every other run got 429."""
    srv, reg = proxy
    port = srv.server_address[1]
    hog = reg.add("run-hog", "wf", ["api"], ttl=60)["api"]
    ok = reg.add("run-ok", "wf", ["api"], ttl=60)["api"]
    held = []
    for _ in range(injectproxy.SHARED_SLOTS + 8):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {hog}\r\n"
                  "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{".encode())
        held.append(s)
    time.sleep(0.5)
    try:
        status, data, _ = _post(port, "/v1/messages", {"x-api-key": ok, "Content-Type": "application/json"},
                                b'{"model": "m", "messages": []}')
        assert status == 200, data
    finally:
        for s in held:
            s.close()
    reg.release("run-hog")
    reg.release("run-ok")


def _server(proxy) -> injectproxy.ProxyServer:
    """A second injector of the fixture's secrets and registry (limits patched before)."""
    srv, reg = proxy
    other = injectproxy.ProxyServer(("127.0.0.1", 0), srv.cfg, srv.values, reg)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    return other


def _hold(port: int, tok: str) -> socket.socket:
    """A request whose answer the upstream holds back (until Upstream.release)."""
    body = b'{"model": "m", "hold": true}'
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {tok}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return s


def test_runs_holding_every_shared_slot_leave_each_run_its_own(proxy, monkeypatch):
    """Review 17: 16 runs of 16 slow requests took all 256 slots (every other run: 429).
    Now each live run has slots of its own that no other run's requests take."""
    monkeypatch.setattr(injectproxy, "SHARED_SLOTS", 8)
    _srv, reg = proxy
    srv = _server(proxy)
    port = srv.server_address[1]
    hogs = [reg.add(f"run-hog{i}", "wf", ["api"], ttl=60)["api"] for i in range(2)]
    ok = reg.add("run-fair", "wf", ["api"], ttl=60)["api"]
    Upstream.release.clear()
    held = [_hold(port, tok) for tok in hogs for _ in range(injectcontrol.MAX_PER_RUN)]
    try:
        deadline = time.time() + 10
        while time.time() < deadline and sum(b'"hold"' in r["body"] for r in Upstream.seen[-40:]) < 16:
            time.sleep(0.1)
        status, data, _ = _post(port, "/v1/messages", {"x-api-key": ok, "Content-Type": "application/json"},
                                b'{"model": "m", "messages": []}')
        assert status == 200, data
    finally:
        Upstream.release.set()
        for s in held:
            s.close()
        srv.shutdown()
        for r in ("run-hog0", "run-hog1", "run-fair"):
            reg.release(r)


def test_connections_past_the_injectors_bound_are_closed_at_once(proxy, monkeypatch):
    """Review 17: every connection got a thread and a descriptor, however many (a run may
    hold RUN_CONNECTIONS; the injector's descriptors and threads ran out first). Now the
    bound holds every live run's whole share, past it a connection is answered 503 and
    closed, and the registry takes no more runs than the bound was made for."""
    from kooi.egress import RUN_CONNECTIONS

    assert injectproxy.MAX_CONNECTIONS >= RUN_CONNECTIONS * injectcontrol.MAX_RUNS
    monkeypatch.setattr(injectproxy, "MAX_CONNECTIONS", 6)
    _srv, reg = proxy
    srv = _server(proxy)
    port = srv.server_address[1]
    idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(6)]
    try:
        time.sleep(0.3)
        extra = socket.create_connection(("127.0.0.1", port), timeout=3)
        answer = extra.recv(4096)
        extra.close()
        assert answer.startswith(b"HTTP/1.1 503"), answer
    finally:
        for s in idle:
            s.close()
    time.sleep(0.3)
    tok = reg.add("run-after", "wf", ["api"], ttl=60)["api"]
    assert _post(port, "/v1/messages", {"x-api-key": tok}, b'{"model": "m"}')[0] == 200
    srv.shutdown()
    reg.release("run-after")
    monkeypatch.setattr(injectcontrol, "MAX_RUNS", 2)
    small = injectcontrol.Registry()
    small.add("a", "wf", ["api"], ttl=60)
    small.add("b", "wf", ["api"], ttl=60)
    with pytest.raises(inject.InjectError, match="runs at once"):
        small.add("c", "wf", ["api"], ttl=60)


def test_the_query_string_is_the_routes_own(proxy):
    """Review 17: the injector forwarded whatever query string a request carried. Now
    only the route's `query` pairs pass (the preset's: beta=true, as Claude Code sends)."""
    srv, reg = proxy
    port = srv.server_address[1]
    tok = reg.add("run-q", "wf", ["api", "bearer"], ttl=60)
    n = len(Upstream.seen)
    for q in ("?beta=true&x=1", "?x=1", "?beta=false", "?beta=true&beta=true", "?beta", "?Beta=true",
              "?beta=true#x", "?beta=%74rue"):
        assert _post(port, "/v1/messages" + q, {"x-api-key": tok["api"]}, b'{"model": "m"}')[0] == 403, q
    assert _post(port, "/api/x?page=2", {"Authorization": f"Bearer {tok['bearer']}"})[0] == 403
    assert len(Upstream.seen) == n
    assert _post(port, "/v1/messages?beta=true", {"x-api-key": tok["api"]}, b'{"model": "m"}')[0] == 200
    assert Upstream.seen[-1]["path"] == "/v1/messages?beta=true"
    refused = reg.release("run-q")["refused"]
    assert len(refused) == 9 and all(r["status"] == 403 for r in refused)


def test_a_body_past_its_deadline_is_refused(proxy, monkeypatch):
    srv, reg = proxy
    monkeypatch.setattr(injectproxy, "BODY_DEADLINE", 1.0)
    tok = reg.add("run-slow", "wf", ["api"], ttl=60)["api"]
    s = socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10)
    s.sendall(f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {tok}\r\n"
              "Content-Length: 100\r\n\r\n{".encode())
    for _ in range(4):
        time.sleep(0.4)
        try:
            s.sendall(b" ")
        except OSError:
            break
    answer = s.recv(4096).decode()
    s.close()
    assert answer.startswith("HTTP/1.1 408"), answer
    rec = reg.release("run-slow")
    assert [r["status"] for r in rec["refused"]] == [408], rec


@pytest.mark.parametrize("body,headers,status,why", [
    (b'{"model": "m", "mcp_servers": [{"type": "url", "url": "https://evil.example", "name": "x"}]}', {}, 403,
     "mcp_servers"),
    (b'{"model": "m", "tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}', {}, 403, "web_fetch"),
    (b'{"model": "m", "tools": [{"type": "web_search_20250305", "name": "web_search"}]}', {}, 403, "web_search"),
    (b'{"model": "m", "tools": [{"type": "some_future_server_tool_20270101", "name": "x"}]}', {}, 403,
     "some_future_server_tool"),
    (b'{"model": "m", "mcp_servers": [], "mcp_servers": [{"type": "url", "url": "https://e"}]}', {}, 400,
     "twice"),
    (b'{"model": "m", "tools": [{"type": "custom", "type": "web_fetch_20250910", "name": "x"}]}', {}, 400, "twice"),
    (b'\x1f\x8b\x08\x00', {"Content-Encoding": "gzip"}, 415, "Content-Encoding"),
    (b'not json', {}, 400, "JSON"),
    (b'[1, 2]', {}, 400, "JSON object"),
    (b'{"model": NaN}', {}, 400, "JSON"),
    # Review 14: content the API fetches from a URL itself reaches a host the request names.
    (b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", '
     b'"url": "https://evil.example/?d=secret"}}]}]}', {}, 403, "URL source"),
    (b'{"model": "m", "system": [{"type": "text", "text": "x"}], "messages": [{"role": "user", "content": [{"type": '
     b'"tool_result", "tool_use_id": "t", "content": [{"type": "document", "source": {"type": "url", "url": '
     b'"https://evil.example/"}}]}]}]}', {}, 403, "URL source"),
])
def test_the_messages_body_is_checked_against_what_the_operator_allowed(proxy, body, headers, status, why):
    """Finding 5: the injector forwarded any body, with the API's server-side tools and
    MCP connector fetching from and sending to hosts the workload names."""
    srv, reg = proxy
    tok = reg.add("run-body", "wf", ["api"], ttl=60)["api"]
    n = len(Upstream.seen)
    got, data, _ = _post(srv.server_address[1], "/v1/messages",
                         {"x-api-key": tok, "Content-Type": "application/json", **headers}, body)
    rec = reg.release("run-body")
    assert got == status and why in data.decode(), data
    assert len(Upstream.seen) == n
    assert rec["refused"][0]["status"] == status


def test_client_tools_and_listed_server_tools_pass(proxy):
    srv, reg = proxy
    tok = reg.add("run-tools", "wf", ["api"], ttl=60)["api"]
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                       "tools": [{"name": "Bash", "input_schema": {"type": "object"}},
                                 {"type": "custom", "name": "Read", "input_schema": {"type": "object"}},
                                 {"type": "bash_20250124", "name": "bash"},
                                 {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}]}).encode()
    got, data, _ = _post(srv.server_address[1], "/v1/messages", {"x-api-key": tok}, body)
    assert got == 200, data
    assert Upstream.seen[-1]["body"] == body  # forwarded as sent, byte for byte
    reg.release("run-tools")
    sdef = srv.cfg.secrets["api"]
    allowed = dataclasses.replace(sdef, server_tools=("web_search",))
    assert injectbody.body_refusal(allowed, b'{"tools": [{"type": "web_search_20250305", "name": "w"}]}') is None
    assert injectbody.body_refusal(allowed, b'{"tools": [{"type": "web_fetch_20250910", "name": "w"}]}') is not None


def test_a_secret_held_per_person_gives_each_session_its_persons_value_and_nothing_to_others(proxy, tmp_path):
    """A person's own subscription token (`claude setup-token`, CLAUDE_CODE_OAUTH_TOKEN):
    the injector reads the workflow, and a session gets its person's value; another
    person, or a run that belongs to nobody, gets none."""
    srv, reg = proxy
    wfdir = tmp_path / "workflows"
    wfdir.mkdir(mode=0o755)
    (wfdir / "claude.yml").write_text("description: d\nsession: {shell: [bash]}\nnetwork: proxy\n"
                                      "secrets: [oauth]\n")
    control = injectcontrol.ControlServer(str(tmp_path / "control.sock"), 0, srv.cfg, srv.values, reg, wfdir)
    try:
        tokens = {who: control.dispatch({"op": "register", "run": f"s-{who}", "workflow": "claude",
                                         "person": who})["placeholders"]["oauth"] for who in ("alice", "bob")}
        with pytest.raises(inject.InjectError, match="no value for person 'carol'"):
            control.dispatch({"op": "register", "run": "s-carol", "workflow": "claude", "person": "carol"})
        with pytest.raises(inject.InjectError, match="one value per person"):
            control.dispatch({"op": "register", "run": "r-1", "workflow": "claude"})
        assert "s-carol" not in reg.runs and "r-1" not in reg.runs
        body = b'{"model": "m", "messages": []}'
        for who, want in (("alice", "ALICE-TOKEN"), ("bob", "BOB-TOKEN")):
            got, data, _ = _post(srv.server_address[1], "/v1/messages?beta=true",
                                 {"Authorization": f"Bearer {tokens[who]}", "anthropic-beta": "oauth-2025-04-20"}, body)
            assert got == 200, data
            assert Upstream.seen[-1]["headers"]["authorization"] == f"Bearer {want}"
            assert Upstream.seen[-1]["headers"]["anthropic-beta"] == "oauth-2025-04-20"
    finally:
        reg.release("s-alice")
        reg.release("s-bob")
        control.server_close()
    # Where they are held, and who may name them.
    assert secrets_state.value_keys(srv.cfg.secrets["oauth"]) == ["oauth@alice", "oauth@bob"]
    assert "only a session workflow" in workflow.secret_errors(["oauth"], "container", True, {}, "wf", srv.cfg)[0]
    assert workflow.secret_errors(["oauth"], "container", True, {}, "wf", srv.cfg, session=True) == []
    for bad in (["Alice"], ["alice\n"], ["alice", "alice"]):  # review 14: `$` took a trailing newline
        with pytest.raises(HostStateError, match="each person once"):
            desc(s={**PRESETS["anthropic"], "persons": bad})


def test_the_roles_filter_takes_one_value_per_person_and_the_injector_reads_them(tmp_path):
    tokens = {"alice": "sk-ant-oat01-alice-never-shown", "bob": "sk-ant-oat01-bob-never-shown"}
    presets = {**PRESETS, "anthropic-oauth": {**PRESETS["anthropic"], "env": "CLAUDE_CODE_OAUTH_TOKEN",
                                              "header": "authorization", "scheme": "Bearer"}}
    secrets = {"claude": {"persons": tokens, "preset": "anthropic-oauth"}, "api": {"value": "k1", "preset": "anthropic"}}
    doc = kooi_secrets_description(secrets, presets, {"port": 3129})
    assert doc["secrets"]["claude"]["persons"] == ["alice", "bob"] and "persons" not in doc["secrets"]["api"]
    assert not any(t in json.dumps(doc) for t in tokens.values())
    files = kooi_secrets_values(secrets)
    assert [f["key"] for f in files] == ["api", "claude@alice", "claude@bob"]
    for entry, word in (({"persons": tokens, "value": "v", "preset": "anthropic"}, "either value"),
                        ({"preset": "anthropic"}, "either value"),
                        ({"persons": {"Alice": "v"}, "preset": "anthropic"}, "person's name"),
                        ({"persons": {"alice": "two\nlines"}, "preset": "anthropic"}, "persons.alice"),
                        ({"persons": [], "preset": "anthropic"}, "persons")):
        with pytest.raises(AnsibleFilterError, match=word) as exc:
            kooi_secrets_description({"s": entry}, presets, {"port": 3129})
        assert "two\nlines" not in str(exc.value)
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    cfg = secrets_state.parse(json.dumps({**doc, "store": str(store)}))
    for f in files:
        (store / f["key"]).write_text(f["value"] + "\n")
        (store / f["key"]).chmod(0o600)
    assert inject.read_values(cfg) == {f["key"]: f["value"].encode() for f in files}
    (store / "claude@bob").unlink()
    with pytest.raises(inject.InjectError, match="claude@bob"):
        inject.read_values(cfg)


def test_a_dead_runs_placeholders_die_when_kooi_finishes_it(proxy, tmp_path, monkeypatch):
    """Review 14: a session whose supervisor was killed, then stopped, kept its live
    placeholder (forwarding a person's token) until the workflow's timeout."""
    from kooi.run import deadrun

    srv, reg = proxy
    wfdir = tmp_path / "workflows"
    wfdir.mkdir(mode=0o755)
    (wfdir / "claude.yml").write_text("description: d\nsession: {shell: [bash]}\nnetwork: proxy\nsecrets: [oauth]\n")
    sock = tmp_path / "control.sock"
    cfg = dataclasses.replace(srv.cfg, injector=dataclasses.replace(srv.cfg.injector, control=str(sock)))
    control = injectcontrol.ControlServer(str(sock), os.getgid(), cfg, srv.values, reg, wfdir)
    threading.Thread(target=control.serve_forever, daemon=True).start()
    try:
        token = inject.call(cfg, {"op": "register", "run": "s-dead", "workflow": "claude",
                                  "person": "alice"})["placeholders"]["oauth"]
        assert reg.lookup(token) is not None
        monkeypatch.setattr(secrets_state, "load", lambda *a: cfg)
        record = deadrun._release_secrets(tmp_path, "s-dead")
        assert record is not None and record["injected"]["oauth"]["env"] == "CLAUDE_CODE_OAUTH_TOKEN", record
        assert reg.lookup(token) is None and deadrun._release_secrets(tmp_path, "s-dead") is None
    finally:
        control.shutdown()
        control.server_close()


# --- review 25: the injector's memory, its parser's edges, and a restart -------------------


def test_bodies_that_cost_memory_are_bounded_per_run_and_in_all(proxy, monkeypatch):
    """Review 25 (F1): 48 bodies of `[{},{},...]` took the injector to 22 GB before the
    host's OOM killer took it. A body's bytes and what parsing it makes are taken from
    the run's share and the whole first: past the run's, 429 (recorded), and another
    run's request still goes through. A body nested past the parser's depth is refused
    and recorded (F4: the connection was dropped, no record)."""
    monkeypatch.setattr(injectproxy, "RUN_BODY_BYTES", 1 << 20)
    srv, reg = proxy
    port = srv.server_address[1]
    hog = reg.add("run-mem", "wf", ["api"], ttl=60)["api"]
    ok = reg.add("run-fine", "wf", ["api"], ttl=60)["api"]
    h = {"x-api-key": hog, "Content-Type": "application/json"}
    status, data, _ = _post(port, "/v1/messages", h, b"[" + b"{}," * 60000 + b"{}]")
    assert status == 429 and b"MiB" in data, (status, data)
    status, data, _ = _post(port, "/v1/messages", h, b"[" * 5000 + b"]" * 5000)
    assert status == 400 and b"nests deeper" in data, (status, data)
    status, data, _ = _post(port, "/v1/messages", {"x-api-key": ok, "Content-Type": "application/json"},
                            b'{"model": "m", "messages": []}')
    assert status == 200, data
    refused = reg.release("run-mem")["refused"]
    assert [r["status"] for r in refused] == [429, 400], refused
    end = time.monotonic() + 5  # given back once the answer is out (the handler's end)
    while srv.body_bytes and time.monotonic() < end:
        time.sleep(0.01)
    assert srv.body_bytes == 0, srv.body_bytes  # every byte taken was given back
    reg.release("run-fine")


@pytest.mark.parametrize("raw,why", [
    ("Content-Encoding: identity\r\nContent-Encoding: br\r\n", b"twice"),
    ("content-encoding: identity\r\nContent-Encoding: gzip\r\n", b"twice"),
    ("X-Foo: b\r\n\tContent-Encoding: gzip\r\n", b"line break"),
])
def test_headers_the_upstream_could_read_otherwise_are_refused(proxy, raw, why):
    """Review 25 (F2, F3): the check read the first Content-Encoding, the upstream got the
    last (or both); a folded line went upstream with its line break."""
    srv, reg = proxy
    tok = reg.add("run-hdr", "wf", ["api"], ttl=60)["api"]
    s = socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10)
    s.sendall(f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {tok}\r\n{raw}Content-Length: 2\r\n"
              "Connection: close\r\n\r\n{}".encode())
    answer = b""
    while chunk := s.recv(65536):
        answer += chunk
    s.close()
    assert answer.startswith(b"HTTP/1.1 400") and why in answer, answer
    assert reg.release("run-hdr")["refused"][0]["status"] == 400


def test_live_runs_survive_a_restart_of_the_injector(tmp_path):
    """Review 25 (F1): the injector restarted after the OOM kill had forgotten every live
    run; their requests were refused (401) for the rest of their lifetime."""
    path = tmp_path / "runs.json"
    reg = injectcontrol.Registry(path)
    tok = reg.add("run-live", "wf", ["api"], ttl=600)["api"]
    reg.add("run-gone", "wf", ["api"], ttl=600)
    reg.release("run-gone")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    again = injectcontrol.Registry(path)
    assert again.load() == 1 and again.lookup(tok)[1] == "api", again.runs
    path.write_text("{not json")
    assert injectcontrol.Registry(path).load() == 0


def test_a_release_that_failed_is_settled_by_the_next_run_and_gc_not_by_the_ttl(proxy, tmp_path):
    """Review 27 (F3): a run whose release failed while the injector was down kept a
    working placeholder after the injector came back (its registry read back from disk)
    until the time to live ran out: a placeholder the workload had left in the project
    worked for the next run's workload. The release is owed from before the run
    registers; a run whose process is gone is released by the next run or `kooi gc`, a
    live run never."""
    from kooi.run import releases

    srv, _ = proxy
    wfdir = tmp_path / "workflows"
    wfdir.mkdir(mode=0o755)
    (wfdir / "agent.yml").write_text("description: d\ncommand: [\"true\"]\nnetwork: proxy\nsecrets: [api]\n")
    sock, runs = tmp_path / "control.sock", tmp_path / "runs"
    runs.mkdir()
    cfg = dataclasses.replace(srv.cfg, injector=dataclasses.replace(srv.cfg.injector, control=str(sock)))

    def injector(reg: injectcontrol.Registry) -> injectcontrol.ControlServer:
        sock.unlink(missing_ok=True)
        control = injectcontrol.ControlServer(str(sock), os.getgid(), cfg, srv.values, reg, wfdir)
        threading.Thread(target=control.serve_forever, daemon=True).start()
        return control

    control = injector(injectcontrol.Registry(tmp_path / "registry.json"))
    ended, live = releases.Owed(runs, "run-ended"), releases.Owed(runs, "run-live")
    token = inject.call(cfg, {"op": "register", "run": "run-ended", "workflow": "agent"})["placeholders"]["api"]
    other = inject.call(cfg, {"op": "register", "run": "run-live", "workflow": "agent"})["placeholders"]["api"]
    control.shutdown()
    control.server_close()  # the injector is down when run-ended ends
    with pytest.raises(inject.InjectError):
        releases.release(runs, cfg, "run-ended")
    ended.close()
    assert releases.settle(runs, cfg)[0].startswith("warning: the placeholders of run run-ended are still owed")
    again = injectcontrol.Registry(tmp_path / "registry.json")
    assert again.load() == 2 and again.lookup(token) is not None  # back from its registry
    control = injector(again)
    try:
        said = releases.settle(runs, cfg)
        assert said == ["placeholders of run run-ended (its own release had failed; it forwarded 0 request(s), "
                        "refused 0)"], said
        assert again.lookup(token) is None and not ended.path.exists()
        assert again.lookup(other) is not None and live.path.exists()  # a live run's stay
        assert releases.release(runs, cfg, "run-live")["run"] == "run-live"
        live.paid()
        assert releases.settle(runs, cfg) == [] and not list((runs / releases.SUBDIR).iterdir())
    finally:
        control.shutdown()
        control.server_close()


@pytest.mark.skipif(os.geteuid() != 0, reason="root under the unit's capability bound")
def test_the_registry_directory_is_made_under_the_units_capability_bound(tmp_path):
    """Review 26's fix, first under systemd (molecule, rootless): root bounded to
    CAP_SETUID, CAP_SETGID and CAP_CHOWN (kooi-inject.service) chowned the new
    directory, then chmodded it: EPERM, and the injector died at every start."""
    import pwd

    user = next(u for u in ("kooi-inject", "nobody") if _has_user(u))
    code = ("import sys; from pathlib import Path; from kooi.inject import registry_dir; "
            f"print(registry_dir(Path({str(tmp_path)!r}), {user!r}))")
    for _ in range(2):  # made, then kept
        r = subprocess.run(["setpriv", "--bounding-set=-all,+setuid,+setgid,+chown", sys.executable, "-c", code],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO / "shim")})
        assert r.returncode == 0, r.stderr
    st = (tmp_path / "registry").stat()
    assert st.st_uid == pwd.getpwnam(user).pw_uid and st.st_mode & 0o777 == 0o700


def _has_user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def test_a_requests_head_is_bounded_and_a_bodys_decoded_size_is_charged(proxy, monkeypatch):
    """Review 27: headers were not bounded (100 lines of 64 KiB a connection: 6 GB from
    256 connections, no placeholder needed; the OOM killer took the injector), and a
    body's charge missed its decoded size (one character past the BMP made a 32 MiB
    ASCII body a 128 MiB string, parsed into another)."""
    srv, reg = proxy
    port = srv.server_address[1]
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"x-pad-%02d: %s\r\n" % (i, b"a" * 1000) for i in range(20)))
    answer = s.recv(4096)
    s.close()
    assert answer.startswith(b"HTTP/1.1 431"), answer
    monkeypatch.setattr(injectproxy, "RUN_BODY_BYTES", 6 << 20)
    tok = reg.add("run-wide", "wf", ["api"], ttl=60)["api"]
    h = {"x-api-key": tok, "Content-Type": "application/json"}
    text = "x" * (1 << 20)
    status, data, _ = _post(port, "/v1/messages", h, json.dumps({"model": "m", "a": text}).encode())
    assert status == 200, data  # about 3 MiB: the body and its one-byte-wide text, twice
    status, data, _ = _post(port, "/v1/messages", h, json.dumps({"model": "m", "a": text + "\U0001F600"},
                                                                 ensure_ascii=False).encode())
    assert status == 429 and b"parsing this body" in data, (status, data)
    status, data, _ = _post(port, "/v1/messages", h, json.dumps({"model": "m", "a": text + "\U0001F600"}).encode())
    assert status == 429, (status, data)  # the same character as a \\ud83d\\ude00 escape
    reg.release("run-wide")


# --- review 28: bytes charged as they arrive, a run's own share, a bounded access log ------


def test_runs_holding_the_shared_body_memory_leave_each_run_its_own(proxy, monkeypatch):
    """Review 28 (F1): three runs declared 32 MiB bodies and sent one byte: the declared
    lengths were charged (and allocated) before a byte arrived, took the injector's whole
    budget, and a fourth run's 27-byte request waited a minute for a 503. Bytes are
    charged as they arrive, and each run's first RUN_RESERVED_BYTES are its own: runs
    that fill the shared memory with real bytes leave another run's request alone."""
    monkeypatch.setattr(injectproxy, "RUN_BODY_BYTES", 4 << 20)
    monkeypatch.setattr(injectproxy, "BODY_BYTES", 4 << 20)
    monkeypatch.setattr(injectproxy, "RUN_RESERVED_BYTES", 1 << 20, raising=False)
    monkeypatch.setattr(injectproxy, "BODY_DEADLINE", 4.0)
    _srv, reg = proxy
    srv = _server(proxy)
    port = srv.server_address[1]
    hogs = [reg.add(f"run-hold-{i}", "wf", ["api"], ttl=60)["api"] for i in range(3)]
    ok = reg.add("run-small", "wf", ["api"], ttl=60)["api"]
    held = []
    try:
        for i, tok in enumerate(hogs):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            sent = 1 if i == 0 else (3 << 20)  # one trickles, two send 3 MiB and stop
            s.sendall(f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {tok}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {4 << 20}\r\n\r\n".encode() + b" " * sent)
            held.append(s)
        time.sleep(0.5)
        t0 = time.monotonic()
        status, data, _ = _post(port, "/v1/messages", {"x-api-key": ok, "Content-Type": "application/json"},
                                b'{"model": "m", "messages": []}')
        assert status == 200 and time.monotonic() - t0 < 2, (status, data, time.monotonic() - t0)
        assert srv.body_bytes < (7 << 20), srv.body_bytes  # what arrived, not what was declared
    finally:
        for s in held:
            s.close()
        for r in [*(f"run-hold-{i}" for i in range(3)), "run-small"]:
            reg.release(r)
        srv.shutdown()
        srv.server_close()


def test_one_run_cannot_fill_the_access_log(proxy, monkeypatch, tmp_path):
    """Review 28 (F3): one run's refused requests wrote about 1 MB a second into the
    injector's access log (rotated daily). Past LOG_PER_RUN entries a run's requests are
    counted in its record, not logged; requests of no live run are logged at a bounded
    rate."""
    monkeypatch.setattr(injectproxy, "LOG_PER_RUN", 5, raising=False)
    monkeypatch.setattr(injectproxy, "LOG_UNKNOWN_BURST", 3, raising=False)
    _srv, reg = proxy
    srv = _server(proxy)
    srv.log_file = open(tmp_path / "access.log", "a", buffering=1)
    port = srv.server_address[1]
    tok = reg.add("run-loud", "wf", ["api"], ttl=60)["api"]
    try:
        for _ in range(12):
            assert _post(port, "/v1/nope", {"x-api-key": tok})[0] == 403
            assert _post(port, "/v1/messages", {"x-api-key": "kooi-placeholder-unknown"})[0] == 401
        lines = [json.loads(x) for x in (tmp_path / "access.log").read_text().splitlines()]
        loud = [e for e in lines if e["run"] == "run-loud"]
        assert len(loud) == 5 and "not logged" in loud[-1]["note"], lines
        assert 3 <= len([e for e in lines if e["run"] == "-"]) <= 4, lines
        assert reg.release("run-loud")["not_logged"] == 7
    finally:
        srv.log_file.close()
        srv.shutdown()
        srv.server_close()


def test_a_release_ends_the_runs_requests_in_flight(proxy):
    """Review 29 (F1, F3): a request whose run was released while its body came in kept
    its memory (a runner cycling register, 16 MiB, release took the injector past 4
    GiB with no live run) and was forwarded with the real key after the release, in no
    record. A release now ends the run's requests in flight and gives their memory back."""
    srv, reg = proxy
    port = srv.server_address[1]
    tok = reg.add("run-cut", "wf", ["api"], ttl=60)["api"]
    body = b'{"model": "m", "messages": []}'.ljust(8 << 20)
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {tok}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:4 << 20])
    end = time.monotonic() + 5
    while srv.body_bytes < (4 << 20) and time.monotonic() < end:
        time.sleep(0.01)
    assert srv.body_bytes >= (4 << 20), srv.body_bytes
    assert reg.release("run-cut")["forwarded"] == 0
    end = time.monotonic() + 3
    while srv.body_bytes and time.monotonic() < end:
        time.sleep(0.01)
    assert srv.body_bytes == 0 and srv.shared_bytes == 0, (srv.body_bytes, srv.shared_bytes)  # given back at once
    s.settimeout(5)
    try:
        s.sendall(body[4 << 20:])
        answer = s.recv(65536)
    except OSError:
        answer = b""
    assert not answer.startswith(b"HTTP/1.1 200"), answer[:200]  # never forwarded after the release
    s.close()


def test_the_access_log_is_bounded_in_size(proxy, monkeypatch, tmp_path):
    """Review 29 (F4): registering run after run, each with its 2000 entries, the runner
    wrote 1.4 MiB a second into the access log. Past LOG_MAX_BYTES the injector moves
    it to access.log.prev and starts a new one: two files at most."""
    monkeypatch.setattr(injectproxy, "LOG_MAX_BYTES", 4000, raising=False)
    _srv, reg = proxy
    srv = _server(proxy)
    log = tmp_path / "access.log"
    srv.log_path = str(log)
    srv.log_file = open(log, "a", buffering=1)
    port = srv.server_address[1]
    try:
        for i in range(6):
            tok = reg.add(f"run-fill-{i}", "wf", ["api"], ttl=60)["api"]
            for _ in range(5):
                assert _post(port, "/v1/" + "A" * 300, {"x-api-key": tok})[0] == 403
            reg.release(f"run-fill-{i}")
        assert log.stat().st_size <= 4000 + 1000 and (tmp_path / "access.log.prev").stat().st_size <= 5000
        assert sorted(p.name for p in tmp_path.iterdir()) == ["access.log", "access.log.prev"]
    finally:
        srv.log_file.close()
        srv.shutdown()
        srv.server_close()


def _certdir(proxy) -> Path:
    """Where the fixture's test CA and server certificate are."""
    return Path(proxy[0].cfg.secrets["api"].ca_file).parent


def _injector_to(proxy, port: int, tmp_path: Path) -> tuple[injectproxy.ProxyServer, Path]:
    """An injector of the fixture's registry whose secret `api` goes to the test upstream
    on PORT (the fixture's certificate), logging to TMP_PATH/access.log."""
    cfg = desc(api={**PRESETS["anthropic"], "upstream": f"https://localhost:{port}",
                    "ca_file": str(_certdir(proxy) / "ca.pem")})
    srv = injectproxy.ProxyServer(("127.0.0.1", 0), cfg, {"api": b"REAL-KEY"}, proxy[1])
    log = tmp_path / "access.log"
    srv.log_file = open(log, "a", buffering=1)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, log


def _server_tls(certdir: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(certdir / "server.pem"), str(certdir / "server.key"))
    return ctx


def _slow_tls_upstream(certdir: Path) -> tuple[int, threading.Event, threading.Event, list[bytes]]:
    """An upstream that takes the TCP connection at once and starts TLS only when GO is
    set: what it then reads of the request is in SEEN (empty: nothing came)."""
    lst = socket.create_server(("127.0.0.1", 0))
    accepted, go, seen = threading.Event(), threading.Event(), []
    ctx = _server_tls(certdir)

    def serve() -> None:
        conn, _ = lst.accept()
        accepted.set()
        go.wait(20)
        data = b""
        try:
            conn.settimeout(5)
            tls = ctx.wrap_socket(conn, server_side=True)
            while b"\r\n\r\n" not in data:
                piece = tls.recv(65536)
                if not piece:
                    break
                data += piece
            if data:
                tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        except OSError:
            pass
        seen.append(data)
        conn.close()
        lst.close()

    threading.Thread(target=serve, daemon=True).start()
    return lst.getsockname()[1], accepted, go, seen


def test_a_release_during_the_upstream_connection_sends_no_key_and_records_what_went(proxy, tmp_path):
    """Review 30 (F1): the released check came before the upstream connection; a release
    while it connected (TCP, TLS) still sent the real key afterwards, and a request in
    flight at the release was in neither the returned record nor the access log. Now
    the key goes out only while the run is live, a release ends the upstream connections
    of its requests, and what went is in the record and the log."""
    _srv, reg = proxy
    port, accepted, go, seen = _slow_tls_upstream(_certdir(proxy))
    srv, log = _injector_to(proxy, port, tmp_path)
    try:
        # 1. Released while the injector waits for the upstream's TLS: the key never goes.
        tok = reg.add("run-tls", "wf", ["api"], ttl=60)["api"]
        answers: list[int] = []

        def ask() -> None:
            try:
                answers.append(_post(srv.server_address[1], "/v1/messages", {"x-api-key": tok})[0])
            except OSError:
                answers.append(0)  # the release ended the connection

        t = threading.Thread(target=ask, daemon=True)
        t.start()
        assert accepted.wait(10)
        t0 = time.monotonic()
        record = reg.release("run-tls")
        assert time.monotonic() - t0 < 8
        go.set()
        t.join(15)
        end = time.monotonic() + 10
        while not seen and time.monotonic() < end:
            time.sleep(0.05)
        assert seen and b"REAL-KEY" not in seen[0], seen  # old code: the request went with the key
        assert answers and answers[0] != 200, answers
        assert record is not None and record["forwarded"] == 0
        # 2. Released while the upstream holds its answer: the request went with the key,
        # so the record and the access log have it.
        Upstream.release.clear()
        main = _server(proxy)
        main.log_file = srv.log_file
        tok = reg.add("run-held", "wf", ["api"], ttl=60)["api"]
        before = len(Upstream.seen)
        s = _hold(main.server_address[1], tok)
        end = time.monotonic() + 10
        while len(Upstream.seen) == before and time.monotonic() < end:
            time.sleep(0.02)
        record = reg.release("run-held")
        Upstream.release.set()
        assert record["forwarded"] == 1, record  # old code: 0, the request in no record
        assert record["requests"][0]["path"] == "/v1/messages", record
        s.close()
        end = time.monotonic() + 10
        while "run-held" not in log.read_text() and time.monotonic() < end:
            time.sleep(0.05)
        lines = [json.loads(x) for x in log.read_text().splitlines()]
        assert any(e["run"] == "run-held" and e["verdict"] == "forwarded" for e in lines), lines
        main.shutdown()
        main.server_close()
    finally:
        Upstream.release.set()
        go.set()
        srv.shutdown()
        srv.server_close()
        srv.log_file.close()


def test_a_client_gone_during_the_answer_still_leaves_its_log_line(proxy, tmp_path):
    """Review 30 (F1): the access log line was written after the answer; a client that
    went away while it streamed left no line although the key had gone upstream."""
    _srv, reg = proxy
    srv = _server(proxy)
    log = tmp_path / "access.log"
    srv.log_file = open(log, "a", buffering=1)
    Upstream.release.clear()
    try:
        tok = reg.add("run-gone", "wf", ["api"], ttl=60)["api"]
        before = len(Upstream.seen)
        s = _hold(srv.server_address[1], tok)
        end = time.monotonic() + 10
        while len(Upstream.seen) == before and time.monotonic() < end:
            time.sleep(0.02)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # a reset: the injector's writes fail
        Upstream.release.set()
        end = time.monotonic() + 10
        while "run-gone" not in log.read_text() and time.monotonic() < end:
            time.sleep(0.05)
        lines = [json.loads(x) for x in log.read_text().splitlines()]
        assert [e["verdict"] for e in lines if e["run"] == "run-gone"] == ["forwarded"], lines
        assert reg.release("run-gone")["forwarded"] == 1
    finally:
        Upstream.release.set()
        srv.shutdown()
        srv.server_close()
        srv.log_file.close()


def test_the_registry_keeps_no_records_on_disk_and_writes_outside_its_lock(tmp_path, monkeypatch):
    """Review 30 (F4): runs.json held every run's full record (54 MB with 63 runs) and was
    rewritten under the registry's lock at each registration and release: every request
    of every run waited 0.5 to 0.8 s. Now it holds what a restart needs (placeholders,
    expiry, counts), written outside the lock."""
    path = tmp_path / "runs.json"
    reg = injectcontrol.Registry(path)
    tok = reg.add("run-1", "wf", ["api"], ttl=60)["api"]
    rec = reg.runs["run-1"]
    for _i in range(200):
        reg.refused(rec, {"time": 1.0, "method": "POST", "path": "/v1/" + "x" * 500, "status": 403,
                          "reason": "r" * 1000})
    reg.add("run-2", "wf", ["api"], ttl=60)
    assert path.stat().st_size < 4096, path.stat().st_size  # old code: ~300 KB
    again = injectcontrol.Registry(path)
    assert again.load() == 2 and again.lookup(tok)[0].run == "run-1"
    # A save that hangs (a slow disk) holds up no lookup.
    gate = threading.Event()
    real = injectcontrol.Registry._write

    def slow(self, doc):
        gate.wait(10)
        real(self, doc)

    monkeypatch.setattr(injectcontrol.Registry, "_write", slow)
    t = threading.Thread(target=reg.add, args=("run-3", "wf", ["api"], 60), daemon=True)
    t.start()
    time.sleep(0.2)
    got: list = []
    looker = threading.Thread(target=lambda: got.append(reg.lookup(tok)), daemon=True)
    looker.start()
    looker.join(3)
    gate.set()
    t.join(10)
    assert got and got[0][0].run == "run-1"


def _cut_upstream(certdir: Path, answer: bytes) -> int:
    """An upstream that reads one request, sends ANSWER and closes the connection."""
    lst = socket.create_server(("127.0.0.1", 0))
    ctx = _server_tls(certdir)

    def serve() -> None:
        conn, _ = lst.accept()
        try:
            tls = ctx.wrap_socket(conn, server_side=True)
            data = b""
            while b"\r\n\r\n" not in data and (piece := tls.recv(65536)):
                data += piece
            head, _, rest = data.partition(b"\r\n\r\n")
            length = int(next((ln.split(b":", 1)[1] for ln in head.split(b"\r\n")
                               if ln.lower().startswith(b"content-length:")), b"0"))
            while len(rest) < length and (piece := tls.recv(65536)):
                rest += piece  # all of it: unread data would make the close a reset
            tls.sendall(answer)
            tls.close()
        except OSError:
            conn.close()
        lst.close()

    threading.Thread(target=serve, daemon=True).start()
    return lst.getsockname()[1]


def test_an_answer_the_upstream_cut_short_is_recorded_as_such_and_ends_the_connection(proxy, tmp_path):
    """Review 31 (F1): an answer with a Content-Length whose upstream connection ended
    early (or was shut down by a release) was recorded and logged as whole, and the
    client's connection stayed open until the injector's idle timeout (60 s)."""
    _srv, reg = proxy
    port = _cut_upstream(_certdir(proxy), b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                          b"Content-Length: 100000\r\n\r\n0123456789")
    srv, log = _injector_to(proxy, port, tmp_path)
    try:
        tok = reg.add("run-cut-short", "wf", ["api"], ttl=60)["api"]
        c = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=10)
        c.request("POST", "/v1/messages", body=b"{}", headers={"x-api-key": tok})
        r = c.getresponse()
        t0 = time.monotonic()
        with pytest.raises(http.client.IncompleteRead):
            r.read()  # old code: waited for the rest until the idle timeout (socket.timeout)
        assert time.monotonic() - t0 < 5
        c.close()
        record = reg.release("run-cut-short")
        assert record["requests"][0]["ended"].startswith("the upstream's answer ended early"), record
        entry = [json.loads(x) for x in log.read_text().splitlines() if "run-cut-short" in x][-1]
        assert entry["verdict"] == "forwarded" and "ended" in entry and entry["bytes_out"] == 10, entry
    finally:
        srv.shutdown()
        srv.server_close()
        srv.log_file.close()


def test_many_runs_ending_at_once_are_all_released(proxy, tmp_path):
    """Review 31 (F2): the control socket's listen queue held 5 and kooi's client
    failed at once (EAGAIN) when it was full: 14 of 32 runs ending together were not
    released (their placeholders lived on, their results had no record)."""
    srv, _ = proxy
    wfdir = tmp_path / "workflows"
    wfdir.mkdir(mode=0o755)
    (wfdir / "agent.yml").write_text("description: d\ncommand: [\"true\"]\nnetwork: proxy\nsecrets: [api]\n")
    sock = tmp_path / "control.sock"
    cfg = dataclasses.replace(srv.cfg, injector=dataclasses.replace(srv.cfg.injector, control=str(sock)))
    reg = injectcontrol.Registry()
    control = injectcontrol.ControlServer(str(sock), os.getgid(), cfg, srv.values, reg, wfdir)
    threading.Thread(target=control.serve_forever, daemon=True).start()
    try:
        n = 48
        failed: list[str] = []

        def both(i: int) -> None:
            try:
                inject.call(cfg, {"op": "register", "run": f"run-burst-{i}", "workflow": "agent"})
                barrier.wait(10)
                inject.call(cfg, {"op": "release", "run": f"run-burst-{i}"})
            except (inject.InjectError, threading.BrokenBarrierError) as exc:
                failed.append(str(exc))

        barrier = threading.Barrier(n)
        threads = [threading.Thread(target=both, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert failed == [] and reg.runs == {}, (failed[:3], len(failed))
    finally:
        control.shutdown()
        control.server_close()


def test_a_runs_refusals_cannot_keep_its_forwarded_requests_out_of_the_log(proxy, monkeypatch, tmp_path):
    """Review 31 (F3): a run's access log bound counted refusals too: 2000 cheap 403s,
    then its requests with the real key went unlogged. Forwarded requests are always
    logged (each is a round trip upstream); refusals have the bound."""
    monkeypatch.setattr(injectproxy, "LOG_PER_RUN", 20)
    _srv, reg = proxy
    srv = _server(proxy)
    log = tmp_path / "access.log"
    srv.log_file = open(log, "a", buffering=1)
    try:
        tok = reg.add("run-blind", "wf", ["api"], ttl=60)["api"]
        port = srv.server_address[1]
        for _ in range(25):
            assert _post(port, "/v1/other", {"x-api-key": tok})[0] == 403
        for _ in range(3):
            assert _post(port, "/v1/messages", {"x-api-key": tok})[0] == 200
        end = time.monotonic() + 10  # each line is written once its answer is out
        while log.read_text().count('"forwarded"') < 3 and time.monotonic() < end:
            time.sleep(0.02)
        lines = [json.loads(x) for x in log.read_text().splitlines() if "run-blind" in x]
        assert len([e for e in lines if e["verdict"] == "forwarded"]) == 3, lines[-5:]  # old code: 0
        assert len([e for e in lines if e["verdict"] == "refused"]) == 20
        assert reg.release("run-blind")["not_logged"] == 5
    finally:
        srv.shutdown()
        srv.server_close()
        srv.log_file.close()


@pytest.mark.parametrize("path", ["/api/caf\u00e9", "/api/a\x01b", "/api/a\x7fb"])
def test_a_path_the_upstream_request_cannot_carry_is_refused_before_the_key(proxy, path):
    """Review 31 (suspicion): on a route with PREFIX/*, a path with a control or
    non-ASCII character made the upstream request fail after the request was recorded
    as sent (an uncaught error for non-ASCII). Such a path is refused (400) first."""
    srv, reg = proxy
    tok = reg.add("run-odd-path", "wf", ["bearer"], ttl=60)["bearer"]
    try:
        s = socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10)
        s.sendall(b"POST " + path.encode("latin-1") + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                  + tok.encode() + b"\r\nContent-Length: 2\r\n\r\n{}")
        answer = s.recv(65536)
        s.close()
        assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
        record = reg.release("run-odd-path")
        assert record["forwarded"] == 0 and record["refused"][0]["status"] == 400, record
    finally:
        reg.release("run-odd-path")
