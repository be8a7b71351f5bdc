"""Every run is bounded: the host's default limits, a workflow's own, the host's maximum,
and fault tests (a fork bomb, a memory hog) in containers and jails while a probe on
the host keeps answering. On this machine kind the rootless engine has no cgroup
controllers (cgroup v1 hybrid), so runs are bounded by rlimits, and the result says
so; the cgroup path is proven on Molecule's userns_remap host (RUN-LIMITS)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import jsonschema
import pytest

from kooi.checks.runs import LIMITS_SCRIPT, limit_problems, parse_limits_output
from kooi.hoststate import limits as limits_state

from .conftest import KOOI, REPO
from .test_run import host, kooi_run, leftovers, project, runner_docker, wfdir, write_wf  # noqa: F401 - fixtures

SCHEMA = json.loads((REPO / "docs/run-result.schema.json").read_text())
MODES = ("container", "jail")


def flow(mode: str, command: list[str], **kw) -> dict:
    data = {"mode": mode, "command": command, "timeout": 60, **kw}
    if mode == "container":
        data["image"] = "runner"
    return data


class Probe:
    """The host answering while a workload misbehaves: how long starting /bin/true takes,
    five times a second, at worst."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.samples = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            subprocess.run(["/bin/true"], check=True)
            self.worst = max(self.worst, time.monotonic() - t0)
            self.samples += 1
            self.stop.wait(0.2)

    def __enter__(self) -> Probe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def marked(marker: str) -> int:
    """Processes whose command line holds MARKER (the workload's, whichever uid)."""
    n = 0
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                n += marker.encode() in (p / "cmdline").read_bytes()
            except OSError:
                continue
    return n


@pytest.mark.parametrize("mode", MODES)
def test_every_run_is_bounded_by_the_hosts_defaults_and_the_result_says_how(host, wfdir, project, mode):
    write_wf(wfdir, f"limits-{mode}", flow(mode, ["sh", "-c", LIMITS_SCRIPT]))
    res, result = kooi_run(f"limits-{mode}", project("python-example"), wfdir)
    assert res.returncode == 0, res.stdout + res.stderr
    jsonschema.validate(result, SCHEMA)
    record = result["limits"]
    defaults = limits_state.load().default
    assert {k: record[k]["from"] for k in limits_state.KEYS} == dict.fromkeys(limits_state.KEYS, "default")
    assert record["memory"]["requested"] == defaults["memory"] and record["pids"]["requested"] == defaults["pids"]
    # What the workload itself saw is what the result says bounds it.
    assert limit_problems(record, *parse_limits_output(res.stdout)) == []
    java = next(x for x in res.stdout.splitlines() if x.startswith("KOOI-JAVA"))
    # JVMs size their heap from a cgroup limit themselves; without one, kooi tells them.
    assert ("-XX:MaxRAM=" in java) != record["memory"]["by"].startswith("cgroup"), java
    assert result["limit"] is None


def test_the_engine_shows_the_limits_of_a_running_workload(host, wfdir, project):
    write_wf(wfdir, "limits-inspect", flow("container", ["sleep", "5"], limits={"pids": 300, "files": 2048}))
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(zip(("res", "result"), kooi_run("limits-inspect",
                                                                                   project("python-example"), wfdir))))
    t.start()
    try:
        for _ in range(100):
            ids = runner_docker(host, "ps", "-q", "--filter", "label=org.kooi.workflow=limits-inspect").split()
            if ids:
                break
            time.sleep(0.2)
        assert ids, "the workload's container never showed up"
        hc = json.loads(runner_docker(host, "inspect", "-f", "{{json .HostConfig}}", ids[0]))
    finally:
        t.join(timeout=120)
    ul = {u["Name"]: u["Hard"] for u in hc["Ulimits"]}
    assert ul["nofile"] == 2048 and ul["core"] == 0
    rec = out["result"]["limits"]
    if rec["pids"]["by"].startswith("cgroup"):
        assert hc["PidsLimit"] == 300 and hc["Memory"] > 0 and hc["CpuShares"] == 512
    else:
        assert ul["nproc"] == 300 and ul["data"] == limits_state.size(rec["memory"]["requested"])


def test_a_workflow_above_the_hosts_maximum_is_refused_before_anything_runs(host, wfdir, project, tmp_path):
    mx = limits_state.load().max
    over = f"{limits_state.size(mx['memory']) // (1 << 30) + 1}g"
    write_wf(wfdir, "limits-greedy", flow("container", ["true"], limits={"memory": over}))
    res, result = kooi_run("limits-greedy", project("python-example"), wfdir)
    assert res.returncode == 2 and result["reason"] == "invalid", res.stderr
    assert f"{over!r} is above this host's maximum {mx['memory']!r}" in result["message"]
    assert "kooi_workflow_max_limits" in result["message"]
    check = subprocess.run([KOOI, "workflow", "check", str(wfdir / "limits-greedy.yml")], capture_output=True, text=True)
    assert check.returncode == 2 and "above this host's maximum" in check.stderr


@pytest.mark.parametrize("mode", MODES)
def test_a_fork_bomb_stays_within_its_pids_limit_while_the_host_answers(host, wfdir, project, mode):
    marker = f"kooi-bomb-{mode}-{time.monotonic_ns()}"
    write_wf(wfdir, f"bomb-{mode}", flow(mode, ["bash", "-c", f": {marker}; bomb() {{ bomb | bomb & }}; bomb; sleep 60"],
                                         timeout=8, limits={"pids": 200}))
    peak = 0
    done = threading.Event()

    def count() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, marked(marker))
            done.wait(0.3)

    counter = threading.Thread(target=count, daemon=True)
    counter.start()
    with Probe() as probe:
        res, result = kooi_run(f"bomb-{mode}", project("python-example"), wfdir)
    done.set()
    counter.join(timeout=10)
    print(f"{mode}: fork bomb peak {peak} processes (limit 200); host probe worst {probe.worst * 1000:.0f} ms "
          f"over {probe.samples} samples; limit reported: {result.get('limit')}")
    assert res.returncode == 124 and result["reason"] == "timeout", res.stderr
    jsonschema.validate(result, SCHEMA)
    assert 100 < peak <= 200, peak  # it did fork, and no further than its limit
    assert probe.worst < 2.0, f"the host took {probe.worst:.1f} s to start /bin/true"
    if result["limits"]["pids"]["by"].startswith("cgroup"):
        assert result["limit"] == "pids"
    time.sleep(1)
    assert marked(marker) == 0, "processes of the fork bomb outlived the run"
    assert leftovers(host) == []


@pytest.mark.parametrize("mode", MODES)
def test_a_memory_hog_ends_at_its_memory_limit(host, wfdir, project, mode):
    hog = ("import sys\nheld = []\ntry:\n    while True:\n        held.append(bytearray(16 << 20))\n"
           "except MemoryError:\n    print('HOG-REFUSED', len(held) * 16, flush=True)\n    sys.exit(3)\n")
    write_wf(wfdir, f"hog-{mode}", flow(mode, ["python3", "-c", hog], limits={"memory": "256m"}))
    with Probe() as probe:
        res, result = kooi_run(f"hog-{mode}", project("python-example"), wfdir)
    print(f"{mode}: memory hog {res.stdout.strip().splitlines()[-1:]}, exit {res.returncode}, limit "
          f"{result.get('limit')}; host probe worst {probe.worst * 1000:.0f} ms")
    assert res.returncode != 0 and result["reason"] == "failed", res.stdout[-2000:]
    assert probe.worst < 2.0
    if result["limits"]["memory"]["by"].startswith("cgroup"):
        assert result["limit"] == "memory" and res.returncode == 137
    else:
        line = next(x for x in res.stdout.splitlines() if x.startswith("HOG-REFUSED"))
        assert int(line.split()[1]) <= 256 and res.returncode == 3
    assert leftovers(host) == []


def test_the_engine_killed_mid_run_gives_engine_unavailable_and_nothing_outlives_recovery(host, wfdir, project):
    """kill -9 of the runner's engine mid-run: kooi run says so (exit 125) instead of
    waiting for its timeout; the workload ends at its own deadline (kooi's init, the
    engine gone); after `kooi engine start`, `kooi gc` removes its container."""
    marker = f"kooi-engine-fault-{time.monotonic_ns()}"
    write_wf(wfdir, "engine-fault", flow("container", ["sh", "-c", f": {marker}; while :; do echo tick; sleep 1; done"],
                                         timeout=15))
    out = Path(f"/var/tmp/kooi-e2e-engine-fault-{time.monotonic_ns()}.json")
    proc = subprocess.Popen([KOOI, "run", "engine-fault", "--project", str(project("python-example")), "--json", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "KOOI_WORKFLOW_DIR": str(wfdir)})
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.startswith("tick"):
                break
        engine_pid = int(subprocess.run(["pgrep", "-u", host["runner_user"], "-x", "dockerd"], capture_output=True,
                                        text=True, check=True).stdout.split()[0])
        t0 = time.monotonic()
        subprocess.run(["kill", "-9", str(engine_pid)], check=True)  # the engine this session started
        rest = proc.stdout.read()
        rc = proc.wait(timeout=60)
        took = time.monotonic() - t0
        result = json.loads(out.read_text())
    finally:
        if proc.poll() is None:
            proc.kill()
        out.unlink(missing_ok=True)
        subprocess.run([KOOI, "engine", "start"], check=True, capture_output=True)
    assert rc == 125 and result["reason"] == "unavailable", rest[-2000:]
    assert "the engine stopped answering during the run" in result["message"]
    assert took < 30, f"kooi run took {took:.0f} s to notice"  # not its 15 s timeout plus a kill
    # The workload's init ends it at its deadline (timeout 15 + 10 s), the engine gone or not.
    for _ in range(60):
        if marked(marker) == 0:
            break
        time.sleep(1)
    assert marked(marker) == 0, "the workload outlived its deadline without its engine"
    gc = subprocess.run(["runuser", "-u", host["runner_user"], "--", KOOI, "gc"], capture_output=True, text=True)
    assert gc.returncode == 0, gc.stderr
    assert leftovers(host) == []
