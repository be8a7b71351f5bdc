"""HOST-APPARMOR-* and ID-APPARMOR: kooi's AppArmor profiles (roles/apparmor).

Where the kernel has no AppArmor (this project's CI machines, many VMs) the profiles
can only be checked on disk and by the parser; enforcement is then not applicable,
and the report says so rather than passing it.
"""

from __future__ import annotations

import re
import shlex

from ..apparmor import parse_profiles
from ..hoststate import paths
from ..hoststate.apparmor import AppArmorState
from .confinement import _get, per_runtime
from .core import FAIL, NA, PASS, Context, Host, Outcome, check

STATE = paths.APPARMOR
PROFILES = "/sys/kernel/security/apparmor/profiles"
COMPLAIN = re.compile(r"flags\s*=\s*\([^)]*\bcomplain\b", re.I)


def _state(host: Host, ctx: Context) -> AppArmorState | None:
    return ctx.described(host, "apparmor")


def _names(st: AppArmorState) -> list[str]:
    return st.profiles


NO_PROFILES = "no kooi profiles on this host (role apparmor not run, or kooi_apparmor_enabled=false)"


def _kernel_has(host: Host) -> bool:
    f = host.file("/sys/module/apparmor/parameters/enabled")
    has: bool = f.exists and f.content_string.strip() == "Y" and host.file(PROFILES).exists
    return has


@check("HOST-APPARMOR-PROFILES", "kooi's AppArmor profiles are installed, root-owned, valid and never in complain mode",
       "a weakened or complain-mode profile (it only logs) letting a workload write /proc/sys or mount a fresh procfs")
def profiles_installed(host: Host, ctx: Context) -> Outcome:
    st = _state(host, ctx)
    if st is None:
        return FAIL, f"{STATE} is missing: role apparmor has not run on this host (re-run site.yml)"
    if not st.enabled:
        return NA, "kooi_apparmor_enabled=false: no kooi profiles"
    pdir = st.profile_dir
    bad, ok = [], []
    parser = host.exists("apparmor_parser") or host.file("/usr/sbin/apparmor_parser").exists \
        or host.file("/sbin/apparmor_parser").exists
    if not parser:
        return FAIL, "apparmor_parser is missing (package apparmor): the profiles cannot even be checked"
    for name in _names(st):
        for path in (f"{pdir}/{name}", f"{pdir}/local/{name}"):
            f = host.file(path)
            if not f.exists:
                if path == f"{pdir}/{name}":
                    bad.append(f"{path} missing")
                continue
            if f.uid != 0 or f.mode & 0o022:
                bad.append(f"{path} owner uid {f.uid} mode {oct(f.mode)}")
            if COMPLAIN.search(f.content_string):
                bad.append(f"{path} sets flags=(complain)")
        res = host.run(f"PATH=/usr/sbin:/sbin:$PATH apparmor_parser --skip-kernel-load --skip-cache "
                       f"{shlex.quote(f'{pdir}/{name}')}")
        if res.rc != 0:
            bad.append(f"{name}: apparmor_parser rejects it: {res.stderr.strip()[-200:]}")
        else:
            ok.append(name)
    if bad:
        return FAIL, "; ".join(bad)
    return PASS, f"{', '.join(ok)} in {pdir}: root-owned, parse cleanly (ABI {st.abi}), no complain flag"


@check("HOST-APPARMOR-ENFORCE", "the kernel holds kooi's profiles in enforce mode (where it has AppArmor)",
       "profiles on disk that the kernel does not enforce: no confinement at all, or complain mode that only logs")
def profiles_enforced(host: Host, ctx: Context) -> Outcome:
    st = _state(host, ctx)
    if st is None or not st.enabled:
        return NA, NO_PROFILES
    has = _kernel_has(host)
    if not st.kernel:
        if has:
            return FAIL, "the kernel has AppArmor now but site.yml found none: re-run site.yml to load the profiles"
        return NA, "the kernel has no AppArmor (or securityfs is not mounted): profiles can only be syntax-checked"
    if not has:
        return FAIL, "site.yml loaded the profiles but the kernel has no AppArmor now (booted with apparmor=0?)"
    loaded = parse_profiles(host.file(PROFILES).content_string)
    want = _names(st) + [f"{st.runner_profile}//nested"] if st.runner_profile else _names(st)
    bad = [f"{n}: {loaded.get(n, 'not loaded')}" for n in want if loaded.get(n) != "enforce"]
    bad += [f"{n}: {m}" for n, m in loaded.items() if n.startswith("kooi-") and m != "enforce" and n not in want]
    if bad:
        return FAIL, "; ".join(bad)
    return PASS, ", ".join(f"{n} (enforce)" for n in want)


@check("ID-APPARMOR", "the workload runs under kooi's runner profile where the engine applies AppArmor",
       "a container without the procfs/sysfs/mount denies (the engine's default, or none)", scope="workload")
@per_runtime
def workload_profile(host: Host, ctx: Context) -> Outcome:
    st = _state(host, ctx)
    if st is None or not st.enabled:
        return NA, NO_PROFILES
    if not st.kernel:
        return NA, "the kernel has no AppArmor: workloads cannot be confined by it"
    if ctx.mode == "rootless":
        return NA, "rootless Docker cannot confine containers with AppArmor (kooi run reports it)"
    if ctx.workload_runtime == "runsc":
        return NA, "runsc ignores AppArmor profiles (gVisor's sentry confines the workload; kooi run reports it)"
    status, why, v = _get(host, ctx, "apparmor")
    if status:
        return status, why
    label = v["apparmor"]
    want = f"{st.runner_profile} (enforce)"
    return (PASS if label == want else FAIL), f"the workload's label: {label!r} (want {want!r})"
