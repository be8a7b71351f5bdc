"""A jail's cgroup: a transient systemd user scope, where the runner's user manager runs
on cgroup v2 with controllers delegated to it (role docker_rootless delegates cpu,
cpuset, io, memory and pids to user@.service). Then the jail's limits bound the jail as
a whole, as the engine's cgroups bound a container:

    systemd-run --user --scope --unit kooi-jail-RUN -p MemoryMax=.. -p TasksMax=.. -p CPUQuota=..
      python3 -I -c WRAPPER           in the scope: dies with kooi run (PR_SET_PDEATHSIG),
        [aa-exec -p kooi-jail --]     binds the scope's cgroup read-only at the jail's
          bwrap ... -- workload       /sys/fs/cgroup, and when bwrap ends copies the
                                      scope's event counters out for the run's `limit`

Elsewhere (no user manager, cgroup v1 or hybrid, no delegated controller, root's runs)
a jail is bounded by rlimits and nice as before (run.limits.for_jail).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..seccomp import limits_reached

CGROUP_MARK = "@KOOI-CGROUP@"  # in bwrap's argv: the scope's cgroup, known only inside it
WANTED = ("memory", "pids", "cpu")

# Runs inside the scope as the runner: argv REPORT PARENT FDS COMMAND...
WRAPPER = r"""
import ctypes, os, signal, subprocess, sys
report, parent, fds = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != parent:
    sys.exit(125)
rel = next(l[3:].strip() for l in open("/proc/self/cgroup") if l.startswith("0::"))
cg = "/sys/fs/cgroup" + rel
with open(report + ".cgroup", "w") as f:
    f.write(cg)

def copy_counters():
    for name in ("pids.events", "memory.events"):
        try:
            with open(cg + "/" + name) as src:
                data = src.read()
        except OSError:
            data = ""
        with open(report + "." + name, "w") as f:
            f.write(data)

def stopped(signum, frame):
    # systemd stops the scope after an OOM kill in it (OOMPolicy=stop): keep its
    # counters first, and end as the killed workload did (SIGKILL, like a container).
    copy_counters()
    try:
        with open(report + ".memory.events") as f:
            oom = any(l.split()[:1] == ["oom_kill"] and l.split()[1] != "0" for l in f)
    except OSError:
        oom = False
    os._exit(128 + (signal.SIGKILL if oom else signum))

signal.signal(signal.SIGTERM, stopped)
argv = [cg if a == "@KOOI-CGROUP@" else a for a in sys.argv[4:]]
p = subprocess.Popen(argv, pass_fds=tuple(int(x) for x in fds.split(",") if x))
rc = p.wait()
copy_counters()
sys.exit(rc if rc >= 0 else 128 - rc)
"""


def controllers(uid: int | None = None, runtime_dir: str | None = None) -> frozenset[str]:
    """The controllers (of memory, pids, cpu) a transient scope of UID's user manager
    can bound; empty where there is no such scope (root, no systemd-run, no user
    manager, no unified hierarchy, nothing delegated)."""
    uid = os.geteuid() if uid is None else uid
    if uid == 0 or not shutil.which("systemd-run"):
        return frozenset()
    rt = runtime_dir or os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
    if not Path(rt, "systemd", "private").exists():
        return frozenset()
    try:
        got = Path(f"/sys/fs/cgroup/user.slice/user-{uid}.slice/user@{uid}.service/cgroup.controllers").read_text()
    except OSError:
        return frozenset()
    return frozenset(c for c in got.split() if c in WANTED)


def argv(unit: str, properties: dict[str, str], report: Path, fds: tuple[int, ...]) -> list[str]:
    """What goes before the jail's own argv: the scope and the wrapper in it."""
    props = [f"--property={k}={v}" for k, v in properties.items()]
    return ["systemd-run", "--user", "--scope", "--quiet", "--collect", f"--unit={unit}", *props, "--",
            "/usr/bin/python3", "-I", "-c", WRAPPER, str(report), str(os.getpid()), ",".join(map(str, fds))]


def started(report: Path) -> bool:
    """Whether the wrapper ran in its scope (systemd-run itself may have failed)."""
    return Path(f"{report}.cgroup").exists()


def reached(report: Path) -> list[str]:
    """The limits the scope's counters say the jail reached (copied out when bwrap ended)."""
    return limits_reached(((f"{report}.pids.events", "max", "pids"),
                           (f"{report}.memory.events", "oom_kill", "memory")))


def reached_now(report: Path) -> list[str]:
    """The same from the live scope (before kooi run kills a jail at its timeout)."""
    try:
        cg = Path(f"{report}.cgroup").read_text()
    except OSError:
        return []
    return limits_reached(((f"{cg}/pids.events", "max", "pids"), (f"{cg}/memory.events", "oom_kill", "memory")))


def cleanup(report: Path) -> None:
    for suffix in (".cgroup", ".pids.events", ".memory.events"):
        Path(f"{report}{suffix}").unlink(missing_ok=True)
