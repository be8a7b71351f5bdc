"""Benchmark: `kooi run` overhead over a bare `docker run` of the same image on the same
engine, and the jail's start-up cost. Not a test: it asserts nothing.

Side by side, alternating (so drift hits every variant), after one warm-up each:
  container/kooi   kooi run (container mode, command `true`), as root dropping to the runner
  container/docker docker run --rm with the same confinement flags, as the runner
  proxy/kooi       kooi run (container mode, `network: proxy`, command `true`): what a
                   run's egress costs (its own port, and on rootless its own network and rules)
  jail/kooi        kooi run (jail mode, command `true`)
  jail/bwrap       the same bubblewrap command line, run directly
  bare             /bin/true
Usage (as root on a provisioned host, after scripts/quickstart.sh):
    python bench/run_overhead.py [--runs 11]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import yaml


def timed(cmd: list[str], env: dict | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--maven-runs", type=int, default=5, help="runs of the Maven example (0 to skip)")
    args = ap.parse_args()
    e = json.loads(Path("/etc/kooi/engine.json").read_text())
    pin = json.loads(Path("/etc/kooi/images.json").read_text())["runner"]
    wfdir = Path(tempfile.mkdtemp(prefix="kooi-bench-", dir="/var/tmp"))
    os.chmod(wfdir, 0o755)
    (wfdir / "bench-container.yml").write_text(yaml.safe_dump({"command": ["true"], "timeout": 60}))
    if Path("/etc/kooi/egress.json").exists():
        (wfdir / "bench-proxy.yml").write_text(yaml.safe_dump({"command": ["true"], "timeout": 60,
                                                                "network": "proxy"}))
    (wfdir / "bench-jail.yml").write_text(yaml.safe_dump({"mode": "jail", "command": ["true"], "timeout": 60}))
    project = Path(e["runner_home"]) / "kooi-bench-project"
    project.mkdir(exist_ok=True)
    shutil.chown(project, e["runner_user"], e["runner_user"])
    env = {**os.environ, "KOOI_WORKFLOW_DIR": str(wfdir)}
    as_runner = ["runuser", "-u", e["runner_user"], "--", "env", f"DOCKER_HOST=unix://{e['socket']}",
                 f"XDG_RUNTIME_DIR=/run/user/{e['runner_uid']}"]
    def docker_run_of(proj: Path, *cmd: str) -> list[str]:
        # The confinement kooi run applies, spelled out for the docker CLI.
        return [*as_runner, "docker", "run", "--rm", "--network", "none", "--cap-drop", "ALL",
                "--security-opt", "no-new-privileges:true", "--read-only", "--init", "--ipc", "private",
                "--tmpfs", "/tmp:exec,mode=1777", "--tmpfs", "/home/kooi:exec,uid=1000,gid=1000,mode=0700",
                "-v", f"{proj}:/workspace", "-w", "/workspace", pin["id"], *cmd]

    docker_run = docker_run_of(project, "true")
    from kooi.run import jail as kooi_run
    from kooi.workflow import Workflow
    bwrap = [*as_runner[:4], *kooi_run.bwrap_argv(Workflow(name="b", path=wfdir, command=("true",)), project)]
    variants = {
        "container/kooi": (["kooi", "run", "bench-container", "--project", str(project), "--quiet"], env),
        "container/docker": (docker_run, None),
        "jail/kooi": (["kooi", "run", "bench-jail", "--project", str(project), "--quiet"], env),
        "jail/bwrap": (bwrap, None),
        "bare": (["true"], None),
    }
    if (wfdir / "bench-proxy.yml").exists():
        variants["proxy/kooi"] = (["kooi", "run", "bench-proxy", "--project", str(project), "--quiet"], env)
    for cmd, ev in variants.values():
        timed(cmd, ev)
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.runs):
        for k, (cmd, ev) in variants.items():
            samples[k].append(timed(cmd, ev))
    maven: dict[str, list[float]] = {"maven/kooi": [], "maven/docker": []}
    if args.maven_runs:
        repo = Path(__file__).resolve().parent.parent
        mproj = Path(e["runner_home"]) / "kooi-bench-maven"
        shutil.rmtree(mproj, ignore_errors=True)
        shutil.copytree(repo / "examples/maven-example", mproj, ignore=shutil.ignore_patterns("target"))
        subprocess.run(["chown", "-R", f"{e['runner_user']}:{e['runner_user']}", str(mproj)], check=True)
        shutil.copy(repo / "examples/workflows/maven-example.yml", wfdir / "maven-example.yml")
        mvn_docker = docker_run_of(mproj, "mvn", "-B", "-o", "verify")
        mvn_kooi = ["kooi", "run", "maven-example", "--project", str(mproj), "--quiet"]
        timed(mvn_kooi, env)  # grants the ACLs the bare docker run then also relies on
        for _ in range(args.maven_runs):
            maven["maven/kooi"].append(timed(mvn_kooi, env))
            maven["maven/docker"].append(timed(mvn_docker))
        subprocess.run(["runuser", "-u", e["runner_user"], "--", "rm", "-rf", str(mproj)], check=True)
    shutil.rmtree(wfdir)
    med = {k: round(statistics.median(v), 4) for k, v in {**samples, **maven}.items() if v}
    report = {
        "runs": args.runs, "maven_runs": args.maven_runs, "median_s": med,
        "ratio_kooi_over_docker_run_true": round(med["container/kooi"] / med["container/docker"], 3),
        "ratio_kooi_jail_over_bwrap_true": round(med["jail/kooi"] / med["jail/bwrap"], 3),
        "bwrap_startup_s": round(med["jail/bwrap"] - med["bare"], 4),
    }
    if "proxy/kooi" in med:
        report["ratio_kooi_proxy_over_kooi_true"] = round(med["proxy/kooi"] / med["container/kooi"], 3)
    if maven["maven/kooi"]:
        report["ratio_kooi_over_docker_run_maven"] = round(med["maven/kooi"] / med["maven/docker"], 3)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
