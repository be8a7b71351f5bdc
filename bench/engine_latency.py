"""Benchmark: `docker run --rm` latency, rootless (runner) vs rootful, same host, same image.

Runs the two side by side (alternating, so drift hits both) and reports medians and
the ratio. Not a test: it asserts nothing. Usage (as root, after quickstart):
    python bench/engine_latency.py [--runs 15] [--image kooi-probe:latest]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--image", default="kooi-probe:latest")
    args = ap.parse_args()
    e = json.loads(Path("/etc/kooi/engine.json").read_text())
    rootless = ["runuser", "-u", e["runner_user"], "--", "env", f"DOCKER_HOST=unix://{e['socket']}",
                f"XDG_RUNTIME_DIR=/run/user/{e['runner_uid']}", "docker"]
    rootful = ["docker", "-H", "unix:///var/run/docker.sock"]
    run = ["run", "--rm", "--network", "none", args.image, "true"]
    for base in (rootless, rootful):  # warm up both
        timed(base + run)
    samples: dict[str, list[float]] = {"rootless": [], "rootful": []}
    for _ in range(args.runs):
        samples["rootless"].append(timed(rootless + run))
        samples["rootful"].append(timed(rootful + run))
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(json.dumps({"runs": args.runs, "median_s": med,
                      "ratio_rootless_over_rootful": med["rootless"] / med["rootful"]}, indent=2))


if __name__ == "__main__":
    main()
