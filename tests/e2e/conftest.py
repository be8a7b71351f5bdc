"""End-to-end tests on this machine (as root): site.yml through the local inventory."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "ansible"
IMAGE_DIR = Path(os.environ.get("KOOI_IMAGE_DIR", "/var/tmp/kooi-images"))
# The command site.yml installed (system python, root-owned copy): what operators, cron
# and pipelines run, not the development venv's console script.
KOOI = "/usr/local/bin/kooi"


def pytest_configure(config):
    if os.geteuid() != 0:
        raise pytest.UsageError("tests/e2e provision this machine and must run as root")
    lock = os.environ.get("KOOI_RUNNER_IMAGE_LOCK", "")
    if not lock or not Path(lock).is_file():
        raise pytest.UsageError(
            f"KOOI_RUNNER_IMAGE_LOCK={lock!r} is not a file: run images/runner/prepare-base.sh and export "
            "the lock it prints (scripts/test.sh does)")


def playbook(*extra: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ansible-playbook", "-i", "inventories/local.yml", "site.yml", *extra]
    res = subprocess.run(cmd, cwd=ANSIBLE, capture_output=True, text=True, check=False,
                         env={**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"})
    if check and res.returncode != 0:
        pytest.fail(f"site.yml failed ({res.returncode}):\n{res.stdout[-4000:]}\n{res.stderr[-2000:]}")
    return res


def recap(out: str) -> dict[str, int]:
    m = re.search(r"localhost\s*:\s*(.*)", out.split("PLAY RECAP")[-1])
    assert m, out[-2000:]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}


@pytest.fixture(scope="session")
def provisioned():
    """site.yml until a run changes nothing: (the first run, the run that changed nothing).
    On a host the quick start or the images stage provisioned, the first already does."""
    first = playbook()
    if recap(first.stdout)["changed"] == 0:
        return first, first
    return first, playbook()


@pytest.fixture(scope="session")
def engine(provisioned):
    res = subprocess.run([KOOI, "engine", "start", "--json"], capture_output=True, text=True,
                         check=False)
    assert res.returncode == 0, res.stderr
    cfg = json.loads(Path("/etc/kooi/engine.json").read_text())
    probe = IMAGE_DIR / "probe.tar"
    assert probe.exists(), f"{probe} missing: run molecule/testhost/build-images.sh first"
    with probe.open("rb") as fh:
        subprocess.run(["runuser", "-u", cfg["runner_user"], "--", "env",
                        f"DOCKER_HOST=unix://{cfg['socket']}",
                        f"XDG_RUNTIME_DIR=/run/user/{cfg['runner_uid']}", "docker", "load", "-q"],
                       stdin=fh, check=True, capture_output=True)
    return cfg


@pytest.fixture(scope="session")
def variants(engine):
    """The runner image variants of examples/images/variants.yml (JDK 17, Go, Node 22), built,
    verified and pinned once per session by site.yml's image role; their pins and
    images removed at the end."""
    playbook("--tags", "runner_image", "-e", f"@{REPO / 'examples/images/variants.yml'}")
    pins = json.loads(Path("/etc/kooi/images.json").read_text())
    assert {"java17", "go", "node22"} <= set(pins), pins
    yield pins
    path = Path("/etc/kooi/images.json")
    now = json.loads(path.read_text())
    gone = [now.pop(n) for n in ("java17", "go", "node22") if n in now]
    path.write_text(json.dumps(now, indent=2, sort_keys=True) + "\n")
    for pin in gone:
        subprocess.run(["runuser", "-u", engine["runner_user"], "--", "env", f"DOCKER_HOST=unix://{engine['socket']}",
                        "docker", "rmi", "-f", pin["id"]], capture_output=True, check=False)
