"""The broker's HTTP framing (kooi.httpwire), its per-run rewrites and its decisions
against a scripted engine (tests/e2e/test_broker.py runs the broker against the
runner's real engine)."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kooi import labels
from kooi.broker import Broker, RunScope
from kooi.brokerrules import Rules
from kooi.engineapi import Engine as Upstream
from kooi.httpwire import BadRequest, Reader, forward_head, read_body, read_head, stream_body
from kooi.policy import Policy


def reader(data: bytes) -> Reader:
    a, b = socket.socketpair()
    b.sendall(data)
    b.close()
    return Reader(a)


def test_a_request_head_is_parsed_and_the_body_left_for_later():
    r = reader(b"POST /v1.41/containers/create?name=x HTTP/1.1\r\nHost: d\r\nContent-Length: 2\r\n\r\n{}")
    req = read_head(r)
    assert (req.method, req.uri, req.length, req.chunked) == ("POST", "/v1.41/containers/create?name=x", 2, False)
    assert read_body(r, req, 100) == b"{}"


@pytest.mark.parametrize("head", [
    b"POST /x HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"POST /x HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
    b"POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    b"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    b"POST /x HTTP/1.1\r\n folded: header\r\n\r\n",
    b"POST /x HTTP/1.1\r\nbad header\r\n\r\n",
    b"POST x HTTP/1.1\r\n\r\n",
    b"GET /x HTTP/2\r\n\r\n",
    b"GET /x HTTP/1.1\r\n" + b"X-A: " + b"a" * 70000 + b"\r\n\r\n",
])
def test_ambiguous_or_malformed_heads_are_refused(head):
    with pytest.raises(BadRequest):
        read_head(reader(head))


def test_chunked_bodies_are_read_whole_and_capped():
    raw = b"POST /containers/create HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;x=y\r\n\":1}\r\n0\r\n\r\n"
    r = reader(raw)
    req = read_head(r)
    assert req.chunked and read_body(r, req, 100) == b'{"a":1}'
    r = reader(raw)
    assert read_body(r, read_head(r), 5) is None


def test_a_streamed_body_is_relayed_exactly_and_no_further():
    raw = (b"PUT /containers/c/archive?path=/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5\r\nhello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n")
    r = reader(raw)
    req = read_head(r)
    out_a, out_b = socket.socketpair()
    stream_body(r, req, out_a)
    out_a.close()
    assert out_b.recv(1000) == b"5\r\nhello\r\n0\r\n\r\n"
    assert r.take().startswith(b"GET /smuggled")  # left unread, never forwarded


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_give_a_request_or_bad_request(data):
    try:
        req = read_head(reader(data))
    except BadRequest:
        return
    assert req.method.isupper() and req.uri.startswith("/")


def rules(**kw) -> Rules:
    scope = RunScope("run-1", {"org.kooi.run": "run-1"}, network="kooi-run-1",
                     socket_host_path="/var/lib/kooi/runs/brokers/b.sock",
                     path_map={"/workspace": "/srv/project"}, **kw)
    return Rules(scope, Upstream("/nonexistent"))


@pytest.mark.parametrize("src,host", [
    ("/workspace", "/srv/project"),
    ("/workspace/target/classes", "/srv/project/target/classes"),
    ("/workspaces/x", "/workspaces/x"),
    ("/run/kooi/docker.sock", "/var/lib/kooi/runs/brokers/b.sock"),
    ("/var/run/docker.sock", "/var/lib/kooi/runs/brokers/b.sock"),
    ("/etc", "/etc"),
])
def test_bind_sources_are_translated_to_host_paths(src, host):
    assert rules().host_path(src) == host


@pytest.mark.parametrize("query", ["", "all=1", "filters=" + urllib.parse.quote('{"label":["a=b"]}'),
                                   "filters=" + urllib.parse.quote('{"label":{"a=b":true},"status":["exited"]}')])
def test_listings_are_filtered_to_the_run(query):
    uri = rules().filter_query("/v1.41/containers/json" + ("?" + query if query else ""))
    params = dict(urllib.parse.parse_qsl(uri.split("?", 1)[1]))
    labels = json.loads(params["filters"])["label"]
    assert "org.kooi.run=run-1" in labels
    if "a%3Db" in query:
        assert "a=b" in labels


def test_a_workload_cannot_give_its_objects_kooi_labels():
    """kooi's labels say which run owns an object and which lock says it lives (gc reads
    them): a workload's own org.kooi.* labels are dropped, the run's are set."""
    doc = {"Image": "x", "Labels": {"org.kooi.lock": "project-1-2.lock", "org.kooi.session": "1",
                                    "org.kooi.run": "other", "org.testcontainers": "true"}}
    rules().add_labels(doc)
    assert doc["Labels"] == {"org.kooi.run": "run-1", "org.testcontainers": "true", **UNSET}


def test_a_filter_that_is_not_json_is_refused():
    with pytest.raises(BadRequest):
        rules().filter_query("/containers/json?filters=%7Bnope")


def test_an_unreachable_engine_surfaces_as_an_os_error():
    r = rules()
    with pytest.raises(OSError):
        r.owns("container", "abc")


def test_reader_hands_back_what_it_buffered():
    a, b = socket.socketpair()
    t = threading.Thread(target=lambda: (b.sendall(b"POST /exec/1/start HTTP/1.1\r\n\r\nstdin-bytes"), b.close()))
    t.start()
    r = Reader(a)
    read_head(r)
    t.join()
    rest = r.take()
    while chunk := a.recv(100):
        rest += chunk
    assert rest == b"stdin-bytes"


def test_a_refusal_reaches_a_client_that_is_still_sending_its_body(tmp_path):
    """A refused build's context is larger than any socket buffer: the broker must keep
    reading until the client is done, or the client sees EPIPE instead of the reason
    (found in CI: `docker build` through the broker failed with 'broken pipe')."""
    b = Broker(str(tmp_path / "b.sock"), str(tmp_path / "no-engine.sock"), Policy(workspace=str(tmp_path)),
               RunScope("r1", {"org.kooi.run": "r1"}))
    b.start()
    try:
        body = b"\0" * (32 << 20)
        s = socket.socket(socket.AF_UNIX)
        s.connect(b.listen)
        s.settimeout(30)
        errors: list[Exception] = []

        def send() -> None:
            try:
                s.sendall(b"POST /v1.41/build HTTP/1.1\r\nHost: docker\r\nContent-Type: application/x-tar\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(body) + body)
            except OSError as exc:
                errors.append(exc)

        t = threading.Thread(target=send)
        t.start()
        got = b""
        while chunk := s.recv(65536):
            got += chunk
            if b"}" in got:
                break
        t.join(30)
        s.close()
        assert got.startswith(b"HTTP/1.1 403 "), got[:200]
        assert "are refused" in json.loads(got.split(b"\r\n\r\n", 1)[1])["message"]
        assert errors == [] and not t.is_alive()
    finally:
        b.stop()


def test_a_forwarded_head_is_framed_anew_and_closes_unless_upgraded():
    r = reader(b"POST /containers/c/attach?stream=1 HTTP/1.1\r\nHost: d\r\nConnection: Upgrade\r\n"
               b"Upgrade: tcp\r\nTransfer-Encoding: chunked\r\n\r\n")
    req = read_head(r)
    assert forward_head(req, upgrade=False) == (b"POST /containers/c/attach?stream=1 HTTP/1.1\r\nHost: d\r\n"
                                                b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n")
    req.body = b"{}"
    assert forward_head(req, upgrade=True) == (b"POST /containers/c/attach?stream=1 HTTP/1.1\r\nHost: d\r\n"
                                               b"Connection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: 2\r\n\r\n")


# --- decisions, against a scripted engine ---------------------------------------------


class Engine(Upstream):
    """Answers the broker's lookups: objects named mine* are the run's, other* another
    run's, anything else does not exist."""

    def __init__(self) -> None:
        super().__init__("/nonexistent")
        self.calls: list[tuple[str, str]] = []
        self.mine = {"kooi-run-1"}  # more of the run's (the run's network, what a test made)

    def call(self, method: str, path: str, body=None):
        self.calls.append((method, path))
        parts = path.split("/")
        if method == "POST" and path == "/volumes/create":
            return 201, {}
        if method != "GET" or len(parts) < 3:
            return 404, None
        kind, ref = parts[1], urllib.parse.unquote(parts[2])
        if kind == "exec":
            return (200, {"ContainerID": ref.replace("exec", "c")}) if ref.startswith(("mine", "other")) else (404, None)
        if ref not in self.mine and (not ref.startswith(("mine", "other")) or "." in ref):
            return 404, {"message": "no such object"}
        run = {labels.RUN: "run-1" if ref.startswith("mine") or ref in self.mine else "run-2"}
        return 200, {"Id": f"id-{ref}", "Name": ref, "Config": {"Labels": run}, "Labels": run}


# What the broker sets empty on every object a workload creates (review 45).
UNSET = {labels.SESSION: "", labels.PERSON: "", labels.HOME: "", labels.SCAN: ""}


def broker(**kw) -> tuple[Broker, Engine]:
    scope = RunScope("run-1", {labels.RUN: "run-1", labels.NESTED: "1"}, network="kooi-run-1",
                     path_map={"/workspace": "/srv/project"}, **kw)
    policy = Policy(workspace="/srv/project", apparmor_profiles=(scope.apparmor,) if scope.apparmor else (),
                    limits=dict(scope.limits), runtimes=(scope.runtime,) if scope.runtime else Policy.runtimes)
    b = Broker("/tmp/kooi-test-never-served.sock", "/nonexistent", policy, scope)
    b.upstream = b.rules.up = Engine()
    return b, b.upstream


def decide(b: Broker, method: str, uri: str, doc=None):
    body = json.dumps(doc).encode() if isinstance(doc, dict) else doc
    req = read_head(reader(f"{method} {uri} HTTP/1.1\r\n\r\n".encode()))
    req.body = body
    return b.decide(req)


@pytest.mark.parametrize("method,uri,reason", [
    ("POST", "/v1.41/build/prune", "this prune endpoint is refused"),
    ("POST", "/system/prune", "this prune endpoint is refused"),
    ("DELETE", "/images/kooi-probe:latest", "removing images is refused"),
    ("POST", "/plugins/x/disable", "plugin management is refused"),
    ("POST", "/build?t=x", "image builds are refused"),
    ("GET", "/containers/other-1/json", "container 'other-1' does not exist or is not this run's"),
    ("DELETE", "/containers/nobody?force=1", "container 'nobody' does not exist or is not this run's"),
    ("POST", "/exec/other-exec/start", "container 'other-c' does not exist or is not this run's"),
    ("DELETE", "/networks/other-net", "network 'other-net' does not exist or is not this run's"),
    ("DELETE", "/volumes/other-vol", "volume 'other-vol' does not exist or is not this run's"),
    ("POST", "/commit?container=other-1", "committing a container is refused"),
    ("POST", "/containers/create", "create: the request arrived without a body"),
    ("POST", "/containers/mine-1/exec", "exec: the request arrived without a body"),
    ("POST", "/v1.41/containers%2Fcreate", "percent-encoded request paths are refused"),
])
def test_the_broker_refuses_with_its_reason(method, uri, reason):
    d, _ = decide(broker()[0], method, uri)
    assert not d.allow and d.reason.startswith(reason), d.reason


def test_a_create_is_labelled_joins_the_run_network_and_binds_the_project():
    b, engine = broker(apparmor="kooi-runner")
    d, req = decide(b, "POST", "/v1.41/containers/create?name=pg",
                    {"Image": "postgres", "labels": {"a": "b"},
                     "hostConfig": {"binds": ["/workspace/data:/data", "mine-vol:/v"]}})
    assert d.allow, d.reason
    doc = json.loads(req.body)
    assert doc["labels"] == {"a": "b", labels.RUN: "run-1", labels.NESTED: "1", **UNSET}  # the client's spelling kept
    hc = doc["hostConfig"]
    assert hc["binds"] == ["/srv/project/data:/data", "mine-vol:/v"]
    assert hc["NetworkMode"] == "kooi-run-1" and hc["SecurityOpt"] == ["apparmor=kooi-runner"]
    assert ("GET", "/volumes/mine-vol") in engine.calls


def test_the_policy_decides_on_the_rewritten_create():
    d, _ = decide(broker()[0], "POST", "/containers/create", {"Image": "x", "HostConfig": {"Privileged": True}})
    assert not d.allow and d.reason == "privileged containers are refused"
    d, _ = decide(broker()[0], "POST", "/containers/create", {"Image": "x", "HostConfig": {"NetworkMode": "other-net"}})
    assert not d.allow and d.reason == "network 'other-net' does not exist or is not this run's"


def test_networks_and_volumes_are_created_labelled():
    d, req = decide(broker()[0], "POST", "/networks/create", {"Name": "n"})
    assert d.allow and json.loads(req.body)["Labels"][labels.RUN] == "run-1"
    d, _ = decide(broker()[0], "POST", "/networks/create", {"Name": "n", "driver": "macvlan"})
    assert not d.allow and d.reason == "network driver 'macvlan' refused (only bridge networks)"
    d, req = decide(broker()[0], "POST", "/volumes/create", {"Name": "v"})
    assert d.allow and json.loads(req.body)["Labels"][labels.RUN] == "run-1"
    with pytest.raises(BadRequest):
        decide(broker()[0], "POST", "/volumes/create", {"Name": "v", "Labels": "x"})
    # Review 14: a session's kept home is kooi's name: not made by a run, not by a mount.
    b, eng = broker()
    d, _ = decide(b, "POST", "/volumes/create", {"Name": "kooi-home.alice.claude-session"})
    assert not d.allow and "kept homes" in d.reason, d.reason
    d = b.rules.container_create({"Image": "x", "HostConfig": {"Mounts": [
        {"Type": "volume", "Source": "kooi-home.alice.claude-session", "Target": "/h"}]}})
    assert d is not None and not d.allow and "kept homes" in d.reason
    assert ("POST", "/volumes/create") not in eng.calls


def test_listings_and_prunes_see_only_the_runs_objects():
    for method, uri in (("GET", "/v1.41/containers/json?all=1"), ("GET", "/networks"), ("GET", "/events"),
                        ("POST", "/volumes/prune")):
        d, req = decide(broker()[0], method, uri)
        filters = json.loads(dict(urllib.parse.parse_qsl(req.uri.split("?", 1)[1]))["filters"])
        assert d.allow and filters["label"] == [f"{labels.RUN}=run-1"], (uri, req.uri)


def test_a_network_connect_needs_the_runs_network_and_container():
    b, _ = broker()
    d, _ = decide(b, "POST", "/networks/mine-net/connect", {"Container": "mine-1"})
    assert d.allow, d.reason
    d, _ = decide(b, "POST", "/networks/mine-net/disconnect", {"Container": 5})
    assert not d.allow and d.reason == "network connect: Container must be a string"
    d, _ = decide(b, "POST", "/networks/other-net/connect", {"Container": "mine-1"})
    assert not d.allow and d.reason == "network 'other-net' does not exist or is not this run's"


def test_the_workloads_own_container_is_out_of_reach():
    b, _ = broker(protected={"id-mine-wl"})
    d, _ = decide(b, "POST", "/containers/mine-wl/update", {"Memory": 1})
    assert not d.allow and "the workload's own container" in d.reason


def test_ownership_is_remembered_by_id():
    b, engine = broker()
    assert decide(b, "GET", "/containers/mine-1/json")[0].allow
    assert decide(b, "POST", "/containers/id-mine-1/start")[0].allow
    assert engine.calls == [("GET", "/containers/mine-1/json")]


RUN_LIMITS = {"Memory": 1 << 30, "MemorySwap": 1 << 30, "PidsLimit": 512, "NanoCpus": 2_000_000_000,
              "ulimit:nproc": 512, "ulimit:nofile": 4096, "ulimit:core": 0}


def test_a_nested_container_gets_the_runs_limits_where_it_names_none():
    # The docker CLI's "not set": 0 for every resource field.
    d, req = decide(broker(limits=RUN_LIMITS)[0], "POST", "/containers/create",
                    {"Image": "postgres", "HostConfig": {"Memory": 0, "PidsLimit": 0, "NanoCpus": 0,
                                                         "Ulimits": [{"Name": "nofile", "Soft": 1024, "Hard": 2048}]}})
    assert d.allow, d.reason
    hc = json.loads(req.body)["HostConfig"]
    assert hc["Memory"] == 1 << 30 and hc["MemorySwap"] == 1 << 30 and hc["PidsLimit"] == 512
    assert hc["NanoCpus"] == 2_000_000_000
    ul = {u["Name"]: (u["Soft"], u["Hard"]) for u in hc["Ulimits"]}
    assert ul == {"nofile": (1024, 2048), "nproc": (512, 512), "core": (0, 0)}  # its own lower nofile kept


def test_a_nested_container_may_ask_for_less_never_for_more():
    b = broker(limits=RUN_LIMITS)[0]
    d, req = decide(b, "POST", "/containers/create", {"Image": "x", "HostConfig": {"Memory": 256 << 20, "CpuQuota": 50000}})
    assert d.allow, d.reason
    hc = json.loads(req.body)["HostConfig"]
    assert hc["MemorySwap"] == 256 << 20 and "NanoCpus" not in hc  # the CLI's --cpus and a quota conflict
    for hc, why in [({"Memory": 2 << 30}, "Memory 2147483648 refused (above the run's limit of 1073741824)"),
                    ({"MemorySwap": -1}, "MemorySwap -1 refused (above the run's limit"),
                    ({"PidsLimit": 100000}, "PidsLimit 100000 refused"),
                    ({"NanoCpus": 4_000_000_000}, "NanoCpus 4000000000 refused"),
                    ({"CpuQuota": 400000, "CpuPeriod": 100000}, "CpuQuota 400000 per 100000 refused"),
                    ({"CpuQuota": -1}, "CpuQuota -1 per 100000 refused"),
                    ({"Ulimits": [{"Name": "nproc", "Soft": 100, "Hard": 100000}]}, "Ulimits 'nproc' Hard=100000 refused"),
                    ({"Ulimits": [{"Name": "core", "Soft": 1, "Hard": 1}]}, "Ulimits 'core' Soft=1 refused")]:
        d, _ = decide(b, "POST", "/containers/create", {"Image": "x", "HostConfig": hc})
        assert not d.allow and why in d.reason, (hc, d.reason)
    d, _ = decide(b, "POST", "/containers/mine-1/update", {"Memory": 4 << 30})
    assert not d.allow and "container update: Memory" in d.reason


def test_a_gvisor_run_puts_every_container_under_runsc_and_refuses_other_runtimes():
    """isolation gvisor (run.brokered): a create that names no runtime gets runsc; one
    that names another is refused, whatever its spelling or case (the engine does not
    fold runtime names; Docker >= 23 also runs any io.containerd.<x>.<vN> shim)."""
    b = broker(runtime="runsc")[0]
    for hc in ({}, {"Runtime": ""}, {"Runtime": "runsc"}, {"runtime": "runsc"}):
        d, req = decide(b, "POST", "/containers/create", {"Image": "postgres", "HostConfig": dict(hc)})
        assert d.allow, (hc, d.reason)
        got = json.loads(req.body)["HostConfig"]
        assert [v for k, v in got.items() if k.lower() == "runtime"] == ["runsc"], got
    d, req = decide(b, "POST", "/containers/create", {"Image": "postgres"})
    assert d.allow and json.loads(req.body)["HostConfig"]["Runtime"] == "runsc"
    for name in ("runc", "io.containerd.runc.v2", "io.containerd.kata.v2", "RUNSC", "/usr/bin/runc", "runsc-debug"):
        d, _ = decide(b, "POST", "/containers/create", {"Image": "x", "HostConfig": {"Runtime": name}})
        assert not d.allow and d.reason == f"runtime {name!r} refused: every container of this run runs under " \
            "runsc (isolation gvisor)", (name, d.reason)
    # Without gVisor the run's containers keep the engine's runc, and runsc is not theirs to ask for.
    d, req = decide(broker()[0], "POST", "/containers/create", {"Image": "x"})
    assert d.allow and "Runtime" not in json.loads(req.body)["HostConfig"]
    d, _ = decide(broker()[0], "POST", "/containers/create", {"Image": "x", "HostConfig": {"Runtime": "runsc"}})
    assert not d.allow and d.reason.startswith("runtime 'runsc' refused"), d.reason


# --- issue 28: shadows, networks, images ----------------------------------------------


def test_a_container_binding_the_workspace_gets_the_guards_shadows():
    b, _ = broker(shadows=(("/.git/hooks".lstrip("/"), "/runs/sh/hooks"), (".git/config", "/runs/sh/config")))
    doc = {"Image": "x", "HostConfig": {"Binds": ["/workspace:/w:ro"],
                                        "Mounts": [{"Type": "bind", "Source": "/workspace/", "Target": "/m"}]}}
    assert b.rules.container_create(doc) is None
    got = {(m["Target"], m["Source"], m["ReadOnly"]) for m in doc["HostConfig"]["Mounts"] if m["Target"] != "/m"}
    assert got == {("/w/.git/hooks", "/runs/sh/hooks", True), ("/w/.git/config", "/runs/sh/config", True),
                   ("/m/.git/hooks", "/runs/sh/hooks", False), ("/m/.git/config", "/runs/sh/config", False)}


@pytest.mark.parametrize("doc,why", [
    ({"Name": "n", "Options": {"com.docker.network.bridge.name": "kooi0"}}, "Options refused"),
    ({"Name": "n", "IPAM": {"Config": [{"Subnet": "10.0.2.0/24"}]}}, "IPAM refused"),
    ({"Name": "n", "IPAM": {"Driver": "other"}}, "IPAM refused"),
    ({"Name": "n", "EnableIPv6": True}, "EnableIPv6 refused"),
    ({"Name": "n", "ConfigFrom": {"Network": "x"}}, "ConfigFrom refused"),
    ({"Name": "n", "Driver": "macvlan"}, "network driver 'macvlan' refused"),
    # the eighth hostile review: root's `kooi gc` printed this name to its terminal
    ({"Name": "rv\x1b]0;OWNED\x07\x1b[2J"}, "Name refused"),
    ({"Name": "a b"}, "Name refused"), ({"Name": "-x"}, "Name refused"), ({"Name": "x" * 129}, "Name refused"),
])
def test_a_network_only_with_the_engines_own_settings(doc, why):
    d, _ = decide(broker()[0], "POST", "/networks/create", doc)
    assert not d.allow and why in d.reason, d.reason


def test_networks_per_run_are_bounded():
    b, _ = broker(max_networks=2)
    ok = {"Name": "n", "CheckDuplicate": True, "Driver": "bridge", "Internal": True, "Attachable": False,
          "Options": None, "IPAM": {"Driver": "default", "Config": [], "Options": {}}, "Labels": {"a": "b"}}
    assert decide(b, "POST", "/networks/create", ok)[0].allow
    assert decide(b, "POST", "/networks/create", ok)[0].allow
    d, _ = decide(b, "POST", "/networks/create", ok)
    assert not d.allow and "the most a run may" in d.reason


@pytest.mark.parametrize("method,uri,allowed", [
    ("POST", "/v1.41/images/kooi-probe:latest/tag?repo=postgres&tag=16", False),
    ("POST", "/images/library/postgres/push", False),
    ("POST", "/images/load?quiet=1", False),
    ("POST", "/images/create?fromSrc=-&repo=x", False),
    ("POST", "/commit?container=mine-1", False),
    ("POST", "/images/create?fromImage=postgres&tag=16-alpine", True),
    ("GET", "/images/kooi-probe:latest/json", True),
])
def test_images_are_used_and_pulled_never_made_or_repointed(method, uri, allowed):
    d, _ = decide(broker()[0], method, uri)
    assert d.allow == allowed, d.reason


def test_a_connection_closed_before_a_request_is_no_request_and_one_closed_within_is_bad():
    from kooi.httpwire import NoRequest

    with pytest.raises(NoRequest):
        read_head(reader(b""))
    with pytest.raises(BadRequest) as exc:
        read_head(reader(b"GET /_ping HTTP/1.1\r\nHost"))
    assert not isinstance(exc.value, NoRequest)


def test_gc_leaves_a_scan_container_that_may_be_in_use():
    """Found in CI: the hourly gc removed the container of an image scan in progress."""
    from kooi.run.leftovers import SCAN_GRACE, _age

    now = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    assert _age(now + ".123456789Z") < SCAN_GRACE and _age(now + "Z") < SCAN_GRACE
    assert _age("2020-01-01T00:00:00.5Z") > SCAN_GRACE
    assert _age("not a time") == 0.0


def test_a_name_another_run_holds_gets_a_name_of_the_runs_own_that_the_run_uses():
    """Names are the engine's, one for all runs: another run's `reaper_default` (or a
    hostile run's squat) made this run's create fail. The run's object gets NAME.<hex>
    and every later use of NAME is its own (tests/e2e/test_broker.py: the real engine)."""
    b, engine = broker()
    d, req = decide(b, "POST", "/networks/create", {"Name": "other-net"})
    real = json.loads(req.body)["Name"]
    assert d.allow and real.startswith("other-net.") and len(real) == len("other-net.") + 8, (d.reason, real)
    engine.mine.add(real)
    d, req = decide(b, "DELETE", "/networks/other-net")
    assert d.allow and req.uri == f"/networks/id-{real}", (d.reason, req.uri)
    d, req = decide(b, "POST", "/containers/create?name=other-1",
                    {"Image": "x", "HostConfig": {"NetworkMode": "other-net", "Binds": ["other-vol:/v"]}})
    assert d.allow, d.reason
    ctr = dict(urllib.parse.parse_qsl(req.uri.split("?", 1)[1]))["name"]
    vol = json.loads(req.body)["HostConfig"]["Binds"][0].split(":")[0]
    assert ctr.startswith("other-1.") and vol.startswith("other-vol."), (ctr, vol)
    assert json.loads(req.body)["HostConfig"]["NetworkMode"] == real
    assert json.loads(req.body)["NetworkingConfig"]["EndpointsConfig"][real]["NetworkID"] == f"id-{real}"
    engine.mine.add(ctr)
    assert decide(b, "POST", "/containers/other-1/start")[1].uri == f"/containers/id-{ctr}/start"
    # A second network of a name the run holds itself: refused (ambiguous); a container
    # or volume: the engine's answer on the run's own (409; the volume itself).
    d, _ = decide(b, "POST", "/networks/create", {"Name": "other-net"})
    assert not d.allow and "of this run's exists" in d.reason, d.reason
    d, _ = decide(b, "POST", "/networks/create", {"Name": "mine-net"})
    assert not d.allow and "of this run's exists" in d.reason, d.reason
    d, req = decide(b, "POST", "/containers/create?name=other-1", {"Image": "x"})
    assert d.allow and dict(urllib.parse.parse_qsl(req.uri.split("?", 1)[1]))["name"] == ctr, req.uri
    engine.mine.add(vol)
    d, req = decide(b, "POST", "/volumes/create", {"Name": "other-vol"})
    assert d.allow and json.loads(req.body)["Name"] == vol, req.body
    d, req = decide(b, "POST", "/volumes/create", {"Name": "mine-vol"})
    assert d.allow and json.loads(req.body)["Name"] == "mine-vol", req.body


@pytest.mark.parametrize("query,listed", [
    ("", True), ('?filters={"driver":{"bridge":true}}', True), ('?filters={"name":["^bridge$"]}', True),
    ('?filters={"type":["builtin"]}', True), ('?filters={"label":["app=x"]}', False),
    ('?filters={"name":["reaper"]}', False), ('?filters={"driver":["overlay"]}', False), ("?filters=nope", False),
])
def test_the_run_network_is_listed_as_the_default_bridge(query, listed):
    """testcontainers-go looks for the default bridge by name and otherwise makes a
    network `reaper_default`, whose published ports the run network's gateway does not
    reach: the run's network is listed as `bridge` too, and `bridge` is the run's."""
    b, _ = broker()
    own = {"Name": "kooi-run-1", "Id": "id-net", "IPAM": {"Config": [{"Gateway": "10.1.0.1"}]}}
    out = b.rules.default_bridge(f"/networks{query}", [own])
    assert (out[-1] == {**own, "Name": "bridge"}) is listed, out
    d, req = decide(b, "GET", "/networks/bridge")
    assert d.allow and req.uri == "/networks/id-kooi-run-1", (d.reason, req.uri)


def test_the_run_networks_containers_show_it_as_the_default_bridge():
    """testcontainers-python 4.0 reads a container's gateway at
    NetworkSettings.Networks["bridge"] (a KeyError on the run's own network): a run's
    container shows its network under `bridge` too, in a listing and an inspection;
    another network, or a container on neither, as the engine said."""
    b, _ = broker()
    ep = {"Gateway": "10.1.0.1", "IPAddress": "10.1.0.2"}
    listed = b.rules.containers_on_bridge([
        {"Id": "a", "NetworkSettings": {"Networks": {"kooi-run-1": dict(ep)}}},
        {"Id": "b", "NetworkSettings": {"Networks": {"tc-net": dict(ep)}}},
        {"Id": "c", "NetworkSettings": None}, "odd"])
    assert listed[0]["NetworkSettings"]["Networks"] == {"kooi-run-1": ep, "bridge": ep}, listed
    assert listed[1]["NetworkSettings"]["Networks"] == {"tc-net": ep} and listed[2:] == [
        {"Id": "c", "NetworkSettings": None}, "odd"], listed
    inspected = b.rules.containers_on_bridge({"Id": "a", "NetworkSettings": {"Networks": {"kooi-run-1": ep}}})
    assert inspected["NetworkSettings"]["Networks"]["bridge"]["Gateway"] == "10.1.0.1", inspected


def test_review_45_a_nested_container_or_volume_cannot_pass_for_a_session_or_a_home():
    """Review 45 (high): the engine copies an image's labels the create does not set, so
    an image labelled org.kooi.session=1 org.kooi.person=alice made a nested container
    that `kooi session` took for alice's session (her SSH login went into it); and a
    volume mount's VolumeOptions.Labels made an anonymous volume that passed for her
    kept home (or another run's volume). The broker sets the session's and home's keys
    itself, and a mount's volume gets the run's labels alone."""
    d, req = decide(broker()[0], "POST", "/v1.41/containers/create", {"Image": "attacker/fake-session", "HostConfig": {
        "Mounts": [{"Type": "volume", "Source": "", "Target": "/h", "VolumeOptions": {"Labels": {
            labels.HOME: "1", labels.PERSON: "alice", labels.RUN: "other-run"}}}]}})
    assert d.allow, d.reason
    sent = json.loads(req.body)
    assert {sent["Labels"].get(k) for k in (labels.SESSION, labels.PERSON, labels.HOME)} == {""}, sent["Labels"]
    vol = sent["HostConfig"]["Mounts"][0]["VolumeOptions"]["Labels"]
    assert vol.get(labels.HOME) == "" and vol.get(labels.PERSON) == "" and vol[labels.RUN] == "run-1", vol


# --- the run's end (review 48) --------------------------------------------------------


class ScriptedEngine:
    """A unix-socket HTTP server standing in for the engine: it records every request
    head it receives and answers each after DELAY seconds."""

    def __init__(self, path: str, delay: float = 0.0) -> None:
        self.path, self.delay, self.got = path, delay, []
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(path)
        self.sock.listen(16)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(c,), daemon=True).start()

    def _one(self, c: socket.socket) -> None:
        try:
            data = b""
            while b"\r\n\r\n" not in data and (chunk := c.recv(4096)):
                data += chunk
            self.got.append(data.split(b"\r\n", 1)[0].decode())
            time.sleep(self.delay)
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        except OSError:
            pass  # the broker cut it (the run ended)
        finally:
            c.close()


def _endable(tmp_path, delay: float = 0.0) -> tuple[Broker, ScriptedEngine]:
    engine = ScriptedEngine(str(tmp_path / "engine.sock"), delay)
    b = Broker(str(tmp_path / "b.sock"), engine.path, Policy(workspace=str(tmp_path)),
               RunScope("r1", {labels.RUN: "r1"}))
    b.start()
    return b, engine


def _forwarded(b: Broker, engine: ScriptedEngine, request: bytes) -> socket.socket:
    """A client of B that sent REQUEST, once the engine has it."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(b.listen)
    s.sendall(request)
    deadline = time.monotonic() + 5
    while not engine.got and time.monotonic() < deadline:
        time.sleep(0.05)
    return s


def test_a_request_held_back_until_the_run_ends_never_reaches_the_engine(tmp_path):
    """Review 48 (high): a nested container sent a request's head without its last CRLF,
    waited until the broker had stopped, then finished it: the broker still decided and
    forwarded it (a container created after the cleanup's listing wrote into the project
    after the guard's check). Once stop() returns, nothing more reaches the engine."""
    b, engine = _endable(tmp_path)
    s = socket.socket(socket.AF_UNIX)
    s.connect(b.listen)
    s.sendall(b"GET /v1.41/version HTTP/1.1\r\nHost: docker\r\n")
    time.sleep(0.2)
    t0 = time.monotonic()
    b.stop()
    assert time.monotonic() - t0 < 5
    try:
        s.sendall(b"\r\n")
        s.settimeout(5)
        answer = s.recv(4096)
    except OSError:
        answer = b""
    time.sleep(0.3)
    assert engine.got == [] and b"200 OK" not in answer, (engine.got, answer)


def test_a_request_on_its_way_when_the_run_ends_is_let_finish_first(tmp_path):
    """A create already forwarded when the run ends is waited for: the cleanup after
    stop() lists what it made."""
    b, engine = _endable(tmp_path, delay=1.0)
    s = _forwarded(b, engine, b"POST /v1.41/auth HTTP/1.1\r\nHost: docker\r\nContent-Length: 2\r\n\r\n{}")
    b.stop()
    s.settimeout(5)
    assert s.recv(4096).startswith(b"HTTP/1.1 200 OK")


def test_a_stream_open_when_the_run_ends_does_not_hold_it(tmp_path):
    """A stream (events, attach, logs, a wait) the engine holds open is cut at once, not
    waited for."""
    b, engine = _endable(tmp_path, delay=60.0)
    s = _forwarded(b, engine, b"GET /v1.41/events HTTP/1.1\r\nHost: docker\r\n\r\n")
    t0 = time.monotonic()
    b.stop()
    assert time.monotonic() - t0 < 5
    s.close()


def test_review_49_a_request_cut_at_the_end_of_the_grace_is_not_forwarded(tmp_path):
    """Review 49: a handler between its decision and its engine connection when the grace
    ran out still got to forward (stop cut the client but kept its entry)."""
    b, engine = _endable(tmp_path)
    a, c = socket.socketpair()
    assert b.begin_forward(c, True)
    ender = threading.Thread(target=b.stop, kwargs={"grace": 0.3})
    ender.start()
    time.sleep(1.5)  # the accept loop's end (up to 0.5 s), then the grace
    up = socket.socket(socket.AF_UNIX)
    up.connect(engine.path)
    assert not b.upstream_of(c, up)
    b.done(c)
    ender.join(15)
    for s in (a, c, up):
        s.close()
