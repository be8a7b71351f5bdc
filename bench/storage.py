"""Benchmark: the rootless engine's storage drivers side by side: kernel overlay
(overlay2), fuse-overlayfs and vfs. Not a test: it asserts nothing.

For each driver a private rootless dockerd runs as the runner user (its own data root,
runtime directory and socket; the runner's engine is not touched). Rounds alternate
the drivers (so drift hits each), after one warm-up round:
  load   `docker load` of an image archive (the extract half of a pull; no registry
         is reachable here): the Testcontainers PostgreSQL image kooi-postgres:17,
         saved from the runner's engine
  ready  `docker run -d` of that image until PostgreSQL accepts connections (its
         initdb writes a fresh cluster through the storage driver: the start a
         Testcontainers test waits for)
then the container and image are removed. Reports medians and ratios against overlay2.

fuse-overlayfs needs the package and /dev/fuse for the runner: the benchmark grants
the runner an ACL on /dev/fuse for its duration and removes it afterwards (role fuse
keeps /dev/fuse root-only unless the operator opts in).

Usage (as root on a provisioned host whose runner engine holds kooi-postgres:17,
e.g. after the e2e tests or images/testcontainers/build.sh):
    python bench/storage.py [--rounds 5] [--drivers overlay2,fuse-overlayfs,vfs]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import time
from pathlib import Path

IMAGE = "kooi-postgres:17"
BASE = Path("/var/tmp/kooi-bench-storage")
LAUNCHER = "/usr/share/docker.io/contrib/dockerd-rootless.sh"


class Daemon:
    def __init__(self, driver: str, engine: dict):
        self.driver, self.user = driver, engine["runner_user"]
        self.dir = BASE / driver
        self.run_dir = self.dir / "run"
        self.sock = self.run_dir / "docker.sock"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        for d in (self.dir, self.run_dir, self.dir / "data"):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            shutil.chown(d, self.user, self.user)
        cfg = self.dir / "daemon.json"
        cfg.write_text(json.dumps({"storage-driver": self.driver, "no-new-privileges": True}))
        os.chmod(cfg, 0o644)
        home = Path(os.path.expanduser(f"~{self.user}"))
        env = {"PATH": "/usr/share/docker.io/contrib:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": str(home), "XDG_RUNTIME_DIR": str(self.run_dir), "LANG": "C.UTF-8"}
        log = open(self.dir / "dockerd.log", "wb")
        self.proc = subprocess.Popen(
            ["runuser", "-u", self.user, "--", "env", *[f"{k}={v}" for k, v in env.items()], LAUNCHER,
             "--config-file", str(cfg), "--data-root", str(self.dir / "data"),
             "--exec-root", str(self.run_dir / "exec"), "--pidfile", str(self.run_dir / "docker.pid"),
             "-H", f"unix://{self.sock}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            res = self.docker("info", "--format", "{{.Driver}}", check=False)
            if res.returncode == 0:
                if res.stdout.strip() != self.driver:
                    raise SystemExit(f"{self.driver}: the daemon runs {res.stdout.strip()!r}")
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        tail = (self.dir / "dockerd.log").read_text(errors="replace")[-2000:]
        raise SystemExit(f"the {self.driver} daemon did not start:\n{tail}")

    def docker(self, *args: str, check: bool = True, stdin=None) -> subprocess.CompletedProcess:
        return subprocess.run(["runuser", "-u", self.user, "--", "env", f"DOCKER_HOST=unix://{self.sock}",
                               "docker", *args], capture_output=True, text=stdin is None, check=check,
                              stdin=stdin)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # our own session: runuser, rootlesskit, dockerd
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def one_round(d: Daemon, archive: Path) -> dict[str, float]:
    t0 = time.perf_counter()
    with archive.open("rb") as f:
        d.docker("load", "-q", stdin=f)
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    cid = d.docker("run", "-d", "--network", "none", "-e", "POSTGRES_PASSWORD=bench", IMAGE).stdout.strip()
    try:
        while True:
            res = d.docker("exec", cid, "pg_isready", "-q", "-h", "/tmp", check=False)
            if res.returncode == 0:
                break
            if time.perf_counter() - t0 > 300:
                raise SystemExit(f"{d.driver}: PostgreSQL not ready after 300 s")
            time.sleep(0.1)
        ready = time.perf_counter() - t0
    finally:
        d.docker("rm", "-f", "-v", cid, check=False)
        d.docker("rmi", "-f", IMAGE, check=False)
    return {"load": load, "ready": ready}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--drivers", default="overlay2,fuse-overlayfs,vfs")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (it starts daemons as the runner user)")
    engine = json.loads(Path("/etc/kooi/engine.json").read_text())
    if engine["mode"] != "rootless":
        raise SystemExit("this benchmark compares the rootless engine's drivers: provision with rootless mode")
    drivers = args.drivers.split(",")
    if "fuse-overlayfs" in drivers and not shutil.which("fuse-overlayfs"):
        raise SystemExit("fuse-overlayfs is not installed (apt-get install fuse-overlayfs)")
    user = engine["runner_user"]
    BASE.mkdir(mode=0o755, exist_ok=True)
    archive = BASE / "postgres.tar"
    runner_docker = ["runuser", "-u", user, "--", "env", f"DOCKER_HOST=unix://{engine['socket']}", "docker"]
    with archive.open("wb") as f:
        res = subprocess.run([*runner_docker, "save", IMAGE], stdout=f, stderr=subprocess.PIPE)
    if res.returncode != 0:
        raise SystemExit(f"cannot save {IMAGE} from the runner's engine: {res.stderr.decode()[-300:]}; "
                         "build it with images/testcontainers/build.sh")
    archive_mb = round(archive.stat().st_size / 2**20, 1)
    facl = "fuse-overlayfs" in drivers
    if facl:
        subprocess.run(["setfacl", "-m", f"u:{user}:rw", "/dev/fuse"], check=True)
    daemons = [Daemon(d, engine) for d in drivers]
    samples: dict[str, dict[str, list[float]]] = {d: {"load": [], "ready": []} for d in drivers}
    try:
        for d in daemons:
            d.start()
            one_round(d, archive)  # warm-up
        for _ in range(args.rounds):
            for d in daemons:
                for k, v in one_round(d, archive).items():
                    samples[d.driver][k].append(v)
    finally:
        for d in daemons:
            d.stop()
        if facl:
            subprocess.run(["setfacl", "-x", f"u:{user}", "/dev/fuse"], check=False)
        archive.unlink(missing_ok=True)
    med = {d: {k: statistics.median(v) for k, v in s.items()} for d, s in samples.items()}
    base = drivers[0]
    print(json.dumps({
        "rounds": args.rounds, "image": IMAGE, "archive_mb": archive_mb,
        "samples_s": samples, "median_s": med,
        f"ratio_over_{base}": {d: {k: med[d][k] / med[base][k] for k in med[d]} for d in drivers},
    }, indent=2))


if __name__ == "__main__":
    main()
