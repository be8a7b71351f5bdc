"""The runner image on this provisioned host: pinned, rebuilt only when an input changes,
refused when its base is not the pinned one or when it carries a setuid file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from .conftest import KOOI, playbook

CONTEXT = Path("/var/lib/kooi/images/runner/context")
LOCK = Path("/etc/kooi/images/runner.lock.yml")


@pytest.fixture(scope="module")
def pinned(engine):
    subprocess.run([KOOI, "engine", "start"], check=True, capture_output=True)
    return json.loads(Path("/etc/kooi/images.json").read_text())["runner"]


def build(context: Path, lock: Path = LOCK, *extra: str, name: str = "runner") -> tuple[subprocess.CompletedProcess, dict]:
    res = subprocess.run([KOOI, "image", "build", "--name", name, "--lock", str(lock), "--context", str(context),
                          "--archive-dir", "/var/tmp/kooi-images", *extra], capture_output=True, text=True)
    try:
        return res, json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return res, {}


def docker(engine, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", engine["runner_user"], "--", "env",
                           f"DOCKER_HOST=unix://{engine['socket']}", "docker", *args],
                          capture_output=True, text=True)


def drop_e2e_images(engine) -> None:
    """Images of these tests' builds ("e2e"), pinned or not (an earlier failed test's)."""
    for image_id in set(docker(engine, "images", "-q", "--filter", "label=org.kooi.image=e2e").stdout.split()):
        docker(engine, "rmi", "-f", image_id)


@pytest.fixture
def context_copy(engine):
    drop_e2e_images(engine)
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
    res = subprocess.run([KOOI, "image", "verify", "--lock", str(LOCK)], capture_output=True, text=True)
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


def test_a_prebuilt_archive_of_other_inputs_is_refused(engine, pinned, context_copy, tmp_path):
    """kooi_runner_image_prebuilt: only an image built from this host's inputs is taken."""
    cf = context_copy / "Containerfile"
    cf.write_text(cf.read_text() + "\n# inputs no archive was built from\n")
    res, _ = build(context_copy, LOCK, "--prebuilt", str(tmp_path / "missing.tar"), name="e2e")
    assert res.returncode == 1 and "prebuilt image archive" in res.stderr and "does not exist" in res.stderr
    archive = tmp_path / "other.tar"
    with archive.open("wb") as f:
        subprocess.run(["runuser", "-u", engine["runner_user"], "--", "env", f"DOCKER_HOST=unix://{engine['socket']}",
                        "docker", "save", "kooi-probe:latest"], stdout=f, check=True)
    res, _ = build(context_copy, LOCK, "--prebuilt", str(archive), name="e2e")
    assert res.returncode == 1, res.stdout
    assert f"refusing the prebuilt archive {archive}" in res.stderr and "(inputs none)" in res.stderr
    assert docker(engine, "image", "inspect", "kooi-probe:latest").returncode == 0  # it was there before
    pins = json.loads(Path("/etc/kooi/images.json").read_text())
    assert pins["runner"] == pinned and "e2e" not in pins


def run_in_image(engine, image_id: str, script: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", engine["runner_user"], "--", "env", f"DOCKER_HOST=unix://{engine['socket']}",
                           "docker", "run", "--rm", "-i", "--network", "none", *flags, "--entrypoint", "sh",
                           image_id, "-s"], input=script, capture_output=True, text=True, timeout=300)


def test_the_pinned_toolchains_run_and_java_trusts_the_extra_cas(engine, pinned):
    lock = yaml.safe_load(LOCK.read_text())
    res = run_in_image(engine, pinned["id"], """
        set -e
        java -version 2>&1 | head -1
        mvn -v | head -1
        echo "node $(node --version) npm $(npm --version)"
        python3 -m venv /tmp/venv && /tmp/venv/bin/python -V && /tmp/venv/bin/pip --version | cut -d' ' -f1-2
        git --version
        curl --version | head -1
        claude --version
        echo "uid $(id -u)"
        for crt in /usr/local/share/ca-certificates/*.crt; do
          fp=$(openssl x509 -noout -fingerprint -sha256 -in "$crt" | sed 's/.*=//')
          keytool -list -cacerts -storepass changeit | grep -q "$fp" && echo "JAVA-TRUSTS $(basename $crt)"
        done
    """)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert 'openjdk version "21' in out
    assert f"Apache Maven {lock['maven']['version']}" in out
    assert "node v20." in out and "npm 9." in out
    assert "Python 3.13" in out and "pip 25" in out
    assert "git version 2." in out and "curl 8." in out
    assert f"{lock['claude_code']['version']} (Claude Code)" in out
    assert "uid 1000" in out
    host_cas = sorted(p.name for p in Path("/usr/local/share/ca-certificates").glob("*.crt"))
    assert host_cas, "this machine has no extra CA to check"
    for name in host_cas:
        assert f"JAVA-TRUSTS {name}" in out, out


def test_later_package_installs_stay_stripped_of_setuid(engine, pinned):
    res = run_in_image(engine, pinned["id"], """
        set -e
        mkdir -p /tmp/p/DEBIAN /tmp/p/usr/local/bin
        printf 'Package: kooi-suid-test\\nVersion: 1.0\\nArchitecture: all\\nMaintainer: kooi <kooi@localhost>\\nDescription: t\\n' \
          > /tmp/p/DEBIAN/control
        cp /bin/true /tmp/p/usr/local/bin/kooi-suid-test && chmod 4755 /tmp/p/usr/local/bin/kooi-suid-test
        dpkg-deb --root-owner-group --build /tmp/p /tmp/kooi-suid-test.deb >/dev/null
        apt-get install -y -qq /tmp/kooi-suid-test.deb >/dev/null 2>&1
        stat -c 'MODE %a' /usr/local/bin/kooi-suid-test
        find / -xdev ! -type l -perm /6000 -print 2>/dev/null | sed 's/^/SUID /'
    """, "--user", "0")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "MODE 755" in res.stdout and "SUID" not in res.stdout, res.stdout


def test_an_image_that_claims_the_runners_inputs_is_never_pinned(engine, pinned):
    """Found building image variants (session 28): an image built FROM the runner image
    inherits its labels, org.kooi.inputs among them, and `kooi image build` (site.yml)
    took the first image carrying the inputs' label for the runner image and pinned it,
    unverified, as every later run's image. A workload can bring such an image onto the
    runner's engine (pulls through the broker are allowed; the label is a string anyone
    can write). Only the image kooi built or loaded and verified is pinned."""
    drop_e2e_images(engine)
    d = Path(tempfile.mkdtemp(prefix="kooi-e2e-claims-", dir="/var/tmp"))
    d.chmod(0o755)
    (d / "Containerfile").write_text(f"FROM {pinned['id']}\nLABEL org.kooi.inputs={pinned['inputs']} "
                                     "org.kooi.image=e2e e2e.claims=1\n")
    (d / "Containerfile").chmod(0o644)
    made = docker(engine, "build", "-q", "-f", str(d / "Containerfile"), str(d))
    shutil.rmtree(d)
    assert made.returncode == 0, made.stderr
    claimer = made.stdout.strip()
    try:
        res, out = build(CONTEXT)
        assert res.returncode == 0, res.stderr[-2000:]
        assert out["id"] == pinned["id"] and out["changed"] is False, out
        assert json.loads(Path("/etc/kooi/images.json").read_text())["runner"] == pinned
        tagged = docker(engine, "image", "inspect", "--format", "{{.Id}}", pinned["tag"]).stdout.strip()
        assert tagged == pinned["id"], f"{pinned['tag']} names {tagged}, not the pinned image"
    finally:
        docker(engine, "rmi", "-f", claimer)


def test_a_declared_variant_is_built_pinned_and_run_and_a_bad_one_stops_the_play(engine, pinned, variants,
                                                                                tmp_path):
    """Issue 31: the variants of examples/images/variants.yml (the `variants` fixture:
    site.yml's image role) are built FROM the pinned runner image at the lock's versions,
    verified and pinned; the JDK 17 one runs the Java 17 example offline. A variant asking
    for a package the archive does not have fails the play before anything changes,
    naming both."""
    assert variants["runner"] == pinned and variants["java17"]["base"] == pinned["id"] == variants["go"]["base"]
    before = Path("/etc/kooi/images.json").read_text()
    bad = tmp_path / "bad.json"
    lock = tmp_path / "kooi-images.lock.yml"
    bad.write_text(json.dumps({"kooi_runner_images": {"broken": {"packages": ["curl", "kooi-no-such-package"]}},
                               "kooi_runner_images_lock": str(lock)}))
    res = playbook("--tags", "runner_image", "-e", f"@{bad}", check=False)
    assert res.returncode != 0 and "broken: kooi-no-such-package" in res.stdout, res.stdout[-3000:]
    assert "broken: curl" not in res.stdout and not lock.exists()
    assert Path("/etc/kooi/images.json").read_text() == before
    wfdir = Path(tempfile.mkdtemp(prefix="kooi-e2e-variant-wf-", dir="/var/tmp"))
    wfdir.chmod(0o755)
    repo = Path(__file__).resolve().parents[2]
    shutil.copy(repo / "examples/workflows/maven-jdk17.yml", wfdir / "maven-jdk17.yml")
    (wfdir / "maven-jdk17.yml").chmod(0o644)
    project = Path(engine["runner_home"]) / "kooi-e2e" / f"maven-jdk17-{os.getpid()}"
    shutil.copytree(repo / "examples/maven-jdk17", project)
    subprocess.run(["chown", "-R", f"{engine['runner_user']}:{engine['runner_user']}", str(project.parent)],
                   check=True)
    try:
        res = subprocess.run([KOOI, "run", "maven-jdk17", "--project", str(project)], capture_output=True, text=True,
                             env={**os.environ, "KOOI_WORKFLOW_DIR": str(wfdir)}, timeout=900)
        assert res.returncode == 0 and "KOOI-JDK feature=17" in res.stdout and "BUILD SUCCESS" in res.stdout, \
            res.stdout[-3000:] + res.stderr
    finally:
        shutil.rmtree(wfdir)
        shutil.rmtree(project, ignore_errors=True)
