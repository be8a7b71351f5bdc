"""kooi authz: the operator token, the health check and how a request is read
(tests/e2e/test_authz.py runs the plugin in front of a real dockerd)."""

from __future__ import annotations

import base64
import json
import threading
import time
from pathlib import Path

import pytest

from kooi import authz
from kooi.hoststate.engine import Authz
from kooi.policy import Policy

TOKEN = "t" * 48


@pytest.fixture
def plugin(tmp_path):
    sock = tmp_path / "p.sock"
    t = threading.Thread(target=authz.serve, args=(sock, Policy(workspace=str(tmp_path))),
                         kwargs={"token": TOKEN, "log": lambda _m: None}, daemon=True)
    t.start()
    import socket

    for _ in range(250):  # the socket file exists from bind(), connections from listen()
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(sock))
                break
            except OSError:
                time.sleep(0.02)
    return sock


def ask(sock: Path, method: str, uri: str, body: dict | None = None, headers: dict | None = None) -> dict:
    import http.client
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.connect(str(sock))
    c = http.client.HTTPConnection("x")
    c.sock = s
    req = {"RequestMethod": method, "RequestUri": uri, "RequestHeaders": headers or {}}
    if body is not None:
        req["RequestBody"] = base64.b64encode(json.dumps(body).encode()).decode()
    c.request("POST", "/AuthZPlugin.AuthZReq", body=json.dumps(req))
    return json.loads(c.getresponse().read())


def test_the_operator_token_allows_what_the_policy_refuses(plugin):
    assert not ask(plugin, "POST", "/v1.41/build?t=x")["Allow"]
    assert ask(plugin, "POST", "/v1.41/build?t=x", headers={"X-Kooi-Token": TOKEN})["Allow"]
    assert ask(plugin, "POST", "/v1.41/build", headers={"x-kooi-token": TOKEN})["Allow"]
    wrong = ask(plugin, "POST", "/v1.41/build", headers={"X-Kooi-Token": TOKEN[:-1] + "u"})
    assert not wrong["Allow"] and "builds are refused" in wrong["Msg"]
    priv = ask(plugin, "POST", "/containers/create", {"HostConfig": {"Privileged": True}})
    assert not priv["Allow"] and priv["Msg"].startswith("kooi-authz: privileged")


def test_health_reports_a_live_plugin_and_a_missing_one(plugin, tmp_path):
    assert authz.health(plugin) == (True, "")
    ok, why = authz.health(tmp_path / "nope.sock")
    assert not ok and "not running" in why
    msg = authz.down_message(Authz("kooi-authz", "/run/docker/plugins/kooi-authz.sock", "/etc/kooi/authz/token",
                                   "kooi-authz.service"), why)
    assert "systemctl start kooi-authz.service" in msg and "refuses every API call" in msg


def test_the_token_file_must_be_root_only_and_long_enough(tmp_path):
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    assert authz.read_token(f) == TOKEN
    f.chmod(0o640)
    with pytest.raises(OSError, match="readable by group or others"):
        authz.read_token(f)
    f.chmod(0o600)
    f.write_text("short")
    with pytest.raises(OSError, match="no usable token"):
        authz.read_token(f)
    assert authz.read_token(None) is None
