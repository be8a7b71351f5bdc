"""Filters of kooi's engine roles: derive the engine's default seccomp profile.

`kooi_seccomp_refuse(profile, names)` returns a copy of a Docker seccomp profile (JSON
loaded) in which no rule allows any of NAMES: they are removed from every
SCMP_ACT_ALLOW rule (a rule left without names is dropped), so the profile's default
action (SCMP_ACT_ERRNO, EPERM) answers them. Nothing else changes. Docker 25 and later
did exactly this for io_uring in their built-in default; kooi applies it to the
default profile of the engine version it installed (files/seccomp/)."""

from __future__ import annotations

import copy

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # used without Ansible (unit tests)
    class AnsibleFilterError(Exception):  # type: ignore[no-redef]
        pass


def kooi_seccomp_refuse(profile, names):
    if not isinstance(profile, dict) or not isinstance(profile.get("syscalls"), list):
        raise AnsibleFilterError("kooi_seccomp_refuse: the input is not a Docker seccomp profile "
                                 "(an object with a 'syscalls' list)")
    if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
        raise AnsibleFilterError(f"kooi_seccomp_refuse: names must be a list of syscall names, got {names!r}")
    if profile.get("defaultAction") not in ("SCMP_ACT_ERRNO", "SCMP_ACT_KILL", "SCMP_ACT_KILL_PROCESS",
                                            "SCMP_ACT_KILL_THREAD", "SCMP_ACT_TRAP"):
        raise AnsibleFilterError("kooi_seccomp_refuse: the profile's defaultAction "
                                 f"{profile.get('defaultAction')!r} would allow what it removes")
    refused = set(names)
    out = copy.deepcopy(profile)
    rules = []
    for rule in out["syscalls"]:
        if rule.get("action") == "SCMP_ACT_ALLOW":
            kept = [n for n in rule.get("names") or [] if n not in refused]
            if not kept:
                continue
            rule["names"] = kept
        rules.append(rule)
    out["syscalls"] = rules
    return out


class FilterModule:
    def filters(self):
        return {"kooi_seccomp_refuse": kooi_seccomp_refuse}
