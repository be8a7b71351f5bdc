"""`testcontainers: true` workflows on the runner's rootless engine: real Testcontainers
(Java with PostgreSQL, Python with a Network of two containers, Node.js with PostgreSQL
at its published port) through the per-run
kooi broker; a failing assertion fails the run; nothing the run started is left."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from .conftest import REPO
from .test_run import host, kooi_run, project, runner_docker, wfdir, write_wf  # noqa: F401 - fixtures

TC_KEYS = ("TESTCONTAINERS_RYUK_DISABLED", "TESTCONTAINERS_HOST_OVERRIDE", "DOCKER_HOST")


@pytest.fixture(scope="module")
def postgres_image(engine):
    res = subprocess.run([str(REPO / "images/testcontainers/build.sh"), "postgres"], capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout.split()[-1]


@pytest.fixture
def tc_wfdir(wfdir):
    for name in ("maven-testcontainers", "testcontainers-python", "testcontainers-node"):
        shutil.copy(REPO / f"examples/workflows/{name}.yml", wfdir / f"{name}.yml")
    return wfdir


def run_objects(host, run_id: str) -> list[str]:
    """Containers, networks and volumes on the engine that carry the run's label."""
    out = []
    for kind in ("ps -a", "network ls", "volume ls"):
        res = subprocess.run(["runuser", "-u", host["runner_user"], "--", "env", f"DOCKER_HOST=unix://{host['socket']}",
                              "docker", *kind.split(), "-q", "--filter", f"label=org.kooi.run={run_id}"],
                             capture_output=True, text=True, check=True)
        out += [f"{kind.split()[0]}:{x}" for x in res.stdout.split()]
    return out


def variant(wfdir: Path, base: str, name: str, **changes) -> None:
    data = yaml.safe_load((wfdir / f"{base}.yml").read_text())
    for k, v in changes.items():
        if k == "environment":
            data.setdefault("environment", {}).update(v)
        else:
            data[k] = v
    write_wf(wfdir, name, data)


def test_maven_testcontainers_passes_through_the_broker(host, tc_wfdir, project, postgres_image):
    proj = project()
    res, result = kooi_run("maven-testcontainers", proj, tc_wfdir, timeout=1500)
    assert res.returncode == 0, res.stdout[-5000:] + res.stderr
    assert "PostgresContainerTest" in res.stdout and "BUILD SUCCESS" in res.stdout
    assert "Tests run: 8, Failures: 0, Errors: 0, Skipped: 0" in res.stdout, res.stdout[-3000:]
    assert result["reason"] == "ok" and result["isolation"] == "rootless"
    assert result["broker"]["allowed"] > 5 and result["broker"]["refused"] == 0, result["broker"]
    assert result["cleanup"]["failed"] == [] and result["cleanup"]["networks"], result["cleanup"]
    assert run_objects(host, result["run_id"]) == []


def test_a_failing_testcontainers_assertion_fails_the_run_and_cleans_up(host, tc_wfdir, project, postgres_image):
    variant(tc_wfdir, "maven-testcontainers", "maven-tc-wrong",
            command=["mvn", "-B", "-o", "-Ptestcontainers", "-Dkooi.expected.sum=1", "-Dtest=PostgresContainerTest",
                     "verify"])
    proj = project()
    res, result = kooi_run("maven-tc-wrong", proj, tc_wfdir, timeout=1500)
    assert res.returncode == 1 and result["reason"] == "failed", res.stdout[-3000:]
    assert "expected: <1> but was: <131172>" in res.stdout
    assert run_objects(host, result["run_id"]) == []


def test_python_testcontainers_network_of_two(host, tc_wfdir, project, postgres_image):
    proj = project("testcontainers-python")
    subprocess.run([str(proj / "vendor.sh"), str(proj)], check=True, capture_output=True, timeout=600)
    subprocess.run(["chown", "-R", f"{host['runner_user']}:{host['runner_user']}", str(proj)], check=True)
    res, result = kooi_run("testcontainers-python", proj, tc_wfdir, timeout=900)
    assert res.returncode == 0, res.stdout[-5000:] + res.stderr
    assert re.search(r"test_a_client_container_reaches_postgres_by_name .*\.\.\. ok", res.stdout), res.stdout
    assert result["cleanup"]["failed"] == [] and run_objects(host, result["run_id"]) == []
    # the same with a wrong expectation fails
    variant(tc_wfdir, "testcontainers-python", "tc-python-wrong", environment={"KOOI_EXPECTED_SUM": "41"})
    res, result = kooi_run("tc-python-wrong", proj, tc_wfdir, timeout=900)
    assert res.returncode == 1 and result["reason"] == "failed", res.stdout[-3000:]
    assert run_objects(host, result["run_id"]) == []


# The pinned testcontainers-python versions (tests/compat/python/locks) and what each
# does under kooi: 4.0.0 reads a container's gateway on the network named "bridge", which
# the broker shows the run's network as (docs/testcontainers.md).
PYTHON_CLIENTS = {"4.0.0": "pass", "4.4.0": "pass", "4.8.2": "pass", "4.15.0": "pass"}


def test_python_clients_pinned_versions_and_the_getting_started_guides_fixture(host, tc_wfdir, postgres_image):
    """Issue 31: testcontainers-python as projects pin it, through the broker. 4.4.0 runs
    the getting-started guide's fixture unchanged (`os.environ["DB_PORT"] =
    get_exposed_port(5432)`: before the run network's gateway had a name, 4.4 compared
    TC_HOST with the gateway's address and returned an int)."""
    src = REPO / "tests/compat/python"
    proj = Path(host["runner_home"]) / "kooi-e2e" / f"compat-python-{time.monotonic_ns()}"
    shutil.copytree(src, proj, ignore=shutil.ignore_patterns("locks", "vendor.sh", "__pycache__"))
    try:
        subprocess.run([str(src / "vendor.sh"), str(proj)], check=True, capture_output=True, timeout=600)
        subprocess.run(["chown", "-R", f"{host['runner_user']}:{host['runner_user']}", str(proj)], check=True)
        # The guide's image name (no registry here: the local PostgreSQL under that name).
        runner_docker(host, "tag", postgres_image, "postgres:16-alpine")
        write_wf(tc_wfdir, "compat-python", {"mode": "container", "image": "runner", "testcontainers": True,
                                             "command": ["sh", "run.sh"], "timeout": 900})
        res, result = kooi_run("compat-python", proj, tc_wfdir, timeout=900)
        found = re.findall(r"^compat python testcontainers (\S+) \(([^)]*)\): (\S+)$", res.stdout, re.M)
        assert {v: outcome for v, _, outcome in found} == PYTHON_CLIENTS, res.stdout[-6000:]
        assert ("4.4.0", "tests/test_store.py tests/test_guide.py", "pass") in found, found
        assert result["cleanup"]["failed"] == [] and run_objects(host, result["run_id"]) == []
    finally:
        shutil.rmtree(proj, ignore_errors=True)


# The pinned Testcontainers for Java versions (tests/compat/java/versions; the Maven
# example pins 1.21.4) and what each does under kooi.
JAVA_CLIENTS = {"1.19.8": "pass", "1.20.6": "pass", "2.0.5": "pass"}


def test_java_clients_pinned_versions_run_the_getting_started_guides_test(host, tc_wfdir, postgres_image):
    """Issue 31: Testcontainers for Java as projects pin it (1.19, 1.20, 2.x: renamed
    modules), the getting-started guide's test through the broker; every artifact comes
    through the egress proxy's maven_central preset and is checked against the project's
    trusted checksums (one changed hash fails that version's build)."""
    src = REPO / "tests/compat/java"
    base = Path(host["runner_home"]) / "kooi-e2e"
    proj, bad = base / f"compat-java-{time.monotonic_ns()}", base / f"compat-java-bad-{time.monotonic_ns()}"
    shutil.copytree(src, proj, ignore=shutil.ignore_patterns("target"))
    shutil.copytree(src, bad, ignore=shutil.ignore_patterns("target"))
    sums = bad / ".mvn/checksums/checksums-central.sha256"
    jar = "org/testcontainers/testcontainers/1.20.6/testcontainers-1.20.6.jar"
    sums.write_text("".join(("0" * 64 + line[64:]) if line.endswith(f"  {jar}\n") else line
                            for line in sums.read_text().splitlines(keepends=True)))
    (bad / "versions").write_text("1.20.6 postgresql junit-jupiter\n")
    try:
        for d in (proj, bad):
            subprocess.run(["chown", "-R", f"{host['runner_user']}:{host['runner_user']}", str(d)], check=True)
        runner_docker(host, "tag", postgres_image, "postgres:16-alpine")  # the guide's image name
        write_wf(tc_wfdir, "compat-java", {"mode": "container", "image": "runner", "testcontainers": True,
                                           "command": ["sh", "run.sh"], "timeout": 1500})
        res, result = kooi_run("compat-java", proj, tc_wfdir, timeout=1500)
        found = dict(re.findall(r"^compat java testcontainers (\S+): (\S+)$", res.stdout, re.M))
        assert found == JAVA_CLIENTS, res.stdout[-6000:]
        assert result["reason"] == "ok" and result["broker"]["refused"] == 0, result["broker"]
        assert result["egress"]["requests"] > 10 and result["egress"]["refused"] == [], result["egress"]
        assert result["cleanup"]["failed"] == [] and run_objects(host, result["run_id"]) == []
        res, result = kooi_run("compat-java", bad, tc_wfdir, timeout=600)
        assert result["reason"] == "failed", res.stdout[-3000:]
        assert "org.testcontainers:testcontainers:jar:1.20.6 trusted checksum mismatch" in res.stdout, \
            res.stdout[-3000:]
        assert "compat java testcontainers 1.20.6: FAIL" in res.stdout
    finally:
        for d in (proj, bad):
            subprocess.run(["runuser", "-u", host["runner_user"], "--", "rm", "-rf", str(d)], check=False)


# The pinned Testcontainers for Node.js versions besides the example's 11.14.0
# (tests/compat/node/locks), and the image each runs in: 12.x needs Node 22.22 or newer
# (zstd in node:zlib), which the runner image (Debian 13's Node 20) has not: the node22
# variant, a download recipe (examples/images/variants.yml; docs/testcontainers.md).
NODE_CLIENTS = {"10.28.0": "runner", "12.2.0": "node22"}


def test_node_clients_pinned_versions_run_the_examples_test(host, tc_wfdir, variants, postgres_image):
    """Issue 31: Testcontainers for Node.js 10.x (the last release before 11) runs the
    example's test unchanged through the broker in the runner image, 12.x (the newest)
    in the node22 variant (vendored from hashed locks)."""
    src = REPO / "tests/compat/node"
    proj = Path(host["runner_home"]) / "kooi-e2e" / f"compat-node-{time.monotonic_ns()}"
    proj.mkdir()
    shutil.copy(src / "run.sh", proj / "run.sh")
    try:
        subprocess.run([str(src / "vendor.sh"), str(proj)], check=True, capture_output=True, timeout=600)
        subprocess.run(["chown", "-R", f"{host['runner_user']}:{host['runner_user']}", str(proj)], check=True)
        for version, image in NODE_CLIENTS.items():
            write_wf(tc_wfdir, "compat-node", {"mode": "container", "image": image, "testcontainers": True,
                                               "command": ["sh", "run.sh", version], "timeout": 600})
            res, result = kooi_run("compat-node", proj, tc_wfdir, timeout=600)
            lines = re.findall(r"^compat node testcontainers (\S+) \(node (v\d+)\.[^)]*\): (\S+)$", res.stdout, re.M)
            found = {v: (node, verdict) for v, node, verdict in lines}
            assert found == {version: ("v22" if image == "node22" else "v20", "pass")}, res.stdout[-6000:]
            assert re.search(r"KOOI-TC-NODE host=engine\.kooi\.internal port=\d+ total=42", res.stdout), res.stdout
            assert result["cleanup"]["failed"] == [] and run_objects(host, result["run_id"]) == []
    finally:
        subprocess.run(["runuser", "-u", host["runner_user"], "--", "rm", "-rf", str(proj)], check=False)


def test_go_testcontainers_with_its_modules_through_the_go_preset(host, tc_wfdir, project, variants, postgres_image):
    """Issue 31: testcontainers-go (v0.45, and v0.44) in the runner image's go variant, through the
    broker; its modules come from the Go module proxy through the run's egress proxy (the
    go preset) and are checked against the project's go.sum. A module host outside the
    preset is refused, and the run's result says so."""
    shutil.copy(REPO / "examples/workflows/testcontainers-go.yml", tc_wfdir / "testcontainers-go.yml")
    proj = project("testcontainers-go")
    # A recent minor too (tests/compat/go: v0.44.0), the example's test unchanged, in the
    # same run (one build cache): a module of its own in a directory `./...` passes by.
    shutil.copytree(REPO / "tests/compat/go", proj / "v0.44")
    shutil.copy(REPO / "examples/testcontainers-go/postgres_test.go", proj / "v0.44")
    subprocess.run(["chown", "-R", f"{host['runner_user']}:{host['runner_user']}", str(proj / "v0.44")], check=True)
    variant(tc_wfdir, "testcontainers-go", "tc-go-both",
            command=["sh", "-c", "go test -count=1 -v ./... && cd v0.44 && go test -count=1 -v ./..."])
    res, result = kooi_run("tc-go-both", proj, tc_wfdir, timeout=900)
    assert res.returncode == 0, res.stdout[-5000:] + res.stderr
    # the guide's way, Host() and MappedPort(): the broker lists the run's network as the
    # default bridge, so testcontainers-go makes no `reaper_default` of its own
    assert re.search(r"KOOI-TC-GO host=engine\.kooi\.internal port=[0-9]+ total=42", res.stdout), res.stdout[-3000:]
    assert re.findall(r"^ok\s+(\S+)", res.stdout, re.M) == ["example.kooi/testcontainers-go",
                                                         "compat.kooi/testcontainers-go"], res.stdout[-3000:]
    assert res.stdout.count("--- PASS: TestPostgresThroughTheBroker") == 2 and result["egress"]["refused"] == []
    assert result["cleanup"]["failed"] == [] and run_objects(host, result["run_id"]) == []
    variant(tc_wfdir, "testcontainers-go", "tc-go-elsewhere",
            environment={"GOFLAGS": "-mod=readonly", "GOPROXY": "https://goproxy.kooi.invalid"})
    res, result = kooi_run("tc-go-elsewhere", proj, tc_wfdir, timeout=900)
    assert res.returncode != 0 and result["reason"] == "failed", res.stdout[-3000:]
    assert {(r["method"], r["host"], r["status"]) for r in result["egress"]["refused"]} == \
        {("CONNECT", "goproxy.kooi.invalid", 403)}, result["egress"]


def test_node_testcontainers_reach_a_published_port_at_the_run_networks_gateway(host, tc_wfdir, project,
                                                                               postgres_image):
    """Node.js Testcontainers (getHost + getMappedPort): the workload, in a network
    namespace of its own, reaches PostgreSQL's published port at its run network's
    gateway (userland proxy off: the engine answers by NAT inside its namespace)."""
    proj = project("testcontainers-node")
    subprocess.run([str(proj / "vendor.sh"), str(proj)], check=True, capture_output=True, timeout=600)
    subprocess.run(["chown", "-R", f"{host['runner_user']}:{host['runner_user']}", str(proj)], check=True)
    res, result = kooi_run("testcontainers-node", proj, tc_wfdir, timeout=600)
    assert res.returncode == 0, res.stdout[-5000:] + res.stderr
    m = re.search(r"KOOI-TC-NODE host=(\S+) port=(\d+) total=42", res.stdout)
    assert m and m.group(1) == "engine.kooi.internal", res.stdout[-3000:]  # the gateway, by name
    assert "# pass 1" in res.stdout and result["cleanup"]["failed"] == []
    assert run_objects(host, result["run_id"]) == []
    variant(tc_wfdir, "testcontainers-node", "tc-node-wrong", environment={"KOOI_EXPECTED_SUM": "41"})
    res, result = kooi_run("tc-node-wrong", proj, tc_wfdir, timeout=600)
    assert res.returncode == 1 and result["reason"] == "failed", res.stdout[-3000:]
    assert "# fail 1" in res.stdout and run_objects(host, result["run_id"]) == []


def test_a_workload_cannot_escape_through_its_engine_socket(host, tc_wfdir, project, postgres_image):
    """From inside a testcontainers run: the broker refuses a privileged container and a
    host mount, the workload's own container is out of reach, and the workload has a
    network namespace of its own (not rootlesskit's: no tap0, none of the engine's
    abstract unix sockets)."""
    script = r"""
import http.client, json, os, socket
def call(method, path, body=None):
    s = socket.socket(socket.AF_UNIX); s.connect("/run/kooi/docker.sock")
    c = http.client.HTTPConnection("x"); c.sock = s
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Content-Type": "application/json"})
    r = c.getresponse(); return r.status, r.read().decode()
print("PRIV", *call("POST", "/containers/create", {"Image": "kooi-postgres:17", "HostConfig": {"Privileged": True}}))
print("HOST", *call("POST", "/containers/create", {"Image": "kooi-postgres:17", "HostConfig": {"Binds": ["/:/host"]}}))
mine = json.loads(call("GET", "/containers/json")[1])
print("LIST", len(mine))
print("SELF", *call("POST", "/containers/" + mine[0]["Id"] + "/update", {"Memory": 0}))
print("ENV", *[os.environ.get(k, "-") for k in %s])
print("NETNS", "tap0" in open("/proc/net/dev").read(), sum("@" in l for l in open("/proc/net/unix")))
print("GW", socket.gethostbyname(os.environ["TC_HOST"]))
""" % (list(TC_KEYS),)
    proj = project("python-example")
    (proj / "probe.py").write_text(script)
    shutil.chown(proj / "probe.py", host["runner_user"], host["runner_user"])
    write_wf(tc_wfdir, "tc-probe", {"mode": "container", "testcontainers": True,
                                    "command": ["python3", "probe.py"]})
    res, result = kooi_run("tc-probe", proj, tc_wfdir)
    assert res.returncode == 0, res.stdout + res.stderr
    out = {line.split(" ", 1)[0]: line for line in res.stdout.splitlines() if line.split(" ", 1)[0] in
           ("PRIV", "HOST", "LIST", "SELF", "ENV", "NETNS", "GW")}
    assert out["PRIV"].startswith("PRIV 403") and "privileged containers are refused" in out["PRIV"], out
    assert out["HOST"].startswith("HOST 403") and "outside the workspace" in out["HOST"], out
    assert out["LIST"] == "LIST 1", out  # only its own container, nobody else's
    assert out["SELF"].startswith("SELF 403") and "workload's own container" in out["SELF"], out
    assert "unix:///run/kooi/docker.sock" in out["ENV"] and "true" in out["ENV"], out
    # published ports at the run network's gateway, by a name (testcontainers-python 4.4
    # compares an address with the gateway's and then returns an int port)
    assert " engine.kooi.internal " in out["ENV"] and re.fullmatch(r"GW \d+\.\d+\.\d+\.1", out["GW"]), out
    assert out["NETNS"] == "NETNS False 0", out
    assert result["broker"]["refused"] == 3, result["broker"]
