"""ID-* checks: what a workload sees inside the runner container.

They run the built-in workflow kooi-selftest through `kooi run` (as root, which drops
to the runner user), exactly the path a pipeline's workload takes, on a scratch
project owned by the runner.
"""

from __future__ import annotations

import functools
import shlex
from typing import cast

import yaml

from ..hoststate import paths
from .core import FAIL, NA, PASS, CheckFunc, Context, Host, Outcome, check, scratch
from .host import daemon_json
from .image import runner_pin

SELFTEST = f"{paths.WORKFLOWS}/kooi-selftest.yml"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# What the self-test printed (None: it cannot run here, {}: it failed) and why not.
Selftest = tuple[dict[str, str] | None, str]

# The built-in self-test workflow per runtime: kooi-selftest-gvisor is kooi-selftest
# with min_isolation: gvisor (roles/shim installs it where the engine has runsc).
SELFTESTS = {"runc": "kooi-selftest", "runsc": "kooi-selftest-gvisor"}
# What gVisor's kernel says it is (pkg/sentry/kernel/version: uname -v of every
# release, 4.4.0 or *-gvisor as its release).
GVISOR_UNAME_V = "#1 SMP Sun Jan 10 15:06:54 PST 2016"


def runtimes(ctx: Context) -> tuple[str, ...]:
    """The runtimes workloads run under on this host: runc, and runsc with gVisor."""
    return ("runc", "runsc") if ctx.engine.gvisor is not None else ("runc",)


def per_runtime(func: CheckFunc) -> CheckFunc:
    """An ID-*/ESC-* check judged on the self-test of each runtime workloads run under:
    it fails if it fails under either, and says what each showed."""
    @functools.wraps(func)
    def judged(host: Host, ctx: Context) -> Outcome:
        names = runtimes(ctx)
        if len(names) == 1:
            return func(host, ctx)
        got: list[tuple[str, Outcome]] = []
        try:
            for rt in names:
                ctx.workload_runtime = rt
                got.append((rt, func(host, ctx)))
        finally:
            ctx.workload_runtime = "runc"
        states = [o[0] for _, o in got]
        status = FAIL if FAIL in states else PASS if PASS in states else NA
        return status, "; ".join(f"{rt}: {o[1]}" for rt, o in got)
    return judged


def _selftest(host: Host, ctx: Context) -> Selftest:
    rt = ctx.workload_runtime
    key = f"selftest:{rt}"
    if key in ctx.cache:
        return cast(Selftest, ctx.cache[key])
    name = SELFTESTS[rt]
    if "runner" not in (ctx.described(host, "images") or {}):
        ctx.cache[key] = (None, "no runner image on this host")
        return cast(Selftest, ctx.cache[key])
    if not host.file(f"{paths.WORKFLOWS}/{name}.yml").exists:
        # The engine has runsc (engine.json), so its self-test must be there too.
        ctx.cache[key] = ({} if rt == "runsc" else None, f"no self-test workflow {name} on this host"
                          + ("; re-run site.yml (role shim installs it where the engine has gVisor)"
                             if rt == "runsc" else ""))
        return cast(Selftest, ctx.cache[key])
    proj = paths.SELFTEST_PROJECT
    prep = host.run(f"{ctx.runner_prefix} mkdir -p {proj}")
    if prep.rc != 0:
        ctx.cache[key] = ({}, f"cannot create {proj}: {prep.stderr.strip()}")
        return cast(Selftest, ctx.cache[key])
    # The host's installed command, whatever PATH the caller has (a venv may shadow it).
    kooi = shlex.quote(ctx.engine.kooi_bin)
    res = host.run(f"PATH={SYSTEM_PATH} {kooi} run {name} --project {proj} --json {scratch(host, ctx)}/{name[5:]}.json")
    seen: dict[str, str] = {}
    for line in res.stdout.splitlines():
        if line.startswith("KOOI-SELFTEST "):
            k, _, value = line[len("KOOI-SELFTEST "):].partition("=")
            seen[k] = value
    if res.rc != 0 or seen.get("end") != "1":
        ctx.cache[key] = ({}, f"kooi run {name} failed rc={res.rc}: "
                              f"{(res.stderr or res.stdout).strip()[-300:]}")
    else:
        ctx.cache[key] = (seen, "")
    return cast(Selftest, ctx.cache[key])


def _get(host: Host, ctx: Context, *keys: str) -> tuple[str | None, str, dict[str, str]]:
    """(NA or FAIL and why, {}) where the self-test did not run or failed, else (None, "", the KEYS it printed)."""
    seen, why = _selftest(host, ctx)
    if seen is None:
        return NA, why, {}
    if not seen:
        return FAIL, why, {}
    return None, "", {k: seen.get(k, "?") for k in keys}


@check("ID-NONROOT", "the workload does not run as uid 0", "a workload holding (namespaced) root", scope="workload")
@per_runtime
def nonroot(host: Host, ctx: Context) -> Outcome:
    st, why, v = _get(host, ctx, "uid")
    if st:
        return st, why
    return (PASS if v["uid"] not in ("0", "?") else FAIL), f"uid {v['uid']}"


@check("ID-CAPS", "the workload holds no capability (CapEff, CapPrm, CapBnd all 0)",
       "a workload using capabilities against the kernel", scope="workload")
@per_runtime
def caps(host: Host, ctx: Context) -> Outcome:
    st, why, v = _get(host, ctx, "CapEff", "CapPrm", "CapBnd")
    if st:
        return st, why
    ok = all(x != "?" and int(x, 16) == 0 for x in v.values())
    return (PASS if ok else FAIL), ", ".join(f"{k} {x}" for k, x in v.items())


@check("ID-NNP", "no_new_privs is set for the workload", "privilege gain through exec of a privileged file", scope="workload")
@per_runtime
def nnp(host: Host, ctx: Context) -> Outcome:
    st, why, v = _get(host, ctx, "NoNewPrivs", "prctl_nnp")
    if st:
        return st, why
    if v["NoNewPrivs"] == "?":  # gVisor's /proc/self/status has no such line
        return (PASS if v["prctl_nnp"] == "1" else FAIL), f"PR_GET_NO_NEW_PRIVS {v['prctl_nnp']}"
    return (PASS if v["NoNewPrivs"] == "1" else FAIL), f"NoNewPrivs {v['NoNewPrivs']}"


@check("ID-SECCOMP", "a seccomp filter confines the workload", "the full kernel syscall surface", scope="workload")
@per_runtime
def seccomp(host: Host, ctx: Context) -> Outcome:
    st, why, v = _get(host, ctx, "Seccomp", "Seccomp_filters", "prctl_seccomp")
    if st:
        return st, why
    if v["Seccomp"] == "?":  # gVisor's /proc/self/status has no such line
        return (PASS if v["prctl_seccomp"] == "2" else FAIL), f"PR_GET_SECCOMP {v['prctl_seccomp']} (2 = filter)"
    n = v["Seccomp_filters"]
    return (PASS if v["Seccomp"] == "2" else FAIL), f"Seccomp {v['Seccomp']} (2 = filter)" + \
        (f", {n} filter(s) stacked" if n not in ("?", "") else "")


@check("ID-ROOTFS-RO", "the workload's root filesystem is read-only and /workspace is writable",
       "a workload altering its toolchain for later steps; a build that cannot write its output", scope="workload")
@per_runtime
def rootfs(host: Host, ctx: Context) -> Outcome:
    st, why, v = _get(host, ctx, "rootfs", "workspace")
    if st:
        return st, why
    ok = v["rootfs"] == "readonly" and v["workspace"] == "writable"
    return (PASS if ok else FAIL), f"root filesystem {v['rootfs']}, /workspace {v['workspace']}"


@check("ID-NOSOCKET", "no engine socket (no unix socket at all) is visible to the workload",
       "a workload driving the container engine (host root or the runner's files)", scope="workload")
@per_runtime
def nosocket(host: Host, ctx: Context) -> Outcome:
    st, why, v = _get(host, ctx, "sockets", "docker_host")
    if st:
        return st, why
    socks = [s for s in v["sockets"].split(",") if s]
    ok = not socks and not v["docker_host"]
    return (PASS if ok else FAIL), f"sockets: {', '.join(socks) or 'none'}; DOCKER_HOST: {v['docker_host'] or 'unset'}"


DENIED = {"EPERM", "EACCES", "ENOSYS"}
SYSCALLS = ("bpf", "perf_event_open", "open_by_handle_at", "userfaultfd", "init_module", "finit_module",
            "kexec_load", "io_uring_setup")
NEW_MOUNTS = ("unshare_userns", "unshare_mountns", "mount_proc")


def _judge(host: Host, ctx: Context, names: tuple[str, ...], what: str) -> tuple[str, str]:
    """The selftest's syscall probe: each of NAMES must have been refused."""
    status, why, v = _get(host, ctx, "syscalls")
    if status:
        return status, why
    return judge_syscalls(v["syscalls"], names, what)


def judge_syscalls(raw: str, names: tuple[str, ...], what: str) -> tuple[str, str]:
    """The selftest's `syscalls=` line (name:errno,...): each of NAMES must have been refused."""
    got = dict(item.split(":", 1) for item in raw.split(",") if ":" in item)
    if not got:
        return FAIL, f"the syscall probe did not run: {raw!r}"
    missing = [n for n in names if n not in got]
    reached = {n: got[n] for n in names if n in got and got[n] not in DENIED}
    if missing or reached:
        return FAIL, (f"{what}: reached the kernel: {reached}" if reached else "") + \
            (f"; not probed: {missing}" if missing else "")
    return PASS, ", ".join(f"{n} {got[n]}" for n in names)


@check("ESC-SYSCALLS", "the workload cannot use bpf, perf_event_open, open_by_handle_at, userfaultfd, "
       "module loading, kexec or io_uring",
       "the kernel interfaces behind most container escapes and kernel exploits", scope="workload")
@per_runtime
def esc_syscalls(host: Host, ctx: Context) -> Outcome:
    return _judge(host, ctx, SYSCALLS, "syscalls")


TRACING = ("ptrace", "process_vm_readv")


@check("ESC-PTRACE", "the workload can neither ptrace nor read the memory of another process of its uid "
       "(ptrace, process_vm_readv)", "a workload injecting into or reading the processes beside it (docker exec'd "
       "shells, tools, the build's own daemons): this kernel has no Yama to stop same-uid tracing", scope="workload")
@per_runtime
def esc_ptrace(host: Host, ctx: Context) -> Outcome:
    return _judge(host, ctx, TRACING, "tracing")


@check("ESC-ENGINE-SYSCALLS", "a container with only the engine's default seccomp profile (as Testcontainers' "
       "containers run) cannot use io_uring, bpf, perf_event_open, open_by_handle_at, userfaultfd, module loading "
       "or kexec", "kernel exploits from containers that kooi's own filter does not reach (images other than "
       "the runner image, started through the broker)", scope="workload")
def esc_engine_syscalls(host: Host, ctx: Context) -> Outcome:
    pin = runner_pin(host, ctx)[0]
    if pin is None or not host.file(SELFTEST).exists:
        return NA, "no runner image (it has the probe's python3) or self-test workflow on this host"
    script = yaml.safe_load(host.file(SELFTEST).content_string)["command"][-1]
    # Root in the container with the engine's default capabilities: what a service
    # container (postgres, ...) gets; no kooi entrypoint, so no kooi filter.
    res = host.run(ctx.as_runner(
        f"docker run --rm --pull=never --network none --user 0 --entrypoint sh {shlex.quote(pin.id)} "
        f"-c {shlex.quote(script)}"))
    raw = next((line.partition("=")[2] for line in res.stdout.splitlines()
                if line.startswith("KOOI-SELFTEST syscalls=")), "")
    if res.rc != 0 or not raw:
        return FAIL, f"the probe container failed rc={res.rc}: {(res.stderr or res.stdout).strip()[-300:]}"
    profile = daemon_json(host, ctx).get("seccomp-profile") or ""
    # kooi's engine profile (docker.io 20.10 and 26.1) also refuses ptrace to every
    # container; the built-in default of other versions allows it.
    names = SYSCALLS + (("ptrace",) if profile else ())
    status, evidence = judge_syscalls(raw, names, "with the engine's default profile")
    if not profile:
        got = dict(item.split(":", 1) for item in raw.split(",") if ":" in item)
        evidence += f"; ptrace {got.get('ptrace', '?')} (the engine's built-in profile allows same-uid tracing)"
    return status, f"{evidence} (default profile: {profile or 'built in'})"


@check("ESC-FRESH-MOUNTS", "the workload cannot create user or mount namespaces or mount (no fresh procfs, "
       "sysfs or cgroupfs revealing host state)",
       "a fresh procfs/sysfs bypassing the masked and read-only paths", scope="workload")
@per_runtime
def esc_fresh_mounts(host: Host, ctx: Context) -> Outcome:
    return _judge(host, ctx, NEW_MOUNTS, "namespaces and mounts")


@check("ESC-DEVICES", "no host block device, /dev/kvm, /dev/mem, /dev/kmem, /dev/port or /dev/fuse in the workload",
       "raw access to host disks, memory or hypervisor and FUSE interfaces", scope="workload")
@per_runtime
def esc_devices(host: Host, ctx: Context) -> Outcome:
    st, why, v = _get(host, ctx, "devices")
    if st:
        return st, why
    devs = [d for d in v["devices"].split(",") if d]
    if v["devices"] == "?":
        return FAIL, "the device probe did not run"
    note = ""
    if ctx.workload_runtime == "runsc" and "fuse" in devs:
        # Every gVisor sandbox has a /dev/fuse of its own, served by the Sentry (not
        # the host's FUSE); mounting with it needs CAP_SYS_ADMIN, which the workload lacks.
        devs.remove("fuse")
        note = " (fuse: gVisor's own, served by its Sentry)"
    return (FAIL, f"present: {devs}") if devs else (PASS, "none of them in /dev" + note)


@check("ID-GVISOR-KERNEL", "a gvisor workflow's workload runs on gVisor's kernel, not the host's (negative control: "
       "the same self-test under runc sees the host's)",
       "one host kernel bug in a syscall the profiles allow is a way out of every level that shares the host's kernel",
       modes=("userns_remap",), scope="workload")
def gvisor_kernel(host: Host, ctx: Context) -> Outcome:
    if ctx.engine.gvisor is None:
        return NA, "gVisor is not a runtime of this engine (kooi_gvisor_enabled is false)"
    host_release = host.run("uname -r").stdout.strip()
    seen: dict[str, dict[str, str]] = {}
    try:
        for rt in ("runsc", "runc"):
            ctx.workload_runtime = rt
            st, why, seen[rt] = _get(host, ctx, "kernel", "kernel_version")
            if st:
                return st, f"under {rt}: {why}"
    finally:
        ctx.workload_runtime = "runc"
    g, c = seen["runsc"], seen["runc"]
    gvisor = g["kernel_version"] == GVISOR_UNAME_V and g["kernel"] != host_release and \
        (g["kernel"] == "4.4.0" or g["kernel"].endswith("-gvisor"))
    control = c["kernel"] == host_release
    evidence = (f"under runsc: {g['kernel']} {g['kernel_version']!r}; under runc (the control): {c['kernel']} "
                f"(the host: {host_release})")
    if not control:
        return FAIL, evidence + "; the control does not see the host's kernel, so the probe proves nothing"
    return (PASS if gvisor else FAIL), evidence
