"""Benchmark: runc vs runsc (gVisor) on the same userns-remap engine, same image.

Side by side, alternating so that drift hits every runtime alike, medians and ratios
against runc. Not a test: it asserts nothing. Run it as root on a host provisioned with
kooi_engine_mode: userns_remap and kooi_gvisor_enabled (a Molecule userns_remap test
host will do), after `kooi verify`:

    python3 bench/gvisor.py [--runs 11] [--runtimes runc,runsc] [--image kooi-probe:latest]
                            [--runner-image ID] [--syscalls 200000] [--kooi-runs 0]

- start-up: `docker run --rm --network none --runtime R IMAGE true`, wall clock;
- syscalls: inside the runner image (python3), N getppid() calls against N loop turns
  without one, so the per-call cost excludes the interpreter's; per call, in µs;
- kooi run (--kooi-runs K, K > 0): the installed maven-example and
  maven-testcontainers workflows against their gvisor copies (min_isolation: gvisor,
  written to a scratch workflow directory), `duration_s` of the run's result and the
  PostgreSQL container's start-up as Testcontainers logs it ("started in PT…S").

A further runtime (e.g. runsc with --platform=ptrace on the same host) can be named in
--runtimes once the engine knows it (daemon.json "runtimes"); the role registers runsc
only.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

SYSCALL_PROBE = r"""
import os, sys, time
n = int(sys.argv[1])
t0 = time.perf_counter()
for _ in range(n):
    pass
t1 = time.perf_counter()
for _ in range(n):
    os.getppid()
t2 = time.perf_counter()
print(((t2 - t1) - (t1 - t0)) / n * 1e6)
"""


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return time.perf_counter() - t0, r.stdout


def kooi_run(workflow: str, project: str, wfdir: str | None) -> tuple[float, list[float]]:
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
    log = Path(result["log"]).read_text()
    pg = [float(m) for m in re.findall(r"postgres[^\n]*started in PT([0-9.]+)S", log, re.I)]
    return float(result["duration_s"]), pg


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
    ap.add_argument("--runner-image", default="")
    ap.add_argument("--syscalls", type=int, default=200000)
    ap.add_argument("--kooi-runs", type=int, default=0)
    ap.add_argument("--project", default="/home/kooi-runner/kooi-verify/maven-example")
    args = ap.parse_args()
    runtimes = args.runtimes.split(",")
    runner = args.runner_image or json.loads(Path("/etc/kooi/images.json").read_text())["runner"]["id"]
    docker = ["docker", "run", "--rm", "--network", "none"]
    start = {rt: [] for rt in runtimes}
    per_call = {rt: [] for rt in runtimes}
    for rt in runtimes:  # warm up each
        timed(docker + ["--runtime", rt, args.image, "true"])
    for _ in range(args.runs):
        for rt in runtimes:
            start[rt].append(timed(docker + ["--runtime", rt, args.image, "true"])[0])
            out = timed(docker + ["--runtime", rt, "--entrypoint", "python3", runner, "-I", "-c", SYSCALL_PROBE,
                                  str(args.syscalls)])[1]
            per_call[rt].append(float(out.strip()))
    base = runtimes[0]
    report: dict[str, object] = {
        "runs": args.runs,
        "startup_s": {rt: med(v) for rt, v in start.items()},
        "startup_ratio": {rt: round(med(v) / med(start[base]), 2) for rt, v in start.items()},
        "syscall_us": {rt: med(v) for rt, v in per_call.items()},
        "syscall_ratio": {rt: round(med(v) / med(per_call[base]), 1) for rt, v in per_call.items()},
    }
    if args.kooi_runs:
        wfdir = gvisor_copies(["maven-example", "maven-testcontainers"])
        dur: dict[str, list[float]] = {}
        pg: dict[str, list[float]] = {}
        for _ in range(args.kooi_runs):
            for wf in ("maven-example", "maven-testcontainers"):
                for level, d in (("runc", None), ("runsc", wfdir)):
                    s, p = kooi_run(wf, args.project, d)
                    dur.setdefault(f"{wf}/{level}", []).append(s)
                    if p:
                        pg.setdefault(level, []).extend(p)
        report["kooi_run_s"] = {k: med(v) for k, v in dur.items()}
        report["kooi_run_ratio"] = {wf: round(med(dur[f"{wf}/runsc"]) / med(dur[f"{wf}/runc"]), 2)
                                    for wf in ("maven-example", "maven-testcontainers")}
        report["postgres_started_s"] = {k: med(v) for k, v in pg.items()}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
