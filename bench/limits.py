"""Benchmark: what the run limits cost (issue 16). Not a test: it asserts nothing.

Side by side, alternating (so drift hits both variants), after one warm-up each, on the
runner's engine as the runner, with the docker CLI:
  maven/unbounded    docker run of the pinned runner image: `mvn -B -o verify` on a copy
                     of the Maven example, confined like kooi run but without limits
  maven/limits       the same with the limits kooi run gives it by default on this
                     engine (kooi.run.limits.for_container: cgroup limits where the
                     engine has the controllers, else rlimits, nice 10 and -XX:MaxRAM)
  postgres/unbounded docker run -d of the Testcontainers Postgres image until
  postgres/limits    `pg_isready` answers (the limits a run's broker forces on it)
Usage (as root on a provisioned host, after scripts/quickstart.sh and
images/testcontainers/build.sh postgres):
    python bench/limits.py [--maven-runs 5] [--postgres-runs 7]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from kooi import engineapi
from kooi.hoststate import engine as engine_state
from kooi.hoststate import limits as limits_state
from kooi.run import limits as run_limits
from kooi.run.container import engine_limits
from kooi.run.errors import Log
from kooi.run.project import grant_workspace, host_uid_of

REPO = Path(__file__).resolve().parents[1]
POSTGRES = "kooi-postgres:17"


def limit_flags(plan: run_limits.Plan) -> tuple[list[str], list[str], list[str]]:
    """(docker run flags, environment flags, command prefix) of PLAN for the docker CLI."""
    hc = plan.host_config
    flags = [f"--ulimit={n}={v}:{v}" for n, v in plan.rlimits.items()]
    if "Memory" in hc:
        flags += [f"--memory={hc['Memory']}", f"--memory-swap={hc['MemorySwap']}"]
    if "PidsLimit" in hc:
        flags.append(f"--pids-limit={hc['PidsLimit']}")
    if "NanoCpus" in hc:
        flags += [f"--cpus={hc['NanoCpus'] / 1e9:g}", f"--cpu-shares={hc['CpuShares']}"]
    env = [f"--env=JAVA_TOOL_OPTIONS=-XX:MaxRAM={plan.max_ram}"] if plan.max_ram else []
    prefix = ["nice", "-n", str(plan.nice)] if plan.nice else []
    return flags, env, prefix


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--maven-runs", type=int, default=5)
    ap.add_argument("--postgres-runs", type=int, default=7)
    args = ap.parse_args()
    e = json.loads(Path("/etc/kooi/engine.json").read_text())
    pin = json.loads(Path("/etc/kooi/images.json").read_text())["runner"]
    eng = engineapi.Engine(e["socket"])
    info = eng.info()
    values = limits_state.load().default
    plan = run_limits.for_container(values, {}, engine_limits(info), info.get("NCPU"), e["mode"], eng.hard_rlimits())
    flags, env, prefix = limit_flags(plan)
    print(f"engine {e['mode']}, limits {values}: {' '.join(flags + env + prefix)}")
    as_runner = ["runuser", "-u", e["runner_user"], "--", "env", f"DOCKER_HOST=unix://{e['socket']}",
                 f"XDG_RUNTIME_DIR=/run/user/{e['runner_uid']}", "docker"]
    project = Path(e["runner_home"]) / "kooi-bench-limits"
    shutil.rmtree(project, ignore_errors=True)
    shutil.copytree(REPO / "examples/maven-example", project, ignore=shutil.ignore_patterns("target"))
    subprocess.run(["chown", "-R", f"{e['runner_user']}:{e['runner_user']}", str(project)], check=True)
    cfg = engine_state.load()
    grant_workspace(project, host_uid_of(cfg, 1000), cfg.runner_uid, Log(None, None))

    def maven(limited: bool) -> float:
        cmd = [*as_runner, "run", "--rm", "--network", "none", "--cap-drop", "ALL", "--security-opt",
               "no-new-privileges:true", "--read-only", "--init", "--tmpfs", "/tmp:exec,mode=1777",
               "--tmpfs", "/home/kooi:exec,uid=1000,gid=1000,mode=0700", "-v", f"{project}:/workspace",
               "-w", "/workspace", *(flags + env if limited else []), pin["id"],
               *(prefix if limited else []), "mvn", "-B", "-q", "-o", "verify"]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - t0

    def postgres(limited: bool) -> float:
        name = f"kooi-bench-pg-{time.monotonic_ns()}"
        t0 = time.perf_counter()
        subprocess.run([*as_runner, "run", "-d", "--name", name, "-e", "POSTGRES_PASSWORD=bench",
                        *(flags if limited else []), POSTGRES], check=True, stdout=subprocess.DEVNULL)
        try:
            while subprocess.run([*as_runner, "exec", name, "pg_isready", "-q", "-h", "127.0.0.1"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
                time.sleep(0.05)
            return time.perf_counter() - t0
        finally:
            subprocess.run([*as_runner, "rm", "-f", name], stdout=subprocess.DEVNULL, check=False)

    results: dict[str, list[float]] = {}
    for name, fn, runs in (("maven", maven, args.maven_runs), ("postgres", postgres, args.postgres_runs)):
        if runs <= 0:
            continue
        fn(False)
        fn(True)  # warm-up
        for _ in range(runs):
            for limited in (False, True):
                results.setdefault(f"{name}/{'limits' if limited else 'unbounded'}", []).append(fn(limited))
    for k, v in results.items():
        print(f"{k:22s} median {statistics.median(v):.3f} s  (n={len(v)}, min {min(v):.3f}, max {max(v):.3f})")
    for name in ("maven", "postgres"):
        if f"{name}/limits" in results:
            ratio = statistics.median(results[f"{name}/limits"]) / statistics.median(results[f"{name}/unbounded"])
            print(f"ratio {name} limits / unbounded: {ratio:.2f}x")
    shutil.rmtree(project, ignore_errors=True)


if __name__ == "__main__":
    main()
