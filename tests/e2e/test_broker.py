"""`kooi broker` in front of the runner's real rootless engine (the command site.yml
installed, run as the runner user): the request policy's refusals reach the client with
their reasons, the run's objects are labelled, other objects are out of reach, Ryuk's
socket mount is answered with the broker, hijacked streams work, and the run's objects
are removed when the broker ends."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import KOOI
from .policy_cases import assert_refused, refused_runs

RUN_ID = "e2e-broker-1"
BASE = Path("/var/tmp/kooi-broker-e2e")
SOCK = BASE / "b.sock"
WS = BASE / "ws"
PROBE = "kooi-probe:latest"
# The run's limits, as a workflow names them (the rest: the host's defaults).
RUN_LIMITS = {"pids": 512, "files": 4096, "memory": "1g"}


def engine_docker(cfg: dict, *args: str, **kw) -> subprocess.CompletedProcess:
    """The engine itself, as its owner (what the workload never gets)."""
    return subprocess.run(["runuser", "-u", cfg["runner_user"], "--", "env", f"DOCKER_HOST=unix://{cfg['socket']}",
                           "docker", *args], capture_output=True, text=True, timeout=120, **kw)


def docker(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """A client of the broker socket."""
    return subprocess.run(["docker", "-H", f"unix://{SOCK}", *args], capture_output=True, text=True,
                          timeout=timeout, **kw)


@pytest.fixture(scope="module")
def broker(engine):
    cfg = engine
    shutil.rmtree(BASE, ignore_errors=True)
    WS.mkdir(parents=True)
    (WS / "data").mkdir()
    (WS / "etc-link").symlink_to("/etc")
    subprocess.run(["chown", "-R", f"{cfg['runner_user']}:{cfg['runner_user']}", str(BASE)], check=True)
    log = open(BASE.parent / "kooi-broker-e2e.log", "w")
    # setpriv execs (runuser would SIGKILL the broker 2 s after forwarding SIGTERM).
    proc = subprocess.Popen(["setpriv", "--reuid", cfg["runner_user"], "--regid", cfg["runner_user"],
                             "--init-groups", KOOI, "broker", "serve",
                             "--socket", str(SOCK), "--workspace", str(WS), "--run-id", RUN_ID, "--cleanup",
                             "--map-workspace", "--limits", json.dumps(RUN_LIMITS)],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    for _ in range(100):
        if SOCK.exists():
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("kooi broker did not create its socket: " + Path(log.name).read_text()[-2000:])
    # An object of someone else (created on the engine directly, not through the broker).
    engine_docker(cfg, "rm", "-f", "kooi-broker-e2e-other")
    other = engine_docker(cfg, "run", "-d", "--name", "kooi-broker-e2e-other", "--network", "none", PROBE,
                          "sleep", "300")
    assert other.returncode == 0, other.stderr
    state = {"cfg": cfg, "proc": proc, "log": log.name}
    try:
        yield state
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        engine_docker(cfg, "rm", "-f", "kooi-broker-e2e-other")
        shutil.rmtree(BASE, ignore_errors=True)


def raw(method: str, path: str, body: bytes | None = None, content_length: int | None = None,
        sock: str | Path = SOCK) -> tuple[int, str]:
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(sock))
    conn = http.client.HTTPConnection("localhost", timeout=60)
    conn.sock = s
    conn.putrequest(method, path)
    conn.putheader("Content-Type", "application/json")
    if body is not None or content_length is not None:
        conn.putheader("Content-Length", str(len(body or b"") if content_length is None else content_length))
    conn.endheaders()
    if body and content_length != 0:
        try:
            conn.send(body)
        except BrokenPipeError:
            pass
    resp = conn.getresponse()
    text = resp.read().decode(errors="replace")
    conn.close()
    return resp.status, text


def test_an_ordinary_run_works_and_is_labelled(broker):
    res = docker("run", "--name", "kooi-broker-e2e-ok", "-v", "/workspace:/w", PROBE,
                 "sh", "-c", "echo hello > /w/data/x; cat /w/data/x")
    assert res.returncode == 0 and "hello" in res.stdout, res.stderr
    assert (WS / "data" / "x").read_text().strip() == "hello"  # /workspace was mapped to the project
    labels = json.loads(docker("inspect", "-f", "{{json .Config.Labels}}", "kooi-broker-e2e-ok").stdout)
    assert labels["org.kooi.run"] == RUN_ID and labels["org.kooi.nested"] == "1"


def test_a_nested_container_gets_the_runs_limits(broker):
    res = docker("run", "--name", "kooi-broker-e2e-limits", PROBE, "cat", "/proc/self/limits")
    assert res.returncode == 0, res.stderr
    seen = {line[:26].strip(): line[26:].split()[:2] for line in res.stdout.splitlines()}
    assert seen["Max open files"] == ["4096", "4096"] and seen["Max core file size"] == ["0", "0"]
    hc = json.loads(docker("inspect", "-f", "{{json .HostConfig}}", "kooi-broker-e2e-limits").stdout)
    info = json.loads(engine_docker(broker["cfg"], "info", "--format", "{{json .}}").stdout)
    if info.get("PidsLimit"):  # the engine's cgroups bound it
        assert hc["PidsLimit"] == 512 and hc["Memory"] == 1 << 30
    else:  # rlimits where it has none (rootless on cgroup v1)
        assert seen["Max processes"] == ["512", "512"] and seen["Max data size"] == [str(1 << 30)] * 2


@pytest.mark.parametrize("args,reason", [
    (["--ulimit", "nproc=100000:100000"], "Ulimits 'nproc' Soft=100000 refused (above the run's limit of 512)"),
    (["--ulimit", "nofile=8192:8192"], "Ulimits 'nofile' Soft=8192 refused (above the run's limit of 4096)"),
    (["--ulimit", "core=1000:1000"], "Ulimits 'core' Soft=1000 refused (above the run's limit of 0)"),
])
def test_a_nested_container_may_not_ask_for_more_than_the_run(broker, args, reason):
    assert_refused(docker("run", "--rm", *args, PROBE, "true"), "kooi broker", reason)


@pytest.mark.parametrize("args,reason", refused_runs(str(WS), below="below the workspace root") + [
    # the workload's view, translated; below the root nothing is bound (the engine would
    # resolve the path again at start)
    (["-v", "/workspace/etc-link:/x"], "below the workspace root"),
    (["-v", "/workspace/data:/x"], "below the workspace root"),
    (["-v", "/run/user/0/docker.sock:/d.sock"], "socket mount"),
    (["--network", "container:kooi-broker-e2e-other"], "is not this run's"),
])
def test_the_broker_refuses_with_its_reason(broker, args, reason):
    assert_refused(docker("run", "--rm", *args, PROBE, "true"), "kooi broker", reason)


def test_volume_with_bind_driver_options_is_refused(broker):
    assert_refused(docker("volume", "create", "-o", "type=none", "-o", "o=bind", "-o", "device=/etc", "evil"),
                   "kooi broker", "volume driver options are refused")


def test_plugin_prune_and_image_removal_are_refused(broker):
    for args, reason in ((["plugin", "disable", "x"], "plugin management is refused"),
                         (["builder", "prune", "-f"], "prune endpoint is refused"),
                         (["image", "rm", PROBE], "removing images is refused"),
                         (["build", "-q", "-"], "are refused")):
        res = docker(*args, input="FROM scratch\n", env={**os.environ, "DOCKER_BUILDKIT": "0"})
        assert res.returncode != 0 and reason in res.stderr, (args, res.stderr)


def test_exec_as_root_is_refused_and_a_hijacked_exec_works(broker):
    name = "kooi-broker-e2e-exec"
    assert docker("run", "-d", "--name", name, "-u", "65534", PROBE, "sleep", "120").returncode == 0
    res = docker("exec", "-u", "root", name, "id")
    assert res.returncode != 0 and "exec as root is refused" in res.stderr, res.stderr
    ok = docker("exec", "-i", name, "sh", "-c", "id -u; cat", input="through the broker\n")
    assert ok.returncode == 0 and ok.stdout.split() == ["65534", "through", "the", "broker"], ok.stderr


def test_other_objects_are_out_of_reach_and_unlisted(broker):
    for args in (["inspect", "kooi-broker-e2e-other"], ["exec", "kooi-broker-e2e-other", "true"],
                 ["stop", "kooi-broker-e2e-other"], ["logs", "kooi-broker-e2e-other"],
                 ["rm", "-f", "kooi-broker-e2e-other"], ["cp", "kooi-broker-e2e-other:/etc/hostname", "-"]):
        res = docker(*args)
        assert res.returncode != 0 and "is not this run's" in res.stderr, (args, res.stderr)
    listed = docker("ps", "-a", "--format", "{{.Names}}").stdout.split()
    assert "kooi-broker-e2e-other" not in listed and "kooi-broker-e2e-ok" in listed
    assert engine_docker(broker["cfg"], "inspect", "kooi-broker-e2e-other").returncode == 0


def test_an_engine_socket_mount_is_answered_with_the_broker(broker):
    res = docker("create", "--name", "kooi-broker-e2e-ryuk", "-v", "/var/run/docker.sock:/var/run/docker.sock",
                 PROBE, "true")
    assert res.returncode == 0, res.stderr
    binds = json.loads(engine_docker(broker["cfg"], "inspect", "-f", "{{json .HostConfig.Binds}}",
                                     "kooi-broker-e2e-ryuk").stdout)
    assert binds == [f"{SOCK}:/var/run/docker.sock"]


def test_duplicate_keys_oversized_and_empty_bodies_are_refused(broker):
    merge = b'{"Image":"kooi-probe:latest","HostConfig":{"Privileged":true},"hostconfig":{"Memory":0}}'
    status, text = raw("POST", "/v1.41/containers/create", merge)
    assert status == 403 and "duplicate key" in text, text
    folded = '{"Image":"kooi-probe:latest","Ho\u017ftConfig":{"Privileged":true}}'.encode()  # Go reads HostConfig
    status, text = raw("POST", "/v1.41/containers/create", folded)
    assert status == 403 and "privileged containers are refused" in text, text
    big = json.dumps({"Image": PROBE, "Labels": {"pad": "x" * 1_100_000}, "HostConfig": {"Privileged": True}})
    status, text = raw("POST", "/v1.41/containers/create", big.encode())
    assert status == 403 and "exceeds" in text, text
    status, text = raw("POST", "/v1.41/containers/create", b'{"Image":"x"}', content_length=0)
    assert status == 403 and "without a body" in text, text


def test_host_settings_past_the_create_policy_are_refused(broker):
    """Two ways past a create's HostConfig, each first shown on the engine itself (the
    control): a create with host settings at the top level of its body (read there when
    HostConfig is absent), and, where the engine still serves API < 1.24 (Docker 20.10,
    Debian 12), a start whose body carries a HostConfig. The broker refuses both."""
    cfg = broker["cfg"]
    engine_sock = cfg["socket"]
    top = {"Image": PROBE, "Cmd": ["true"], "Binds": ["/etc:/hostetc:ro"], "CapAdd": ["ALL"]}
    status, text = raw("POST", "/v1.41/containers/create?name=kooi-broker-e2e-top", json.dumps(top).encode(),
                       sock=engine_sock)
    assert status == 201, text
    try:
        seen = engine_docker(cfg, "inspect", "-f", "{{json .HostConfig.Binds}} {{json .HostConfig.CapAdd}}",
                             "kooi-broker-e2e-top").stdout.split()
        assert seen == ['["/etc:/hostetc:ro"]', '["ALL"]'], seen  # the engine took them
    finally:
        engine_docker(cfg, "rm", "-f", "kooi-broker-e2e-top")
    status, text = raw("POST", "/v1.41/containers/create", json.dumps(top).encode())
    assert status == 403 and "Binds at the top level" in text, text

    legacy = json.dumps({"Binds": ["/etc:/hostetc:ro"], "CapAdd": ["ALL"]}).encode()
    min_api = engine_docker(cfg, "version", "-f", "{{.Server.MinAPIVersion}}").stdout.strip()
    if tuple(int(p) for p in min_api.split(".")) < (1, 24):
        ctl = engine_docker(cfg, "create", "--name", "kooi-broker-e2e-legacy", PROBE, "true")
        assert ctl.returncode == 0, ctl.stderr
        try:
            status, text = raw("POST", "/v1.23/containers/kooi-broker-e2e-legacy/start", legacy, sock=engine_sock)
            assert status == 204, text
            seen = engine_docker(cfg, "inspect", "-f", "{{json .HostConfig.Binds}}", "kooi-broker-e2e-legacy")
            assert seen.stdout.strip() == '["/etc:/hostetc:ro"]', seen  # the engine took them
        finally:
            engine_docker(cfg, "rm", "-f", "kooi-broker-e2e-legacy")
    created = docker("create", PROBE, "true")
    assert created.returncode == 0, created.stderr
    ident = created.stdout.strip()
    status, text = raw("POST", f"/v1.23/containers/{ident}/start", legacy)
    assert status == 403 and "API version 1.23 refused" in text, text
    seen = engine_docker(cfg, "inspect", "-f", "{{.State.Status}} {{json .HostConfig.Binds}}", ident)
    assert seen.stdout.split()[0] == "created" and "/etc" not in seen.stdout, seen.stdout
    assert docker("rm", "-f", ident).returncode == 0


def test_networks_and_volumes_are_the_runs_own(broker):
    assert docker("network", "create", "broker-e2e-net").returncode == 0
    assert docker("volume", "create", "kooi-broker-e2e-vol").returncode == 0
    res = docker("run", "--rm", "--network", "broker-e2e-net", "-v", "kooi-broker-e2e-vol:/v", PROBE,
                 "sh", "-c", "echo ok > /v/x")
    assert res.returncode == 0, res.stderr
    res = docker("run", "--rm", "--network", "bridge", "-v", "auto-created-vol:/v", PROBE, "true")
    assert res.returncode == 0, res.stderr
    vols = json.loads(engine_docker(broker["cfg"], "volume", "inspect", "auto-created-vol").stdout)
    assert vols[0]["Labels"]["org.kooi.run"] == RUN_ID  # created labelled, so cleanup finds it


def test_names_another_run_holds_are_the_runs_own_through_its_broker(broker):
    """Review 18 (the Go example): names are the engine's, one for all runs. A run that
    created a network, a volume or a container named like what another run's workload
    makes (Testcontainers' `reaper_default`, a compose project's `app_default`) made
    that run fail ("exists, refused", 409). Now the second run's object gets a name of
    its own, and the run reaches it by the name it asked for."""
    cfg = broker["cfg"]
    squat = ["--label", "org.kooi.run=e2e-squatter"]
    for args in (["network", "create", *squat, "squat-net"], ["volume", "create", *squat, "squat-vol"],
                 ["create", "--name", "squat-ctr", "--network", "none", *squat, PROBE, "true"]):
        res = engine_docker(cfg, *args)
        assert res.returncode == 0, (args, res.stderr)
    try:
        for args in (["network", "create", "squat-net"], ["volume", "create", "squat-vol"]):
            res = docker(*args)
            assert res.returncode == 0, (args, res.stderr)
        res = docker("run", "--name", "squat-ctr", "--network", "squat-net", "-v", "squat-vol:/v", PROBE,
                     "sh", "-c", "echo mine > /v/x && cat /v/x")
        assert res.returncode == 0 and res.stdout.strip() == "mine", res.stderr
        # By the names it asked for, the run's own; the other run's are untouched.
        for kind in ("network", "volume", "container"):
            name = f"squat-{kind[:3] if kind != 'container' else 'ctr'}"
            mine = json.loads(docker(kind, "inspect", name).stdout or "[{}]")[0]
            labels = mine.get("Labels") if kind != "container" else mine.get("Config", {}).get("Labels")
            assert (labels or {}).get("org.kooi.run") == RUN_ID, (kind, mine)
            theirs = json.loads(engine_docker(cfg, kind, "inspect", name).stdout)[0]
            theirs_labels = theirs.get("Labels") if kind != "container" else theirs["Config"]["Labels"]
            assert theirs_labels["org.kooi.run"] == "e2e-squatter", (kind, theirs)
        assert docker("rm", "squat-ctr").returncode == 0
        assert docker("network", "rm", "squat-net").returncode == 0
        assert docker("volume", "rm", "squat-vol").returncode == 0
        # A second object of a name the run holds itself stays refused (ambiguous).
        assert docker("network", "create", "own-net").returncode == 0
        res = docker("network", "create", "own-net")
        assert res.returncode != 0 and "exists" in res.stderr, res.stderr
    finally:
        engine_docker(cfg, "rm", "-f", "squat-ctr")
        engine_docker(cfg, "network", "rm", "squat-net")
        engine_docker(cfg, "volume", "rm", "squat-vol")


def test_stopping_the_broker_removes_everything_the_run_created(broker):
    proc = broker["proc"]
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["broker"]["refused"] > 10 and summary["cleanup"]["failed"] == []
    cfg = broker["cfg"]
    for kind in ("ps -a", "network ls", "volume ls"):
        left = engine_docker(cfg, *kind.split(), "-q", "--filter", f"label=org.kooi.run={RUN_ID}").stdout.split()
        assert left == [], (kind, left)
    assert engine_docker(cfg, "inspect", "kooi-broker-e2e-other").returncode == 0  # not the run's: kept
    assert not SOCK.exists()
    assert "broker refused" in Path(broker["log"]).read_text()
    assert os.path.exists(broker["log"])
