"""gVisor on the userns-remap test hosts (kooi_gvisor_enabled, role gvisor): the engine
runs a container under runsc with the platform and the netns workaround the role chose
from facts, the container sees gVisor's kernel (the same container under runc sees the
host's), the sandbox writes files as the remap range's root, the authorization plugin
admits runsc and no other new runtime, and HOST-GVISOR fails when runsc is writable by
others (its negative control)."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from kooi.checks import Context, run_all

PROBE = "kooi-probe:latest"


@pytest.fixture(scope="module")
def ctx(host):
    c = Context.from_host(host)
    if c.engine.gvisor is None:
        pytest.fail("this host's engine.json has no gvisor: the scenario sets kooi_gvisor_enabled, so role gvisor "
                    "did not describe the runtime")
    # Below the runner's home: kooi-authz admits binds only below its workspace roots.
    # runsc's gofer opens a bind source itself, as the remap range's root (measured:
    # "cannot create sandbox" when the runner's 0750 home denies it the search that
    # runc, mounting as real root, never needs); the test grants that search for its
    # duration (kooi run does the same for gVisor runs: run.project.grant_search).
    d = f"{c.engine.runner_home}/kooi-gvisor-test"
    remap_root = host.check_output(f"grep '^{c.engine.remap_user}:' /etc/subuid | cut -d: -f2")
    host.run(f"rm -rf {d} && mkdir -p {d} && chmod 0777 {d} && setfacl -m u:{remap_root}:x {c.engine.runner_home}")
    try:
        yield c
    finally:
        host.run(f"rm -rf {d}; setfacl -x u:{remap_root} {c.engine.runner_home}")


def run(host, *args: str):
    return host.run("docker run --rm --network none " + " ".join(shlex.quote(a) for a in args))


def test_the_role_chose_from_facts(host, ctx):
    g = ctx.engine.gvisor
    platforms = host.run(f"{g.runsc} help platforms").stdout.split()
    assert g.platform == ("systrap" if "systrap" in platforms else "ptrace") and g.platform != "kvm"
    probe = host.run("unshare --net -- test -e /proc/sys/net/core/rmem_default").rc == 0
    assert g.netns_workaround == (probe and int(g.version) < 20240807), (probe, g.version)
    runtime = json.loads(host.check_output("docker info --format '{{json .Runtimes}}'"))["runsc"]
    assert runtime["path"] == g.path and tuple(runtime["runtimeArgs"]) == g.args, runtime


def test_a_container_under_runsc_sees_gvisors_kernel_and_writes_as_the_remap_root(host, ctx):
    host_release = host.check_output("uname -r")
    d = f"{ctx.engine.runner_home}/kooi-gvisor-test"
    res = run(host, "--runtime", "runsc", "-v", f"{d}:/w", PROBE, "sh", "-c", "uname -r; echo x > /w/f")
    assert res.rc == 0, res.stderr
    assert res.stdout.strip() != host_release and (res.stdout.strip() == "4.4.0" or "gvisor" in res.stdout), res.stdout
    # The control: the same container under runc sees the host's kernel.
    ctl = run(host, "--runtime", "runc", PROBE, "sh", "-c", "uname -r")
    assert ctl.rc == 0 and ctl.stdout.strip() == host_release, (ctl.stdout, ctl.stderr)
    remap_root = host.check_output(f"grep '^{ctx.engine.remap_user}:' /etc/subuid | cut -d: -f2")
    assert host.file(f"{d}/f").uid == int(remap_root)


def test_no_other_runtime_is_admitted(host, ctx):
    """The plugin admits runsc (the test above went through it on hosts that have it)
    and refuses any other new name; without the plugin the engine knows no other."""
    res = run(host, "--runtime", "runsc-debug", PROBE, "true")
    assert res.rc != 0, res.stdout
    # Docker 20.10: "Unknown runtime specified runsc-debug"; 26: "unknown or invalid runtime name".
    why = r"runtime 'runsc-debug' refused" if ctx.engine.authz else r"(?i)unknown.* runtime"
    assert re.search(why, res.stderr), res.stderr


def test_host_gvisor_fails_when_runsc_is_writable_by_others(host, ctx):
    g = ctx.engine.gvisor

    def status() -> str:
        ctx.cache.clear()
        return next(r for r in run_all(host, ctx, ["HOST-GVISOR"])).status

    assert status() == "pass"
    host.run(f"chmod g+w {g.runsc}")
    try:
        assert status() == "fail"
    finally:
        host.run(f"chmod g-w {g.runsc}")
    assert status() == "pass"

