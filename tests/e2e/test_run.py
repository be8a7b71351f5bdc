"""`kooi run` on this provisioned host: the real runner image on the real rootless
engine, real bubblewrap jails. Workflows for the tests live in a root-owned temporary
directory (KOOI_WORKFLOW_DIR); projects are owned by the runner user."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import jsonschema
import pytest
import yaml

from kooi.hoststate import paths
from kooi.run import filters
from kooi.run.project import RunLock

from .conftest import KOOI, REPO

RESULT_KEYS = {"workflow", "run_id", "project", "mode", "isolation", "workflow_file", "image",
               "image_digest", "start", "end", "duration_s", "exit_code", "reason", "message", "log",
               "limits", "limit", "warnings", "broker", "cleanup", "egress", "apparmor", "seccomp", "gvisor",
               "secrets", "project_guard", "refused", "session"}

SLEEPER = {"mode": "container", "command": ["sh", "-c", "sleep 600 & sleep 600"], "timeout": 3}
JAIL_PROBE = r"""
echo ok > /workspace/jail-wrote-this
for d in /etc /usr /usr/bin /home /root /var /run; do
  if ( : > "$d/kooi-jail-probe" ) 2>/dev/null; then echo "WROTE:$d"; fi
done
: > /tmp/kooi-jail-private-tmp && echo "TMP:ok"
for s in /run/user /var/run/docker.sock /run/docker.sock /run/kooi; do
  [ -e "$s" ] && echo "SEES:$s"
done
python3 - "$KOOI_TEST_PORT" <<'EOF'
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
    print("NET:connected")
except OSError as e:
    print("NET:refused", e.__class__.__name__)
EOF
echo "SESSION:$(ps -o sid= -p $$ 2>/dev/null || cat /proc/self/stat | cut -d' ' -f6)"
echo "IFACES:$(ls /sys/class/net 2>/dev/null | tr '\n' ' ')"
"""


@pytest.fixture(scope="module")
def host(engine):
    subprocess.run([KOOI, "engine", "start"], check=True, capture_output=True)
    pins = json.loads(Path("/etc/kooi/images.json").read_text())
    assert "runner" in pins, "site.yml did not pin a runner image"
    return {**engine, "pins": pins}


@pytest.fixture
def wfdir():
    d = Path(tempfile.mkdtemp(prefix="kooi-e2e-workflows-", dir="/var/tmp"))
    os.chmod(d, 0o755)
    shutil.copy(REPO / "examples/workflows/maven-example.yml", d / "maven-example.yml")
    shutil.copy(REPO / "examples/workflows/python-example.yml", d / "python-example.yml")
    yield d
    shutil.rmtree(d)


def write_wf(d: Path, name: str, data: dict) -> None:
    (d / f"{name}.yml").write_text(yaml.safe_dump(data))
    os.chmod(d / f"{name}.yml", 0o644)


@pytest.fixture
def project(host, request):
    """A copy of an example project, owned by the runner user."""
    base = Path(host["runner_home"]) / "kooi-e2e"
    base.mkdir(exist_ok=True)
    shutil.chown(base, host["runner_user"], host["runner_user"])
    made = []

    def make(example: str = "maven-example") -> Path:
        dest = base / f"{example}-{len(made)}-{os.getpid()}-{time.monotonic_ns()}"
        shutil.copytree(REPO / "examples" / example, dest, ignore=shutil.ignore_patterns("target"))
        subprocess.run(["chown", "-R", f"{host['runner_user']}:{host['runner_user']}", str(dest)], check=True)
        made.append(dest)
        return dest

    yield make
    for d in made:
        # The workload's files belong to the runner's sub-uid; the runner may delete
        # them (default ACL), which is what this proves on cleanup.
        subprocess.run(["runuser", "-u", host["runner_user"], "--", "rm", "-rf", str(d)], check=True)


def kooi_run(name: str, project: Path, wfdir: Path, *extra: str, user: str | None = None,
             timeout: float = 600) -> tuple[subprocess.CompletedProcess, dict]:
    out = Path(f"/var/tmp/kooi-e2e-{name.replace('/', '_')}-{time.monotonic_ns()}.json")
    cmd = [KOOI, "run", name, "--project", str(project), "--json", str(out), *extra]
    if user:
        cmd = ["runuser", "-u", user, "--", *cmd]
        out.touch()
        shutil.chown(out, user)
    env = {**os.environ, "KOOI_WORKFLOW_DIR": str(wfdir)}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    try:
        result = json.loads(out.read_text()) if out.stat().st_size else {}
    finally:
        out.unlink(missing_ok=True)
    return res, result


def runner_docker(host, *args: str) -> str:
    """The docker CLI as the runner, against the runner's engine; its stdout."""
    return subprocess.run(["runuser", "-u", host["runner_user"], "--", "env", f"DOCKER_HOST=unix://{host['socket']}",
                           "docker", *args], capture_output=True, text=True, check=True).stdout


def leftovers(host) -> list[str]:
    return runner_docker(host, "ps", "-a", "--filter", "label=org.kooi.managed=1", "--format", "{{.Names}}").split()


def tree_digest(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def test_maven_example_passes_with_a_complete_result(host, wfdir, project):
    proj = project()
    res, result = kooi_run("maven-example", proj, wfdir)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    assert "BUILD SUCCESS" in res.stdout and "Tests run: 7, Failures: 0" in res.stdout
    assert set(result) == RESULT_KEYS and result["session"] is None  # a run, not a session
    jsonschema.validate(result, json.loads((REPO / "docs/run-result.schema.json").read_text()))
    assert result["exit_code"] == 0 and result["reason"] == "ok"
    assert result["mode"] == "container" and result["isolation"] == "rootless"
    # This machine's kernel has no AppArmor: the result says so instead of claiming a profile.
    assert result["apparmor"]["applied"] is False and result["apparmor"]["profile"] is None
    assert "kernel has no AppArmor" in result["apparmor"]["note"]
    assert result["image_digest"] == host["pins"]["runner"]["id"]
    assert result["project"] == str(proj) and result["start"] < result["end"]
    assert "BUILD SUCCESS" in Path(result["log"]).read_text()
    assert (proj / "target" / "maven-example-1.0.0.jar").exists()
    assert leftovers(host) == []


def test_a_failing_test_fails_the_run(host, wfdir, project):
    proj = project()
    test = proj / "src/test/java/nl/kooi/example/BrokenTest.java"
    test.write_text("package nl.kooi.example;\nimport org.junit.jupiter.api.Test;\n"
                    "import static org.junit.jupiter.api.Assertions.assertEquals;\n"
                    "class BrokenTest { @Test void broken() { assertEquals(1, 2); } }\n")
    shutil.chown(test, host["runner_user"], host["runner_user"])
    res, result = kooi_run("maven-example", proj, wfdir)
    assert res.returncode != 0 and res.returncode == result["exit_code"]
    assert result["reason"] == "failed"
    assert "BrokenTest" in res.stdout and "BUILD FAILURE" in res.stdout
    assert leftovers(host) == []


def test_timeout_kills_the_whole_workload(host, wfdir, project):
    write_wf(wfdir, "sleeper", SLEEPER)
    t0 = time.monotonic()
    res, result = kooi_run("sleeper", project("python-example"), wfdir)
    assert res.returncode == 124, res.stderr
    assert result["reason"] == "timeout" and "timeout of 3 s" in result["message"]
    jsonschema.validate(result, json.loads((REPO / "docs/run-result.schema.json").read_text()))
    assert time.monotonic() - t0 < 60
    assert leftovers(host) == []


def test_a_killed_supervisor_does_not_let_the_workload_outlive_its_deadline(host, wfdir, project):
    """kill -9 of kooi run (the OOM killer, a pipeline cancelling its job): the
    container's init, kooi's python3 as pid 1, still ends it at the run's timeout plus
    the grace; the next run of the workflow on the project removes what it left."""
    write_wf(wfdir, "orphan", {**SLEEPER, "timeout": 3})
    env = {**os.environ, "KOOI_WORKFLOW_DIR": str(wfdir)}
    proj = project("python-example")
    p = subprocess.Popen([KOOI, "run", "orphan", "--project", str(proj)], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    names: list[str] = []
    until = time.monotonic() + 120
    while not names and time.monotonic() < until and p.poll() is None:
        names = runner_docker(host, "ps", "--filter", "label=org.kooi.workflow=orphan", "--format", "{{.Names}}").split()
        time.sleep(0.2)
    assert names, f"the workload never started (kooi run: {p.poll()})"
    p.kill()
    p.wait()
    killed = time.monotonic()
    # Hold the dead run's lock while watching its container: the hourly `kooi gc` (the
    # runner's crontab on this machine) would otherwise remove it first when the hour
    # comes round, and this is about the init's deadline, not gc's.
    hold = RunLock(Path(paths.RUNS), "orphan", proj)
    hold.acquire(0)
    state: list[str] = []
    try:
        while time.monotonic() - killed < 3 + filters.DEADLINE_GRACE + 60:
            state = runner_docker(host, "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", names[0]).split()
            if state[0] != "running":
                break
            time.sleep(0.5)
    finally:
        hold.release()
    took = time.monotonic() - killed
    assert state == ["exited", "124"], state
    # Not kooi run (dead), the init: it ended past kooi's own timeout.
    assert took > 3, took
    # The next run of the workflow on the project removes what the dead one left.
    res, result = kooi_run("orphan", proj, wfdir)
    assert res.returncode == 124, res.stdout[-2000:] + res.stderr
    assert any(names[0] in w and "whose kooi run died" in w for w in result["warnings"]), result["warnings"]
    assert result["limits"]["deadline"] == {"requested": 3 + filters.DEADLINE_GRACE, "enforced": True,
                                            "by": "the container's init"}, result["limits"]
    assert leftovers(host) == []


def test_concurrent_runs_do_not_collide(host, wfdir, project):
    write_wf(wfdir, "nap", {"command": ["sh", "-c", "sleep 4; echo napped > /workspace/nap-$HOSTNAME"],
                            "timeout": 60})
    same = project("python-example")
    other = project("python-example")
    results: dict[str, tuple] = {}

    def go(key: str, proj: Path, delay: float) -> None:
        time.sleep(delay)
        results[key] = kooi_run("nap", proj, wfdir)

    threads = [threading.Thread(target=go, args=a) for a in
               (("a", same, 0), ("b", same, 1.5), ("c", other, 0.5))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (ra, ja), (rb, jb), (rc, jc) = results["a"], results["b"], results["c"]
    assert ra.returncode == 0 and ja["reason"] == "ok", ra.stderr
    assert rb.returncode == 75 and jb["reason"] == "busy", rb.stderr
    assert rc.returncode == 0 and jc["reason"] == "ok", rc.stderr
    assert len({ja["run_id"], jc["run_id"]}) == 2
    assert (other / "nap-nap").exists() and (same / "nap-nap").exists()
    assert leftovers(host) == []


def test_busy_run_waits_when_asked(host, wfdir, project):
    write_wf(wfdir, "nap", {"command": ["sleep", "3"], "timeout": 60})
    proj = project("python-example")
    first = threading.Thread(target=kooi_run, args=("nap", proj, wfdir))
    first.start()
    time.sleep(1.0)
    res, result = kooi_run("nap", proj, wfdir, "--wait", "30")
    first.join()
    assert res.returncode == 0 and result["reason"] == "ok", res.stderr


@pytest.fixture
def loopback_listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    yield srv.getsockname()[1]
    srv.close()


def test_jail_writes_only_the_project_and_has_no_network_or_socket(host, wfdir, project, loopback_listener):
    write_wf(wfdir, "jail-probe", {"mode": "jail", "command": ["sh", "-c", JAIL_PROBE],
                                   "environment": {"KOOI_TEST_PORT": str(loopback_listener)}, "timeout": 60})
    Path("/tmp/kooi-jail-private-tmp").unlink(missing_ok=True)
    proj = project("python-example")
    res, result = kooi_run("jail-probe", proj, wfdir)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert (proj / "jail-wrote-this").read_text() == "ok\n"
    assert "WROTE:" not in out, out
    assert "TMP:ok" in out and not Path("/tmp/kooi-jail-private-tmp").exists()
    assert not any(Path(d, "kooi-jail-probe").exists() for d in ("/", "/etc", "/usr", "/home", "/var"))
    assert "SEES:" not in out, out
    assert "NET:refused" in out, out
    assert result["isolation"] == "jail" and result["image"] is None


SYSCALL_PROBE = r"""
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long
def call(nr, *a):
    r = libc.syscall(nr, *[ctypes.c_long(x) for x in a]); e = ctypes.get_errno()
    return "ok" if r >= 0 else errno.errorcode.get(e, str(e))
# x86_64: io_uring_setup(1, NULL), bpf(BPF_PROG_LOAD, NULL, 0), userfaultfd(0), unshare(CLONE_NEWUSER)
print("SYSCALLS", call(425, 1, 0), call(321, 5, 0, 0), call(323, 0), call(272, 0x10000000))
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probe uses x86_64 system call numbers")
def test_kooi_seccomp_filter_confines_jails_and_runner_containers(host, wfdir, project):
    """io_uring answers kooi's ENOSYS in a jail and in a runner container; the control
    (the same probe as the runner user outside any jail) shows the call reaching the
    kernel (EFAULT for its NULL argument), and the same image started on the same engine
    without kooi's entrypoint gets the engine's default profile's EPERM: Docker 25+
    refuses io_uring itself, and on this machine's docker.io 20.10 kooi's engine profile
    does (its negative control: tests/e2e/test_verify.py)."""
    proj = project("python-example")
    for mode in ("jail", "container"):
        wf_ = {"mode": mode, "command": ["python3", "-I", "-c", SYSCALL_PROBE], "timeout": 120}
        if mode == "container":
            wf_["image"] = "runner"
        write_wf(wfdir, f"probe-{mode}", wf_)
        res, result = kooi_run(f"probe-{mode}", proj, wfdir)
        assert res.returncode == 0, res.stdout + res.stderr
        line = next(x for x in res.stdout.splitlines() if x.startswith("SYSCALLS "))
        assert line.split()[1:] == ["ENOSYS", "EPERM", "EPERM", "EPERM"], (mode, line)
        assert result["seccomp"]["kooi"] is True, result["seccomp"]
    plain = subprocess.run(["runuser", "-u", host["runner_user"], "--", "python3", "-I", "-c", SYSCALL_PROBE],
                           capture_output=True, text=True, check=True)
    assert plain.stdout.split()[1] == "EFAULT", plain.stdout
    image = host["pins"]["runner"]["id"]
    bare = subprocess.run(["runuser", "-u", host["runner_user"], "--", "env", f"DOCKER_HOST=unix://{host['socket']}",
                           "docker", "run", "--rm", "--network", "none", "--cap-drop", "ALL", image,
                           "python3", "-I", "-c", SYSCALL_PROBE], capture_output=True, text=True, timeout=120)
    assert bare.returncode == 0, bare.stderr
    assert bare.stdout.split()[1] == "EPERM", bare.stdout


PTRACE_PROBE = r"""
import ctypes, errno, os, time
libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long
child = os.fork()
if child == 0:
    time.sleep(30); os._exit(0)
r = libc.syscall(101, ctypes.c_long(16), ctypes.c_long(child), ctypes.c_long(0), ctypes.c_long(0))  # PTRACE_ATTACH
print("PTRACE", "ok" if r == 0 else errno.errorcode.get(ctypes.get_errno()), flush=True)
os.kill(child, 9); os.waitpid(child, 0)
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probe uses x86_64 system call numbers")
def test_ptrace_is_refused_unless_a_workflow_opts_in_for_a_debugger(host, wfdir, project):
    """Same-uid ptrace (this kernel has no Yama): refused by kooi's filter in jails and
    containers; `debugger: true` lifts it in a jail. In containers the engine's own
    profile refuses it too on this machine's docker.io 20.10 (kooi's profile), so a
    debugger workflow is refused up front there instead of failing inside."""
    proj = project("python-example")
    for mode, debugger, want in (("jail", False, "EPERM"), ("jail", True, "ok"), ("container", False, "EPERM")):
        wf_ = {"mode": mode, "command": ["python3", "-I", "-c", PTRACE_PROBE], "timeout": 60, "debugger": debugger}
        write_wf(wfdir, f"ptrace-{mode}-{debugger}".lower(), wf_)
        res, result = kooi_run(f"ptrace-{mode}-{debugger}".lower(), proj, wfdir)
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"PTRACE {want}" in res.stdout, (mode, debugger, res.stdout[-1000:])
    write_wf(wfdir, "ptrace-container-true", {"command": ["true"], "timeout": 60, "debugger": True})
    res, result = kooi_run("ptrace-container-true", proj, wfdir)
    profile = json.loads(Path(host["daemon_config"]).read_text()).get("seccomp-profile")
    if profile:  # kooi's engine profile refuses ptrace to every container
        assert res.returncode == 126 and result["reason"] == "refused", res.stderr
        assert "kooi_engine_seccomp: engine" in result["message"]
    else:
        assert res.returncode == 0 and "ptrace allowed (debugger: true)" in result["seccomp"]["note"]


def test_jail_timeout_kills_every_jailed_process(host, wfdir, project):
    marker = f"kooi-jail-sleep-{os.getpid()}"
    write_wf(wfdir, "jail-sleeper", {"mode": "jail", "timeout": 2,
                                     "command": ["sh", "-c", f"bash -c 'exec -a {marker}-bg sleep 600' & "
                                                                 f"bash -c 'exec -a {marker} sleep 601'"]})
    res, result = kooi_run("jail-sleeper", project("python-example"), wfdir)
    assert res.returncode == 124 and result["reason"] == "timeout"
    time.sleep(0.5)
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    # Only the jail's own processes count (other tests' containers also run `sleep`).
    assert marker not in ps, ps


def test_unknown_and_malformed_workflows_are_clear_errors_that_change_nothing(host, wfdir, project):
    proj = project("python-example")
    before = tree_digest(proj)
    res, result = kooi_run("no-such-flow", proj, wfdir)
    assert res.returncode == 2 and result["reason"] == "invalid"
    assert "no workflow 'no-such-flow'" in res.stderr and "maven-example" in res.stderr
    (wfdir / "broken.yml").write_text("command: [true]\ncomand: [typo]\nlimits: {memory: lots}\n")
    os.chmod(wfdir / "broken.yml", 0o644)
    res, result = kooi_run("broken", proj, wfdir)
    assert res.returncode == 2
    assert f"{wfdir}/broken.yml: unknown key 'comand'" in res.stderr
    assert "key 'limits.memory'" in res.stderr
    res, _ = kooi_run("../etc/passwd", proj, wfdir)
    assert res.returncode == 2 and "not a workflow name" in res.stderr
    os.chmod(wfdir / "broken.yml", 0o666)
    res, _ = kooi_run("broken", proj, wfdir)
    assert res.returncode == 2 and "writable by group or others" in res.stderr
    assert tree_digest(proj) == before
    assert leftovers(host) == []


def test_workflow_below_its_minimum_isolation_is_refused(host, wfdir, project):
    write_wf(wfdir, "strict-jail", {"mode": "jail", "command": ["true"], "min_isolation": "rootless"})
    res, result = kooi_run("strict-jail", project("python-example"), wfdir)
    assert res.returncode == 126 and result["reason"] == "refused"
    assert "requires isolation rootless" in res.stderr


def test_a_gvisor_workflow_is_refused_where_no_engine_runs_runsc(host, wfdir, project):
    """This host's engine is rootless: no runsc (google/gvisor#12575); a jail never is
    gVisor. Refused with what provides the level, before anything starts."""
    proj = project("python-example")
    before = tree_digest(proj)
    write_wf(wfdir, "hostile", {"mode": "container", "image": "runner", "command": ["true"],
                                "min_isolation": "gvisor"})
    write_wf(wfdir, "hostile-jail", {"mode": "jail", "command": ["true"], "min_isolation": "gvisor"})
    res, result = kooi_run("hostile", proj, wfdir)
    assert res.returncode == 126 and result["reason"] == "refused" and result["isolation"] == host["mode"]
    assert "requires isolation gvisor" in res.stderr and "kooi_gvisor_enabled: true" in res.stderr, res.stderr
    res, result = kooi_run("hostile-jail", proj, wfdir)
    assert res.returncode == 126 and result["isolation"] == "jail"
    assert "a jail shares the host's kernel and never provides gvisor" in res.stderr, res.stderr
    assert tree_digest(proj) == before
    assert leftovers(host) == []


def test_only_root_or_the_runner_may_run(host, wfdir, project):
    res, result = kooi_run("python-example", project("python-example"), wfdir, user="nobody")
    assert res.returncode == 126 and "runs as the runner user" in res.stderr


def test_runner_user_runs_directly(host, wfdir, project):
    res, result = kooi_run("python-example", project("python-example"), wfdir, user=host["runner_user"])
    assert res.returncode == 0 and result["reason"] == "ok", res.stdout + res.stderr


def test_missing_engine_is_a_clear_error_that_changes_nothing(host, wfdir, project):
    proj = project()
    before = tree_digest(proj)
    subprocess.run([KOOI, "engine", "stop"], check=True, capture_output=True)
    try:
        res, result = kooi_run("maven-example", proj, wfdir)
    finally:
        subprocess.run([KOOI, "engine", "start"], check=True, capture_output=True)
    assert res.returncode == 125 and result["reason"] == "unavailable"
    assert "kooi engine start" in res.stderr
    assert tree_digest(proj) == before


def test_engine_status_says_when_the_running_daemon_differs_from_its_configuration(host, tmp_path):
    """The same daemon against a configuration it does not run with (another storage
    driver, an authorization plugin): drift lines and exit 1; against its own: exit 0."""
    cfg = json.loads(Path("/etc/kooi/engine.json").read_text())
    daemon = json.loads(Path(cfg["daemon_config"]).read_text())
    (tmp_path / "daemon.json").write_text(json.dumps({**daemon, "storage-driver": "vfs",
                                                      "authorization-plugins": ["kooi-authz"]}))
    (tmp_path / "engine.json").write_text(json.dumps({**cfg, "daemon_config": str(tmp_path / "daemon.json")}))
    ok = subprocess.run([KOOI, "engine", "status"], capture_output=True, text=True)
    assert ok.returncode == 0 and "drift" not in ok.stdout, ok.stdout + ok.stderr
    bad = subprocess.run([KOOI, "engine", "status", "--config", str(tmp_path / "engine.json")],
                         capture_output=True, text=True)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert f"drift: storage driver: configured vfs, running {daemon.get('storage-driver', 'overlay2')}" in bad.stdout
    assert "drift: authorization plugins: configured ['kooi-authz'], running none" in bad.stdout
    assert "Traceback" not in bad.stderr


def test_gc_removes_what_a_dead_run_left(host):
    env = ["runuser", "-u", host["runner_user"], "--", "env", f"DOCKER_HOST=unix://{host['socket']}", "docker"]
    subprocess.run([*env, "create", "--label", "org.kooi.managed=1", "--label", "org.kooi.workflow=ghost",
                    "--label", "org.kooi.project=/nonexistent", "--name", "kooi-ghost-run",
                    host["pins"]["runner"]["id"], "true"], check=True, capture_output=True)
    dry = subprocess.run([KOOI, "gc", "--dry-run"], capture_output=True, text=True, check=True)
    assert "would remove container kooi-ghost-run" in dry.stdout
    assert "kooi-ghost-run" in leftovers(host)
    res = subprocess.run([KOOI, "gc"], capture_output=True, text=True, check=True)
    assert "removed container kooi-ghost-run" in res.stdout
    assert leftovers(host) == []


def _run_logs(host) -> set[str]:
    return {p.name for p in Path("/var/lib/kooi/runs/logs").glob("*.log")}


def test_an_unwritable_json_destination_is_refused_before_anything_runs(host, wfdir, project):
    """Issue 13: the result file is opened first, as the caller; exit 2 naming it."""
    proj = project("python-example")
    before, logs = tree_digest(proj), _run_logs(host)
    for dest in ("/nonexistent/dir/r.json", str(proj)):
        res = subprocess.run([KOOI, "run", "python-example", "--project", str(proj), "--json", dest],
                             capture_output=True, text=True, env={**os.environ, "KOOI_WORKFLOW_DIR": str(wfdir)},
                             timeout=60)
        assert res.returncode == 2, (dest, res.stdout, res.stderr)
        assert f"--json {dest}: " in res.stderr and ("cannot write there" in res.stderr or "is a directory" in res.stderr)
        assert res.stdout == ""  # the workload never started
    assert tree_digest(proj) == before and _run_logs(host) == logs
    # Root's own directory, which the runner cannot write: the caller opens it, so it works.
    out = Path(tempfile.mkdtemp(prefix="kooi-e2e-rootonly-", dir="/var/tmp")) / "r.json"
    os.chmod(out.parent, 0o700)
    try:
        res = subprocess.run([KOOI, "run", "python-example", "--project", str(proj), "--json", str(out)],
                             capture_output=True, text=True, env={**os.environ, "KOOI_WORKFLOW_DIR": str(wfdir)},
                             timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        assert json.loads(out.read_text())["reason"] == "ok"
    finally:
        shutil.rmtree(out.parent)


@pytest.fixture(scope="module")
def private_venv(host):
    """kooi installed into a venv in a root-only directory (like a pyenv or conda Python, or
    a checkout, under /root): nothing there is readable by the runner kooi run drops to."""
    d = Path(tempfile.mkdtemp(prefix="kooi-e2e-private-", dir="/var/tmp"))
    os.chmod(d, 0o700)
    venv = d / "venv"
    # Debian's docker and yaml, kooi copied in (what `pip install` of the checkout puts there).
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
                   check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    shutil.copytree(REPO / "shim/kooi", site / "kooi")
    (venv / "bin/kooi").write_text(f"#!{venv}/bin/python3\nimport sys\nfrom kooi.cli import main\nsys.exit(main())\n")
    os.chmod(venv / "bin/kooi", 0o755)
    yield venv
    shutil.rmtree(d)


def test_kooi_from_a_venv_the_runner_cannot_read_is_refused_up_front(host, wfdir, project, private_venv):
    """Issue 13: root's kooi drops to the runner and imports after the drop; a Python the
    runner cannot read would fail mid-run (ModuleNotFoundError), so it is refused first."""
    proj = project("python-example")
    before, logs = tree_digest(proj), _run_logs(host)
    for name in ("python-example", "maven-example"):  # jail and container
        res = subprocess.run([str(private_venv / "bin/kooi"), "run", name, "--project", str(proj)],
                             capture_output=True, text=True, env={**os.environ, "KOOI_WORKFLOW_DIR": str(wfdir)},
                             timeout=120)
        assert res.returncode == 125, res.stdout + res.stderr
        assert f"drops to the runner user {host['runner_user']}, who cannot read" in res.stderr
        assert str(private_venv.parent) in res.stderr and "/usr/local/bin/kooi" in res.stderr
    assert tree_digest(proj) == before and _run_logs(host) == logs
    assert leftovers(host) == []
