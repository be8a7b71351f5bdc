"""The broker attaches the workload's container to every network the run creates
(`RunScope.attach`, what `kooi run` uses on the userns-remap engine, whose bridges are
isolated from each other): on the runner's real engine, the workload reaches a
container on a network the run created by that container's own address, and the
run can still remove the network (the broker detaches the workload first)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kooi import broker as kb
from kooi.policy import Policy

from .test_broker import PROBE, engine_docker

RUN_ID = "e2e-attach-1"
BASE = Path("/var/tmp/kooi-attach-e2e")
SOCK = BASE / "b.sock"
RUN_NET = "kooi-e2e-attach-run"
WORKLOAD = "kooi-e2e-attach-workload"


def docker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "-H", f"unix://{SOCK}", *args], capture_output=True, text=True, timeout=120)


def networks_of(cfg: dict, name: str) -> set[str]:
    res = engine_docker(cfg, "inspect", "-f", "{{json .NetworkSettings.Networks}}", name)
    assert res.returncode == 0, res.stderr
    return set(json.loads(res.stdout))


@pytest.fixture()
def attached(engine):
    cfg = engine
    labels = {"org.kooi.run": RUN_ID, "org.kooi.managed": "1"}
    lab = [a for k, v in labels.items() for a in ("--label", f"{k}={v}")]
    engine_docker(cfg, "rm", "-f", WORKLOAD)
    engine_docker(cfg, "network", "rm", RUN_NET)
    shutil.rmtree(BASE, ignore_errors=True)
    BASE.mkdir(parents=True)
    assert engine_docker(cfg, "network", "create", *lab, RUN_NET).returncode == 0
    wl = engine_docker(cfg, "run", "-d", "--name", WORKLOAD, "--network", RUN_NET, "-u", "65534", *lab,
                       PROBE, "sleep", "300")
    assert wl.returncode == 0, wl.stderr
    wl_id = wl.stdout.strip()
    scope = kb.RunScope(RUN_ID, {**labels, "org.kooi.nested": "1"}, network=RUN_NET,
                        protected={wl_id}, attach=wl_id)
    b = kb.Broker(str(SOCK), cfg["socket"], Policy(workspace=str(BASE)), scope)
    b.start()
    try:
        yield cfg, b
    finally:
        b.stop()
        engine_docker(cfg, "rm", "-f", WORKLOAD)
        left = kb.cleanup(cfg["socket"], RUN_ID)
        shutil.rmtree(BASE, ignore_errors=True)
        assert not left["failed"], left


def test_the_workload_joins_networks_the_run_creates_and_reaches_containers_there(attached):
    cfg, b = attached
    assert docker("network", "create", "tcnet-a").returncode == 0
    assert networks_of(cfg, WORKLOAD) == {RUN_NET, "tcnet-a"}
    srv = docker("run", "-d", "--name", "kooi-e2e-attach-srv", "--network", "tcnet-a", "--network-alias", "db",
                 PROBE, "sh", "-c", "echo hello-from-db | busybox nc -l -p 5000")
    assert srv.returncode == 0, srv.stderr
    ip = engine_docker(cfg, "inspect", "-f", '{{(index .NetworkSettings.Networks "tcnet-a").IPAddress}}',
                       "kooi-e2e-attach-srv").stdout.strip()
    for _ in range(50):
        got = engine_docker(cfg, "exec", WORKLOAD, "busybox", "nc", "-w", "3", ip, "5000")
        if "hello-from-db" in got.stdout:
            break
        time.sleep(0.2)
    assert "hello-from-db" in got.stdout, (got.stdout, got.stderr)
    # The run removes its network: the broker detaches the workload first.
    assert docker("rm", "-f", "kooi-e2e-attach-srv").returncode == 0
    rm = docker("network", "rm", "tcnet-a")
    assert rm.returncode == 0, rm.stderr
    assert networks_of(cfg, WORKLOAD) == {RUN_NET}


def test_a_network_prune_removes_networks_only_the_workload_is_on(attached):
    cfg, b = attached
    for name in ("tcnet-idle", "tcnet-busy"):
        assert docker("network", "create", name).returncode == 0
    busy = docker("run", "-d", "--name", "kooi-e2e-attach-busy", "--network", "tcnet-busy", PROBE, "sleep", "300")
    assert busy.returncode == 0, busy.stderr
    res = docker("network", "prune", "-f")
    assert res.returncode == 0, res.stderr
    assert networks_of(cfg, WORKLOAD) == {RUN_NET, "tcnet-busy"}
    assert engine_docker(cfg, "network", "inspect", "tcnet-idle").returncode != 0
    # The workload's own run network is not the run's to remove out from under it.
    assert docker("network", "rm", RUN_NET).returncode != 0
    assert networks_of(cfg, WORKLOAD) == {RUN_NET, "tcnet-busy"}
