"""Benchmark: a person's session (kooi session, docs/sessions.md) against `docker exec
-it` into a running container of the same pinned runner image, through real
pseudo-terminals, side by side and alternating (drift hits every variant alike):

- time to a prompt: a cold start (`kooi session start WF --attach`: the container is
  made), a warm attach (`kooi session attach` to a running session) and `docker exec -it
  C bash -l` into a running container;
- keystroke echo latency (one key written to the terminal until the terminal shows it):
  through `kooi session attach`, through the SSH entry (`ssh -tt` to the host's sshd
  with kooi's drop-in; --ssh-port and --ssh-key, where the operator provisioned it),
  through `docker exec -it` and through `docker exec -it tmux` into the same plain
  container (a terminal multiplexer behind docker exec, without kooi): median, p99 and
  the ratio to docker exec;
- memory of an idle session (proportional set size): its container's processes plus
  kooi's supervisor on the host, against the container with one `docker exec -it bash`.

Not a test: it asserts nothing. As root after the quick start:
    python3 bench/session.py [--rounds 5] [--keys 200] [--ssh-port 2299 --ssh-key FILE]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import statistics
import struct
import subprocess
import termios
import time
from pathlib import Path

KOOI = "/usr/local/bin/kooi"
WF, PERSON = "shell-session", "bench"
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78DEHMNZc]")
PROMPT = re.compile(r"kooi@[\w.-]+:\S*\$")
KEYS = "qzxwvjk"


class Term:
    """ARGV on a new pseudo-terminal (120x40), read and written as a person's terminal."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execvpe(argv[0], argv, {**os.environ, "TERM": "xterm-256color", **(env or {})})
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.seen = ""

    def until(self, found: object, timeout: float = 120.0) -> float:
        """Read until FOUND(text so far, escapes removed) is true; the time it took."""
        t0 = time.perf_counter()
        while not found(ANSI.sub("", self.seen)):  # type: ignore[operator]
            left = t0 + timeout - time.perf_counter()
            if left <= 0:
                raise TimeoutError(f"not on the terminal after {timeout} s: {ANSI.sub('', self.seen)[-400:]!r}")
            if select.select([self.fd], [], [], min(left, 0.5))[0]:
                try:
                    self.seen += os.read(self.fd, 65536).decode(errors="replace")
                except OSError:
                    raise TimeoutError("the terminal closed") from None
        return time.perf_counter() - t0

    def drain(self, quiet: float = 0.05) -> None:
        while select.select([self.fd], [], [], quiet)[0]:
            try:
                os.read(self.fd, 65536)
            except OSError:
                return
        self.seen = ""

    def key_echo(self, ch: str) -> float:
        self.drain()
        t0 = time.perf_counter()
        os.write(self.fd, ch.encode())
        self.until(lambda s: ch in s, timeout=10)
        return time.perf_counter() - t0

    def close(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)
        os.close(self.fd)


def echo_latencies(term: Term, n: int) -> list[float]:
    out = []
    for i in range(n):
        out.append(term.key_echo(KEYS[i % len(KEYS)]))
        if i % 40 == 39:
            os.write(term.fd, b"\x15")  # Ctrl-U: a short line
    return out


def pss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(p.name))
    out, todo = [], [pid]
    while todo:
        q = todo.pop()
        out.append(q)
        todo += kids.get(q, [])
    return out


def stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"median_ms": round(statistics.median(xs) * 1000, 2),
            "p99_ms": round(xs[min(len(xs) - 1, int(len(xs) * 0.99))] * 1000, 2), "n": len(xs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--keys", type=int, default=200)
    ap.add_argument("--ssh-port", type=int)
    ap.add_argument("--ssh-key")
    args = ap.parse_args()
    e = json.loads(Path("/etc/kooi/engine.json").read_text())
    image = json.loads(Path("/etc/kooi/images.json").read_text())["runner"]["id"]
    docker = ["runuser", "-u", e["runner_user"], "--", "env", f"DOCKER_HOST=unix://{e['socket']}",
              f"XDG_RUNTIME_DIR=/run/user/{e['runner_uid']}", "docker"]
    repo = Path(__file__).resolve().parent.parent
    project = Path(e["runner_home"]) / "kooi-bench-session"
    shutil.rmtree(project, ignore_errors=True)
    shutil.copytree(repo / "examples/python-example", project)
    subprocess.run(["chown", "-R", f"{e['runner_user']}:{e['runner_user']}", str(project)], check=True)
    name = "kooi-bench-exec"
    subprocess.run([*docker, "rm", "-f", name], capture_output=True)
    subprocess.run([*docker, "run", "-d", "--name", name, "--network", "none", "--cap-drop", "ALL",
                    "--security-opt", "no-new-privileges:true", image, "sleep", "infinity"], check=True,
                   capture_output=True)
    stop = [KOOI, "session", "stop", WF, "--person", PERSON]
    subprocess.run(stop, capture_output=True)
    prompt = PROMPT.search
    times: dict[str, list[float]] = {"cold start (kooi session start --attach)": [],
                                      "warm attach (kooi session attach)": [], "docker exec -it bash -l": []}
    try:
        for _ in range(args.rounds):
            t = Term([KOOI, "session", "start", WF, "--project", str(project), "--person", PERSON, "--attach"])
            times["cold start (kooi session start --attach)"].append(t.until(prompt))
            t.close()
            t = Term([KOOI, "session", "attach", WF, "--person", PERSON])
            times["warm attach (kooi session attach)"].append(t.until(prompt))
            t.close()
            t = Term([*docker, "exec", "-it", name, "bash", "-l"])
            times["docker exec -it bash -l"].append(t.until(prompt))
            t.close()
            subprocess.run(stop, capture_output=True, timeout=180)
        subprocess.run([KOOI, "session", "start", WF, "--project", str(project), "--person", PERSON],
                       check=True, capture_output=True)
        terms = {"kooi session attach": Term([KOOI, "session", "attach", WF, "--person", PERSON]),
                 "docker exec -it": Term([*docker, "exec", "-it", name, "bash", "-l"]),
                 # The same multiplexer without kooi: what tmux behind docker exec costs.
                 "docker exec -it tmux": Term([*docker, "exec", "-it", name, "tmux", "-f", "/dev/null", "new",
                                               "-A", "-s", "m", "bash -l"])}
        if args.ssh_port and args.ssh_key:
            terms["ssh (kooi's entry)"] = Term(["ssh", "-tt", "-i", args.ssh_key, "-p", str(args.ssh_port), "-o",
                                               "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no", "-o",
                                               "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                                               f"{e['runner_user']}@127.0.0.1"])
        for t in terms.values():
            t.until(prompt)
        lat: dict[str, list[float]] = {k: [] for k in terms}
        per = max(1, args.keys // 10)
        for _ in range(10):  # alternating blocks
            for k, t in terms.items():
                lat[k] += echo_latencies(t, per)
        terms.pop("docker exec -it tmux").close()  # its server out of the memory measure below
        subprocess.run([*docker, "exec", name, "tmux", "kill-server"], capture_output=True)
        time.sleep(5)  # idle
        container = subprocess.run([*docker, "ps", "-q", "--filter", "label=org.kooi.session=1", "--filter",
                                    f"label=org.kooi.person={PERSON}"], capture_output=True, text=True).stdout.split()

        def top(c: str) -> list[int]:
            """The container's processes: those in its init's pid namespace (docker top
            needs a cgroup, which the rootless engine on cgroup v1 gives none)."""
            init = subprocess.run([*docker, "inspect", "-f", "{{.State.Pid}}", c], capture_output=True,
                                  text=True).stdout.strip()
            if not init.isdigit():
                return []
            ns = os.readlink(f"/proc/{init}/ns/pid")
            out = []
            for q in Path("/proc").iterdir():
                try:
                    if q.name.isdigit() and os.readlink(q / "ns/pid") == ns:
                        out.append(int(q.name))
                except OSError:
                    pass
            return out

        supervisor = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                      and b"session\0start\0" + WF.encode() in (p / "cmdline").read_bytes()
                      and b"--attach" not in (p / "cmdline").read_bytes()]
        session_pids = top(container[0]) if container else []
        host_pids = [q for s in supervisor for q in descendants(s)]
        exec_cli = [t.pid for k, t in terms.items() if k == "docker exec -it"]
        memory = {"session: container processes (KiB PSS)": pss_kib(session_pids),
                  "session: kooi's supervisor and its children on the host (KiB PSS)": pss_kib(host_pids),
                  "docker exec -it bash: container processes (KiB PSS)": pss_kib(top(name)),
                  "docker exec -it bash: the docker CLI on the host (KiB PSS)": pss_kib(
                      [q for p in exec_cli for q in descendants(p)])}
        for t in terms.values():
            t.close()
    finally:
        subprocess.run(stop, capture_output=True, timeout=180)
        subprocess.run([KOOI, "session", "reset", WF, "--person", PERSON], capture_output=True, timeout=60)
        subprocess.run([*docker, "rm", "-f", name], capture_output=True)
        shutil.rmtree(project, ignore_errors=True)
    base = stats(lat["docker exec -it"])["median_ms"]
    report = {
        "rounds": args.rounds,
        "time_to_prompt_s": {k: round(statistics.median(v), 3) for k, v in times.items()},
        "keystroke_echo": {k: {**stats(v), "ratio_median_to_docker_exec": round(stats(v)["median_ms"] / base, 2)}
                           for k, v in lat.items()},
        "idle_memory": memory,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
