"""AppArmor enforcement on a kernel that has it (a QEMU guest with a Debian kernel).

Each denial is shown next to its control: the same probe under a profile without the
rule succeeds, so the denial is AppArmor's and not something else's. The probes open
files for writing without writing (`exec 3>>FILE`): nothing in the guest changes.
Docker here is the guest's rootful engine without a user namespace (container root is
real root), the weakest setting, where only AppArmor stands between the probe and
/proc/sys once `systempaths=unconfined` lifts Docker's read-only /proc/sys mount.
(kooi's request policy refuses systempaths=unconfined; the tests lift it to isolate
AppArmor's layer.)
"""

from __future__ import annotations

import shlex

import pytest

from kooi import apparmor
from kooi.checks import Context, run_all
from kooi.checks.core import FAIL, NA, PASS
from kooi.hoststate import apparmor as apparmor_state
from kooi.hoststate.engine import EngineConfig

PROBE = "kooi-probe:latest"
CORE = "/proc/sys/kernel/core_pattern"
OPEN_W = "exec 3>>{path} && echo OPENED"
# Enough privilege to mount a procfs (the nested-runtime situation), AppArmor aside.
MOUNTER = "--cap-add SYS_ADMIN --security-opt seccomp=unconfined --security-opt systempaths=unconfined"
BYPASS = "busybox mkdir -p /tmp/p && busybox mount -t proc proc /tmp/p && echo MOUNTED && " + \
    OPEN_W.format(path="/tmp/p/sys/kernel/core_pattern")


def docker_run(host, profile: str, script: str, extra: str = ""):
    # The probe reports its exit code itself: busybox's mount exits 255 on a denial,
    # which the ssh backend would take for a lost connection.
    return host.run(f"timeout 300 docker run --rm --network none --security-opt apparmor={profile} {extra} "
                    f"{PROBE} sh -c {shlex.quote(f'({script}); echo probe-rc=$?')}")


def out(res) -> str:
    return res.stdout + res.stderr


def guest_engine(mode: str) -> EngineConfig:
    """The guest has no kooi engine: a description with the mode and the user only."""
    return EngineConfig(mode=mode, runner_user="ansible", runner_uid=1000, runner_gid=1000,
                        runner_home="/home/ansible", socket="/var/run/docker.sock",
                        daemon_config="/etc/docker/daemon.json")


@pytest.fixture(scope="module")
def ctx():
    # Only the AppArmor checks run here (the guest has no kooi engine); they need no
    # more of the host description than the mode.
    return Context(engine=guest_engine("userns_remap"))


@pytest.fixture(scope="module")
def naive(host):
    """kooi-runner with mounts allowed and nothing else changed: what a nested runtime
    needs if one only relaxed the profile. Loaded for the test, removed after."""
    text = host.file("/etc/apparmor.d/kooi-runner").content_string
    text = text.replace("profile kooi-runner ", "profile kooi-test-naive ", 1).replace("  deny mount,\n", "  mount,\n", 1)
    assert "profile kooi-test-naive " in text and "\n  mount,\n" in text
    host.run(f"printf '%s' {shlex.quote(text)} > /run/kooi-test-naive")
    res = host.run("apparmor_parser -r /run/kooi-test-naive")
    assert res.rc == 0, res.stderr
    yield "kooi-test-naive"
    host.run("apparmor_parser -R /run/kooi-test-naive; rm -f /run/kooi-test-naive")


def test_the_kernel_enforces_koois_profiles(host, ctx):
    text = host.file("/sys/kernel/security/apparmor/profiles").content_string
    for name in ("kooi-runner", "kooi-runner//nested", "kooi-jail"):
        assert f"{name} (enforce)" in text.splitlines(), text
    status = {r.id: r.status for r in run_all(host, ctx, ["HOST-APPARMOR-PROFILES", "HOST-APPARMOR-ENFORCE"])}
    assert status == {"HOST-APPARMOR-PROFILES": PASS, "HOST-APPARMOR-ENFORCE": PASS}, status
    state = apparmor_state.parse(host.file("/etc/kooi/apparmor.json").content_string)
    assert state.kernel is True and state.runner_profile == "kooi-runner"


def test_the_kernels_profile_list_is_root_only(host):
    # What kooi run relies on: it reads the list while still root (before dropping to
    # the runner); a runner calling kooi run itself gets the profile applied and a note
    # that its mode could not be verified.
    res = host.run("runuser -u ansible -- cat /sys/kernel/security/apparmor/profiles")
    assert res.rc != 0 and "Permission denied" in res.stderr, res.stdout[:200]


def test_a_container_runs_under_kooi_runner(host):
    res = docker_run(host, "kooi-runner", "cat /proc/self/attr/current")
    assert res.stdout.splitlines()[:2] == ["kooi-runner (enforce)", "probe-rc=0"], out(res)


def test_a_procsys_write_is_denied_by_kooi_runner_and_not_without_it(host):
    probe = OPEN_W.format(path=CORE)
    control = docker_run(host, "unconfined", probe, "--security-opt systempaths=unconfined")
    assert "OPENED" in control.stdout, "control: without AppArmor the open must succeed: " + out(control)
    denied = docker_run(host, "kooi-runner", probe, "--security-opt systempaths=unconfined")
    assert "OPENED" not in denied.stdout and "Permission denied" in out(denied), out(denied)
    sysrq = docker_run(host, "kooi-runner", OPEN_W.format(path="/proc/sysrq-trigger"),
                       "--security-opt systempaths=unconfined")
    assert "OPENED" not in sysrq.stdout and "Permission denied" in out(sysrq), out(sysrq)


def test_the_fresh_procfs_bypass_exists_where_only_mounts_are_relaxed(host, naive):
    res = docker_run(host, naive, BYPASS, MOUNTER)
    assert "MOUNTED" in res.stdout and "OPENED" in res.stdout, \
        "control: a relaxed profile must show the bypass (fresh procfs, /proc/sys denies miss it): " + out(res)


def test_kooi_runner_refuses_the_mount(host):
    res = docker_run(host, "kooi-runner", BYPASS, MOUNTER)
    assert "MOUNTED" not in res.stdout and "OPENED" not in res.stdout, out(res)
    assert "Permission denied" in out(res), out(res)


def test_the_nested_child_profile_allows_procfs_only_where_its_denies_apply(host):
    # A nested runtime is entered by executing one of kooi_apparmor_nested_runtimes
    # (here /usr/bin/unshare, busybox under that name: exec transitions go by path).
    inner = ("cat /proc/self/attr/current; busybox mkdir -p /tmp/p /tmp/x/proc; "
             "busybox mount -t proc proc /tmp/p && echo MOUNTED-ELSEWHERE; "
             "busybox mount -t proc proc /tmp/x/proc && echo MOUNTED-PROC; "
             "exec 3>>/tmp/x/proc/sys/kernel/core_pattern && echo OPENED")
    script = f"busybox mkdir -p /usr/bin && busybox cp /bin/busybox /usr/bin/unshare && " \
             f"/usr/bin/unshare -m sh -c {shlex.quote(inner)}"
    res = docker_run(host, "kooi-runner", script, MOUNTER)
    lines = res.stdout.splitlines()
    assert lines and lines[0] == "kooi-runner//nested (enforce)", out(res)
    assert "MOUNTED-ELSEWHERE" not in lines, "procfs mounted outside a .../proc directory: " + out(res)
    assert "MOUNTED-PROC" in lines, "the nested profile must let a runtime mount its procfs: " + out(res)
    assert "OPENED" not in lines and "Permission denied" in out(res), out(res)


def test_the_jail_profile_confines_bwrap_and_lets_it_build_the_jail(host):
    res = host.run("runuser -u ansible -- aa-exec -p kooi-jail -- bwrap --unshare-all --die-with-parent "
                   "--ro-bind / / --proc /proc --dev /dev --tmpfs /tmp cat /proc/self/attr/current")
    assert res.rc == 0 and res.stdout.strip() == "kooi-jail (enforce)", out(res)


def test_a_profile_in_complain_mode_fails_its_check_and_kooi_run(host, ctx, tmp_path):
    assert host.run("apparmor_parser -r -C /etc/apparmor.d/kooi-runner").rc == 0
    try:
        status = {r.id: r.status for r in run_all(host, ctx, ["HOST-APPARMOR-PROFILES", "HOST-APPARMOR-ENFORCE"])}
        listing = tmp_path / "profiles"
        listing.write_text(host.file("/sys/kernel/security/apparmor/profiles").content_string)
        state = apparmor_state.parse(host.file("/etc/kooi/apparmor.json").content_string)
        with pytest.raises(apparmor.AppArmorError, match="complain mode"):
            apparmor.for_container("userns_remap", state, listing)
    finally:
        assert host.run("apparmor_parser -r /etc/apparmor.d/kooi-runner").rc == 0
    assert status == {"HOST-APPARMOR-PROFILES": PASS, "HOST-APPARMOR-ENFORCE": FAIL}, status
    after = {r.id: r.status for r in run_all(host, ctx, ["HOST-APPARMOR-ENFORCE"])}
    assert after == {"HOST-APPARMOR-ENFORCE": PASS}


def test_rootless_engines_are_reported_not_confined(host, ctx):
    state = apparmor_state.parse(host.file("/etc/kooi/apparmor.json").content_string)
    conf = apparmor.for_container("rootless", state)
    assert conf.profile is None and "rootless Docker cannot" in conf.note
    rootless_ctx = Context(engine=guest_engine("rootless"))
    assert {r.id: r.status for r in run_all(host, rootless_ctx, ["ID-APPARMOR"])} == {"ID-APPARMOR": NA}
