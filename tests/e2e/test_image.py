"""The runner image on this provisioned host: pinned, rebuilt only when an input changes,
refused when its base is not the pinned one or when it carries a setuid file."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

CONTEXT = Path("/var/lib/kooi/images/runner/context")
LOCK = Path("/etc/kooi/images/runner.lock.yml")


@pytest.fixture(scope="module")
def pinned(engine):
    subprocess.run(["kooi", "engine", "start"], check=True, capture_output=True)
    return json.loads(Path("/etc/kooi/images.json").read_text())["runner"]


def build(context: Path, lock: Path = LOCK, *extra: str, name: str = "runner") -> tuple[subprocess.CompletedProcess, dict]:
    res = subprocess.run(["kooi", "image", "build", "--name", name, "--lock", str(lock), "--context", str(context),
                          "--archive-dir", "/var/tmp/kooi-images", *extra], capture_output=True, text=True)
    try:
        return res, json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return res, {}


def docker(engine, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", engine["runner_user"], "--", "env",
                           f"DOCKER_HOST=unix://{engine['socket']}", "docker", *args],
                          capture_output=True, text=True)


@pytest.fixture
def context_copy(engine):
    d = Path(tempfile.mkdtemp(prefix="kooi-e2e-context-", dir="/var/tmp"))
    shutil.copytree(CONTEXT, d, dirs_exist_ok=True)
    yield d
    shutil.rmtree(d)
    # Test builds pin under the name "e2e"; drop that pin and its image.
    path = Path("/etc/kooi/images.json")
    pins = json.loads(path.read_text())
    e2e = pins.pop("e2e", None)
    path.write_text(json.dumps(pins, indent=2, sort_keys=True) + "\n")
    if e2e:
        docker(engine, "rmi", "-f", e2e["id"])


def test_the_pinned_image_matches_the_lock(pinned):
    lock = yaml.safe_load(LOCK.read_text())
    assert pinned["base"] == lock["base"]["digest"]
    res = subprocess.run(["kooi", "image", "verify", "--lock", str(LOCK)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_an_unchanged_context_does_not_rebuild(pinned):
    res, out = build(CONTEXT, LOCK, "--check")
    assert res.returncode == 0 and out["changed"] is False, res.stderr
    res, out = build(CONTEXT)
    assert res.returncode == 0, res.stderr
    assert out == {**out, "changed": False, "built": False, "id": pinned["id"]}


def test_a_changed_input_rebuilds(engine, pinned, context_copy):
    cf = context_copy / "Containerfile"
    cf.write_text(cf.read_text() + "\n# an input changed\n")
    res, out = build(context_copy, LOCK, "--check", name="e2e")
    assert out["changed"] is True and out["id"] is None
    res, out = build(context_copy, name="e2e")
    assert res.returncode == 0, res.stderr[-3000:]
    assert out["changed"] is True and out["built"] is True and out["id"] != pinned["id"]
    again, out2 = build(context_copy, name="e2e")
    assert out2["changed"] is False and out2["id"] == out["id"]
    assert json.loads(Path("/etc/kooi/images.json").read_text())["runner"] == pinned


def test_a_base_that_is_not_the_pinned_one_is_refused(engine, pinned, context_copy, tmp_path):
    lock = tmp_path / "lock.yml"
    lock.write_text(LOCK.read_text().replace(pinned["base"], "sha256:" + "0" * 64))
    res, _ = build(context_copy, lock, name="e2e")
    assert res.returncode == 1
    assert "refusing base archive" in res.stderr and "sha256:" + "0" * 64 in res.stderr
    assert json.loads(Path("/etc/kooi/images.json").read_text())["runner"] == pinned


def test_an_image_with_a_setuid_file_is_refused_and_removed(engine, pinned, context_copy):
    cf = context_copy / "Containerfile"
    cf.write_text(cf.read_text() + "\nUSER 0\nRUN chmod u+s /usr/bin/find && chmod g+s /usr/bin/id\nUSER 1000:1000\n")
    res, _ = build(context_copy, name="e2e")
    assert res.returncode == 1, res.stdout
    assert "refusing the built image" in res.stderr
    assert "setuid 0o4755 /usr/bin/find" in res.stderr and "setgid 0o2755 /usr/bin/id" in res.stderr
    left = docker(engine, "images", "-q", "--filter", "label=org.kooi.image=e2e")
    assert left.stdout.split() == []
    assert json.loads(Path("/etc/kooi/images.json").read_text())["runner"] == pinned
