"""The confinement `kooi run` asks for, as pure data (the e2e tests prove it on a real
engine and a real jail)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kooi import run
from kooi.hoststate.engine import EngineConfig
from kooi.hoststate.limits import BUILTIN, LimitsConfig, resolve
from kooi.run import container, filters, jail
from kooi.run import limits as run_limits
from kooi.run import project as project_mod
from kooi.workflow import Limits, Workflow

CFG = EngineConfig(mode="rootless", runner_user="kooi-runner", runner_uid=1001, runner_gid=1001,
                   runner_home="/home/kooi-runner", socket="/run/user/1001/docker.sock",
                   daemon_config="/etc/kooi/engine/kooi-runner/daemon.json")
IMG = {"Config": {"User": "1000:1000", "Env": ["PATH=/usr/bin", "HOME=/home/kooi"]}}


def wf(**kw) -> Workflow:
    return Workflow(name="t", path=Path("/etc/kooi/workflows/t.yml"), command=("mvn", "verify"), **kw)


def args(w: Workflow, enforce=None, img=IMG, host: LimitsConfig | None = None, ncpu=4):
    res = run.Result(workflow="t", run_id="t-1", project="/p")
    values, origin, errors = resolve(w.limits.named(), host or LimitsConfig())
    assert not errors
    plan = run_limits.for_container(values, origin, enforce or {"memory": True, "pids": True, "cpus": True},
                                    ncpu, CFG.mode)
    kw = container.container_args(w, CFG, img, Path("/p"), "t-1", plan, res)
    return kw, res


def test_container_is_confined():
    kw, _ = args(wf())
    hc = kw["HostConfig"]
    assert hc["CapDrop"] == ["ALL"] and "CapAdd" not in hc
    assert hc["SecurityOpt"] == ["no-new-privileges:true"]
    assert hc["ReadonlyRootfs"] is True and hc["NetworkMode"] == "none"
    assert kw["User"] == "1000:1000" and hc["Init"] is True and hc["IpcMode"] == "private"
    assert "Privileged" not in hc and "Binds" not in hc and "Devices" not in hc and "Volumes" not in kw
    [mount] = hc["Mounts"]
    assert mount == {"Target": "/workspace", "Source": "/p", "Type": "bind", "ReadOnly": False}
    assert set(hc["Tmpfs"]) == {"/tmp", "/home/kooi"}
    assert all("nosuid" in o and "nodev" in o for o in hc["Tmpfs"].values())
    assert kw["Labels"]["org.kooi.managed"] == "1" and kw["Labels"]["org.kooi.run"] == "t-1"
    assert not any(e.startswith("DOCKER_HOST=") for e in kw["Env"])
    assert "Image" not in kw  # the caller adds the pinned id


def test_limits_are_passed_where_enforced():
    kw, res = args(wf(limits=Limits(memory="2g", cpus=1.5, pids=256)))
    hc = kw["HostConfig"]
    assert hc["Memory"] == 2 << 30 and hc["MemorySwap"] == 2 << 30
    assert hc["NanoCpus"] == 1_500_000_000 and hc["PidsLimit"] == 256 and hc["CpuShares"] == 512
    assert {u["Name"]: (u["Soft"], u["Hard"]) for u in hc["Ulimits"]} == {"nofile": (65536, 65536), "core": (0, 0)}
    assert res.warnings == []
    assert res.limits["memory"]["requested"] == "2g" and res.limits["memory"]["enforced"] is True
    assert res.limits["memory"]["from"] == "workflow" and res.limits["files"]["from"] == "default"
    assert not any(e.startswith("JAVA_TOOL_OPTIONS=") for e in kw.get("Env", []))


def test_every_run_gets_the_hosts_defaults():
    host = LimitsConfig({"memory": "1g", "cpus": 1, "pids": 300, "files": 1024}, {})
    kw, res = args(wf(), host=host)
    hc = kw["HostConfig"]
    assert hc["Memory"] == 1 << 30 and hc["PidsLimit"] == 300 and hc["NanoCpus"] == 1_000_000_000
    assert all(r["from"] in ("default", "kooi") for r in res.limits.values())


def test_cpus_are_bounded_at_the_hosts_cpus():
    kw, res = args(wf(limits=Limits(cpus=8)), ncpu=2)
    assert kw["HostConfig"]["NanoCpus"] == 2_000_000_000
    assert any("more than the host's 2 CPUs" in w for w in res.warnings)


def test_unenforceable_limits_fall_back_to_rlimits_and_say_so():
    kw, res = args(wf(limits=Limits(memory="512m", pids=64)), {"memory": False, "pids": False, "cpus": False})
    hc = kw["HostConfig"]
    assert "Memory" not in hc and "PidsLimit" not in hc and "NanoCpus" not in hc
    ul = {u["Name"]: u["Hard"] for u in hc["Ulimits"]}
    assert ul == {"data": 512 << 20, "nproc": 64, "nofile": 65536, "core": 0}
    assert res.limits["pids"]["enforced"] is True and "RLIMIT_NPROC" in res.limits["pids"]["by"]
    assert res.limits["memory"]["enforced"] is False and "per process" in res.limits["memory"]["by"]
    assert res.limits["cpus"]["enforced"] is False and "nice 10" in res.limits["cpus"]["by"]
    # Warnings for what the workflow named (memory); the host's default cpus: the log only.
    assert len(res.warnings) == 1 and res.warnings[0].startswith("limits: memory 512m bounds each process")


def test_limits_above_the_hosts_maximum_are_errors():
    host = LimitsConfig(dict(BUILTIN), {"memory": "8g", "pids": 4096})
    _, _, errors = resolve({"memory": "9g", "pids": 4096, "cpus": None, "files": None}, host)
    assert len(errors) == 1 and "memory" in errors[0] and "8g" in errors[0]


@pytest.mark.parametrize("user", ["", "0", "root", "0:0", "root:root"])
def test_root_images_are_refused(user):
    with pytest.raises(run.RunError) as exc:
        args(wf(), img={"Config": {"User": user}})
    assert exc.value.code == run.EXIT_REFUSED


def test_workdir_is_inside_the_workspace():
    kw, _ = args(wf(workdir="sub/dir"))
    assert kw["WorkingDir"] == "/workspace/sub/dir"


def test_kooi_seccomp_filter_wraps_only_kooi_runner_images():
    kooi_img = {"Config": {**IMG["Config"], "Labels": {"org.kooi.image": "runner"}, "Entrypoint": ["/e"]}}
    kw, _ = args(wf(), img=kooi_img)
    info = filters.stack_on_container(kw, kooi_img)
    assert info["kooi"] is True and info["engine"] == "default"
    ep = kw["Entrypoint"]
    assert ep[:4] == ["python3", "-I", "-S", "-c"] and ep[4] == filters.SOURCE and ep[5:] == ["--", "/e"]
    assert kw["Cmd"] == ["mvn", "verify"]
    assert kw["HostConfig"]["Init"] is True  # no deadline asked: the engine's init
    kw, _ = args(wf())
    info = filters.stack_on_container(kw, IMG)
    assert info["kooi"] is False and "Entrypoint" not in kw and "not one" in info["note"]


def test_kooi_init_holds_the_deadline_in_runner_images():
    kooi_img = {"Config": {**IMG["Config"], "Labels": {"org.kooi.image": "runner"}, "Entrypoint": ["/e"]}}
    kw, _ = args(wf(), img=kooi_img)
    filters.stack_on_container(kw, kooi_img, 600)
    assert kw["Entrypoint"][5:] == ["--", "--deadline", str(600 + filters.DEADLINE_GRACE), "/e"]
    assert kw["HostConfig"]["Init"] is False  # kooi's python3 is pid 1
    kw, _ = args(wf())
    filters.stack_on_container(kw, IMG, 600)
    assert kw["HostConfig"]["Init"] is True and "Entrypoint" not in kw


def test_kooi_init_kills_everything_at_its_deadline_and_passes_exit_codes():
    if subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True).returncode != 0:
        pytest.fail("unshare --pid (root, util-linux) is needed to run kooi's init as a pid 1")
    init = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-I", "-S", "-c", filters.SOURCE, "--"]
    # The workload tries to stop and kill its init, then to outlive the deadline.
    r = subprocess.run([*init, "--deadline", "1.5", "sh", "-c", "sleep 60 & kill -STOP 1; kill -KILL 1; sleep 60"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 124 and "deadline of 2 s passed" in r.stderr, r
    assert subprocess.run([*init, "--deadline", "30", "sh", "-c", "exit 7"], timeout=30).returncode == 7
    assert subprocess.run([*init, "--deadline", "30", "sh", "-c", "kill -TERM $$"], timeout=30).returncode == 143


def test_jail_binds_only_usr_etc_and_the_project(monkeypatch):
    monkeypatch.setattr(jail.shutil, "which", lambda _: "/usr/bin/bwrap")
    argv = jail.bwrap_argv(wf(environment={"A": "b"}), Path("/home/kooi-runner/p"), seccomp_fd=7)
    assert argv[argv.index("--seccomp") + 1] == "7"
    binds = [(argv[i], argv[i + 1], argv[i + 2]) for i, a in enumerate(argv)
             if a in ("--bind", "--ro-bind", "--dev-bind")]
    rw = [b for b in binds if b[0] in ("--bind", "--dev-bind")]
    assert rw == [("--bind", "/home/kooi-runner/p", "/workspace")]
    assert {b[1] for b in binds if b[0] == "--ro-bind"} <= {"/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32",
                                                              "/lib64", "/libx32"}
    for flag in ("--unshare-all", "--die-with-parent", "--new-session", "--clearenv"):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert "--share-net" not in argv
    assert argv[-3:] == ["--", "mvn", "verify"]
    assert not any("/run" in a for a in argv)


def test_a_jail_with_a_user_scope_is_bounded_by_its_cgroup_and_without_one_by_rlimits():
    values = {"memory": "1g", "pids": 300, "cpus": 8, "files": 4096}
    plan = run_limits.for_jail(values, {"memory": "workflow"}, hard={}, scope=frozenset({"memory", "pids", "cpu"}),
                               ncpu=2)
    assert plan.scope == {"MemoryMax": str(1 << 30), "MemorySwapMax": "0", "TasksMax": "300", "CPUQuota": "200%",
                          "CPUWeight": "50"}
    assert plan.rlimits == {"nofile": 4096, "core": 0} and plan.nice is None and plan.max_ram == 1 << 30
    assert all(plan.record[k]["by"].startswith("cgroup") for k in ("memory", "pids", "cpus"))
    assert plan.values["cpus"] == 2 and plan.info  # bounded at the host's CPUs, said in the log
    # Only pids delegated: the rest falls back, and a limit the workflow named is a warning.
    part = run_limits.for_jail(values, {"memory": "workflow"}, hard={}, scope=frozenset({"pids"}))
    assert part.scope == {"TasksMax": "300"} and part.rlimits["data"] == 1 << 30 and "nproc" not in part.rlimits
    assert part.nice == run_limits.NICE and any("memory 1g bounds each process" in n for n in part.notes)
    bare = run_limits.for_jail(values, {}, hard={})
    assert bare.scope == {} and bare.rlimits["nproc"] == 300 and not bare.record["memory"]["enforced"]


def test_a_scoped_jail_binds_its_cgroup_read_only_and_the_wrapper_substitutes_it(monkeypatch, tmp_path):
    monkeypatch.setattr(jail.shutil, "which", lambda _: "/usr/bin/bwrap")
    argv = jail.bwrap_argv(wf(), Path("/home/kooi-runner/p"), cgroup=True)
    i = argv.index(jail.jailscope.CGROUP_MARK)
    assert argv[i - 1:i + 2] == ["--ro-bind", jail.jailscope.CGROUP_MARK, "/sys/fs/cgroup"]
    assert jail.jailscope.CGROUP_MARK not in jail.bwrap_argv(wf(), Path("/home/kooi-runner/p"))
    pre = jail.jailscope.argv("kooi-jail-x", {"TasksMax": "9"}, tmp_path / "r", (7,))
    assert pre[:7] == ["systemd-run", "--user", "--scope", "--quiet", "--collect", "--unit=kooi-jail-x",
                       "--property=TasksMax=9"]
    assert pre[-3:] == [str(tmp_path / "r"), str(os.getpid()), "7"]
    # The wrapper itself, outside any scope: it runs the command with the fd, substitutes
    # its cgroup, copies the counters out and passes the exit code on.
    rfd, wfd = os.pipe()
    os.write(wfd, b"seccomp")
    os.close(wfd)
    r = subprocess.run([sys.executable, "-I", "-c", jail.jailscope.WRAPPER, str(tmp_path / "r"), str(os.getpid()),
                        str(rfd), "sh", "-c", f'echo "$0"; cat /dev/fd/{rfd}; exit 3', jail.jailscope.CGROUP_MARK],
                       capture_output=True, text=True, pass_fds=(rfd,), timeout=30)
    os.close(rfd)
    cg = (tmp_path / "r.cgroup").read_text()
    assert r.returncode == 3 and r.stdout.splitlines() == [cg, "seccomp"], r
    assert cg.startswith("/sys/fs/cgroup") and jail.jailscope.started(tmp_path / "r")
    assert (tmp_path / "r.pids.events").exists() and (tmp_path / "r.memory.events").exists()
    jail.jailscope.cleanup(tmp_path / "r")
    assert list(tmp_path.iterdir()) == []


def test_subid_start_reads_the_users_range(tmp_path):
    sub = tmp_path / "subuid"
    sub.write_text("other:100000:65536\nkooi-runner:300000:65536\n")
    assert run.subid_start("kooi-runner", str(sub)) == 300000
    with pytest.raises(run.RunError, match="no range for nobody-here"):
        run.subid_start("nobody-here", str(sub))


def test_container_uids_map_like_the_engine(monkeypatch):
    monkeypatch.setattr(project_mod, "subid_start", lambda user, path="/etc/subuid": 300000)
    assert run.host_uid_of(CFG, 0) == 1001          # rootless: container root is the runner
    assert run.host_uid_of(CFG, 1000) == 300999     # ... and uid N the runner's sub-id N-1
    remap = EngineConfig(**{**CFG.__dict__, "mode": "userns_remap", "remap_user": "kooi-remap"})
    assert run.host_uid_of(remap, 1000) == 301000   # remap: container uid N is sub-id N


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="switching effective ids needs root")
def test_unreadable_by_names_what_another_user_cannot_read(tmp_path):
    import os

    private = tmp_path / "private"
    (private / "pkg").mkdir(parents=True)
    os.chmod(private, 0o700)
    shared = Path("/usr/lib")
    before = (os.getgroups(), os.getegid(), os.geteuid())
    bad = run.unreadable_by(65534, 65534, [65534], [str(private / "pkg"), str(shared)])
    assert bad == [str(private / "pkg")]
    assert (os.getgroups(), os.getegid(), os.geteuid()) == before  # switched back
    assert run.unreadable_by(0, 0, [0], [str(private / "pkg")]) == []


def test_acl_users_reads_what_setfacl_wrote(tmp_path):
    """kooi run reads the project's ACL from the kernel's xattr instead of starting
    getfacl on every run; it must see exactly what setfacl (and getfacl) see."""
    import subprocess

    from kooi.run.project import acl_users

    d = tmp_path / "p"
    d.mkdir()
    assert acl_users(d) == {} and acl_users(d, default=True) == {}
    subprocess.run(["setfacl", "-m", "u:123456:rwx,u:123457:r-x,d:u:123456:rwx,d:u:1000:rw-", str(d)], check=True)
    mask = -1
    assert acl_users(d) == {123456: 7, 123457: 5, mask: 7}
    assert acl_users(d, default=True) == {123456: 7, 1000: 6, mask: 7}
    listing = subprocess.run(["getfacl", "-pn", "--omit-header", str(d)], capture_output=True, text=True).stdout
    assert "user:123457:r-x" in listing and "default:user:1000:rw-" in listing
    os.chmod(d, 0o755)  # narrows the access ACL's mask
    assert acl_users(d)[mask] == 5


def test_a_project_whose_acl_mask_was_narrowed_is_granted_again(tmp_path):
    """A chmod 755 on the project leaves user:UID:rwx but masks it to r-x: kooi run must
    grant again instead of trusting the entry."""
    from kooi.run.errors import Log
    from kooi.run.project import acl_users, grant_workspace

    d = tmp_path / "p"
    d.mkdir()
    log = Log(None, None)
    grant_workspace(d, 123456, os.getuid(), log)
    os.chmod(d, 0o755)
    assert acl_users(d)[-1] == 5
    grant_workspace(d, 123456, os.getuid(), log)
    assert acl_users(d)[-1] == 7


def test_gvisor_is_per_workflow_and_only_where_the_engine_runs_runsc():
    from kooi.hoststate.engine import Gvisor
    from kooi.run.execute import why_below

    g = Gvisor(runtime="runsc", path="/usr/local/lib/kooi/runsc", runsc="/usr/bin/runsc", args=("--platform=systrap",),
               version="20240729", platform="systrap", network="sandbox")
    remap = EngineConfig(**{**CFG.__dict__, "mode": "userns_remap", "remap_user": "kooi-remap"})
    with_gvisor = EngineConfig(**{**remap.__dict__, "gvisor": g})
    assert run.isolation_of("container", with_gvisor, "gvisor") == "gvisor"
    assert run.isolation_of("container", with_gvisor, None) == "userns_remap"  # others keep runc
    assert run.isolation_of("container", with_gvisor, "rootless") == "userns_remap"
    assert run.isolation_of("jail", with_gvisor, "gvisor") == "jail"
    assert run.isolation_of("container", remap, "gvisor") == "userns_remap"
    assert run.isolation_of("container", CFG, "gvisor") == "rootless"
    assert why_below("w", "gvisor", "userns_remap", "container", remap).endswith(
        "this host's engine has no gVisor runtime: set kooi_gvisor_enabled: true and re-run site.yml")
    assert "a rootless engine cannot run gVisor's runsc" in why_below("w", "gvisor", "rootless", "container", CFG)
    assert "never provides gvisor: use mode: container" in why_below("w", "gvisor", "jail", "jail", with_gvisor)
    assert why_below("w", "rootless", "jail", "jail", CFG) == \
        "workflow w requires isolation rootless or stronger; this run would get jail (jail mode on a rootless host)"


def test_grant_search_gives_the_gofer_search_only_where_others_lack_it(tmp_path):
    import shutil

    if not shutil.which("setfacl"):
        pytest.fail("setfacl is missing (package acl): the unit tests need it")
    me = os.getuid()
    top = tmp_path / "home"
    (top / "proj" / "sub").mkdir(parents=True)
    top.chmod(0o750)
    (top / "proj").chmod(0o755)
    log = run.errors.Log(None, None)
    # A directory on the way that the runner does not own is refused, never changed.
    with pytest.raises(run.RunError, match="keeps gVisor's gofer"):
        project_mod.grant_search(top / "proj" / "sub", 4242, me + 1, log)
    assert 4242 not in project_mod.acl_users(top)
    try:
        project_mod.grant_search(top / "proj" / "sub", 4242, me, log)
        assert project_mod.acl_users(top).get(4242) == 1  # x, on the 0750 directory
        assert 4242 not in project_mod.acl_users(top / "proj")  # others may search it already
        project_mod.grant_search(top / "proj" / "sub", 4242, me, log)  # once is enough
        assert project_mod.acl_users(top).get(4242) == 1
    finally:  # pytest's own temporary directories above tmp_path got the entry too
        for d in top.parents:
            if 4242 in project_mod.acl_users(d):
                subprocess.run(["setfacl", "-x", "u:4242", str(d)], check=True)


def test_share_with_group_sets_setgid_directories_and_never_follows_a_link(tmp_path):
    import stat

    project, outside = tmp_path / "proj", tmp_path / "outside"
    (project / "src").mkdir(parents=True)
    (project / "src" / "A.java").write_text("x")
    outside.mkdir()
    (project / "elsewhere").symlink_to(outside)
    gid = os.getgroups()[0] if os.getgroups() else os.getegid()
    log = run.errors.Log(None, None)
    project_mod.share_with_group(project, gid, "nobody", log)
    for d in (project, project / "src"):
        st = d.stat()
        assert st.st_gid == gid and st.st_mode & stat.S_ISGID, d
    assert (project / "src" / "A.java").stat().st_gid == gid
    assert not outside.stat().st_mode & stat.S_ISGID  # the link was not followed
    with pytest.raises(run.RunError, match="not in gVisor's workload group"):
        project_mod.share_with_group(tmp_path / "outside", 4242, "nobody", log)


def test_one_run_per_project_and_none_on_a_directory_inside_another_runs(tmp_path):
    from kooi.run.errors import RunError
    from kooi.run.project import RunLock

    runs = tmp_path / "runs"
    p = tmp_path / "home" / "p"
    outer = RunLock(runs, "a", p)
    outer.acquire(0)
    for inner_path, what in ((p / "n", "a directory around it"), (p, "this project or inside it")):
        with pytest.raises(RunError, match=what):
            RunLock(runs, "b", inner_path).acquire(0)
    outer.release()
    # siblings run side by side; their parent waits for both
    a, b = RunLock(runs, "a", p / "n"), RunLock(runs, "b", p / "m")
    a.acquire(0)
    b.acquire(0)
    with pytest.raises(RunError, match="this project or inside it"):
        RunLock(runs, "c", p).acquire(0)
    a.release()
    b.release()
    RunLock(runs, "c", p).acquire(0)


def test_a_second_path_to_a_project_is_the_same_project(tmp_path):
    """The second review: a bind mount of the project under another name took another
    lock; its run's snapshot removed the first run's submodule block. The key is the
    directory's device and inode (a symlink stands in for the bind mount here)."""
    from kooi.run.errors import RunError
    from kooi.run.project import RunLock

    p = tmp_path / "p"
    p.mkdir()
    (tmp_path / "alias").symlink_to(p)
    first = RunLock(tmp_path / "runs", "a", p)
    first.acquire(0)
    with pytest.raises(RunError, match="this project"):
        RunLock(tmp_path / "runs", "b", tmp_path / "alias").acquire(0)


def test_a_name_that_is_not_utf8_is_shown_escaped_not_a_crash(tmp_path):
    from kooi.run.errors import Log

    name = b"x\xffy/.envrc".decode("utf-8", "surrogateescape")
    log = Log(tmp_path / "run.log", None)
    log.note(f"project: refused a change to protected {name} (created)")
    log.close()
    assert "x\\udcffy/.envrc" in (tmp_path / "run.log").read_text()
