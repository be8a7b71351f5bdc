"""Rootless cgroup limits where the kernel allows them: kooi's rootless engine on the
guest's real Debian kernel, whose systemd mounts cgroup v2 (the CI machine's kernel, and
so every container test host, is cgroup v1 hybrid, where a rootless engine has no
controller at all). docker_rootless delegates cpu, cpuset, io, memory and pids to the
runner's user manager; the engine then reports the limits it can enforce (what `kooi
run` reads to choose cgroup limits over rlimits) and a container gets them. A jail
gets a systemd user scope of its own with the same limits (run.jailscope): `kooi run`
of a jail workflow is bounded by its cgroup, sees it, and ends a fork bomb and a
memory hog with their limit as the run's reason.
"""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from kooi.checks.runs import LIMITS_SCRIPT, limit_problems, parse_limits_output
from kooi.run.container import engine_limits

PROBE = "kooi-probe:latest"


@pytest.fixture(scope="module")
def engine(host):
    cfg = json.loads(host.file("/etc/kooi/engine.json").content_string)
    assert cfg["mode"] == "rootless", cfg
    return cfg


def as_runner(engine, cmd: str) -> str:
    return (f"runuser -u {engine['runner_user']} -- env DOCKER_HOST=unix://{engine['socket']} "
            f"XDG_RUNTIME_DIR=/run/user/{engine['runner_uid']} {cmd}")


def test_the_guest_has_the_unified_hierarchy_and_koois_delegation(host, engine):
    assert host.file("/sys/fs/cgroup/cgroup.controllers").exists
    drop_in = host.file("/etc/systemd/system/user@.service.d/kooi-delegate.conf")
    assert "Delegate=cpu cpuset io memory pids" in drop_in.content_string
    uid = engine["runner_uid"]
    got = host.file(f"/sys/fs/cgroup/user.slice/user-{uid}.slice/user@{uid}.service/cgroup.controllers")
    assert {"cpu", "cpuset", "io", "memory", "pids"} <= set(got.content_string.split()), got.content_string


def test_the_rootless_engine_reports_cgroup_limits(host, engine):
    res = host.run(as_runner(engine, "docker info --format '{{json .}}'"))
    assert res.rc == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["CgroupVersion"] == "2" and info["CgroupDriver"] == "systemd", info
    assert any("rootless" in o for o in info["SecurityOptions"]), info["SecurityOptions"]
    # What kooi run decides from: every limit by the cgroup, none left to rlimits.
    assert engine_limits(info) == {"memory": True, "pids": True, "cpus": True}, info


def test_a_rootless_container_gets_its_memory_pids_and_cpu_limits(host, engine):
    load = host.run(as_runner(engine, "docker load -q") + " < /root/kooi-probe.tar")
    assert load.rc == 0, load.stderr
    script = "cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory.swap.max /sys/fs/cgroup/pids.max " \
        "/sys/fs/cgroup/cpu.max"
    res = host.run(as_runner(engine, "timeout 300 docker run --rm --network none --memory 64m --memory-swap 64m "
                                     f"--pids-limit 32 --cpus 0.5 {PROBE} sh -c {shlex.quote(script)}"))
    assert res.rc == 0, res.stderr
    assert res.stdout.split() == ["67108864", "0", "32", "50000", "100000"], res.stdout


def test_an_unbounded_rootless_container_has_no_limits(host, engine):
    """The control: the same files without the flags, so the values above are the
    engine's doing (pids.max is then systemd's default TasksMax for the container's
    scope, 15% of the kernel's threads: 2305 on the guest)."""
    res = host.run(as_runner(engine, f"timeout 300 docker run --rm --network none {PROBE} "
                                     "cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/pids.max /sys/fs/cgroup/cpu.max"))
    assert res.rc == 0, res.stderr
    memory, pids, *cpu = res.stdout.split()
    assert memory == "max" and cpu == ["max", "100000"] and pids != "32", res.stdout

WFDIR = "/var/tmp/kooi-delegation-workflows"


def jail_run(host, engine, name: str, data: dict) -> tuple[int, dict, str]:
    """`kooi run` of a jail workflow (as root, which drops to the runner) on a project
    the runner owns; (exit code, result, output)."""
    project = f"{engine['runner_home']}/kooi-delegation"
    wf = yaml.safe_dump({"mode": "jail", "timeout": 120, **data})
    host.run(f"install -d -m 0755 {WFDIR} && install -d -o {engine['runner_user']} -m 0755 {project}")
    assert host.run(f"cat > {WFDIR}/{name}.yml <<'KOOI_EOF'\n{wf}KOOI_EOF").rc == 0
    out = f"/var/tmp/kooi-delegation-{name}.json"
    host.run(f"rm -f {out}")
    res = host.run(f"KOOI_WORKFLOW_DIR={WFDIR} timeout 600 {engine['kooi_bin']} run {name} --project {project} "
                   f"--json {out}")
    f = host.file(out)
    return res.rc, (json.loads(f.content_string) if f.exists else {}), res.stdout + res.stderr


def test_a_jail_is_bounded_by_a_systemd_user_scope_and_sees_its_cgroup(host, engine):
    rc, result, out = jail_run(host, engine, "scope-limits", {"command": ["sh", "-c", LIMITS_SCRIPT]})
    assert rc == 0, out
    record = result["limits"]
    assert {k: record[k]["by"].split(" (")[0] for k in ("memory", "pids", "cpus")} == {
        "memory": "cgroup memory controller", "pids": "cgroup pids controller", "cpus": "cgroup CPU quota, CPU weight 50"}
    assert "systemd user scope kooi-jail-" in out, out
    # What the workload saw (its scope's cgroup at /sys/fs/cgroup) is what the result says.
    assert limit_problems(record, *parse_limits_output(out)) == [], out
    # The scope is gone with the run.
    units = host.run(f"runuser -u {engine['runner_user']} -- env XDG_RUNTIME_DIR=/run/user/{engine['runner_uid']} "
                     "systemctl --user list-units --all --no-legend --plain")
    assert units.rc == 0, units.stderr
    assert "kooi-dockerd.service" in units.stdout and "kooi-jail-" not in units.stdout, units.stdout


def test_a_fork_bomb_in_a_scoped_jail_ends_at_its_pids_limit(host, engine):
    rc, result, out = jail_run(host, engine, "scope-bomb", {
        "command": ["bash", "-c", "bomb() { bomb | bomb & }; bomb; sleep 60"], "timeout": 20, "limits": {"pids": 64}})
    assert result.get("limit") == "pids", out[-2000:]
    assert rc != 0 and result["limits"]["pids"]["by"].startswith("cgroup"), out[-2000:]


def test_a_memory_hog_in_a_scoped_jail_ends_at_its_memory_limit(host, engine):
    hog = ("held = []\nwhile True:\n    held.append(bytearray(8 << 20))\n")
    rc, result, out = jail_run(host, engine, "scope-hog", {"command": ["python3", "-c", hog],
                                                           "limits": {"memory": "96m"}})
    assert result.get("limit") == "memory", out[-2000:]
    # The OOM killer's SIGKILL, as in a container (systemd then stops the scope).
    assert rc == 137 and result["reason"] == "failed", out[-2000:]


def test_a_scoped_jail_dies_with_a_killed_kooi_run(host, engine):
    """SIGKILL of `kooi run` (an OOM kill, a pipeline killing its job): the wrapper in
    the scope dies with it (PR_SET_PDEATHSIG), bwrap with the wrapper, and the scope
    with its last process."""
    marker = "kooi-scope-orphan-probe"
    project = f"{engine['runner_home']}/kooi-delegation"
    wf = yaml.safe_dump({"mode": "jail", "timeout": 600, "command": ["sh", "-c", f": {marker}; sleep 600"]})
    host.run(f"install -d -m 0755 {WFDIR} && install -d -o {engine['runner_user']} -m 0755 {project}")
    assert host.run(f"cat > {WFDIR}/scope-orphan.yml <<'KOOI_EOF'\n{wf}KOOI_EOF").rc == 0
    units = (f"runuser -u {engine['runner_user']} -- env XDG_RUNTIME_DIR=/run/user/{engine['runner_uid']} "
             "systemctl --user list-units --no-legend --plain 'kooi-jail-*'")
    started = host.run(f"KOOI_WORKFLOW_DIR={WFDIR} setsid -f {engine['kooi_bin']} run scope-orphan --project {project} "
                       f"</dev/null >/dev/null 2>&1; for i in $(seq 120); do pgrep -f '^sh -c : {marker}' && break; "
                       "sleep 1; done")
    assert started.rc == 0 and started.stdout.strip(), "the jailed workload never started"
    assert "kooi-jail-" in host.run(units).stdout
    # (Patterns that do not match the shell that runs them.)
    assert host.run("pkill -KILL -f 'kooi ru[n] scope-orphan'").rc == 0
    gone = host.run(f"for i in $(seq 60); do pgrep -f '^sh -c : {marker}' >/dev/null || exit 0; sleep 1; done; exit 1")
    assert gone.rc == 0, "the jailed workload outlived kooi run"
    left = host.run(f"for i in $(seq 30); do {units} | grep -q kooi-jail- || exit 0; sleep 1; done; {units}")
    assert left.rc == 0, left.stdout
