"""kooi run at isolation gvisor (min_isolation: gvisor) on the userns-remap test host
with the runner image and kooi-authz (issue 17's acceptance): the Maven example builds
under runsc; the Maven example's Testcontainers tests pass with the build and every
container it starts under runsc (docker inspect while the run runs); the run's broker
refuses any other runtime, puts a create that names none under runsc, and execs into
such a container (gVisor's kernel answers).

The verify playbook runs it after the runc runs of the same examples, whose project
(below the runner's 0750 home) and kooi-postgres image it reuses."""

from __future__ import annotations

import json
import re
import shlex

import pytest
import yaml

from kooi.checks import Context

# The verify playbook runs these after the runc runs of the same examples, whose projects
# (below the runner's 0750 home) and kooi-postgres image they reuse.
WFDIR = "/var/lib/kooi/verify-gvisor-workflows"
BROKER_PROBE = r"""
import http.client, json, socket
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect("/run/kooi/docker.sock")
def call(method, path, doc=None):
    c = C("d"); c.request(method, path, json.dumps(doc) if doc is not None else None,
                          {"Content-Type": "application/json"})
    r = c.getresponse(); return r.status, json.loads(r.read() or b"null")
for rt in ("runc", "io.containerd.runc.v2", "RUNSC"):
    st, doc = call("POST", "/v1.41/containers/create", {"Image": "kooi-probe:latest", "HostConfig": {"Runtime": rt}})
    print(f"PROBE {rt} {st} {doc.get('message') if isinstance(doc, dict) else doc}")
st, doc = call("POST", "/v1.41/containers/create", {"Image": "kooi-probe:latest", "Cmd": ["true"]})
print(f"PROBE default {st}")
st, got = call("GET", f"/v1.41/containers/{doc['Id']}/json")
print(f"PROBE inspected {got['HostConfig']['Runtime']}")
print(f"PROBE removed {call('DELETE', '/v1.41/containers/' + doc['Id'])[0]}")
st, doc = call("POST", "/v1.41/containers/create", {"Image": "kooi-probe:latest", "Cmd": ["sleep", "120"]})
cid = doc["Id"]
print(f"PROBE started {call('POST', f'/v1.41/containers/{cid}/start')[0]}")
st, ex = call("POST", f"/v1.41/containers/{cid}/exec",
              {"AttachStdout": True, "AttachStderr": True, "Tty": True, "Cmd": ["cat", "/proc/version"]})
eid = ex["Id"]
c = C("d")
c.request("POST", f"/v1.41/exec/{eid}/start", json.dumps({"Detach": False, "Tty": True}),
          {"Content-Type": "application/json"})
r = c.getresponse()
print(f"PROBE exec {st} {r.status} {r.read().decode(errors='replace').strip()}")
print(f"PROBE exec exit {call('GET', f'/v1.41/exec/{eid}/json')[1].get('ExitCode')}")
print(f"PROBE removed {call('DELETE', f'/v1.41/containers/{cid}?force=1')[0]}")
"""


@pytest.fixture(scope="module")
def ctx(host):
    c = Context.from_host(host)
    if c.engine.gvisor is None:
        pytest.fail("this host's engine.json has no gvisor: the scenario sets kooi_gvisor_enabled")
    if "runner" not in (c.described(host, "images") or {}):
        pytest.fail("no runner image pinned on this host: the verify playbook runs this file only where it is")
    return c


def workflow(host, name: str, base: str | None = None, **doc) -> None:
    """Workflow NAME in WFDIR (root's, as kooi run requires): the example BASE with
    min_isolation: gvisor, or DOC."""
    if base:
        doc = {**yaml.safe_load(host.file(f"/etc/kooi/workflows/{base}.yml").content_string), **doc}
    doc["min_isolation"] = "gvisor"
    text = yaml.safe_dump(doc, sort_keys=False)
    host.run(f"install -d -m 0755 {WFDIR} && printf %s {shlex.quote(text)} > {WFDIR}/{name}.yml "
             f"&& chmod 0644 {WFDIR}/{name}.yml")


def kooi_run(host, ctx, name: str, project: str) -> tuple[int, str, dict, list[tuple[str, str, str]]]:
    """`kooi run NAME` at gvisor, watching the engine meanwhile: (rc, output, result,
    [(container, runtime, nested label)] of every container of the run it saw)."""
    out, seen = f"/var/lib/kooi/runs/verify-{name}.json", f"/tmp/verify-{name}.seen"
    script = f"""
KOOI_WORKFLOW_DIR={WFDIR} kooi run {name} --project {shlex.quote(project)} --json {out} > /tmp/verify-{name}.out 2>&1 &
pid=$!
while kill -0 $pid 2>/dev/null; do
  docker ps -q --filter label=org.kooi.managed=1 | xargs -r docker inspect \
    -f '{{{{.Name}}}} {{{{.HostConfig.Runtime}}}} {{{{index .Config.Labels "org.kooi.nested"}}}}' 2>/dev/null
  sleep 0.3
done | sort -u > {seen}
wait $pid; echo "rc=$?"
"""
    res = host.run(script)
    rc = int(res.stdout.strip().rpartition("rc=")[2] or -1)
    output = host.file(f"/tmp/verify-{name}.out").content_string
    result = json.loads(host.file(out).content_string) if host.file(out).exists else {}
    rows = [tuple(line.split(" ", 2)) for line in host.file(seen).content_string.splitlines() if line.strip()]
    return rc, output, result, [(r[0].lstrip("/"), r[1], r[2] if len(r) > 2 else "") for r in rows]


def test_the_maven_example_builds_under_gvisor(host, ctx):
    project = f"{ctx.engine.runner_home}/kooi-verify/maven-example"
    workflow(host, "maven-example-gvisor", "maven-example")
    rc, out, result, seen = kooi_run(host, ctx, "maven-example-gvisor", project)
    assert rc == 0 and "BUILD SUCCESS" in out, out[-3000:]
    g = ctx.engine.gvisor
    assert result["isolation"] == "gvisor" and result["gvisor"] == {
        "runtime": "runsc", "runsc": g.version, "platform": g.platform, "network": g.network}, result
    assert result["apparmor"]["applied"] is False and "runsc ignores AppArmor" in result["apparmor"]["note"]
    mine = [s for s in seen if s[0] == f"kooi-{result['run_id']}"]
    assert mine and all(s[1] == "runsc" for s in mine), seen


def test_testcontainers_run_every_container_under_gvisor(host, ctx):
    """The Maven example's Testcontainers tests (PostgreSQL at its published port,
    exec, logs): the build and every container it starts run under runsc."""
    project = f"{ctx.engine.runner_home}/kooi-verify/maven-example"
    workflow(host, "maven-testcontainers-gvisor", "maven-testcontainers")
    rc, out, result, seen = kooi_run(host, ctx, "maven-testcontainers-gvisor", project)
    assert rc == 0 and "Tests run: 8, Failures: 0, Errors: 0, Skipped: 0" in out, out[-4000:]
    assert result["isolation"] == "gvisor" and result["cleanup"]["failed"] == [], result
    nested = [s for s in seen if s[2] == "1"]
    assert nested, f"no nested container was seen while the run ran: {seen}"
    assert all(s[1] == "runsc" for s in seen), seen


def test_a_gvisor_runs_broker_refuses_any_other_runtime(host, ctx):
    workflow(host, "broker-runtime-gvisor", mode="container", image="runner", testcontainers=True, timeout=300,
             command=["python3", "-I", "-c", BROKER_PROBE])
    project = f"{ctx.engine.runner_home}/kooi-verify/gvisor-broker"
    host.run(f"runuser -u {ctx.runner} -- mkdir -p {project}")
    rc, out, result, _ = kooi_run(host, ctx, "broker-runtime-gvisor", project)
    assert rc == 0, out[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("PROBE ")]
    for rt in ("runc", "io.containerd.runc.v2", "RUNSC"):
        assert f"PROBE {rt} 403 kooi broker: runtime '{rt}' refused: every container of this run runs under runsc " \
               "(isolation gvisor)" in lines, lines
    assert "PROBE default 201" in lines and "PROBE inspected runsc" in lines and "PROBE removed 204" in lines, lines
    # docker exec into a container of the run, through the broker: runsc exec runs the
    # command in the sandbox, whose kernel is gVisor's.
    assert "PROBE started 204" in lines, lines
    execd = [line for line in lines if line.startswith("PROBE exec 201 200 ")]
    assert execd and " 4.4.0 " in execd[0] and "Sun Jan 10 15:06:54 PST 2016" in execd[0], lines
    assert "PROBE exec exit 0" in lines and lines.count("PROBE removed 204") == 2, lines
    assert result["broker"]["refused"] == 3, result["broker"]


def test_a_persons_session_runs_under_gvisor_and_keeps_its_home(host, ctx):
    """Issue 30 on the userns-remap engine behind kooi-authz, at the gVisor level: a
    session of the installed shell-session workflow (min_isolation: gvisor) starts, a
    command in it runs in gVisor's kernel as the session's user with no capabilities,
    its home (an engine volume in the remapped range) is kept across stop and start, and
    stop gives a run's result with the session's section."""
    workflow(host, "session-gvisor", "shell-session", timeout=900)
    project = f"{ctx.engine.runner_home}/kooi-verify/gvisor-session"
    host.run(f"runuser -u {ctx.runner} -- mkdir -p {project}")
    env = f"KOOI_WORKFLOW_DIR={WFDIR}"

    def session(*args: str) -> tuple[int, str]:
        res = host.run(f"{env} kooi session {' '.join(shlex.quote(a) for a in args)} 2>&1")
        return res.rc, res.stdout

    def start() -> None:
        rc, out = session("start", "session-gvisor", "--project", project, "--person", "verify")
        assert rc == 0, out[-3000:]

    session("stop", "session-gvisor", "--person", "verify")  # a failed earlier verify's
    session("reset", "session-gvisor", "--person", "verify")
    start()
    try:
        rc, out = session("exec", "session-gvisor", "--person", "verify", "--", "sh", "-c",
                          "cat /proc/version; id -u; grep CapEff /proc/self/status; echo kept > ~/.verify-kept; exit 3")
        assert rc == 3, out
        assert " 4.4.0 " in out and re.search(r"^CapEff:\s+0+$", out, re.M), out  # gVisor's kernel, no capabilities
        assert re.search(r"^[1-9][0-9]*$", out, re.M), out  # not root
        rc, out = session("stop", "session-gvisor", "--person", "verify", "--json")
        assert rc == 0, out
        result = json.loads(out[out.index("{"):])
        assert result["isolation"] == "gvisor" and result["reason"] == "ok", result
        assert result["session"]["end"] == "stopped" and result["session"]["person"] == "verify", result
        start()
        rc, out = session("exec", "session-gvisor", "--person", "verify", "--", "sh", "-c", "cat ~/.verify-kept")
        assert rc == 0 and out.strip() == "kept", out
    finally:
        session("stop", "session-gvisor", "--person", "verify")
        session("reset", "session-gvisor", "--person", "verify")
