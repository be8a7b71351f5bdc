"""Every run's limits, and how each backend bounds the workload by them.

A run's limits are its workflow's `limits`, and the host's defaults for what it does
not name (hoststate.limits; kooi_workflow_default_limits), never above the host's
maximum. Where the engine enforces cgroup limits they bound the run as a whole;
where it cannot (rootless on cgroup v1, or v2 without delegated controllers) kooi
bounds what can be bounded without cgroups, and the result says which is which:

    memory  cgroup memory (and no swap)   else RLIMIT_DATA per process, JVMs sized by -XX:MaxRAM
    pids    cgroup pids                   else RLIMIT_NPROC: per uid in the engine's user
                                          namespace (the runner's concurrent runs share it)
    cpus    CPU quota, CPU shares 512     else nice 10 (a lower priority, no bound)
    files   RLIMIT_NOFILE per process (always)
    core    RLIMIT_CORE 0: no core dumps (always)

A jail's cgroup is a systemd user scope where the runner's user manager has delegated
controllers (run.jailscope); elsewhere it gets the rlimits and nice of the right column.

The same values bound what a testcontainers workload starts through its broker
(forced where absent, refused above the run's: broker.RunScope.limits).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..hoststate import limits as host_limits
from ..hoststate.limits import size

NICE = 10  # where no cgroup bounds CPU time: the workload yields to everything else
CPU_SHARES = 512  # where one does: half the default weight (CIS Docker 5.11)
CPU_WEIGHT = 50  # the same for a jail's systemd scope (cgroup v2 weight; the default is 100)


@dataclass
class Plan:
    """What a backend applies, and what the result says about it."""

    values: dict[str, Any]
    record: dict[str, dict[str, Any]] = field(default_factory=dict)
    host_config: dict[str, Any] = field(default_factory=dict)  # cgroup fields (containers)
    rlimits: dict[str, int] = field(default_factory=dict)      # docker/prlimit names -> value
    scope: dict[str, str] = field(default_factory=dict)        # a jail's systemd scope properties
    nice: int | None = None
    max_ram: int | None = None  # -XX:MaxRAM for JVMs where memory is not a cgroup limit
    origin: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # about limits the workflow named: the run's warnings
    info: list[str] = field(default_factory=list)   # about the host's defaults: the log only

    def note(self, key: str, text: str) -> None:
        (self.notes if self.origin.get(key) == "workflow" else self.info).append(text)

    def ulimits(self) -> list[dict[str, Any]]:
        return [{"Name": n, "Soft": v, "Hard": v} for n, v in self.rlimits.items()]

    def prlimit_argv(self) -> list[str]:
        return ["prlimit", *(f"--{n}={v}" for n, v in self.rlimits.items()), "--"]

    def ceilings(self) -> dict[str, int]:
        """The bounds of what the run's workload starts through its broker (policy.Policy.limits)."""
        out = {k: int(v) for k, v in self.host_config.items() if k in ("Memory", "MemorySwap", "PidsLimit", "NanoCpus")}
        out.update({f"ulimit:{n}": v for n, v in self.rlimits.items()})
        if "memory" in self.values:
            # Memory in a tmpfs belongs to no process: bounded by the run's memory
            # whether or not the engine has a memory cgroup.
            out["tmpfs:total"] = size(self.values["memory"])
        return out

    def summary(self) -> str:
        parts = [f"{k} {r['requested']} ({r['by']})" for k, r in self.record.items() if k in self.values]
        return "limits: " + "; ".join(parts)


def _rec(plan: Plan, key: str, origin: dict[str, str], enforced: bool, by: str) -> None:
    plan.record[key] = {"requested": plan.values[key], "from": origin.get(key, "default"),
                        "enforced": enforced, "by": by}


def _within(plan: Plan, key: str, rlimit: str, hard: dict[str, int], whose: str) -> int:
    """The value of limit KEY, lowered to HARD[RLIMIT] (a hard limit no unprivileged
    process can raise, e.g. the daemon's open files)."""
    value = int(plan.values[key])
    top = hard.get(rlimit)
    if top is not None and value > top:
        plan.note(key, f"{key} {value} is more than {whose} hard limit of {top}; bounded at {top}")
        plan.values[key] = value = top
    return value


def for_container(values: dict[str, Any], origin: dict[str, str], enforce: dict[str, bool],
                  ncpu: int | None, mode: str, hard: dict[str, int] | None = None) -> Plan:
    """ENFORCE: what the engine's cgroups can bound (engine_limits); NCPU: its CPUs;
    HARD: the daemon's own hard rlimits (Engine.hard_rlimits), above which no
    container's can be set."""
    plan = Plan(dict(values), origin=dict(origin))
    hard = hard or {}
    why = f"the {mode} engine has no cgroup controller for it: that needs cgroup v2 with delegated controllers"
    mem = size(values["memory"])
    if enforce.get("memory"):
        plan.host_config.update(Memory=mem, MemorySwap=mem)
        _rec(plan, "memory", origin, True, "cgroup memory controller (the run's total, no swap)")
    else:
        plan.rlimits["data"] = mem
        plan.max_ram = mem
        _rec(plan, "memory", origin, False, f"per process only: RLIMIT_DATA, JVMs sized by -XX:MaxRAM; {why}")
        plan.note("memory", f"memory {values['memory']} bounds each process, not the run's total; {why}")
    pids = int(values["pids"]) if enforce.get("pids") else _within(plan, "pids", "nproc", hard, "the engine's")
    if enforce.get("pids"):
        plan.host_config["PidsLimit"] = pids
        _rec(plan, "pids", origin, True, "cgroup pids controller (the run's processes and threads)")
    else:
        plan.rlimits["nproc"] = pids
        _rec(plan, "pids", origin, True, "RLIMIT_NPROC: per workload uid in the engine's user namespace, "
                                         f"shared by the runner's concurrent runs; {why}")
    cpus = float(values["cpus"])
    if enforce.get("cpus"):
        if ncpu and cpus > ncpu:
            plan.note("cpus", f"cpus {values['cpus']} is more than the host's {ncpu} CPUs; bounded at {ncpu}")
            cpus = float(ncpu)
            plan.values["cpus"] = ncpu
        plan.host_config.update(NanoCpus=int(cpus * 1e9), CpuShares=CPU_SHARES)
        _rec(plan, "cpus", origin, True, f"cgroup CPU quota, CPU shares {CPU_SHARES}")
    else:
        plan.nice = NICE
        _rec(plan, "cpus", origin, False, f"not bounded: the workload runs at nice {NICE}; {why}")
        plan.note("cpus", f"cpus {values['cpus']} is not bounded, the workload runs at nice {NICE}; {why}")
    plan.rlimits["nofile"] = _within(plan, "files", "nofile", hard, "the engine's")
    _rec(plan, "files", origin, True, "RLIMIT_NOFILE per process")
    plan.rlimits["core"] = 0
    plan.record["core"] = {"requested": 0, "from": "kooi", "enforced": True, "by": "RLIMIT_CORE: no core dumps"}
    return plan


def own_hard_rlimits() -> dict[str, int]:
    import resource

    out = {}
    for name, res in (("nproc", resource.RLIMIT_NPROC), ("nofile", resource.RLIMIT_NOFILE)):
        hard = resource.getrlimit(res)[1]
        if hard != resource.RLIM_INFINITY:
            out[name] = hard
    return out


def for_jail(values: dict[str, Any], origin: dict[str, str], hard: dict[str, int] | None = None,
             scope: frozenset[str] = frozenset(), ncpu: int | None = None) -> Plan:
    """SCOPE: the controllers a systemd user scope of the runner's can bound
    (run.jailscope.controllers); they bound the jail as a whole (Plan.scope, systemd
    properties). What they do not cover gets rlimits set inside the jail (prlimit after
    bwrap has made its user namespace, so RLIMIT_NPROC counts the jail's processes only)
    and a lower priority. JVMs are always sized by -XX:MaxRAM: a JVM in a jail cannot
    tell a scope's memory limit from the host's memory."""
    plan = Plan(dict(values), origin=dict(origin))
    hard = own_hard_rlimits() if hard is None else hard
    mem = size(values["memory"])
    why = "a jail has no cgroup of its own here: that needs a user manager with delegated controllers (cgroup v2)"
    plan.max_ram = mem
    if "memory" in scope:
        plan.scope.update(MemoryMax=str(mem), MemorySwapMax="0")
        _rec(plan, "memory", origin, True, "cgroup memory controller (a systemd user scope: the jail's total, "
                                           "no swap), JVMs sized by -XX:MaxRAM")
    else:
        plan.rlimits["data"] = mem
        _rec(plan, "memory", origin, False, f"per process only: RLIMIT_DATA, JVMs sized by -XX:MaxRAM; {why}")
        plan.note("memory", f"memory {values['memory']} bounds each process, not the run's total; {why}")
    if "pids" in scope:
        plan.scope["TasksMax"] = str(int(values["pids"]))
        _rec(plan, "pids", origin, True, "cgroup pids controller (a systemd user scope: the jail's processes "
                                         "and threads)")
    else:
        plan.rlimits["nproc"] = _within(plan, "pids", "nproc", hard, "kooi run's")
        _rec(plan, "pids", origin, True, "RLIMIT_NPROC in the jail's user namespace (its processes and threads)")
    if "cpu" in scope:
        cpus = float(values["cpus"])
        ncpu = ncpu or os.cpu_count() or 1
        if cpus > ncpu:
            plan.note("cpus", f"cpus {values['cpus']} is more than the host's {ncpu} CPUs; bounded at {ncpu}")
            cpus = float(ncpu)
            plan.values["cpus"] = ncpu
        plan.scope.update(CPUQuota=f"{round(cpus * 100)}%", CPUWeight=str(CPU_WEIGHT))
        _rec(plan, "cpus", origin, True, f"cgroup CPU quota, CPU weight {CPU_WEIGHT} (a systemd user scope)")
    else:
        plan.nice = NICE
        _rec(plan, "cpus", origin, False, f"not bounded: the workload runs at nice {NICE}; {why}")
        plan.note("cpus", f"cpus {values['cpus']} is not bounded, the workload runs at nice {NICE}; {why}")
    plan.rlimits.update(nofile=_within(plan, "files", "nofile", hard, "kooi run's"), core=0)
    _rec(plan, "files", origin, True, "RLIMIT_NOFILE per process")
    plan.record["core"] = {"requested": 0, "from": "kooi", "enforced": True, "by": "RLIMIT_CORE: no core dumps"}
    return plan


def java_options(existing: str, max_ram: int | None) -> str:
    """JAVA_TOOL_OPTIONS with -XX:MaxRAM: a JVM sizes its heap from the memory it thinks
    it has (a quarter of it); without a cgroup limit that is the host's."""
    if max_ram is None or "-XX:MaxRAM=" in existing:
        return existing
    return f"{existing} -XX:MaxRAM={max_ram}".strip()


def host_ceilings(cfg: host_limits.LimitsConfig) -> dict[str, int]:
    """The most any container on the host's engine may ask for: the host's maximum
    (kooi_workflow_max_limits) as policy.Policy.limits, for the authorization plugin
    (a run's broker holds its own run's, lower ones)."""
    out: dict[str, int] = {"ulimit:core": 0}
    mx = cfg.max
    if "memory" in mx:
        mem = size(mx["memory"])
        out.update({"Memory": mem, "MemorySwap": mem, "ulimit:data": mem, "tmpfs:total": mem})
    if "pids" in mx:
        out.update({"PidsLimit": int(mx["pids"]), "ulimit:nproc": int(mx["pids"])})
    if "cpus" in mx:
        out["NanoCpus"] = int(float(mx["cpus"]) * 1e9)
    if "files" in mx:
        out["ulimit:nofile"] = int(mx["files"])
    return out


def broker_ceilings(text: str, upstream: str) -> dict[str, int]:
    """`kooi broker --limits`: a workflow's `limits` (JSON TEXT), the rest the host's
    defaults, as the engine at UPSTREAM bounds them (what kooi run gives a run's
    broker). ValueError: TEXT is not such limits; OSError: the engine does not answer."""
    import json

    from .. import engineapi
    from .container import engine_limits

    try:
        want = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(want, dict) or set(want) - set(host_limits.KEYS):
        raise ValueError(f"expected an object with keys from {', '.join(host_limits.KEYS)}")
    for key, value in want.items():
        if (err := host_limits.value_error(key, value)) is not None:
            raise ValueError(f"{key}: {err}")
    values, origin, errors = host_limits.resolve(want, host_limits.load())
    if errors:
        raise ValueError("; ".join(errors))
    eng = engineapi.Engine(upstream)
    try:
        info = eng.info()
    except engineapi.APIError as exc:
        raise OSError(f"the engine does not answer GET /info: {exc}") from None
    mode = "rootless" if "rootless" in (info.get("SecurityOptions") or [""])[-1] else "rootful"
    plan = for_container(values, origin, engine_limits(info), info.get("NCPU"), mode, eng.hard_rlimits())
    return plan.ceilings()
