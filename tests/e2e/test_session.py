"""Sessions (kooi session, docs/sessions.md) end to end on this machine's rootless
engine, driven through real pseudo-terminals: the host's tmux runs `kooi session
attach` as a person would in a terminal, keys go in with send-keys and the screen comes
back with capture-pane. The session's own tmux (in the runner image) is what keeps the
work and the scrollback across detaching."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import KOOI
from .test_run import host, project, wfdir, write_wf  # noqa: F401 - fixtures

SOCKET = f"kooi-e2e-{os.getpid()}"  # the host tmux server these tests drive (their own)
SESSION_WF = {"session": {"idle_timeout": 600, "seed": {".config/kooi-seed.txt": "seeded once\n"}},
              "timeout": 900, "description": "e2e shell session"}


def kooi(wfdir: Path, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    res = subprocess.run([KOOI, "session", *args], capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "KOOI_WORKFLOW_DIR": str(wfdir)})
    if check:
        assert res.returncode == 0, f"kooi session {' '.join(args)}: {res.returncode}\n{res.stdout}\n{res.stderr}"
    return res


def tmux(*args: str, check: bool = True) -> str:
    return subprocess.run(["tmux", "-L", SOCKET, *args], capture_output=True, text=True, check=check).stdout


def screen(term: str) -> str:
    return tmux("capture-pane", "-p", "-J", "-S", "-300", "-t", term)


def wait_for(term: str, text: str, timeout: float = 60) -> str:
    end = time.monotonic() + timeout
    while True:
        shown = screen(term)
        if text in shown:
            return shown
        if time.monotonic() > end:
            raise AssertionError(f"{text!r} not on terminal {term} after {timeout} s:\n{shown}")
        time.sleep(0.3)


def terminal(name: str, command: str) -> str:
    """A new host terminal (120x40) running COMMAND; its name."""
    tmux("new-session", "-d", "-s", name, "-x", "120", "-y", "40", "-e", "TERM=xterm-256color",
         "-e", f"KOOI_WORKFLOW_DIR={os.environ.get('KOOI_WORKFLOW_DIR', '')}", command)
    return name


def typed(term: str, line: str) -> None:
    tmux("send-keys", "-t", term, "-l", line)
    tmux("send-keys", "-t", term, "Enter")


def result_of(host: dict, run_id: str, timeout: float = 60) -> dict:
    path = Path("/var/lib/kooi/runs/results") / f"{run_id}.json"
    end = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < end, f"no result {path}"
        time.sleep(0.5)
    doc: dict = json.loads(path.read_text())
    return doc


@pytest.fixture
def terminals():
    yield
    tmux("kill-server", check=False)


@pytest.fixture
def session_wf(wfdir):
    write_wf(wfdir, "shell", SESSION_WF)
    yield wfdir
    for person in ("alice", "bob"):
        subprocess.run([KOOI, "session", "stop", "shell", "--person", person], capture_output=True,
                       env={**os.environ, "KOOI_WORKFLOW_DIR": str(wfdir)}, timeout=180, check=False)
        subprocess.run([KOOI, "session", "reset", "shell", "--person", person], capture_output=True,
                       env={**os.environ, "KOOI_WORKFLOW_DIR": str(wfdir)}, timeout=60, check=False)


def started(wfdir: Path, proj: Path, person: str, name: str = "shell") -> str:
    res = kooi(wfdir, "start", name, "--project", str(proj), "--person", person)
    assert "runs (run " in res.stdout, res.stdout
    return res.stdout.split("runs (run ", 1)[1].split(",", 1)[0]


def test_a_terminal_session_keeps_its_work_across_detach_and_every_entry_is_caged(host, project, session_wf,
                                                                                    terminals):
    wfdir, proj = session_wf, project("python-example")
    run_id = started(wfdir, proj, "alice")
    t1 = terminal("t1", f"{KOOI} session attach shell --person alice")
    wait_for(t1, "[kooi shell]")  # the session's own status line: its tmux, not the host's
    typed(t1, "echo hello-$((6*7)); id -u; grep -E '^(Seccomp|Seccomp_filters|CapEff):' /proc/self/status; echo end-$((5*5))")
    shown = wait_for(t1, "end-25")
    assert "\n1000\n" in shown.replace("\r", ""), shown
    assert re.search(r"Seccomp_filters:\s+2\b", shown), shown  # the engine's profile and kooi's filter
    assert re.search(r"CapEff:\s+0000000000000000\b", shown), shown
    # Ctrl-C stops the foreground command, not the session.
    typed(t1, "sleep 1000")
    time.sleep(1)
    tmux("send-keys", "-t", t1, "C-c")
    typed(t1, "echo after-$((1+1))")
    wait_for(t1, "after-2")
    # A dropped connection: the host terminal goes, the session's work does not.
    typed(t1, "(for i in 1 2 3 4 5 6; do sleep 1; done; echo background-done) &")
    tmux("kill-session", "-t", t1)
    time.sleep(1)
    t2 = terminal("t2", f"{KOOI} session attach shell --person alice")
    shown = wait_for(t2, "background-done", timeout=30)
    assert "hello-42" in shown, shown  # the scrollback came back with it
    # Two terminals at once, one session: what one types the other shows.
    t3 = terminal("t3", f"{KOOI} session attach shell --person alice")
    wait_for(t3, "background-done")
    typed(t2, "echo shared-$((2*21))")
    wait_for(t3, "shared-42")
    # One command for scripts: through kooi's filter too, its exit code is the caller's.
    ex = kooi(wfdir, "exec", "shell", "--person", "alice", "--", "sh", "-c",
              "grep Seccomp_filters /proc/self/status; cat ~/.config/kooi-seed.txt; exit 7", check=False)
    assert ex.returncode == 7, ex.stdout + ex.stderr
    assert "Seccomp_filters:\t2" in ex.stdout and "seeded once" in ex.stdout, ex.stdout
    # Nothing else of the host: no engine socket, another person sees nothing.
    ex = kooi(wfdir, "exec", "shell", "--person", "alice", "--", "sh", "-c",
              "find / -xdev -type s 2>/dev/null | grep -v '^/tmp/tmux-1000/'; echo DOCKER_HOST=${DOCKER_HOST:-none}",
              check=False)
    assert ex.stdout == "DOCKER_HOST=none\n", ex.stdout  # no socket but its own terminal server's
    other = kooi(wfdir, "attach", "shell", "--person", "bob", check=False)
    assert other.returncode == 3 and "bob has no running session" in other.stderr, other.stderr
    listed = json.loads(kooi(wfdir, "list", "--person", "alice", "--json").stdout)
    assert [s["run_id"] for s in listed["sessions"] if s["running"]] == [run_id], listed
    # stop: the result, like a run's, says how it ended; the terminals are told.
    stopped = json.loads(kooi(wfdir, "stop", "shell", "--person", "alice", "--json").stdout)
    assert stopped["run_id"] == run_id and stopped["reason"] == "ok", stopped
    assert stopped["session"]["end"] == "stopped" and stopped["session"]["person"] == "alice", stopped
    assert stopped["project_guard"] is not None and stopped["exit_code"] == 0, stopped


def test_the_home_is_kept_across_stop_and_start_until_reset(host, project, session_wf):
    wfdir, proj = session_wf, project("python-example")

    def sh(script: str) -> subprocess.CompletedProcess:
        return kooi(wfdir, "exec", "shell", "--person", "alice", "--", "sh", "-c", script, check=False)

    run_id = started(wfdir, proj, "alice")
    assert sh("echo kept > ~/.history-of-alice && echo changed > ~/.config/kooi-seed.txt").returncode == 0
    # gc while the project's path names nothing (moved away for a moment): the session
    # lives, and gc leaves it alone (it took it for a dead run's once, CI stop 37).
    away = proj.with_name(proj.name + ".away")
    proj.rename(away)
    try:
        gc = subprocess.run([KOOI, "gc"], capture_output=True, text=True, check=True)
    finally:
        away.rename(proj)
    assert run_id not in gc.stdout, gc.stdout
    assert sh("true").returncode == 0
    again = kooi(wfdir, "start", "shell", "--project", str(proj), "--person", "alice", check=False)
    assert again.returncode == 75 and "running already" in again.stderr, again.stderr
    busy = kooi(wfdir, "reset", "shell", "--person", "alice", check=False)
    assert busy.returncode == 75, busy.stderr
    kooi(wfdir, "stop", "shell", "--person", "alice")
    started(wfdir, proj, "alice")
    out = sh("cat ~/.history-of-alice ~/.config/kooi-seed.txt").stdout
    assert out.split() == ["kept", "changed"], out  # kept, and the seed is not written over
    kooi(wfdir, "stop", "shell", "--person", "alice")
    assert "removed alice's kept home" in kooi(wfdir, "reset", "shell", "--person", "alice").stdout
    started(wfdir, proj, "alice")
    out = sh("ls -A ~; cat ~/.config/kooi-seed.txt").stdout
    assert ".history-of-alice" not in out and "seeded once" in out, out


def test_idle_and_lifetime_end_a_session_even_without_its_supervisor(host, project, wfdir):
    write_wf(wfdir, "idler", {"session": {"idle_timeout": 10}, "timeout": 600})
    write_wf(wfdir, "shortlived", {"session": {"idle_timeout": 600}, "timeout": 12})
    proj_a, proj_b = project("python-example"), project("python-example")
    try:
        _idle_and_lifetime(host, wfdir, proj_a, proj_b)
    finally:
        for name, person in (("idler", "alice"), ("shortlived", "bob")):
            kooi(wfdir, "stop", name, "--person", person, check=False, timeout=180)
            kooi(wfdir, "reset", name, "--person", person, check=False)


def _idle_and_lifetime(host: dict, wfdir: Path, proj_a: Path, proj_b: Path) -> None:
    idle_run = started(wfdir, proj_a, "alice", "idler")
    short_run = started(wfdir, proj_b, "bob", "shortlived")
    # kill -9 of bob's supervisor: the session's init keeps its deadline all the same.
    sup = subprocess.run(["pgrep", "-f", "-u", host["runner_user"], "kooi session start shortlived"],
                         capture_output=True, text=True, check=False).stdout.split()
    assert sup, "no supervisor of bob's session"
    for pid in sup:
        os.kill(int(pid), signal.SIGKILL)
    idle = result_of(host, idle_run, timeout=90)
    assert idle["session"]["end"] == "idle" and idle["reason"] == "ok", idle
    # Bob's container ends by its init (timeout 12 + grace 10); kooi gc then finishes it.
    cid = subprocess.run(["runuser", "-u", host["runner_user"], "--", "env", f"DOCKER_HOST=unix://{host['socket']}",
                          "docker", "ps", "-aq", "--filter", f"label=org.kooi.run={short_run}"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert cid, "bob's session container is gone before its deadline"
    end = time.monotonic() + 60
    while time.monotonic() < end:
        state = subprocess.run(["runuser", "-u", host["runner_user"], "--", "env",
                                f"DOCKER_HOST=unix://{host['socket']}", "docker", "inspect", "-f",
                                "{{.State.Running}} {{.State.ExitCode}}", cid[0]],
                               capture_output=True, text=True, check=True).stdout.split()
        if state[0] == "false":
            break
        time.sleep(1)
    assert state == ["false", "124"], state
    subprocess.run([KOOI, "gc"], capture_output=True, check=True)
    short = result_of(host, short_run, timeout=10)
    assert short["project_guard"] is not None, short
