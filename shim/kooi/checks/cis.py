"""Which CIS Docker Benchmark items each check covers, rootless-aware.

The numbering is the CIS Docker Benchmark v1.6.0's. A check covers an item when its
pass shows the item's recommendation holds on the host (or, where a rootless engine
makes an item moot or changes its meaning, what the rootless note says instead).
Items no kooi check covers are listed with the reason, so the report shows the gaps
rather than hiding them. docs/cis.md renders this table.
"""

from __future__ import annotations

from typing import Any

from .core import FAIL, NA, PASS

BENCHMARK = "CIS Docker Benchmark v1.6.0"

ITEMS: dict[str, str] = {
    "1.1.2": "Only trusted users are allowed to control the Docker daemon",
    "2.1": "Run the Docker daemon as a non-root user, if possible",
    "2.2": "Network traffic is restricted between containers on the default bridge",
    "2.9": "User namespace support is enabled",
    "2.12": "Authorization for Docker client commands is enabled",
    "2.14": "Containers are restricted from acquiring new privileges (daemon default)",
    "2.15": "Live restore is enabled",
    "2.16": "Userland proxy is disabled",
    "3.1": "docker.service file ownership is root:root",
    "3.2": "docker.service file permissions are 644 or more restrictive",
    "3.15": "Docker socket file ownership is root:docker",
    "3.16": "Docker socket file permissions are 660 or more restrictive",
    "3.17": "daemon.json file ownership is root:root",
    "3.18": "daemon.json file permissions are 644 or more restrictive",
    "4.1": "A user for the container has been created",
    "4.2": "Containers use only trusted base images",
    "4.8": "setuid and setgid permissions are removed",
    "5.1": "An AppArmor profile is enabled, if applicable",
    "5.3": "Linux kernel capabilities are restricted within containers",
    "5.4": "Privileged containers are not used",
    "5.5": "Sensitive host system directories are not mounted on containers",
    "5.9": "The host's network namespace is not shared",
    "5.10": "Memory usage for containers is limited",
    "5.11": "CPU priority is set appropriately on containers",
    "5.12": "The container's root filesystem is mounted as read only",
    "5.15": "The host's process namespace is not shared",
    "5.16": "The host's IPC namespace is not shared",
    "5.17": "Host devices are not directly exposed to containers",
    "5.21": "The default seccomp profile is not disabled",
    "5.25": "The container is restricted from acquiring additional privileges",
    "5.28": "The PIDs cgroup limit is used",
    "5.30": "The host's user namespaces are not shared",
    "5.31": "The Docker socket is not mounted inside any containers",
}

# check id -> the items its pass shows
MAP: dict[str, list[str]] = {
    "HOST-RUNNER-USER": ["2.1"],
    "HOST-RUNNER-NOSUDO": ["1.1.2"],
    "HOST-RUNNER-NODOCKER": ["1.1.2"],
    "HOST-SUBID-RANGES": ["2.9"],
    "HOST-SUBID-NOOVERLAP": ["2.9"],
    "HOST-ENGINE-ROOTLESS": ["2.1", "2.9"],
    "HOST-ENGINE-USERNS-REMAP": ["2.9"],
    "HOST-DAEMON-SETTINGS": ["2.2", "2.14", "2.15", "2.16"],
    "HOST-ENGINE-FILES": ["3.1", "3.2", "3.17", "3.18"],
    "HOST-ENGINE-SOCKET": ["3.15", "3.16"],
    "HOST-ROOTFUL-SOCKET": ["1.1.2"],
    "HOST-ENGINE-DRIFT": ["2.9"],
    "HOST-STORAGE-DRIVER": [],
    "HOST-FUSE": [],
    "HOST-GVISOR": [],
    "HOST-APPARMOR-PROFILES": ["5.1"],
    "HOST-APPARMOR-ENFORCE": ["5.1"],
    "ESC-USERNS-MAP": ["2.9"],
    "ESC-PROCSYS-WRITE": ["5.4"],
    "IMG-DIGEST-PIN": ["4.2"],
    "IMG-NOSUID": ["4.8"],
    "IMG-FILECAPS": ["4.8"],
    "IMG-NONROOT": ["4.1"],
    "ID-NONROOT": ["4.1"],
    "ID-CAPS": ["5.3"],
    "ID-NNP": ["5.25"],
    "ID-SECCOMP": ["5.21"],
    "ID-ROOTFS-RO": ["5.12"],
    "ID-NOSOCKET": ["5.31"],
    "ID-APPARMOR": ["5.1"],
    "ESC-SYSCALLS": ["5.21"],
    "ESC-ENGINE-SYSCALLS": ["5.21"],
    "ESC-PTRACE": ["5.21"],
    "ESC-FRESH-MOUNTS": [],
    "ESC-DEVICES": ["5.17"],
    "ID-GVISOR-KERNEL": [],
    "POL-AUTHZ-PLUGIN": ["2.12"],
    "POL-AUTHZ-REFUSES": ["2.12", "5.4", "5.5", "5.9", "5.15", "5.30"],
    "POL-EGRESS": [],
    "NET-EGRESS-RULES": [],
    "NET-EGRESS-CONFINED": [],
    "NET-EGRESS-PROXY": [],
    "HOST-SECRETS-STORE": [],
    "HOST-SECRETS-INJECTOR": [],
    "HOST-SSH-ENTRY": [],
    "HOST-SSH-KEYS": [],
    "RUN-RESULT": [],
    "RUN-TIMEOUT": [],
    "RUN-LOCK": [],
    "RUN-PROJECT-GUARD": [],
    "RUN-LIMITS": ["5.10", "5.11", "5.28"],
    "RUN-SECRETS-HIDDEN": [],
    "RUN-EGRESS-OWN-WAY": [],
    "RUN-CLEANUP": [],
}

# What an item means on a rootless host (shown next to the item in rootless reports).
ROOTLESS: dict[str, str] = {
    "2.2": "rootless: icc=false in the runner's daemon.json, as for rootful",
    "2.9": "rootless: the daemon itself runs in the runner's user namespace; container root is a subordinate uid",
    "2.12": "rootless: no authorization plugin; each kooi run's workload reaches the engine only through "
            "its own kooi broker (request policy), never the runner's socket",
    "2.15": "rootless: live-restore does not apply to a rootless daemon",
    "2.16": "rootless: off as for rootful; published ports stay in the engine's own network namespace "
            "(rootlesskit does not expose them on the host)",
    "3.1": "rootless: kooi's unit (root-owned) replaces docker.service; the rootful units are disabled",
    "3.2": "rootless: kooi's unit (root-owned) replaces docker.service",
    "3.15": "rootless: the runner's socket in its 0700 runtime directory (no docker group)",
    "3.16": "rootless: the runner's socket in its 0700 runtime directory",
    "3.17": "rootless: kooi's root-owned daemon.json (--config-file), not the runner's ~/.config",
    "3.18": "rootless: kooi's root-owned daemon.json (--config-file)",
    "5.1": "rootless: Docker cannot apply AppArmor to rootless containers (profiles are checked on disk)",
    "5.10": "rootless: the memory cgroup where the controller is delegated (cgroup v2); elsewhere RLIMIT_DATA per "
            "process only (RUN-LIMITS says which)",
    "5.11": "rootless: CPU shares and quota where the cpu controller is delegated; elsewhere nice 10",
    "5.28": "rootless: the pids cgroup where the controller is delegated; elsewhere RLIMIT_NPROC per workload uid",
}

# Items no kooi check covers yet, and why.
UNCOVERED: dict[str, str] = {
    "5.16": "kooi run gives every workload a private IPC namespace and kooi's request policy refuses "
            "IpcMode=host (the policy's tests prove it); no check yet",
}


def items_for(check_id: str) -> list[str]:
    return list(MAP.get(check_id, []))


def summarize(checks: list[dict[str, Any]], mode: str) -> list[dict[str, Any]]:
    """Per item: the checks that cover it and the item's status (fail if any fails,
    na if all are n/a, pass otherwise; uncovered items say why)."""
    out = []
    for item, title in ITEMS.items():
        ids = [c for c in checks if item in MAP.get(c["id"], [])]
        statuses = {c["status"] for c in ids}
        if not ids:
            status = "uncovered"
        elif FAIL in statuses:
            status = FAIL
        elif statuses == {NA}:
            status = NA
        else:
            status = PASS
        note = UNCOVERED.get(item, "") if not ids else (ROOTLESS.get(item, "") if mode == "rootless" else "")
        out.append({"item": item, "title": title, "status": status, "checks": [c["id"] for c in ids], "note": note})
    return out
