"""Secrets: the description's parser, the workflow checks, the role's filter, and the
injector's proxy in-process against a real HTTPS upstream on loopback (a certificate
from a CA made here): the credential header is always replaced, only the secret's
paths and methods pass, answers stream through, nothing is attributed to another run."""

from __future__ import annotations

import http.client
import http.server
import json
import socket
import ssl
import sys
import threading
import time
from pathlib import Path

import pytest

from kooi import inject, workflow
from kooi.hoststate import HostStateError
from kooi.hoststate import secrets as secrets_state

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "roles/kooi_defaults/filter_plugins"))
sys.path.insert(0, str(REPO / "tests/e2e"))
from kooi_secrets import AnsibleFilterError, kooi_secrets_description  # noqa: E402
from testca import make_ca  # noqa: E402

PRESETS = {"anthropic": {"mode": "inject", "env": "ANTHROPIC_API_KEY", "base_url_env": "ANTHROPIC_BASE_URL",
                         "upstream": "https://api.anthropic.com", "header": "x-api-key",
                         "paths": ["/v1/messages"], "methods": ["POST"]}}


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
    reg = inject.Registry()
    a = reg.add("run-a", "wf", ["anthropic"], ttl=60)["anthropic"]
    b = reg.add("run-b", "wf", ["anthropic"], ttl=60)["anthropic"]
    assert a != b and a.startswith(inject.PLACEHOLDER_PREFIX)
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

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        Upstream.seen.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                              "body": body})
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
                       "paths": ["/api"]})
    reg = inject.Registry()
    srv = inject.ProxyServer(("127.0.0.1", 0), cfg, {"api": b"REAL-KEY", "bearer": b"REAL-TOKEN"}, reg)
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
