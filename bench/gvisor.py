"""Benchmark: runc vs runsc (gVisor) on the same userns-remap engine, same image.

Side by side, alternating so that drift hits every runtime alike, medians and ratios
against runc. Not a test: it asserts nothing. Run it as root on a host provisioned with
kooi_engine_mode: userns_remap and kooi_gvisor_enabled (a Molecule userns_remap test
host will do), after `kooi verify`:

    python3 bench/gvisor.py [--runs 11] [--runtimes runc,runsc] [--image kooi-probe:latest]
                            [--syscalls 100000] [--kooi-runs 0]

- start-up: `docker run --rm --network none --runtime R IMAGE true`, wall clock;
- syscalls: `dd if=/dev/zero of=/dev/null bs=1 count=N` in the same container (2N
  read/write calls); per call, in µs: (its median - start-up's median) / 2N;
- PostgreSQL ready (--postgres IMAGE): `docker run -d` of the image until its log shows
  "database system is ready to accept connections" twice (after initdb and the
  restart: what Testcontainers' PostgreSQL module waits for);
- kooi run (--kooi-runs K, K > 0): the installed maven-example and
  maven-testcontainers workflows against their gvisor copies (min_isolation: gvisor,
  written to a scratch workflow directory), `duration_s` of the run's result.

A further runtime (e.g. runsc with --platform=ptrace on the same host) can be named in
--runtimes once the engine knows it (daemon.json "runtimes"); the role registers runsc
only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return time.perf_counter() - t0, r.stdout


def postgres_ready(runtime: str, image: str, timeout: float = 180) -> float:
    t0 = time.perf_counter()
    cid = subprocess.run(["docker", "run", "-d", "--runtime", runtime, "--network", "none",
                          "-e", "POSTGRES_PASSWORD=bench", image], check=True, capture_output=True,
                         text=True).stdout.strip()
    try:
        while time.perf_counter() - t0 < timeout:
            logs = subprocess.run(["docker", "logs", cid], capture_output=True, text=True)
            if (logs.stdout + logs.stderr).count("database system is ready to accept connections") >= 2:
                return time.perf_counter() - t0
            time.sleep(0.1)
        raise SystemExit(f"{image} under {runtime}: not ready after {timeout} s")
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)


def kooi_run(workflow: str, project: str, wfdir: str | None) -> float:
    out = Path(tempfile.mktemp(prefix="kooi-bench-", suffix=".json", dir="/var/lib/kooi/runs"))
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    if wfdir:
        env["KOOI_WORKFLOW_DIR"] = wfdir
    r = subprocess.run(["kooi", "run", workflow, "--project", project, "--json", str(out), "--quiet"],
                       capture_output=True, text=True, env=env)
    result = json.loads(out.read_text())
    out.unlink()
    if r.returncode != 0:
        raise SystemExit(f"kooi run {workflow}: rc {r.returncode}: {result.get('message')}")
    return float(result["duration_s"])


def gvisor_copies(names: list[str]) -> str:
    """WORKFLOW-gvisor for each installed workflow NAME, in a scratch directory."""
    import yaml

    d = tempfile.mkdtemp(prefix="kooi-bench-workflows-", dir="/var/lib/kooi")
    Path(d).chmod(0o755)
    for name in names:
        doc = yaml.safe_load(Path(f"/etc/kooi/workflows/{name}.yml").read_text())
        doc["min_isolation"] = "gvisor"
        (Path(d) / f"{name}.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
        (Path(d) / f"{name}.yml").chmod(0o644)
    return d


def med(xs: list[float]) -> float:
    return round(statistics.median(xs), 4) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--runtimes", default="runc,runsc")
    ap.add_argument("--image", default="kooi-probe:latest")
    ap.add_argument("--syscalls", type=int, default=100000)
    ap.add_argument("--kooi-runs", type=int, default=0)
    ap.add_argument("--postgres", default="", help="a PostgreSQL image on the engine (kooi-postgres:17)")
    ap.add_argument("--project", default="/home/kooi-runner/kooi-verify/maven-example")
    args = ap.parse_args()
    runtimes = args.runtimes.split(",")
    docker = ["docker", "run", "--rm", "--network", "none"]
    start: dict[str, list[float]] = {rt: [] for rt in runtimes}
    dd: dict[str, list[float]] = {rt: [] for rt in runtimes}
    dd_cmd = ["sh", "-c", f"dd if=/dev/zero of=/dev/null bs=1 count={args.syscalls}"]
    for rt in runtimes:  # warm up each
        timed(docker + ["--runtime", rt, args.image, "true"])
    for _ in range(args.runs):
        for rt in runtimes:
            start[rt].append(timed(docker + ["--runtime", rt, args.image, "true"])[0])
            dd[rt].append(timed(docker + ["--runtime", rt, args.image] + dd_cmd)[0])
    per_call = {rt: (med(dd[rt]) - med(start[rt])) / (2 * args.syscalls) * 1e6 for rt in runtimes}
    base = runtimes[0]
    report: dict[str, object] = {
        "runs": args.runs,
        "startup_s": {rt: med(v) for rt, v in start.items()},
        "startup_ratio": {rt: round(med(v) / med(start[base]), 2) for rt, v in start.items()},
        "dd_s": {rt: med(v) for rt, v in dd.items()},
        "syscall_us": {rt: round(v, 3) for rt, v in per_call.items()},
        "syscall_ratio": {rt: round(v / per_call[base], 1) for rt, v in per_call.items()},
    }
    if args.postgres:
        ready: dict[str, list[float]] = {rt: [] for rt in runtimes}
        for _ in range(max(3, args.runs // 2)):
            for rt in runtimes:
                ready[rt].append(postgres_ready(rt, args.postgres))
        report["postgres_ready_s"] = {rt: med(v) for rt, v in ready.items()}
        report["postgres_ready_ratio"] = {rt: round(med(v) / med(ready[base]), 2) for rt, v in ready.items()}
    if args.kooi_runs:
        wfdir = gvisor_copies(["maven-example", "maven-testcontainers"])
        dur: dict[str, list[float]] = {}
        for _ in range(args.kooi_runs):
            for wf in ("maven-example", "maven-testcontainers"):
                for level, d in (("runc", None), ("runsc", wfdir)):
                    dur.setdefault(f"{wf}/{level}", []).append(kooi_run(wf, args.project, d))
        report["kooi_run_s"] = {k: med(v) for k, v in dur.items()}
        report["kooi_run_ratio"] = {wf: round(med(dur[f"{wf}/runsc"]) / med(dur[f"{wf}/runc"]), 2)
                                    for wf in ("maven-example", "maven-testcontainers")}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
