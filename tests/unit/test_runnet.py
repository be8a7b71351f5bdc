"""A run's own way to the host (kooi.run.runnet) on the userns-remap engine: the egress
role's rules, rendered as site.yml renders them, loaded into a network namespace of the
test's own, with interfaces named as kooi names a run's bridges and the host's other
Docker bridges; real connections from a second namespace (root: CI runs as root)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kooi.hoststate.egress import EgressConfig
from kooi.hoststate.engine import EngineConfig
from kooi.run import runnet

REPO = Path(__file__).resolve().parents[2]
MAIN, INJECTOR, FIRST = 3128, 3129, 3140


def render(**over: object) -> str:
    """roles/egress/templates/egress.nft.j2 with the roles' defaults, through Ansible's
    own templating (what site.yml writes)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    v: dict[str, object] = {}
    for f in ("roles/kooi_defaults/defaults/main.yml", "roles/egress/defaults/main.yml",
              "roles/egress/vars/main.yml"):
        v.update({k: trust_as_template(x) if isinstance(x, str) else x
                  for k, x in yaml.safe_load((REPO / f).read_text()).items()})
    v.update(egress_uids=["1001"], egress_nft_digest="test", **over)
    text = (REPO / "roles/egress/templates/egress.nft.j2").read_text()
    out: str = Templar(loader=DataLoader(), variables=v).template(trust_as_template(text))
    return out


def cfg(mode: str) -> EngineConfig:
    return EngineConfig(mode=mode, runner_user="kooi-runner", runner_uid=1001, runner_gid=1001,
                        runner_home="/home/kooi-runner", socket="/run/docker.sock", daemon_config="")


def test_bridges_are_named_after_the_run_or_its_port_and_none_where_the_run_shares_the_main_port():
    eg = EgressConfig(port=MAIN, run_port_first=FIRST, run_port_count=32, run_bridges=9)
    rootless = runnet.bridges(cfg("rootless"), eg, "run-a", FIRST)
    assert len(rootless) == runnet.BRIDGES and all(b.startswith("kr") and len(b) <= 15 for b in rootless)
    assert rootless != runnet.bridges(cfg("rootless"), eg, "run-b", FIRST)
    remap = runnet.bridges(cfg("userns_remap"), eg, "run-a", 65535)
    assert remap == tuple(f"kp65535n{n}" for n in range(9)) and all(len(b) <= 15 for b in remap)
    assert runnet.bridges(cfg("userns_remap"), eg, "run-a", MAIN) == ()
    assert runnet.bridges(cfg("userns_remap"), EgressConfig(port=MAIN, run_bridges=0), "run-a", FIRST) == ()
    assert runnet.bridges(cfg("userns_remap"), None, "run-a", FIRST) == ()
    # the names every engine's policy lets kooi give a bridge (kooi.policybody.KOOI_BRIDGE)
    from kooi.policybody import KOOI_BRIDGE
    assert all(KOOI_BRIDGE.fullmatch(b) for b in (*rootless, *remap))
    assert all(KOOI_BRIDGE.fullmatch(runnet.bridge(f"run-{i}", n)) for i in range(50) for n in range(runnet.BRIDGES))


def test_the_rules_know_as_many_bridges_per_run_as_the_shim_gives_a_run():
    role = yaml.safe_load((REPO / "roles/egress/vars/main.yml").read_text())
    assert role["egress_run_bridges"] == runnet.BRIDGES
    assert role["egress_run_max_connections"] == runnet.MAX_CONNECTIONS


def test_ports_of_existing_bridges_are_in_use(tmp_path):
    for name in ("kp3141n0", "kp3141n3", "kp3150n1", "kp31x0n0", "docker0", "br-abc", "kr0a1b2c3d0"):
        (tmp_path / name).mkdir()
    assert runnet.ports_in_use(cfg("userns_remap"), tmp_path) == {3141, 3150}


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=30)


@pytest.fixture
def host() -> Iterator[dict[str, str]]:
    """Two namespaces: 'host' (the rules, listeners on the proxy's ports) and 'ctr'
    (the containers), joined by veth pairs whose host ends are named like bridges."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root (network namespaces): run the suite as root, as CI does")
    tag = secrets.token_hex(3)
    ns = {"host": f"kooi-t-h{tag}", "ctr": f"kooi-t-c{tag}"}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for n in ns.values():
            sh("ip", "netns", "add", n)
        links = {"kp3140n0": "10.77.1", "kp3140n5": "10.77.2", "kp3141n0": "10.77.3", "docker0": "10.77.4",
                 "kx3140n0": "10.77.5"}
        for i, (name, net) in enumerate(links.items()):
            sh("ip", "link", "add", name, "netns", ns["host"], "type", "veth", "peer", "name", f"c{i}",
               "netns", ns["ctr"])
            sh("ip", "-n", ns["host"], "addr", "add", f"{net}.1/24", "dev", name)
            sh("ip", "-n", ns["ctr"], "addr", "add", f"{net}.2/24", "dev", f"c{i}")
            sh("ip", "-n", ns["host"], "link", "set", name, "up")
            sh("ip", "-n", ns["ctr"], "link", "set", f"c{i}", "up")
        sh("ip", "-n", ns["host"], "link", "set", "lo", "up")
        for port in (MAIN, INJECTOR, FIRST, FIRST + 1):
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns["host"], sys.executable, "-c",
                 "import socket,sys,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);"
                 f" s.bind(('0.0.0.0', {port})); s.listen(512); time.sleep(120)"]))
        yield {**ns, **links}
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for n in ns.values():
            sh("ip", "netns", "del", n, check=False)


def reach(h: dict[str, str], net: str, port: int) -> str:
    """Connect from the container end of the link whose host end has NET's addresses."""
    code = ("import socket,sys; s=socket.socket(); s.settimeout(3)\n"
            f"try:\n s.connect(('{net}.1', {port})); print('connected')\n"
            "except OSError as e: print('refused', e.errno)")
    return sh("ip", "netns", "exec", h["ctr"], sys.executable, "-c", code).stdout.strip()


def test_a_run_reaches_its_own_port_and_the_injectors_and_no_other_on_userns_remap(host):
    rules = render(kooi_engine_mode="userns_remap", kooi_secrets=[{"name": "k", "inject": {}}])
    r = subprocess.run(["ip", "netns", "exec", host["host"], "nft", "-f", "-"], input=rules, text=True,
                       capture_output=True, check=False)
    assert r.returncode == 0, r.stderr
    time.sleep(0.3)  # the listeners
    seen = {(name, port): reach(host, host[name], port)
            for name in ("kp3140n0", "kp3140n5", "kp3141n0", "docker0", "kx3140n0")
            for port in (MAIN, INJECTOR, FIRST, FIRST + 1)}
    ok = "connected"
    refused = "refused 113"  # EHOSTUNREACH: administratively prohibited
    want = {
        # the run holding 3140, on its own network and on one its workload made
        ("kp3140n0", FIRST): ok, ("kp3140n0", INJECTOR): ok, ("kp3140n0", MAIN): refused,
        ("kp3140n0", FIRST + 1): refused,
        ("kp3140n5", FIRST): ok, ("kp3140n5", INJECTOR): ok, ("kp3140n5", MAIN): refused,
        ("kp3140n5", FIRST + 1): refused,
        # the run holding 3141
        ("kp3141n0", FIRST + 1): ok, ("kp3141n0", FIRST): refused, ("kp3141n0", MAIN): refused,
        ("kp3141n0", INJECTOR): ok,
        # docker0 (and br-*): no run's workload; the main port and the injector's
        ("docker0", MAIN): ok, ("docker0", INJECTOR): ok, ("docker0", FIRST): refused,
        ("docker0", FIRST + 1): refused,
        # an interface the rules do not name: none of the proxy's ports
        ("kx3140n0", MAIN): refused, ("kx3140n0", INJECTOR): refused, ("kx3140n0", FIRST): refused,
        ("kx3140n0", FIRST + 1): refused,
    }
    assert seen == want


def test_a_run_holds_at_most_its_bound_of_connections_on_userns_remap(host):
    rules = render(kooi_engine_mode="userns_remap", kooi_secrets=[])
    r = subprocess.run(["ip", "netns", "exec", host["host"], "nft", "-f", "-"], input=rules, text=True,
                       capture_output=True, check=False)
    assert r.returncode == 0, r.stderr
    code = ("import socket,time\nheld=[]\nfails=0\n"
            f"for i in range({runnet.MAX_CONNECTIONS + 20}):\n"
            " s=socket.socket(); s.settimeout(3)\n"
            f" try:\n  s.connect(('{host['kp3140n0']}.1', {FIRST})); held.append(s)\n"
            " except OSError: fails+=1\n"
            f"t=socket.socket(); t.settimeout(3); t.connect(('{host['kp3141n0']}.1', {FIRST + 1}))\n"
            "print(len(held), fails, 'other-run-ok')")
    time.sleep(0.3)
    out = sh("ip", "netns", "exec", host["ctr"], sys.executable, "-c", code).stdout.split()
    assert out == [str(runnet.MAX_CONNECTIONS), "20", "other-run-ok"]
