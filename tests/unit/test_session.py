"""How a session's container differs from a run's (run.session), and how its end is
recorded (run.execute): without an engine. tests/e2e/test_session.py drives real ones."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kooi import labels
from kooi.run.context import SessionRun
from kooi.run.errors import Result, RunError
from kooi.run.execute import _session_end
from kooi.run.session import KEEPER, SEED_ENV, shape, tmux_conf
from kooi.workflow import Session, Workflow

IMG = {"Config": {"Env": ["HOME=/home/kooi", "PATH=/usr/bin"], "User": "1000:1000"}}


def body() -> dict:
    return {"Cmd": ["x"], "Labels": {labels.RUN: "r"}, "Env": ["A=1"],
            "HostConfig": {"Tmpfs": {"/tmp": "rw", "/home/kooi": "rw"}, "Mounts": []}}


def wf(**kw) -> Workflow:
    return Workflow(name="shell", path=Path("/etc/kooi/workflows/shell.yml"), command=(),
                    session=Session(shell=("bash", "-l"), idle_timeout=60, seed=((".a/b", "x'y"),)), **kw)


def test_the_kept_home_replaces_the_home_tmpfs_and_the_terminal_server_is_the_workload():
    b = body()
    shape(b, wf(), SessionRun("alice", "kooi-home.alice.shell"), IMG)
    assert "/home/kooi" not in b["HostConfig"]["Tmpfs"] and "/tmp" in b["HostConfig"]["Tmpfs"]
    assert {"Type": "volume", "Source": "kooi-home.alice.shell", "Target": "/home/kooi",
            "ReadOnly": False} in b["HostConfig"]["Mounts"]
    assert b["Cmd"] == ["python3", "-I", "-S", "-c", KEEPER]
    assert b["Labels"][labels.SESSION] == "1" and b["Labels"][labels.PERSON] == "alice"
    env = dict(e.split("=", 1) for e in b["Env"])
    assert json.loads(env[SEED_ENV]) == {".a/b": "x'y"} and env["A"] == "1"


def test_an_image_without_a_home_of_its_own_cannot_keep_one():
    with pytest.raises(RunError, match="no home of its own"):
        shape(body(), wf(), SessionRun("alice", "h"), {"Config": {"Env": ["HOME=/tmp"]}})


def test_the_shell_reaches_tmux_quoted():
    w = Workflow(name="s", path=Path("/x"), command=(),
                 session=Session(shell=("sh", "-c", "echo 'a b'; exec bash"), idle_timeout=60))
    line = next(x for x in tmux_conf(w).splitlines() if x.startswith("set -g default-command"))
    import shlex

    value = shlex.split(line)[3]  # tmux's quoting is the shell's for these
    assert value.startswith("exec ") and shlex.split(value[5:]) == list(w.session.shell)


@pytest.mark.parametrize("reason,code,end,want_reason,want_end", [
    ("ok", 0, "stopped", "ok", "stopped"), ("failed", 143, "stopped", "ok", "stopped"),
    ("failed", 137, "idle", "ok", "idle"), ("failed", 1, "running", "failed", "ended"),
    ("timeout", 124, "running", "timeout", "lifetime"), ("interrupted", 143, "running", "interrupted", "interrupted"),
    ("unavailable", 125, "running", "unavailable", "failed")])
def test_how_a_session_ended_is_recorded(reason, code, end, want_reason, want_end):
    res = Result(workflow="shell", run_id="r", project="/p", reason=reason, exit_code=code)
    res.session = {"person": "alice", "workflow": "shell", "home": "h", "idle_timeout": 60, "lifetime": 900,
                   "end": end}
    _session_end(res)
    assert (res.reason, res.session["end"]) == (want_reason, want_end)
    assert res.exit_code == (0 if want_end in ("stopped", "idle") else code)



def test_idle_cpu_counts_the_containers_processes_only():
    """The init's idle measure is the CPU of its own pid namespace's processes. On a host
    whose cgroup files are the machine's (cgroup v1, or v2 without a cgroup of the
    container's own: the rootless engine without delegated controllers) the cgroup's
    account counted every process of the host, and a session on a busy machine never
    went idle (CI, stop 37). A busy process outside the namespace must not count."""
    import os
    import shutil
    import subprocess
    import sys

    from kooi import seccomp

    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.fail("needs root and unshare (util-linux): a new pid namespace with its own /proc")
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 4\nwhile time.time() < end: pass"])
    try:
        probe = ("import sys, time\nsys.path.insert(0, %r)\nfrom kooi import seccomp\n"
                 "a = seccomp.cpu_seconds(); time.sleep(1.5); print(seccomp.cpu_seconds() - a)"
                 % str(Path(seccomp.__file__).parent.parent))
        out = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", probe],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    finally:
        busy.kill()
        busy.wait()
    assert float(out) < 0.2, f"{out.strip()} CPU seconds counted in 1.5 s beside a busy process outside"


@pytest.mark.skipif(os.geteuid() != 0, reason="root's start makes the directory the runner's")
def test_roots_first_start_leaves_the_session_directory_the_runners(tmp_path):
    """The e2e agent session test on a fresh host: root's first `kooi session start`
    made /var/lib/kooi/runs/sessions root's, and every `kooi session stop` (as the
    runner) then failed to write its stop mark there. Made the runner's, or given back;
    a link there is not followed."""
    import fcntl

    from kooi.sessions import _start_lock

    for case in ("missing", "roots"):
        parent = tmp_path / case / "sessions"
        parent.parent.mkdir()
        if case == "roots":
            parent.mkdir()
        fd = _start_lock(parent / "alice.x.start-lock", 1, 4242, 4243)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        assert (parent.stat().st_uid, parent.stat().st_gid) == (4242, 4243), case
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "link").mkdir()
    (tmp_path / "link/sessions").symlink_to(victim)
    os.close(_start_lock(tmp_path / "link/sessions/alice.x.start-lock", 1, 4242, 4243))
    assert victim.stat().st_uid == 0


def test_review_45_reset_removes_only_the_persons_own_home_of_that_workflow(monkeypatch, tmp_path):
    """Review 45: `kooi-home.alice.x.y` is alice's home of x.y and alice.x's of y; reset
    checked only that it was a home, so `reset y --person alice.x` removed alice's."""
    from kooi import labels, sessions

    deleted = []

    class Engine:
        def request(self, method, path, query=None):
            if method == "GET" and path.startswith("/volumes/"):
                return {"Labels": labels.home_labels("alice", "x.y")}
            if method == "GET":
                return []
            deleted.append(path)
            return None

    monkeypatch.setattr(sessions, "_client", lambda cfg: Engine())
    cfg = _lock_cfg(monkeypatch, tmp_path)
    with pytest.raises(sessions.SessionError, match="not alice.x's kept home of y"):
        sessions.reset(cfg, sessions.Caller("alice.x", False), "y")
    assert deleted == []
    assert "removed alice's kept home for x.y" in sessions.reset(cfg, sessions.Caller("alice", False), "x.y")


def _lock_cfg(monkeypatch, tmp_path):
    """Where sessions take their start locks (the run state), and whose they are."""
    import types

    import kooi.run
    monkeypatch.setattr(kooi.run, "RUN_DIR", tmp_path)
    return types.SimpleNamespace(runner_uid=os.getuid(), runner_gid=os.getgid())


def test_review_48_reset_waits_for_a_start_in_progress(monkeypatch, tmp_path):
    """Review 48 (medium): a reset between a start's look at the home and its container's
    create removed the home, the engine made an unlabelled one in its place, and every
    later start and reset of the person's session refused it. Reset takes the start lock:
    while a start holds it, reset waits, then refuses without touching the engine."""
    import fcntl

    from kooi import sessions

    touched = []
    monkeypatch.setattr(sessions, "_client", lambda cfg: touched.append(cfg))
    monkeypatch.setattr(sessions, "find", lambda *a, **k: touched.append(a) or [])
    cfg = _lock_cfg(monkeypatch, tmp_path)
    held = sessions._start_lock(sessions.start_lock_path(tmp_path, "alice", "x"), 1, os.getuid(), os.getgid())
    try:
        with pytest.raises(sessions.SessionError, match="another start of this session holds"):
            sessions.reset(cfg, sessions.Caller("alice", False), "x", timeout=0.3)
        assert touched == []
    finally:
        fcntl.flock(held, fcntl.LOCK_UN)
        os.close(held)


def test_review_49_start_locks_of_two_persons_never_share_a_name(tmp_path):
    """Review 49: `alice.x`'s lock of workflow `y` and `alice`'s of `x.y` were one file."""
    from kooi import sessions

    assert sessions.start_lock_path(tmp_path, "alice.x", "y") != sessions.start_lock_path(tmp_path, "alice", "x.y")
