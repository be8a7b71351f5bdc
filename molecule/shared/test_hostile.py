"""The hostile suite, part 1 (issue 28): a `testcontainers: true` workload attacks the
engine API through its run's broker, one test per class of attack a review found,
and the host is checked for harm afterwards (or while the run runs, where the harm
would only last as long as the run). Runs on this machine's rootless engine (local
end-to-end stage: `--hosts=local://`) and on the userns-remap test host (Molecule's
verify: `--hosts=docker://HOST`).

The workload is a Python script in the runner image talking HTTP to
/run/kooi/docker.sock, as any client library does; it prints `HOSTILE name status
message` per attempt. Nested containers use kooi-probe:latest (loaded by the quick
start and by the verify playbook)."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from kooi.checks import Context

WFDIR = "/var/lib/kooi/hostile-workflows"
PROBE = "kooi-probe:latest"
# The workload's side: one attempt per class; the host-side assertions are below.
ATTACK = r"""
import http.client, json, os, socket, sys, time
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect("/run/kooi/docker.sock")
def call(method, path, doc=None, raw=None):
    c = C("d"); body = raw if raw is not None else (json.dumps(doc) if doc is not None else None)
    c.request(method, "/v1.41" + path, body, {"Content-Type": "application/json"})
    r = c.getresponse(); data = r.read()
    try: return r.status, json.loads(data or b"null")
    except ValueError: return r.status, data.decode(errors="replace")
def say(name, st, doc):
    msg = doc.get("message", "") if isinstance(doc, dict) else ""
    print(f"HOSTILE {name} {st} {msg}", flush=True)
    return doc
def create(name, hc, **top):
    st, doc = call("POST", "/containers/create", {"Image": PROBE, "Cmd": top.pop("cmd", ["sleep", "60"]),
                                                  "HostConfig": hc, **top})
    say(name, st, doc)
    return doc.get("Id") if st == 201 else None
def run(cid, wait=True):
    call("POST", f"/containers/{cid}/start")
    if wait:
        call("POST", f"/containers/{cid}/wait")
PROBE = sys.argv[1]
home = os.environ["HOSTILE_HOME"]
# 1. a bind source swapped for a symlink between create and start
os.makedirs("/workspace/d", exist_ok=True)
cid = create("bind-swap", {"Binds": ["/workspace/d:/h"]},
             cmd=["sh", "-c", "ls -a /h; echo pwned > /h/kooi-hostile-marker"])
if cid:
    os.rmdir("/workspace/d"); os.symlink(home, "/workspace/d")
    run(cid)
for p in ("/workspace/.", "/workspace/d/..", "/workspace//d"):
    create(f"bind-path {p}", {"Binds": [f"{p}:/h"]})
create("bind-propagation", {"Binds": ["/workspace:/w:rshared"]})
# 2. the project seen by a nested container: git's hooks are the shadows
cid = create("workspace-bind", {"Binds": ["/workspace:/w"]},
             cmd=["sh", "-c", "mkdir -p /w/.git/hooks && printf '#!/bin/sh\ntouch /tmp/kooi-hostile-hook\n' "
                  "> /w/.git/hooks/post-checkout && chmod +x /w/.git/hooks/post-checkout"])
if cid:
    call("POST", f"/containers/{cid}/start")
    st, waited = call("POST", f"/containers/{cid}/wait")
    print(f"HOSTILE hook-written {waited.get('StatusCode') if isinstance(waited, dict) else waited}", flush=True)
    time.sleep(4)  # the host looks at the real .git/hooks meanwhile
# 3. images that outlive the run
say("image-tag", *call("POST", f"/images/{PROBE}/tag?repo=kooi-hostile-tag&tag=x"))
cid = create("commit-source", {})
if cid:
    say("image-commit", *call("POST", f"/commit?container={cid}&repo=kooi-hostile-commit&tag=x"))
say("image-load", *call("POST", "/images/load?quiet=1", raw=b"not a tar"))
say("image-import", *call("POST", "/images/create?fromSrc=-&repo=kooi-hostile-import", raw=b"not a tar"))
# 4./5. networks: driver options (the bridge's name), IPAM, how many
say("network-options", *call("POST", "/networks/create", {"Name": "hostile-opt",
    "Options": {"com.docker.network.bridge.name": "kooi0h"}}))
say("network-ipam", *call("POST", "/networks/create", {"Name": "hostile-ipam",
    "IPAM": {"Config": [{"Subnet": "10.0.2.0/24", "Gateway": "10.0.2.2"}]}}))
# a network named like one that exists (every use of the name becomes ambiguous): one
# of the run's own, and a kooi- name (other runs' networks are kooi-RUNID)
say("network-dup-base", *call("POST", "/networks/create", {"Name": "hostile-dup"}))
say("network-dup-own", *call("POST", "/networks/create", {"Name": "hostile-dup", "CheckDuplicate": False}))
say("network-dup-kooi", *call("POST", "/networks/create", {"Name": "kooi-xyz", "CheckDuplicate": False}))
for i in range(8):
    say(f"network-{i}", *call("POST", "/networks/create", {"Name": f"hostile-n{i}", "CheckDuplicate": True,
        "Driver": "bridge", "Internal": False, "Attachable": False, "EnableIPv6": False, "Options": {},
        "IPAM": {"Driver": "default", "Config": [], "Options": {}}, "Labels": {"x": "y"}}))
# 13. a network named at create and resolved by the engine again at start: the run's
# network removed, another one of that name made meanwhile (another run's, the host's)
cid = create("net-pinned", {"NetworkMode": "hostile-dup"})
if cid:
    say("net-pinned-gone", *call("DELETE", "/networks/hostile-dup"))
    open("/workspace/.hostile-net-gone", "w").close()
    for _ in range(300):
        if os.path.exists("/workspace/.hostile-net-made"):
            break
        time.sleep(0.1)
    st, doc = call("POST", f"/containers/{cid}/start")
    got = call("GET", f"/containers/{cid}/json")[1]
    nets = ((got or {}).get("NetworkSettings") or {}).get("Networks") or {} if isinstance(got, dict) else {}
    print(f"HOSTILE net-pinned-start {st} " + json.dumps({k: (v or {}).get("NetworkID") for k, v in nets.items()}),
          flush=True)
    call("DELETE", f"/containers/{cid}?force=1")
# ... and a NetworkID of the workload's in the endpoint (the engine joins what it names)
cid = create("net-endpoint-id", {"NetworkMode": "hostile-n0"},
             NetworkingConfig={"EndpointsConfig": {"hostile-n0": {"NetworkID": "bridge"}}})
if cid:
    st, doc = call("POST", f"/containers/{cid}/start")
    got = call("GET", f"/containers/{cid}/json")[1]
    nets = ((got or {}).get("NetworkSettings") or {}).get("Networks") or {} if isinstance(got, dict) else {}
    print(f"HOSTILE net-endpoint-id-start {st} " + json.dumps({k: (v or {}).get("NetworkID") for k, v in nets.items()}),
          flush=True)
    call("DELETE", f"/containers/{cid}?force=1")
# 6. tmpfs and log options past the run's limits
create("tmpfs-huge", {"Tmpfs": {"/t": "size=64g"}})
create("tmpfs-zero", {"Tmpfs": {"/t": "size=0"}})
create("tmpfs-percent", {"Tmpfs": {"/t": "size=50%"}})
create("tmpfs-blocks", {"Tmpfs": {"/t": "nr_blocks=0"}})
create("tmpfs-mount", {"Mounts": [{"Type": "tmpfs", "Target": "/t", "TmpfsOptions": {"SizeBytes": 64 << 30}}]})
create("shm-huge", {"ShmSize": 64 << 30})
cid = create("tmpfs-unsized", {"Tmpfs": {"/t": "rw"}})
if cid:
    print("HOSTILE tmpfs-forced " + json.dumps(call("GET", f"/containers/{cid}/json")[1]["HostConfig"]["Tmpfs"]))
create("log-options", {"LogConfig": {"Type": "json-file", "Config": {"max-size": "100g"}}})
# 7. exec as root, spelled otherwise
cid = create("exec-target", {})
if cid:
    run(cid, wait=False)
    for user in ("00", "+0", "0:0", "1000:00"):
        say(f"exec-user {user}", *call("POST", f"/containers/{cid}/exec", {"User": user, "Cmd": ["id"]}))
# 8. ulimit names in another case
create("ulimit-case", {"Ulimits": [{"Name": "NPROC", "Soft": 1000000, "Hard": 1000000}]})
# 9. a second request on a connection the engine was to take over but did not (a
# detached exec start; an error): the engine would read it as a request of its own
def smuggle(name, first):
    cid = create(f"{name}-target", {})
    run(cid, wait=False)
    st, ex = call("POST", f"/containers/{cid}/exec", {"Cmd": ["true"]})
    if first == "error":
        first = (f"POST /v1.41/exec/{ex['Id']}/start?x=1 HTTP/1.1\r\nHost: d\r\nContent-Type: application/json\r\n"
                 "Content-Length: 9\r\n\r\nnot json!")
    else:
        body = json.dumps({"Detach": True, "Tty": False})
        first = (f"POST /v1.41/exec/{ex['Id']}/start HTTP/1.1\r\nHost: d\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n{body}")
    evil = json.dumps({"Image": PROBE, "Cmd": ["sh", "-c", "id > /h/kooi-hostile-smuggled"],
                       "HostConfig": {"Binds": [f"{home}:/h"], "NetworkMode": "none"}})
    second = (f"POST /v1.41/containers/create?name=kooi-hostile-{name} HTTP/1.1\r\nHost: d\r\n"
              f"Content-Type: application/json\r\nContent-Length: {len(evil)}\r\n\r\n{evil}")
    s = socket.socket(socket.AF_UNIX); s.connect("/run/kooi/docker.sock"); s.settimeout(10)
    s.sendall(first.encode()); time.sleep(1)
    try:
        s.sendall(second.encode())
    except OSError:
        pass  # the broker closed the connection after the answer
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except OSError:
        pass
    s.close()
    answers = [l.split(" ", 2)[1] for l in got.decode(errors="replace").split("\r\n") if l.startswith("HTTP/1.1 ")]
    print(f"HOSTILE {name} {'+'.join(answers)}", flush=True)
    st, _ = call("POST", f"/containers/kooi-hostile-{name}/start")
    print(f"HOSTILE {name}-start {st}", flush=True)
smuggle("smuggle-detached", "detached")
smuggle("smuggle-error", "error")
# 11. anonymous volumes left behind: removed without v=1 by the workload itself
for name, hc, top in (("anon-volumes", {}, {"Volumes": {"/data": {}}}),
                      ("anon-mount", {"Mounts": [{"Type": "volume", "Target": "/data2"}]}, {})):
    cid = create(name, hc, cmd=["sh", "-c", "echo x > /data/x 2>/dev/null; echo x > /data2/x 2>/dev/null; true"],
                 **top)
    if cid:
        run(cid)
        say(f"{name}-removed", *call("DELETE", f"/containers/{cid}?force=1"))
# 12. a collection's endpoint with another method names an object of that name (the
# engine owner's container "prune")
say("delete-prune", *call("DELETE", "/containers/prune?force=1"))
# 10. other runs' ids probed: the same answer whether they exist or not
say("probe-missing", *call("GET", "/containers/0123456789ab/json"))
say("probe-other", *call("GET", f"/containers/{os.environ['HOSTILE_OTHER']}/json"))
print("HOSTILE done", flush=True)
"""


@pytest.fixture(scope="module")
def ctx(host):
    c = Context.from_host(host)
    if "runner" not in (c.described(host, "images") or {}):
        pytest.fail("no runner image pinned on this host: the hostile suite needs it")
    if not host.run(f"runuser -u {c.runner} -- env DOCKER_HOST=unix://{c.engine.socket} "
                    f"XDG_RUNTIME_DIR=/run/user/{c.engine.runner_uid} docker image inspect {PROBE}").succeeded:
        pytest.fail(f"{PROBE} is not loaded into the runner's engine (the quick start and verify.yml load it)")
    return c


@pytest.fixture(scope="module")
def attacked(host, ctx):
    """One hostile run: (rc, output lines, result, what the host saw while it ran)."""
    home = ctx.engine.runner_home
    project = f"{home}/kooi-hostile/project"
    # A container of someone else's (the engine's owner's), whose id the workload probes,
    # and one named like a collection's endpoint.
    engine(host, ctx, "rm -f kooi-hostile-other prune")
    other = engine(host, ctx, f"create --name kooi-hostile-other --network none {PROBE} true").stdout.strip()
    assert other, "could not create the other container"
    assert engine(host, ctx, f"create --name prune --network none {PROBE} true").succeeded
    volumes_before = set(engine(host, ctx, "volume ls -q").stdout.split())
    doc = {"mode": "container", "image": "runner", "testcontainers": True, "timeout": 300,
           "limits": {"memory": "256m", "pids": 512},
           "environment": {"HOSTILE_HOME": home, "HOSTILE_OTHER": other},
           "command": ["python3", "-I", "-c", ATTACK, PROBE]}
    text = yaml.safe_dump(doc, sort_keys=False)
    host.run(f"install -d -m 0755 {WFDIR} && printf %s {shlex.quote(text)} > {WFDIR}/hostile-api.yml "
             f"&& chmod 0644 {WFDIR}/hostile-api.yml")
    # Another workflow on the same project, started while the attack runs.
    other_wf = yaml.safe_dump({"mode": "jail", "timeout": 60, "command": ["true"]}, sort_keys=False)
    host.run(f"printf %s {shlex.quote(other_wf)} > {WFDIR}/hostile-second.yml && chmod 0644 "
             f"{WFDIR}/hostile-second.yml")
    host.run(f"rm -f {home}/kooi-hostile-marker {home}/kooi-hostile-smuggled /tmp/kooi-hostile-hook; "
             f"rm -rf {home}/kooi-hostile")
    host.run(f"runuser -u {ctx.runner} -- sh -c 'mkdir -p {project}/sub && cd {project} && git init -q . "
             f"&& git -c user.email=t@t -c user.name=t commit -q --allow-empty -m init'")
    out, seen = "/var/lib/kooi/runs/hostile-api.json", "/var/lib/kooi/runs/hostile-api.seen"
    script = f"""
rm -f {out} {seen}
KOOI_WORKFLOW_DIR={WFDIR} kooi run hostile-api --project {shlex.quote(project)} --json {out} \
  > /var/lib/kooi/runs/hostile-api.out 2>&1 &
pid=$!
( sleep 3; KOOI_WORKFLOW_DIR={WFDIR} kooi run hostile-second --project {shlex.quote(project)} \
    > /var/lib/kooi/runs/hostile-second.out 2>&1; echo "second rc=$?" >> {seen} ) &
( sleep 3; KOOI_WORKFLOW_DIR={WFDIR} kooi run hostile-second --project {shlex.quote(project + "/sub")} \
    > /var/lib/kooi/runs/hostile-third.out 2>&1; echo "third rc=$?" >> {seen} ) &
while kill -0 $pid 2>/dev/null; do
  [ -e {project}/.git/hooks/post-checkout ] && echo "real hook written" >> {seen}
  if [ -e {project}/.hostile-net-gone ] && [ ! -e {project}/.hostile-net-made ]; then
    runuser -u {ctx.runner} -- env DOCKER_HOST=unix://{ctx.engine.socket} \
      XDG_RUNTIME_DIR=/run/user/{ctx.engine.runner_uid} docker network create hostile-dup >/dev/null
    runuser -u {ctx.runner} -- touch {project}/.hostile-net-made
  fi
  sleep 0.2
done
wait $pid; rc=$?; wait; echo "rc=$rc"
"""
    res = host.run(script)
    rc = int(res.stdout.strip().rpartition("rc=")[2] or -1)
    output = host.file("/var/lib/kooi/runs/hostile-api.out").content_string
    result = json.loads(host.file(out).content_string) if host.file(out).exists else {}
    during = host.file(seen).content_string if host.file(seen).exists else ""
    lines = Lines(line for line in output.splitlines() if line.startswith("HOSTILE "))
    second = host.file("/var/lib/kooi/runs/hostile-second.out")
    lines.second_out = second.content_string if second.exists else ""
    lines.second = next((ln for ln in during.splitlines() if ln.startswith("second rc=")), "")
    lines.third = next((ln for ln in during.splitlines() if ln.startswith("third rc=")), "")
    third = host.file("/var/lib/kooi/runs/hostile-third.out")
    lines.third_out = third.content_string if third.exists else ""
    during = "\n".join(ln for ln in during.splitlines() if not ln.startswith(("second rc=", "third rc=")))
    # What the run left on the engine, then removed (a smuggled create would be unlabelled).
    lines.leftover = engine(host, ctx, "ps -a --format '{{.Names}}'").stdout
    lines.new_volumes = sorted(set(engine(host, ctx, "volume ls -q").stdout.split()) - volumes_before)
    lines.victim_net = engine(host, ctx, "network inspect -f '{{.Id}}' hostile-dup").stdout.strip()
    lines.bridge_net = engine(host, ctx, "network inspect -f '{{.Id}}' bridge").stdout.strip()
    engine(host, ctx, "rm -f kooi-hostile-other kooi-hostile-smuggle-detached kooi-hostile-smuggle-error prune")
    engine(host, ctx, "network rm hostile-dup")
    for v in lines.new_volumes:
        engine(host, ctx, f"volume rm -f {v}")
    assert "HOSTILE done" in output, f"the attack did not run to its end (rc {rc}):\n{output[-4000:]}"
    return rc, lines, result, during, output


class Lines(list):
    """The workload's `HOSTILE name status message` lines; `lines[name]`: the first for NAME;
    `leftover`: the names of the engine's containers right after the run."""

    leftover = ""
    second = ""      # `second rc=N` of another workflow's run on the project, started meanwhile
    second_out = ""  # its output
    third = ""       # `third rc=N` of a run on a directory inside the project, started meanwhile
    third_out = ""
    new_volumes: list[str] = []  # volumes on the engine after the run that were not there before
    victim_net = ""  # the id of the network the host made under the name of one the run removed
    bridge_net = ""  # the id of the engine's default bridge

    def __getitem__(self, name):  # type: ignore[override]
        if not isinstance(name, str):
            return super().__getitem__(name)
        found = [v for v in self if v.startswith(f"HOSTILE {name} ") or v == f"HOSTILE {name}"]
        assert found, f"the workload printed nothing for {name}"
        return found[0]


def engine(host, ctx, cmd: str):
    return host.run(f"runuser -u {ctx.runner} -- env DOCKER_HOST=unix://{ctx.engine.socket} "
                    f"XDG_RUNTIME_DIR=/run/user/{ctx.engine.runner_uid} docker {cmd}")


def refused(lines: Lines, name: str, why: str) -> None:
    line = lines[name]
    assert " 403 kooi broker: " in line and why in line, f"{name}: {line}"


def test_a_bind_source_swapped_before_start_reaches_nothing(host, ctx, attacked):
    """Finding 1: the workload creates a container binding /workspace/d, swaps d for a
    symlink to the runner's home and starts it. Only the workspace itself may be bound."""
    rc, lines, result, _, out = attacked
    refused(lines, "bind-swap", "is below the workspace root")
    assert not host.file(f"{ctx.engine.runner_home}/kooi-hostile-marker").exists, out[-3000:]
    for p in ("/workspace/.", "/workspace/d/..", "/workspace//d"):
        refused(lines, f"bind-path {p}", "below the workspace root")
    refused(lines, "bind-propagation", "bind propagation")
    assert any("below the workspace root" in r for r in result["broker"]["refusals"]), result["broker"]


def test_a_nested_container_sees_the_shadows_not_the_real_git_hooks(host, ctx, attacked):
    """Finding 2: a nested container binding the workspace wrote .git/hooks; the real
    one would run on the host's next git checkout while the run still runs."""
    rc, lines, result, during, out = attacked
    assert " 201 " in lines["workspace-bind"] and lines["hook-written"], out[-3000:]
    assert during == "", f"the project's real .git/hooks changed while the run ran: {during}"
    project = f"{ctx.engine.runner_home}/kooi-hostile/project"
    assert not host.file(f"{project}/.git/hooks/post-checkout").exists
    if lines["hook-written"] == "HOSTILE hook-written 0":
        # It wrote (rootless: its uid 0 is the runner, the copies' owner): into the
        # shadow, listed. On userns-remap its uid 0 is another subordinate uid than the
        # workload's, which may not write the copies at all.
        refusals = json.dumps(result.get("project_guard"))
        assert ".git/hooks" in refusals and "shadowed" in refusals, result.get("project_guard")


def test_no_image_outlives_the_run(host, ctx, attacked):
    """Finding 3: tag, commit, load and import would leave images (or re-point a tag
    that later runs use)."""
    rc, lines, result, _, _ = attacked
    for name in ("image-tag", "image-commit", "image-load", "image-import"):
        refused(lines, name, "outlives the run")
    left = engine(host, ctx, "images --format '{{.Repository}}:{{.Tag}}'").stdout
    assert "kooi-hostile" not in left, left


def test_networks_only_with_the_engines_own_settings_and_bounded(host, ctx, attacked):
    """Findings 4 and 5: bridge names and driver options, IPAM subnets of the
    workload's choosing, and networks without end."""
    rc, lines, result, _, _ = attacked
    refused(lines, "network-options", "Options refused")
    refused(lines, "network-ipam", "IPAM refused")
    assert " 201 " in lines["network-dup-base"], lines["network-dup-base"]
    created = [n for n in (f"network-{i}" for i in range(8)) if " 201 " in lines[n]]
    assert len(created) == 7, [lines[f"network-{i}"] for i in range(8)]  # and dup-base: 8
    refused(lines, "network-7", "the most a run may")
    left = engine(host, ctx, "network ls --format '{{.Name}}'").stdout
    assert "kooi-hostile" not in left, left


def test_tmpfs_and_logs_within_the_runs_limits(host, ctx, attacked):
    """Finding 6: a tmpfs of any size (or unlimited: size=0, nr_blocks=0, a share of the
    host's memory) and log options past the engine's bound."""
    rc, lines, result, _, out = attacked
    for name in ("tmpfs-huge", "tmpfs-mount", "shm-huge"):
        refused(lines, name, "above the run's limit")
    for name in ("tmpfs-zero", "tmpfs-percent"):
        refused(lines, name, "size must be given once")
    refused(lines, "tmpfs-blocks", "option 'nr_blocks=0' refused")
    refused(lines, "log-options", "log options")
    assert " 201 " in lines["tmpfs-unsized"], lines["tmpfs-unsized"]
    forced = json.loads(lines["tmpfs-forced"].split(" ", 2)[2])
    assert forced == {"/t": f"rw,size={256 << 20}"}, forced


def test_exec_as_root_in_any_spelling_and_ulimit_names_in_any_case(host, ctx, attacked):
    """Findings 7 and 8."""
    rc, lines, result, _, _ = attacked
    for user in ("00", "+0", "0:0", "1000:00"):
        refused(lines, f"exec-user {user}", f"exec as {user} is refused")
    # The broker refuses it where rlimits bound the run's processes; where a pids cgroup
    # does, the authorization plugin's host maximum (userns-remap with kooi-authz).
    line = lines["ulimit-case"]
    assert " 403 " in line and "Ulimits 'NPROC'" in line and "refused (above" in line, line


def test_the_run_says_what_was_refused_and_leaves_nothing(host, ctx, attacked):
    rc, lines, result, _, out = attacked
    assert rc == 0 and result["reason"] == "ok", out[-3000:]
    n = sum(1 for v in lines if " 403 kooi broker: " in v)
    assert result["broker"]["refused"] >= n > 20, (n, result["broker"])
    assert result["cleanup"]["failed"] == [], result["cleanup"]
    left = engine(host, ctx, f"ps -aq --filter label=org.kooi.run={result['run_id']}").stdout.strip()
    assert left == "", left


def test_no_second_request_rides_on_a_connection_the_engine_did_not_take_over(host, ctx, attacked):
    """Found by the hostile review of this change: after a detached exec start (or an
    error) on a route the engine may hijack, the broker relayed the client's further
    bytes, which the engine served as requests nobody inspected (a create binding the
    runner's home, unlabelled, outliving the run)."""
    rc, lines, result, _, out = attacked
    for name in ("smuggle-detached", "smuggle-error"):
        answers = lines[name].split(" ", 2)[2] if lines[name].count(" ") >= 2 else ""
        assert answers in ("200", "400", "500"), lines[name]
        assert lines[f"{name}-start"].endswith(" 403"), lines[f"{name}-start"]
    assert not host.file(f"{ctx.engine.runner_home}/kooi-hostile-smuggled").exists
    assert "kooi-hostile-smuggle" not in lines.leftover, lines.leftover


def test_a_network_name_that_exists_is_refused_and_ids_are_not_probed(host, ctx, attacked):
    rc, lines, result, _, _ = attacked
    refused(lines, "network-dup-own", "exists, refused")
    refused(lines, "network-dup-kooi", "kooi's own run networks")
    for name in ("probe-missing", "probe-other"):
        refused(lines, name, "does not exist or is not this run's")


def test_a_network_named_at_create_is_the_one_the_container_joins(host, ctx, attacked):
    """Issue 28, finding 1's class: the engine resolves a network's name again when the
    container starts; a name the policy found to be the run's could by then be another's
    network. The broker hands the engine the network's id, never its name."""
    rc, lines, result, _, _ = attacked
    assert lines.victim_net, "the host made no network in place of the run's"
    assert " 201 " in lines["net-pinned"] and " 204 " in lines["net-pinned-gone"], lines
    start = lines["net-pinned-start"]
    assert lines.victim_net not in start and " 204 " not in start, start
    # The engine joins the network an endpoint's NetworkID names (any network, by id or
    # name: measured, "bridge" joined the default bridge); the broker writes it itself.
    endpoint = lines["net-endpoint-id"]
    assert " 201 " in endpoint, endpoint
    started = lines["net-endpoint-id-start"]
    assert lines.bridge_net and lines.bridge_net not in started and '"hostile-n0": "' in started, started


def test_one_run_per_project_whatever_its_workflow(host, ctx, attacked):
    """Issue 29, finding 2 (shown again by the hostile review of this change): a run of
    another workflow that starts on the project while a hostile run changes its protected
    paths takes those changes into its snapshot and puts them back for good."""
    rc, lines, result, _, _ = attacked
    assert lines.second == "second rc=75", (lines.second, lines.second_out[-2000:])
    assert "another run on this project or inside it holds" in lines.second_out, lines.second_out[-2000:]
    # The second hostile review of issue 29: runs on P and on P/n at once each took the
    # other's changes into their snapshots, and one swapped a directory of the other's
    # project for a link before that run's guard put things back through it.
    assert lines.third == "third rc=75", (lines.third, lines.third_out[-2000:])
    assert "another run on a directory around it holds" in lines.third_out, lines.third_out[-2000:]


@pytest.mark.parametrize("mode,script,want_rc,want_reason", [
    # Issue 29, finding 8: the workload's own output set the result's verdicts.
    ("container", "echo 'kooi: limit reached: memory pids'; exit 0", 0, "ok"),
    ("jail", "echo 'bwrap: Creating new namespace failed: Operation not permitted'; exit 1", 1, "failed"),
])
def test_the_result_is_kooi_s_not_the_workload_s(host, ctx, mode, script, want_rc, want_reason):
    name = f"hostile-verdict-{mode}"
    doc = {"mode": mode, "timeout": 60, "command": ["sh", "-c", script]}
    if mode == "container":
        doc["image"] = "runner"
    text = yaml.safe_dump(doc, sort_keys=False)
    project = f"{ctx.engine.runner_home}/kooi-hostile/verdict-{mode}"
    out = f"/var/lib/kooi/runs/{name}.json"
    host.run(f"install -d -m 0755 {WFDIR} && printf %s {shlex.quote(text)} > {WFDIR}/{name}.yml && "
             f"chmod 0644 {WFDIR}/{name}.yml && runuser -u {ctx.runner} -- mkdir -p {project} && rm -f {out}")
    res = host.run(f"KOOI_WORKFLOW_DIR={WFDIR} kooi run {name} --project {project} --json {out}")
    result = json.loads(host.file(out).content_string)
    assert (res.rc, result["reason"]) == (want_rc, want_reason), res.stdout + res.stderr
    assert result.get("limit") is None, result


def test_no_anonymous_volume_outlives_the_run(host, ctx, attacked):
    """Found by the second hostile review: a container with anonymous volumes, removed by
    the workload without v=1, left them (unlabelled: no cleanup found them)."""
    rc, lines, result, _, _ = attacked
    for name in ("anon-volumes", "anon-mount"):
        assert " 201 " in lines[name] and " 204 " in lines[f"{name}-removed"], (lines[name], lines[f"{name}-removed"])
    assert lines.new_volumes == [], lines.new_volumes


def test_another_method_on_a_collection_reaches_nothing_by_name(host, ctx, attacked):
    rc, lines, result, _, _ = attacked
    refused(lines, "delete-prune", "does not exist or is not this run's")
    assert "prune" in lines.leftover.split(), lines.leftover


def test_the_workloads_output_neither_rewrites_the_terminal_nor_floods_the_log(host, ctx):
    """Issue 29, findings 6 and 8: raw escape sequences in the output could hide kooi's
    own lines (or write a `kooi: ok` line over them), and a jail's output went to its log
    without bound (200 MB in 1.2 s)."""
    name = "hostile-output"
    script = ("printf 'kooi: refused\\033[2K\\r\\033[1Akooi: ok: spoofed\\n'; "
              # review 25: a character split between two writes (two U+FFFD before)
              "printf '\\342\\202'; sleep 0.2; printf '\\254 split\\n'; "
              "head -c 70000000 /dev/zero | tr '\\0' x | fold -w 65536; echo END-OF-FLOOD")
    text = yaml.safe_dump({"mode": "jail", "timeout": 120, "command": ["sh", "-c", script]}, sort_keys=False)
    project = f"{ctx.engine.runner_home}/kooi-hostile/output"
    out = f"/var/lib/kooi/runs/{name}.json"
    host.run(f"install -d -m 0755 {WFDIR} && printf %s {shlex.quote(text)} > {WFDIR}/{name}.yml && "
             f"chmod 0644 {WFDIR}/{name}.yml && runuser -u {ctx.runner} -- mkdir -p {project} && rm -f {out}")
    echo = f"/var/lib/kooi/runs/{name}.out"
    res = host.run(f"KOOI_WORKFLOW_DIR={WFDIR} kooi run {name} --project {project} --json {out} > {echo}; "
                   f"head -c 4096 {echo}; rm -f {echo}")
    result = json.loads(host.file(out).content_string)
    assert result["reason"] == "ok", result
    assert "\x1b" not in res.stdout and "\r" not in res.stdout, repr(res.stdout[:300])
    assert "kooi: refused\\x1b[2K\\x0d\\x1b[1Akooi: ok: spoofed" in res.stdout, repr(res.stdout[:300])
    assert "\n\u20ac split\n" in res.stdout and "\ufffd" not in res.stdout, repr(res.stdout[:300])
    size = int(host.run(f"stat -c %s {result['log']}").stdout)
    assert size < (64 << 20) + (1 << 20), size
    assert any("output past 64 MiB was dropped" in w for w in result["warnings"]), result["warnings"]


def test_a_burst_of_output_reaches_the_log_whole(host, ctx):
    """Issue 29, finding 8: after a burst the run's log lost its last lines, with no
    warning (kooi followed the engine's json-file log, which rotated at 10 MB x 3 faster
    than kooi read it: measured 118k of 500k lines, the last one lost). A container run's
    output now comes from an attached stream, which the engine never drops."""
    name = "hostile-burst"
    script = ("import os, sys, time\nw = sys.stdout.write\nfor i in range(400000): w(f'{i:08d}' + 'a' * 91 + '\\n')\n"
              # review 25: a character split between two writes (two U+FFFD before)
              "sys.stdout.flush(); os.write(1, b'\\xe2\\x82'); time.sleep(0.2); os.write(1, b'\\xac split\\n')\n"
              "print('END-OF-BURST')")
    text = yaml.safe_dump({"mode": "container", "image": "runner", "timeout": 120,
                           "command": ["python3", "-c", script]}, sort_keys=False)
    project = f"{ctx.engine.runner_home}/kooi-hostile/burst"
    out = f"/var/lib/kooi/runs/{name}.json"
    host.run(f"install -d -m 0755 {WFDIR} && printf %s {shlex.quote(text)} > {WFDIR}/{name}.yml && "
             f"chmod 0644 {WFDIR}/{name}.yml && runuser -u {ctx.runner} -- mkdir -p {project} && rm -f {out}")
    host.run(f"KOOI_WORKFLOW_DIR={WFDIR} kooi run {name} --project {project} --quiet --json {out}")
    result = json.loads(host.file(out).content_string)
    assert result["reason"] == "ok", result
    counted = host.run(f"grep -c '^[0-9]\\{{8\\}}a\\{{91\\}}$' {result['log']}; grep -c '^END-OF-BURST$' {result['log']}; "
                       f"grep -c '^\u20ac split$' {result['log']}; grep -c \"$(printf '\\357\\277\\275')\" {result['log']}")
    assert counted.stdout.split() == ["400000", "1", "1", "0"], (counted.stdout, result["warnings"])
