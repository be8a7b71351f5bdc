"""Benchmark: site.yml first run and second run on a fresh systemd test host.

Starts a fresh test host container (the same shape as the Molecule platforms), runs
site.yml twice over the docker connection and records the wall time of each run;
repeats with a new host per round and reports medians and the ratio second/first.
Not a test: it asserts nothing but that the playbook succeeds. Usage (as root, after
scripts/bootstrap.sh and molecule/testhost/build-images.sh):
    .venv/bin/python bench/provision.py [--rounds 3] [--image kooi-testhost:debian12]
        [--engine-mode rootless]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CAPS_DROPPED = ["SYS_RESOURCE"]  # the build VM lacks it; a container asking for it fails


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, **kw)


def start_host(name: str, image: str) -> None:
    subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    sh(["docker", "run", "-d", "--name", name, "--hostname", name,
        "--cap-add", "ALL", *sum((["--cap-drop", c] for c in CAPS_DROPPED), []),
        "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
        "--device", "/dev/net/tun", "--cgroupns", "host",
        "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "-v", "/var/lib/docker", "-v", "/home",
        "-v", f"{os.environ.get('KOOI_IMAGE_DIR', '/var/tmp/kooi-images')}:/kooi-images:ro",
        "--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp", image],
       stdout=subprocess.DEVNULL)
    for _ in range(60):
        r = subprocess.run(["docker", "exec", name, "systemctl", "is-system-running"],
                           capture_output=True, text=True)
        if r.stdout.strip() in ("running", "degraded"):
            return
        time.sleep(1)
    raise SystemExit(f"bench: {name} did not finish booting")


def run_site(inventory: Path) -> float:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible" / "ansible.cfg"))
    t0 = time.perf_counter()
    sh([str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(inventory),
        str(REPO / "ansible" / "site.yml")], env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--image", default="kooi-testhost:debian12")
    ap.add_argument("--engine-mode", default="rootless", choices=["rootless", "userns_remap"])
    ap.add_argument("--with-image", action="store_true",
                    help="also build the runner image (minutes; needs images/runner/prepare-base.sh first)")
    args = ap.parse_args()
    first: list[float] = []
    second: list[float] = []
    for i in range(args.rounds):
        name = f"kooi-bench-provision-{i}"
        start_host(name, args.image)
        try:
            with tempfile.TemporaryDirectory() as d:
                inv = Path(d) / "hosts.yml"
                inv.write_text(json.dumps({"kooi_runners": {"hosts": {name: {
                    "ansible_connection": "community.docker.docker",
                    "ansible_python_interpreter": "/usr/bin/python3",
                    "kooi_engine_mode": args.engine_mode,
                    "kooi_runner_image_build": args.with_image,
                    "kooi_runner_image_archive_dir": "/kooi-images",
                    "kooi_runner_image_lock": os.environ.get(
                        "KOOI_RUNNER_IMAGE_LOCK", str(REPO / "images/runner/lock.yml")),
                    "kooi_extra_ca_files": sorted(str(p) for p in
                                                  Path("/usr/local/share/ca-certificates").glob("*.crt")),
                }}}}))
                first.append(run_site(inv))
                second.append(run_site(inv))
                print(f"round {i + 1}: first {first[-1]:.1f} s, second {second[-1]:.1f} s",
                      file=sys.stderr)
        finally:
            subprocess.run(["docker", "rm", "-f", "-v", name], capture_output=True)
    med_first, med_second = statistics.median(first), statistics.median(second)
    print(json.dumps({"image": args.image, "engine_mode": args.engine_mode, "with_image": args.with_image,
                      "rounds": args.rounds,
                      "first_s": [round(x, 1) for x in first],
                      "second_s": [round(x, 1) for x in second],
                      "median_first_s": round(med_first, 1), "median_second_s": round(med_second, 1),
                      "ratio_second_over_first": round(med_second / med_first, 3)}, indent=2))


if __name__ == "__main__":
    main()
