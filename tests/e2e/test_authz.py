"""`kooi authz` in front of a real rootful dockerd (a second daemon the test starts, with
its own data root and socket, `--authorization-plugin`): every refusal of the request
policy reaches the client with its reason, ordinary runs work, the plugin fails closed
and a restarted plugin is picked up without restarting dockerd."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import IMAGE_DIR, REPO
from .policy_cases import assert_refused, refused_runs

NAME = "kooi-authz-e2e"
PLUGIN_SOCK = Path(f"/run/docker/plugins/{NAME}.sock")
BASE = Path("/var/tmp/kooi-authz-e2e")
DOCKER_SOCK = Path("/run/kooi-authz-e2e/docker.sock")
WS = BASE / "workspace"


TOKEN_FILE = BASE / "token"
TOKEN = "kooi-e2e-operator-token-" + "x" * 40


def start_plugin() -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO / "shim")}
    proc = subprocess.Popen([sys.executable, "-m", "kooi", "authz", "serve", "--socket", str(PLUGIN_SOCK),
                             "--workspace-root", str(WS), "--token-file", str(TOKEN_FILE)],
                            env=env, stderr=open(BASE / "plugin.log", "a"))
    for _ in range(100):
        if PLUGIN_SOCK.exists():
            return proc
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("kooi authz did not create its socket: " + (BASE / "plugin.log").read_text()[-2000:])


@pytest.fixture(scope="module")
def daemon():
    shutil.rmtree(BASE, ignore_errors=True)
    (BASE / "data").mkdir(parents=True)
    WS.mkdir()
    (WS / "etc-link").symlink_to("/etc")
    (WS / "data").mkdir()
    TOKEN_FILE.write_text(TOKEN)
    TOKEN_FILE.chmod(0o600)
    DOCKER_SOCK.parent.mkdir(parents=True, exist_ok=True)
    plugin = start_plugin()
    log = open(BASE / "dockerd.log", "w")
    # Its own network namespace: this daemon must not touch the host's interfaces
    # (with --bridge none on the host's namespace it removed the host's docker0).
    dockerd = subprocess.Popen(
        ["unshare", "--net", "--", "dockerd", "--data-root", str(BASE / "data"), "--exec-root", "/run/kooi-authz-e2e/exec",
         "--pidfile", "/run/kooi-authz-e2e/dockerd.pid", "-H", f"unix://{DOCKER_SOCK}", "--bridge", "none",
         "--iptables=false", "--ip-masq=false", "--authorization-plugin", NAME],
        stdout=log, stderr=subprocess.STDOUT)
    state = {"plugin": plugin}
    try:
        for _ in range(120):
            if docker("version").returncode == 0:
                break
            if dockerd.poll() is not None:
                break
            time.sleep(0.5)
        else:
            pytest.fail("the authz-guarded dockerd did not answer: " + (BASE / "dockerd.log").read_text()[-2000:])
        assert dockerd.poll() is None, (BASE / "dockerd.log").read_text()[-2000:]
        with (IMAGE_DIR / "probe.tar").open("rb") as fh:
            res = subprocess.run(["docker", "-H", f"unix://{DOCKER_SOCK}", "load", "-q"], stdin=fh,
                                 capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        yield state
    finally:
        dockerd.send_signal(signal.SIGTERM)
        try:
            dockerd.wait(timeout=30)
        except subprocess.TimeoutExpired:
            dockerd.kill()
        state["plugin"].kill()
        state["plugin"].wait()
        subprocess.run(["umount", "-R", str(BASE / "data")], capture_output=True)
        shutil.rmtree(BASE, ignore_errors=True)


def docker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "-H", f"unix://{DOCKER_SOCK}", *args], capture_output=True, text=True,
                          timeout=timeout)


def raw_create(body: bytes, content_length: int | None = None,
               path: str = "/v1.41/containers/create") -> tuple[int, str]:
    """POST PATH straight to the daemon socket, with full control of the body."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(DOCKER_SOCK))
    conn = http.client.HTTPConnection("localhost")
    conn.sock = s
    conn.putrequest("POST", path)
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(len(body) if content_length is None else content_length))
    conn.endheaders()
    if body and content_length != 0:
        try:
            conn.send(body)
        except BrokenPipeError:
            pass  # the daemon answered (refused) before reading the whole body
    resp = conn.getresponse()
    text = resp.read().decode(errors="replace")
    conn.close()
    return resp.status, text


RUN = ["run", "--rm", "--network", "none"]


def test_an_ordinary_run_works(daemon):
    res = docker(*RUN, "-v", f"{WS}/data:/data", "kooi-probe:latest", "sh", "-c", "echo hello > /data/x; cat /data/x")
    assert res.returncode == 0 and "hello" in res.stdout, res.stderr


def test_kooi_runs_own_engine_client_passes_the_plugin(daemon):
    """kooi run's Engine API client (engineapi) through the plugin, the way a run on a
    userns_remap host uses it: image references by id, tag and digest, a network by
    name, and a container's whole life. CI once saw every run on such a host refused,
    because the client percent-encoded the ':' of an image id."""
    from kooi.engineapi import Engine

    eng = Engine(str(DOCKER_SOCK), timeout=60)
    eng.ping()
    img = eng.image("kooi-probe:latest")
    assert eng.image(img["Id"])["Id"] == img["Id"]
    if img.get("RepoDigests"):
        assert eng.image(img["RepoDigests"][0])["Id"] == img["Id"]
    eng.network("none")
    cid = eng.create({"Image": img["Id"], "Cmd": ["sh", "-c", "echo from-engineapi"],
                      "HostConfig": {"NetworkMode": "none"}}, name="kooi-authz-e2e-engineapi")
    try:
        eng.start(cid)
        assert (eng.wait(cid, timeout=60) or {}).get("StatusCode") == 0
        assert b"from-engineapi" in b"".join(eng.logs(cid))
    finally:
        eng.remove(cid)


def test_followed_logs_outlast_the_clients_timeout(daemon):
    """A workload that stays silent longer than the client's timeout keeps its later
    output: kooi run's log follower once stopped after 30 s of silence and dropped the
    rest of the log while the run still succeeded."""
    from kooi.engineapi import Engine

    eng = Engine(str(DOCKER_SOCK), timeout=1)
    cid = eng.create({"Image": "kooi-probe:latest", "Cmd": ["sh", "-c", "echo before; sleep 3; echo after"],
                      "HostConfig": {"NetworkMode": "none"}}, name="kooi-authz-e2e-silent")
    try:
        eng.start(cid)
        out = b"".join(eng.logs(cid))
        assert b"before" in out and b"after" in out, out
    finally:
        eng.remove(cid)


@pytest.mark.parametrize("args,reason", refused_runs(str(WS)) + [
    (["-v", "/var/run/docker.sock:/var/run/docker.sock"], "socket mount"),
    # Above the host's maximum (/etc/kooi/limits.json, kooi_workflow_max_limits).
    (["--ulimit", "core=1000:1000"], "Ulimits 'core' Soft=1000 refused (above this host's maximum"),
    (["--pids-limit", "99999999"], "PidsLimit 99999999 refused (above this host's maximum"),
    (["--memory", "1000g"], "Memory 1073741824000 refused (above this host's maximum"),
])
def test_the_plugin_refuses_with_its_reason(daemon, args, reason):
    assert_refused(docker("run", "--rm", *args, "kooi-probe:latest", "true"), "kooi-authz", reason)


def test_volume_with_bind_driver_options_is_refused(daemon):
    assert_refused(docker("volume", "create", "-o", "type=none", "-o", "o=bind", "-o", "device=/etc", "evil"),
                   "kooi-authz", "volume driver options are refused")


def test_plugin_management_is_refused(daemon):
    res = docker("plugin", "disable", NAME)
    assert res.returncode != 0 and "plugin management is refused" in res.stderr, res.stderr


def test_exec_as_root_is_refused(daemon):
    name = "kooi-authz-e2e-exec"
    assert docker("run", "-d", "--name", name, "--network", "none", "-u", "65534", "kooi-probe:latest",
                  "sleep", "60").returncode == 0
    try:
        res = docker("exec", "-u", "root", name, "id")
        assert res.returncode != 0 and "exec as root is refused" in res.stderr, res.stderr
        ok = docker("exec", name, "id", "-u")
        assert ok.returncode == 0 and ok.stdout.strip() == "65534", ok.stderr
    finally:
        docker("rm", "-f", name)


def test_an_oversized_privileged_create_is_refused(daemon):
    body = json.dumps({"Image": "kooi-probe:latest", "Cmd": ["true"], "Labels": {"pad": "x" * 1_100_000},
                       "HostConfig": {"Privileged": True}}).encode()
    status, text = raw_create(body)
    assert status >= 400 and "without a body" in text, (status, text[:500])


def test_a_field_name_spelt_with_a_unicode_fold_is_refused(daemon):
    """Go's JSON decoder fills HostConfig from "Ho\u017ftConfig" (U+017F LONG S): the plugin must
    read it too, or a privileged container walks past it."""
    body = '{"Image":"kooi-probe:latest","Cmd":["true"],"Ho\u017ftConfig":{"Privileged":true}}'.encode()
    status, text = raw_create(body)
    assert status == 403 and "privileged containers are refused" in text, (status, text[:500])


def test_host_settings_past_the_create_policy_are_refused(daemon):
    """Without HostConfig the engine reads host settings at the top level of a create's
    body; below API 1.24 Docker 20.10 applies a HostConfig sent with a start (host root on
    a userns-remap engine: Privileged with UsernsMode host). The plugin refuses both."""
    top = {"Image": "kooi-probe:latest", "Cmd": ["true"], "Privileged": True, "UsernsMode": "host"}
    status, text = raw_create(json.dumps(top).encode())
    assert status == 403 and "privileged containers are refused" in text, (status, text[:500])
    # MaskedPaths [] (systempaths=unconfined) at the top level, and next to a HostConfig.
    status, text = raw_create(json.dumps({"Image": "kooi-probe:latest", "MaskedPaths": []}).encode())
    assert status == 403 and "MaskedPaths refused" in text, (status, text[:500])
    status, text = raw_create(json.dumps({"Image": "kooi-probe:latest", "HostConfig": {},
                                          "Memory": 1 << 40}).encode())
    assert status == 403 and "Memory at the top level" in text, (status, text[:500])
    # An absolute-form request target: dockerd routes on its path, the plugin sees it raw.
    status, text = raw_create(json.dumps({"Image": "kooi-probe:latest", "HostConfig": {"Privileged": True}}).encode(),
                              path="http://d/v1.41/containers/create")
    assert status == 403 and "absolute-form" in text, (status, text[:500])
    name = "kooi-authz-e2e-legacy"
    assert docker("create", "--name", name, "--network", "none", "kooi-probe:latest", "true").returncode == 0
    try:
        status, text = raw_create(json.dumps({"Privileged": True, "UsernsMode": "host"}).encode(),
                                  path=f"/v1.23/containers/{name}/start")
        assert status == 403 and "API version 1.23 refused" in text, (status, text[:500])
        seen = docker("inspect", "-f", "{{.State.Status}} {{.HostConfig.Privileged}}", name).stdout.split()
        assert seen == ["created", "false"], seen
    finally:
        docker("rm", "-f", name)


def test_a_create_with_content_length_zero_is_refused(daemon):
    body = json.dumps({"Image": "kooi-probe:latest", "HostConfig": {"Privileged": True}}).encode()
    status, text = raw_create(body, content_length=0)
    assert status >= 400 and "kooi-authz" in text, (status, text[:500])


def test_only_the_operator_token_may_build(daemon):
    """site.yml's image builds carry the root-only token (header X-Kooi-Token)."""
    ctx = BASE / "ctx"
    ctx.mkdir(exist_ok=True)
    (ctx / "Dockerfile").write_text("FROM kooi-probe:latest\nRUN echo built > /built\n")
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    res = subprocess.run(["docker", "-H", f"unix://{DOCKER_SOCK}", "build", "-q", "-t", "kooi-e2e-built", str(ctx)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode != 0 and "builds are refused" in res.stderr, res.stderr
    conf = BASE / "docker-config"
    conf.mkdir(exist_ok=True)
    (conf / "config.json").write_text(json.dumps({"HttpHeaders": {"X-Kooi-Token": TOKEN}}))
    res = subprocess.run(["docker", "--config", str(conf), "-H", f"unix://{DOCKER_SOCK}", "build", "-q", "-t",
                          "kooi-e2e-built", str(ctx)], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    (conf / "config.json").write_text(json.dumps({"HttpHeaders": {"X-Kooi-Token": TOKEN[:-1]}}))
    res = subprocess.run(["docker", "--config", str(conf), "-H", f"unix://{DOCKER_SOCK}", "run", "--rm",
                          "--privileged", "kooi-e2e-built", "true"], capture_output=True, text=True, env=env)
    assert res.returncode != 0 and "privileged containers are refused" in res.stderr, res.stderr


def test_health_says_whether_the_plugin_answers(daemon):
    env = {**os.environ, "PYTHONPATH": str(REPO / "shim")}
    ok = subprocess.run([sys.executable, "-m", "kooi", "authz", "health", "--socket", str(PLUGIN_SOCK)],
                        capture_output=True, text=True, env=env)
    assert ok.returncode == 0 and "healthy" in ok.stdout, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "kooi", "authz", "health", "--socket", str(BASE / "none.sock")],
                         capture_output=True, text=True, env=env)
    assert bad.returncode == 1 and "not running" in bad.stderr, bad.stderr


def test_plugin_down_fails_closed_and_a_restart_is_picked_up(daemon):
    daemon["plugin"].kill()
    daemon["plugin"].wait()
    PLUGIN_SOCK.unlink(missing_ok=True)
    t0 = time.monotonic()
    res = docker("ps", timeout=120)
    assert res.returncode != 0, "the daemon answered without its authorization plugin"
    assert NAME in res.stderr, res.stderr
    daemon["plugin"] = start_plugin()
    ok = docker(*RUN, "kooi-probe:latest", "true", timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert time.monotonic() - t0 < 110
