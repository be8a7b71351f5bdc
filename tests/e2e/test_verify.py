"""`kooi verify` on this provisioned host: every check reported in each format, the
JSON valid against docs/verify.schema.json, a deliberate weakness fails exactly its
check, and verify leaves the host as it was."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from kooi.checks import CHECKS

from .conftest import KOOI, REPO

WATCHED = ("/etc/passwd", "/etc/group", "/etc/subuid", "/etc/subgid", "/etc/kooi/engine.json",
           "/etc/kooi/images.json", "/etc/kooi/engine/kooi-runner/daemon.json")


def verify(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([KOOI, "verify", *args], capture_output=True, text=True, timeout=600)


def fingerprint() -> dict[str, str]:
    return {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in WATCHED if Path(p).exists()}


def as_runner(engine, *cmd: str) -> list[str]:
    return ["runuser", "-u", engine["runner_user"], "--", "env", f"DOCKER_HOST=unix://{engine['socket']}",
            f"XDG_RUNTIME_DIR=/run/user/{engine['runner_uid']}", *cmd]


def containers(engine) -> list[str]:
    return subprocess.run(as_runner(engine, "docker", "ps", "-aq"), capture_output=True, text=True,
                          check=True).stdout.split()


@pytest.fixture(scope="module")
def full_report(engine) -> tuple[subprocess.CompletedProcess, dict, dict[str, str], list[str]]:
    """One run of the whole catalogue (tens of seconds on a loaded CI machine), read by
    the tests of what it reports and how: (the run, its report, the watched files' and
    the engine's containers before it)."""
    before, before_containers = fingerprint(), containers(engine)
    res = verify("--format", "json")
    return res, json.loads(res.stdout), before, before_containers


def test_json_report_is_complete_valid_and_changes_nothing(engine, full_report):
    res, report, before, before_containers = full_report
    assert res.returncode == 0, [(c["id"], c["evidence"]) for c in report["checks"] if c["status"] == "fail"]
    jsonschema.validate(report, json.loads((REPO / "docs/verify.schema.json").read_text()))
    assert [c["id"] for c in report["checks"]] == [c.id for c in CHECKS]
    assert report["ok"] and report["summary"]["fail"] == 0
    assert {c["id"] for c in report["checks"] if c["status"] == "pass"} >= {
        "HOST-ENGINE-ROOTLESS", "ESC-PROCSYS-WRITE", "ESC-USERNS-MAP", "IMG-NOSUID", "ID-CAPS"}
    assert fingerprint() == before
    assert containers(engine) == before_containers


def test_junit_and_text_reports(engine, full_report, tmp_path):
    # The command's JUnit output (two checks), and the whole catalogue's report rendered
    # by the same renderer: CI keeps it (.ci/out/verify-local.xml).
    from kooi.verify import FORMATS

    out = tmp_path / "two.xml"
    res = verify("--format", "junit", "--output", str(out), "--check", "HOST-ENGINE-ROOTLESS", "--check",
                 "HOST-RUNNER-NODOCKER")
    assert res.returncode == 0 and "0 failed" in res.stdout, res.stdout + res.stderr
    cases = ET.parse(out).getroot().findall(".//testcase")
    assert sorted(c.get("name") for c in cases) == ["HOST-ENGINE-ROOTLESS", "HOST-RUNNER-NODOCKER"]
    assert "CIS Docker Benchmark v1.6.0: 2.1, 2.9" in next(
        c.find("system-out").text for c in cases if c.get("name") == "HOST-ENGINE-ROOTLESS")
    full = Path(os.environ.get("KOOI_REPORT_DIR") or tmp_path) / "verify-local.xml"
    full.write_text(FORMATS["junit"](full_report[1]))
    assert [c.get("name") for c in ET.parse(full).getroot().findall(".//testcase")] == [c.id for c in CHECKS]
    text = verify("--check", "HOST-RUNNER-NODOCKER", "--check", "IMG-NONROOT")
    assert text.returncode == 0
    assert "PASS HOST-RUNNER-NODOCKER" in text.stdout and "verify: 2 passed, 0 failed" in text.stdout


def _listening(path: Path) -> bool:
    """A daemon answers on the socket (a stale socket file left by a stopped one does not count)."""
    import socket
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True




def test_a_weakness_fails_its_check_and_the_exit_code(engine):
    user = engine["runner_user"]
    subprocess.run(["groupadd", "-f", "docker"], check=True)
    subprocess.run(["gpasswd", "-a", user, "docker"], check=True, capture_output=True)
    # Checks that run workloads or scan the pinned image's files (scope "workload",
    # "image"): no host setting changes what the running engine's workloads see, and they
    # are most of a catalogue run (the full catalogue runs above).
    host_checks = [a for c in CHECKS if c.scope == "host" for a in ("--check", c.id)]
    try:
        res = verify("--format", "json", *host_checks)
    finally:
        subprocess.run(["gpasswd", "-d", user, "docker"], check=True, capture_output=True)
    report = json.loads(res.stdout)
    assert res.returncode == 1 and not report["ok"]
    expected = {"HOST-RUNNER-NODOCKER"}
    sock = Path("/var/run/docker.sock")
    if sock.exists() and sock.group() == "docker" and _listening(sock):  # a rootful daemon here: now reachable too
        expected.add("HOST-ROOTFUL-SOCKET")
    assert {c["id"] for c in report["checks"] if c["status"] == "fail"} == expected


def test_cis_report_by_benchmark_item(engine):
    # The checks behind the items asserted here (the json and junit tests run them all).
    res = verify("--format", "cis", "--check", "HOST-ENGINE-ROOTLESS", "--check", "HOST-APPARMOR-PROFILES",
                 "--check", "HOST-APPARMOR-ENFORCE")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].endswith("CIS Docker Benchmark v1.6.0")
    item = next(line for line in lines if line.split()[1:2] == ["2.9"])
    assert item.startswith("PASS") and "HOST-ENGINE-ROOTLESS" in item
    apparmor = next(line for line in lines if line.split()[1:2] == ["5.1"])
    assert apparmor.startswith("PASS")  # the profiles on disk; enforcement n/a on this kernel
    assert lines[-1].startswith("cis: ") and " 0 fail," in lines[-1]


def test_unknown_check_ids_are_usage_errors(engine):
    res = verify("--check", "HOST-NOPE")
    assert res.returncode == 2 and "unknown check id" in res.stderr


def test_workload_probes_fail_when_the_workload_is_not_confined(engine):
    """Negative control for the in-workload checks: the self-test's own program, run
    with no confinement at all (as root on this host: a workflow that slipped past every
    policy), makes each ID-*/ESC-* check it feeds fail. Their passes on confined runs
    therefore come from the confinement, not from probes that cannot see anything."""
    import testinfra
    import yaml

    from kooi.checks import Context, run_all

    command = yaml.safe_load(Path("/etc/kooi/workflows/kooi-selftest.yml").read_text())["command"]
    res = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd="/")
    seen = dict(line[len("KOOI-SELFTEST "):].partition("=")[::2] for line in res.stdout.splitlines()
                if line.startswith("KOOI-SELFTEST "))
    assert res.returncode == 0 and seen.get("end") == "1", res.stdout[-2000:] + res.stderr[-2000:]
    host = testinfra.get_host("local://")
    ctx = Context.from_host(host)
    ctx.cache["selftest:runc"] = (seen, "")  # what checks.confinement caches per runtime
    ids = ["ID-NONROOT", "ID-CAPS", "ID-NNP", "ID-SECCOMP", "ID-ROOTFS-RO", "ID-NOSOCKET",
           "ESC-SYSCALLS", "ESC-FRESH-MOUNTS", "ESC-DEVICES"]
    got = {r.id: (r.status, r.evidence) for r in run_all(host, ctx, ids)}
    assert {i for i, (status, _) in got.items() if status != "fail"} == set(), got
    # io_uring and bpf reached the kernel: the probe tells a refused call from a taken one.
    assert "io_uring_setup" in got["ESC-SYSCALLS"][1] and "bpf" in got["ESC-SYSCALLS"][1], got["ESC-SYSCALLS"]


def _failing(*ids: str) -> tuple[set[str], dict]:
    res = verify("--format", "json", *[a for i in ids for a in ("--check", i)])
    report = json.loads(res.stdout)
    return {c["id"] for c in report["checks"] if c["status"] == "fail"}, \
        {c["id"]: c["evidence"] for c in report["checks"]}


def test_the_engine_without_kooi_seccomp_profile_fails_its_check(engine):
    """Negative control for ESC-ENGINE-SYSCALLS. This machine's docker.io is 20.10, whose
    built-in default seccomp profile lets io_uring through: site.yml gave the engine
    kooi's profile (daemon.json seccomp-profile), and the check passes with it. The same
    engine restarted without it lets a plain container's io_uring_setup reach the kernel,
    and exactly that check fails."""
    version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "docker.io"], capture_output=True,
                             text=True, check=True).stdout
    assert version.startswith("20.10."), f"this test expects Debian 12's docker.io 20.10, found {version}"
    conf = Path(engine["daemon_config"])
    original = conf.read_text()
    settings = json.loads(original)
    assert settings.get("seccomp-profile") == "/etc/kooi/seccomp/docker-20.10-kooi.json", settings
    failing, evidence = _failing("ESC-ENGINE-SYSCALLS", "ESC-USERNS-MAP")
    assert failing == set(), evidence
    assert "io_uring_setup EPERM" in evidence["ESC-ENGINE-SYSCALLS"], evidence
    del settings["seccomp-profile"]
    conf.write_text(json.dumps(settings))
    try:
        subprocess.run([KOOI, "engine", "stop"], check=True, capture_output=True)
        subprocess.run([KOOI, "engine", "start"], check=True, capture_output=True)
        failing, evidence = _failing("ESC-ENGINE-SYSCALLS", "ESC-USERNS-MAP")
    finally:
        conf.write_text(original)
        subprocess.run([KOOI, "engine", "stop"], check=True, capture_output=True)
        subprocess.run([KOOI, "engine", "start"], check=True, capture_output=True)
    assert failing == {"ESC-ENGINE-SYSCALLS"}, evidence
    assert "io_uring_setup" in evidence["ESC-ENGINE-SYSCALLS"] and "built in" in evidence["ESC-ENGINE-SYSCALLS"]


def test_a_leftover_run_container_fails_run_cleanup(engine):
    """Negative control for RUN-CLEANUP: a container a crashed kooi-runcheck run left
    behind (labelled like one) fails exactly that check; RUN-RESULT still passes."""
    pins = json.loads(Path("/etc/kooi/images.json").read_text())
    name = "kooi-runcheck-leftover"
    subprocess.run(as_runner(engine, "docker", "create", "--label", "org.kooi.managed=1",
                              "--label", "org.kooi.workflow=kooi-runcheck", "--name", name,
                              pins["runner"]["id"], "true"), check=True, capture_output=True)
    try:
        failing, evidence = _failing("RUN-CLEANUP", "RUN-RESULT")
    finally:
        subprocess.run(as_runner(engine, "docker", "rm", "-f", name), check=True, capture_output=True)
    assert failing == {"RUN-CLEANUP"}, evidence
    assert "earlier kooi-runcheck runs" in evidence["RUN-CLEANUP"]
    failing, evidence = _failing("RUN-CLEANUP")
    assert failing == set(), evidence
