"""Benchmark: what policed engine access costs. Not a test: it asserts nothing.

1. Broker latency per API call: the runner's rootless engine straight vs through a
   kooi broker (in this process, the same policy and rules `kooi run` uses), for
   `GET /_ping`, `GET /containers/json` (the broker adds the run's label filter) and a
   `POST /containers/create` + `DELETE` pair (the broker reads, checks, labels and
   rewrites the body). Alternating, after a warm-up.
2. Authorization plugin latency per API call: a second rootful dockerd (own network
   namespace, data root and socket) without and with `--authorization-plugin` (kooi
   authz), `GET /_ping` and `GET /containers/json`.
3. Testcontainers-style PostgreSQL ready time (container start until the second
   "ready to accept connections" line, the condition Testcontainers waits for):
   kooi-postgres on the rootless engine vs the host's rootful dockerd, alternating.

Usage (as root on a provisioned host with images/testcontainers/build.sh run):
    python bench/engine_access.py [--calls 300] [--pg-runs 5] [--skip-plugin]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "shim"))

from kooi import broker  # noqa: E402
from kooi.policy import Policy  # noqa: E402


def call(sock: str, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock)
    c = http.client.HTTPConnection("localhost", timeout=60)
    c.sock = s
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Content-Type": "application/json"} if body is not None else {})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def per_call(sock: str, kind: str, image: str) -> float:
    t0 = time.perf_counter()
    if kind == "ping":
        call(sock, "GET", "/_ping")
    elif kind == "list":
        call(sock, "GET", "/v1.41/containers/json?all=1")
    else:
        st, data = call(sock, "POST", "/v1.41/containers/create",
                        {"Image": image, "Cmd": ["true"], "HostConfig": {"NetworkMode": "none"}})
        assert st == 201, data
        call(sock, "DELETE", f"/v1.41/containers/{json.loads(data)['Id']}?force=1")
    return time.perf_counter() - t0


def ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1000, 3)


def bench_broker(cfg: dict, calls: int, image: str) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="kooi-bench-broker-"))
    ws = tmp / "ws"
    ws.mkdir()
    listen = str(tmp / "b.sock")
    scope = broker.RunScope("bench-broker", {"org.kooi.run": "bench-broker", "org.kooi.nested": "1"})
    b = broker.Broker(listen, cfg["socket"], Policy(workspace=str(ws)), scope)
    b.start(mode=0o600)
    out = {}
    try:
        for kind in ("ping", "list", "create+delete"):
            n = calls if kind != "create+delete" else max(20, calls // 10)
            direct, brokered = [], []
            per_call(cfg["socket"], kind, image)
            per_call(listen, kind, image)
            for _ in range(n):
                direct.append(per_call(cfg["socket"], kind, image))
                brokered.append(per_call(listen, kind, image))
            out[kind] = {"calls": n, "direct_ms": ms(direct), "broker_ms": ms(brokered),
                         "added_ms": round(ms(brokered) - ms(direct), 3),
                         "ratio": round(statistics.median(brokered) / statistics.median(direct), 2)}
    finally:
        b.stop()
        broker.cleanup(cfg["socket"], "bench-broker")
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def start_dockerd(base: Path, plugin: str | None) -> tuple[subprocess.Popen, str]:
    sock = str(base / "d.sock")
    cmd = ["unshare", "--net", "--", "dockerd", "--data-root", str(base / "data"), "--exec-root",
           str(base / "exec"), "--pidfile", str(base / "d.pid"), "-H", f"unix://{sock}", "--bridge", "none",
           "--iptables=false", "--ip-masq=false"]
    if plugin:
        cmd += ["--authorization-plugin", plugin]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(240):
        try:
            if call(sock, "GET", "/_ping")[0] == 200:
                return p, sock
        except OSError:
            pass
        time.sleep(0.25)
    p.kill()
    raise RuntimeError("the benchmark dockerd did not answer")


def stop(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()


def bench_plugin(calls: int) -> dict:
    name = "kooi-authz-bench"
    base = Path(tempfile.mkdtemp(prefix="kooi-bench-authz-", dir="/var/tmp"))
    plugin_sock = Path(f"/run/docker/plugins/{name}.sock")
    env = {**os.environ, "PYTHONPATH": str(REPO / "shim")}
    plugin = subprocess.Popen([sys.executable, "-m", "kooi", "authz", "serve", "--socket", str(plugin_sock)],
                              env=env, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if plugin_sock.exists():
            break
        time.sleep(0.05)
    samples: dict[str, dict[str, list[float]]] = {"ping": {}, "list": {}}
    try:
        for variant, pname in (("without", None), ("with", name)):
            d, sock = start_dockerd(base, pname)
            try:
                for kind in samples:
                    per_call(sock, kind, "")
                    samples[kind][variant] = [per_call(sock, kind, "") for _ in range(calls)]
            finally:
                stop(d)
    finally:
        plugin.send_signal(signal.SIGTERM)
        plugin.wait(timeout=10)
        subprocess.run(["umount", "-R", str(base / "data")], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
    return {k: {"calls": calls, "without_ms": ms(v["without"]), "with_ms": ms(v["with"]),
                "added_ms": round(ms(v["with"]) - ms(v["without"]), 3),
                "ratio": round(statistics.median(v["with"]) / statistics.median(v["without"]), 2)}
            for k, v in samples.items()}


def pg_ready(docker: list[str], image: str) -> float:
    t0 = time.perf_counter()
    cid = subprocess.run([*docker, "run", "-d", "-e", "POSTGRES_PASSWORD=bench", "-p", "127.0.0.1::5432", image,
                          "postgres", "-c", "fsync=off"], capture_output=True, text=True, check=True).stdout.strip()
    try:
        logs = subprocess.Popen([*docker, "logs", "-f", cid], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        seen = 0
        assert logs.stdout is not None
        for line in logs.stdout:
            if "ready to accept connections" in line:
                seen += 1
                if seen == 2:
                    break
        took = time.perf_counter() - t0
        logs.kill()
        logs.wait()
        if seen < 2:
            raise RuntimeError("postgres did not become ready")
        return took
    finally:
        subprocess.run([*docker, "rm", "-f", cid], capture_output=True)


def bench_pg(cfg: dict, runs: int, image: str) -> dict:
    rootless = ["runuser", "-u", cfg["runner_user"], "--", "env", f"DOCKER_HOST=unix://{cfg['socket']}", "docker"]
    rootful = ["docker", "-H", "unix:///var/run/docker.sock"]
    save = subprocess.Popen([*rootless, "save", image], stdout=subprocess.PIPE)
    subprocess.run([*rootful, "load", "-q"], stdin=save.stdout, check=True, capture_output=True)
    save.wait()
    out: dict[str, list[float]] = {"rootless": [], "rootful": []}
    pg_ready(rootless, image)
    pg_ready(rootful, image)
    for _ in range(runs):
        out["rootless"].append(pg_ready(rootless, image))
        out["rootful"].append(pg_ready(rootful, image))
    subprocess.run([*rootful, "rmi", image], capture_output=True)
    return {"runs": runs, "rootless_s": round(statistics.median(out["rootless"]), 3),
            "rootful_s": round(statistics.median(out["rootful"]), 3),
            "ratio_rootless_over_rootful": round(statistics.median(out["rootless"]) /
                                                 statistics.median(out["rootful"]), 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--pg-runs", type=int, default=5)
    ap.add_argument("--image", default="kooi-postgres:17")
    ap.add_argument("--skip-plugin", action="store_true")
    args = ap.parse_args()
    cfg = json.loads(Path("/etc/kooi/engine.json").read_text())
    report = {"broker": bench_broker(cfg, args.calls, args.image)}
    if not args.skip_plugin:
        report["authz_plugin"] = bench_plugin(args.calls)
    if args.pg_runs:
        report["postgres_ready"] = bench_pg(cfg, args.pg_runs, args.image)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
