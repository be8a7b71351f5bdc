"""Egress from the engine's containers, end to end between two test hosts.

The engine host runs a container as the runner on the default bridge (a run's own
containers are on bridges of the run's, which reach the host only on the run's ports:
tests/e2e/test_egress.py; docker0 keeps the main proxy port); the peer, another test host on the scenario's
network, serves HTTP on a port this test opens. Root on the engine host reaches the
peer (the path exists: negative control); the container does not, neither the peer
nor another port of its own host; it reaches only the egress proxy, which answers.

userns-remap: container traffic is forwarded by the host (kooi's forward and input
chains). Rootless: it leaves through slirp4netns as the runner's uid (the output chain).

Run by molecule/shared/verify.yml with KOOI_EGRESS_PEER=docker://<other test host>.
"""

from __future__ import annotations

import json
import os
import random
import shlex

import pytest
import testinfra

from kooi.checks import Context

SERVER = ("import http.server,socketserver,sys\n"
          "class H(http.server.BaseHTTPRequestHandler):\n"
          " def do_GET(self):\n"
          "  b=b'kooi-peer-ok\\n'\n"
          "  self.send_response(200);self.send_header('Content-Length',str(len(b)));self.end_headers()\n"
          "  self.wfile.write(b)\n"
          " def log_message(self,*a): pass\n"
          "socketserver.TCPServer.allow_reuse_address=True\n"
          "http.server.ThreadingHTTPServer(('0.0.0.0',int(sys.argv[1])),H).serve_forever()\n")

FETCH = ("import sys,urllib.request\n"
         "o=urllib.request.build_opener(urllib.request.ProxyHandler({}))\n"
         "print(o.open(sys.argv[1],timeout=10).read().decode().strip())\n")


@pytest.fixture(scope="module")
def ctx(host):
    return Context.from_host(host)


@pytest.fixture(scope="module")
def egress(host):
    f = host.file("/etc/kooi/egress.json")
    assert f.exists, "egress control is on in every scenario: /etc/kooi/egress.json is missing"
    return json.loads(f.content_string)


@pytest.fixture(scope="module")
def port():
    return random.randint(20000, 39999)


def _serve(h, port: int):
    """Start the test server on a test host; yields nothing, stops it by its pid."""
    res = h.run(f"nohup python3 -c {shlex.quote(SERVER)} {port} >/dev/null 2>&1 & echo $!")
    assert res.rc == 0 and res.stdout.strip().isdigit(), res.stderr
    pid = res.stdout.strip()
    ready = h.run(f"for i in $(seq 50); do python3 -c {shlex.quote(FETCH)} http://127.0.0.1:{port}/ "
                  f"2>/dev/null && exit 0; sleep 0.2; done; exit 1")
    assert ready.rc == 0, f"the test server on port {port} did not come up"
    return pid


@pytest.fixture(scope="module")
def peer(port):
    spec = os.environ.get("KOOI_EGRESS_PEER")
    assert spec, "KOOI_EGRESS_PEER (the other test host, e.g. docker://NAME) is required"
    p = testinfra.get_host(spec)
    pid = _serve(p, port)
    # Its address on the scenario's network (eth0), not its own Docker bridge's.
    addr = p.check_output("ip -4 -o addr show dev eth0 | awk '{print $4}' | cut -d/ -f1 | head -n1")
    assert addr, "the peer has no IPv4 address on eth0"
    yield p, addr
    p.run(f"kill {pid}")


@pytest.fixture(scope="module")
def local_server(host, port):
    pid = _serve(host, port + 1)
    yield port + 1
    host.run(f"kill {pid}")


STARTED = "KOOI-PROBE-STARTED"


def in_container(host, ctx, cmd: str, env: dict[str, str] | None = None):
    """Run `cmd` (busybox) in a probe container started by the runner on its engine.
    The container must really run (a missing image or a refused create would make
    every "cannot reach" assertion pass for the wrong reason)."""
    envs = " ".join(f"-e {shlex.quote(f'{k}={v}')}" for k, v in (env or {}).items())
    line = (f"docker run --rm --network bridge --cap-drop ALL --security-opt no-new-privileges "
            f"{envs} {ctx.probe_image} sh -c {shlex.quote(f'echo {STARTED}; {cmd}')}")
    res = host.run(f"timeout 60 {ctx.as_runner(line)}")
    assert res.stdout.startswith(STARTED), f"the probe container did not run: {res.stdout} {res.stderr}"
    return res


def http_get(host, ctx, addr: str, port: int):
    """GET / from the container with busybox nc (busybox-static's wget crashes without
    the libc's name service modules, which the busybox-only image lacks)."""
    return in_container(host, ctx, f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | busybox nc -w 8 {addr} {port}; "
                                   "echo nc-rc=$?")


def proxy_host(host, ctx) -> str:
    if ctx.mode == "rootless":
        return "10.0.2.2"
    res = host.run(ctx.as_runner("docker network inspect bridge -f '{{(index .IPAM.Config 0).Gateway}}'"))
    assert res.rc == 0 and res.stdout.strip(), res.stderr
    return res.stdout.strip()


def test_the_proxys_logs_are_checked_for_size_every_5_minutes(host):
    """Issue 29, finding 6: the distribution's daily logrotate run let a flood of refused
    requests grow the proxy's logs for a day; kooi's own timer checks every 5 minutes."""
    assert not host.file("/etc/logrotate.d/kooi-egress").exists
    if host.file("/run/systemd/system").is_directory:
        timer = host.service("kooi-egress-logrotate.timer")
        assert timer.is_enabled and timer.is_running
        res = host.run("systemctl start kooi-egress-logrotate.service")
        assert res.rc == 0, res.stderr
    else:
        assert "*/5 * * * * root /usr/sbin/logrotate" in host.file("/etc/cron.d/kooi-egress-logrotate").content_string


def test_root_on_the_engine_host_reaches_the_peer(host, peer, port):
    _, addr = peer
    res = host.run(f"python3 -c {shlex.quote(FETCH)} http://{addr}:{port}/")
    assert res.rc == 0 and res.stdout.strip() == "kooi-peer-ok", (res.stdout, res.stderr)


def test_a_container_does_not_reach_the_peer(host, ctx, peer, port):
    _, addr = peer
    res = http_get(host, ctx, addr, port)
    assert "kooi-peer-ok" not in res.stdout and "nc-rc=0" not in res.stdout, res.stdout + res.stderr


def test_a_container_sends_no_udp_to_the_peer(host, ctx, peer, port):
    # A DNS query to the peer as resolver: no answer can come back when nothing leaves.
    # The peer runs no resolver, so the test proves only together with the TCP one above
    # and the host-side evidence below (the reject counters of kooi's table).
    _, addr = peer
    before = _rejected(host, ctx)
    res = in_container(host, ctx, f"busybox nslookup -timeout=2 kooi.test {addr}")
    assert res.rc != 0
    assert _rejected(host, ctx) > before, "the query was not stopped by kooi's table"


def test_a_container_does_not_reach_other_ports_of_its_host(host, ctx, local_server):
    gw = proxy_host(host, ctx)
    res = http_get(host, ctx, gw, local_server)
    assert "kooi-peer-ok" not in res.stdout and "nc-rc=0" not in res.stdout, res.stdout + res.stderr


def test_a_container_reaches_only_the_proxy_which_refuses_unlisted_names(host, ctx, egress, peer, port):
    _, addr = peer
    # A proxy request by hand (see http_get). This is also the positive control of the
    # probe itself: the same nc reaches what the rules allow.
    target = f"peer.kooi.test:{port}"
    req = f"GET http://{target}/ HTTP/1.1\\r\\nHost: {target}\\r\\nConnection: close\\r\\n\\r\\n"
    res = in_container(host, ctx, f"printf '{req}' | busybox nc -w 15 {proxy_host(host, ctx)} {egress['port']} "
                                  "| head -n 1")
    status = res.stdout.splitlines()[1:2]
    assert status and status[0].startswith("HTTP/1.1 403"), res.stdout + res.stderr
    log = host.run(f"tail -n 50 {shlex.quote(egress.get('access_log', '/var/log/kooi/egress/access.log'))}")
    assert f"peer.kooi.test:{port}" in log.stdout, log.stdout


def test_control_without_koois_table_the_same_probe_reaches_the_peer(host, ctx, egress, peer, port):
    # The denials above are kooi's table's doing: without it the path exists. Restored
    # from the role's rules file whatever happens.
    _, addr = peer
    assert host.run(f"nft delete table inet {egress.get('table', 'kooi_egress')}").rc == 0
    try:
        res = http_get(host, ctx, addr, port)
    finally:
        restore = host.run(f"nft -f {shlex.quote(egress['rules_file'])}")
    assert restore.rc == 0, restore.stderr
    assert "kooi-peer-ok" in res.stdout, res.stdout + res.stderr


def _rejected(host, ctx) -> int:
    """Packets kooi's table rejected so far (the sum of its counters on reject rules)."""
    res = host.run("nft -j list table inet kooi_egress")
    assert res.rc == 0, res.stderr
    total = 0
    for item in json.loads(res.stdout)["nftables"]:
        rule = item.get("rule")
        if not rule:
            continue
        exprs = rule.get("expr", [])
        if any("reject" in e for e in exprs):
            total += sum(e["counter"]["packets"] for e in exprs if "counter" in e)
    return total
