"""Every body field of the Engine API requests kooi's policy reads, with its verdict.

The Engine API specification of the engines kooi runs (API 1.41, Debian 12's
docker.io 20.10; 1.45, Debian 13's 26.1; tests/data/engine-api-*.json, written by
scripts/engine-api-extract.py) lists the fields; this table says what kooi does with
each. tests/unit/test_policy_coverage.py fails for a field of the specification
without a verdict (a verdict on a field covers the fields below it unless they have
their own), and docs/policy.md's field table is generated from it
(`python3 scripts/policy-docs.py`).

The table is also the policy's list of what it looked at: a create, exec, update or
volume create that sets a top-level (or HostConfig) field the table does not name is
refused (kooi.policybody), so a field the engine learns later is a refusal until someone
gives it a verdict.

Verdicts:
- allowed: any value (it acts inside the container, or on objects of the run's own);
- refused: refused whenever it is set (not null, false, 0, "" or empty);
- bounded: allowed within a bound the policy checks (the why says which);
- forced: the broker sets it where a request leaves it out, and bounds it;
- checked: allowed after a check of what it names (ownership, the workspace);
- ignored: the engine ignores it on Linux (or for this engine version).
"""

from __future__ import annotations

from .gojson import fold

ALLOWED, REFUSED, BOUNDED, FORCED, CHECKED, IGNORED = "allowed", "refused", "bounded", "forced", "checked", "ignored"

_INSIDE = "acts inside the container only"
_CONFIG = {
    "ArgsEscaped": (IGNORED, "Windows only"),
    "AttachStderr": (ALLOWED, _INSIDE), "AttachStdin": (ALLOWED, _INSIDE), "AttachStdout": (ALLOWED, _INSIDE),
    "Cmd": (ALLOWED, _INSIDE), "Domainname": (ALLOWED, _INSIDE), "Entrypoint": (ALLOWED, _INSIDE),
    "Env": (ALLOWED, _INSIDE), "ExposedPorts": (ALLOWED, _INSIDE), "Healthcheck": (ALLOWED, _INSIDE),
    "Hostname": (ALLOWED, _INSIDE),
    "Image": (ALLOWED, "resolved to an image id at create; a run cannot make or re-point images"),
    "Labels": (FORCED, "the broker adds the run's labels (org.kooi.run, org.kooi.nested), by which it owns and "
                       "removes what the run made"),
    "MacAddress": (ALLOWED, "on the run's own networks"), "NetworkDisabled": (ALLOWED, _INSIDE),
    "OnBuild": (IGNORED, "builds are refused"), "OpenStdin": (ALLOWED, _INSIDE), "Shell": (ALLOWED, _INSIDE),
    "StdinOnce": (ALLOWED, _INSIDE), "StopSignal": (ALLOWED, _INSIDE), "StopTimeout": (ALLOWED, _INSIDE),
    "Tty": (ALLOWED, _INSIDE), "User": (ALLOWED, "root inside is the run's subordinate uid (or, on the rootless "
                                                 "engine, the runner); binds reach only the workspace"),
    "Volumes": (ALLOWED, "anonymous volumes, removed with the container (the run's cleanup removes volumes too)"),
    "WorkingDir": (ALLOWED, _INSIDE),
}
_BOUNDS = "within the ceiling: the run's limits (broker), the host's maximum (plugin)"
_BOUNDS_ONLY = "only bounds the container"
_RESOURCES = {
    "BlkioDeviceReadBps": (ALLOWED, _BOUNDS_ONLY), "BlkioDeviceReadIOps": (ALLOWED, _BOUNDS_ONLY),
    "BlkioDeviceWriteBps": (ALLOWED, _BOUNDS_ONLY), "BlkioDeviceWriteIOps": (ALLOWED, _BOUNDS_ONLY),
    "BlkioWeight": (ALLOWED, _BOUNDS_ONLY), "BlkioWeightDevice": (ALLOWED, _BOUNDS_ONLY),
    "CgroupParent": (REFUSED, "another parent cgroup escapes the run's limits"),
    "CpuCount": (IGNORED, "Windows only"), "CpuPercent": (IGNORED, "Windows only"),
    "CpuPeriod": (BOUNDED, "with CpuQuota, " + _BOUNDS),
    "CpuQuota": (BOUNDED, "per CpuPeriod, " + _BOUNDS + "; -1 refused"),
    "CpuRealtimePeriod": (REFUSED, "realtime scheduling can starve the host"),
    "CpuRealtimeRuntime": (REFUSED, "realtime scheduling can starve the host"),
    "CpuShares": (ALLOWED, _BOUNDS_ONLY), "CpusetCpus": (ALLOWED, _BOUNDS_ONLY), "CpusetMems": (ALLOWED, _BOUNDS_ONLY),
    "DeviceCgroupRules": (REFUSED, "host devices"), "DeviceRequests": (REFUSED, "host devices (GPUs)"),
    "Devices": (REFUSED, "host devices (disks, /dev/mem)"),
    "IOMaximumBandwidth": (IGNORED, "Windows only"), "IOMaximumIOps": (IGNORED, "Windows only"),
    "Init": (ALLOWED, _INSIDE),
    "KernelMemory": (IGNORED, "deprecated; ignored by the engines kooi runs"),
    "KernelMemoryTCP": (ALLOWED, _BOUNDS_ONLY),
    "Memory": (FORCED, "the run's own where the engine has a memory cgroup and a create names none; " + _BOUNDS),
    "MemoryReservation": (ALLOWED, "a soft limit below Memory"),
    "MemorySwap": (FORCED, "= Memory where the broker sets Memory; " + _BOUNDS + "; -1 refused"),
    "MemorySwappiness": (ALLOWED, _BOUNDS_ONLY),
    "NanoCpus": (FORCED, "the run's own where a create names none; " + _BOUNDS),
    "OomKillDisable": (REFUSED, "a container the OOM killer may not end takes the host's memory"),
    "PidsLimit": (FORCED, "the run's own where a create names none; " + _BOUNDS + "; below 0 refused"),
    "Ulimits": (FORCED, "the run's rlimits for each name a create does not list; unlimited (-1) or above the "
                        "ceiling refused; names compared case-insensitively, as the engine upper-cases them"),
}
_HOST = {
    **{f"HostConfig.{k}": v for k, v in _RESOURCES.items()},
    "HostConfig.Annotations": (REFUSED, "they reach the OCI runtime"),
    "HostConfig.AutoRemove": (ALLOWED, "removes the container when it exits"),
    "HostConfig.Binds": (CHECKED, "plugin: sources below the workspace, symlinks resolved; a run's broker: only "
                                  "the workspace itself (the engine resolves a source again at every start); "
                                  "never a socket; no shared or slave propagation; named volumes the run's own"),
    "HostConfig.CapAdd": (REFUSED, "capabilities against the kernel"),
    "HostConfig.CapDrop": (ALLOWED, "only takes away"),
    "HostConfig.Cgroup": (REFUSED, "another container's cgroup"),
    "HostConfig.CgroupnsMode": (BOUNDED, "host refused"),
    "HostConfig.ConsoleSize": (ALLOWED, _INSIDE),
    "HostConfig.ContainerIDFile": (IGNORED, "a client-side setting"),
    "HostConfig.Dns": (ALLOWED, "name servers are reached through the run's egress rules"),
    "HostConfig.DnsOptions": (ALLOWED, _INSIDE), "HostConfig.DnsSearch": (ALLOWED, _INSIDE),
    "HostConfig.ExtraHosts": (ALLOWED, _INSIDE), "HostConfig.GroupAdd": (ALLOWED, _INSIDE),
    "HostConfig.IpcMode": (BOUNDED, "host and container:ID refused (shared memory of the host or a sibling)"),
    "HostConfig.Isolation": (IGNORED, "Windows only"),
    "HostConfig.Links": (REFUSED, "legacy links name other containers, resolved again at start"),
    "HostConfig.LogConfig": (BOUNDED, "drivers json-file, local, none (others ship logs past the egress rules); "
                                      "no options (the engine's own bound the log's size)"),
    "HostConfig.MaskedPaths": (REFUSED, "systempaths=unconfined arrives as MaskedPaths: []"),
    "HostConfig.Mounts": (CHECKED, "bind: as Binds; volume: the run's own, no driver options, no Subpath; tmpfs: "
                                   "sized within the run's memory; other types refused"),
    "HostConfig.Mounts[].BindOptions.Propagation": (BOUNDED, "shared and slave refused: mounts would cross between "
                                                             "the container and the host"),
    "HostConfig.Mounts[].VolumeOptions.DriverConfig": (REFUSED, "o=bind,device=... reaches host paths"),
    "HostConfig.Mounts[].VolumeOptions.Subpath": (REFUSED, "a path inside a volume the workload writes, resolved "
                                                           "again at start"),
    "HostConfig.Mounts[].TmpfsOptions": (BOUNDED, "SizeBytes within the run's memory, with every other tmpfs of "
                                                  "the container; Mode; nothing else"),
    "HostConfig.NetworkMode": (CHECKED, "host refused; the broker puts a container on the run's network unless "
                                        "it names one of the run's own (or container:ID of the run's)"),
    "HostConfig.OomScoreAdj": (BOUNDED, "below 0 refused: the OOM killer would end others first"),
    "HostConfig.PidMode": (BOUNDED, "host and container:ID refused (ptrace of the host's or a sibling's "
                                    "processes)"),
    "HostConfig.PortBindings": (ALLOWED, "published inside the engine's namespace, reached at the run network's "
                                         "gateway (docs/testcontainers.md)"),
    "HostConfig.Privileged": (REFUSED, "all capabilities, every device, no confinement"),
    "HostConfig.PublishAllPorts": (ALLOWED, "as PortBindings"),
    "HostConfig.ReadonlyPaths": (REFUSED, "custom masks weaken confinement"),
    "HostConfig.ReadonlyRootfs": (ALLOWED, _INSIDE),
    "HostConfig.RestartPolicy": (BOUNDED, "no only: a restarting container outlives its run"),
    "HostConfig.Runtime": (BOUNDED, "runc (runsc where role gvisor registered it; a gVisor run's broker forces "
                                    "runsc), spelled exactly"),
    "HostConfig.SecurityOpt": (BOUNDED, "no-new-privileges and kooi's AppArmor profiles only; the broker forces "
                                        "kooi's profile where the engine applies AppArmor"),
    "HostConfig.ShmSize": (BOUNDED, "counted with the container's tmpfs against the run's memory"),
    "HostConfig.StorageOpt": (ALLOWED, _BOUNDS_ONLY),
    "HostConfig.Sysctls": (REFUSED, "kernel settings"),
    "HostConfig.Tmpfs": (BOUNDED, "a plain decimal size on each (size=0, %, nr_blocks refused), together within "
                                  "the run's memory; the broker sizes one that names none"),
    "HostConfig.UTSMode": (BOUNDED, "host refused"),
    "HostConfig.UsernsMode": (BOUNDED, "host refused (it undoes userns-remap)"),
    "HostConfig.VolumeDriver": (BOUNDED, "local only"),
    "HostConfig.VolumesFrom": (REFUSED, "another container's volumes"),
}
_ENDPOINT = {
    "Aliases": (ALLOWED, "names on the run's own network"),
    "DNSNames": (ALLOWED, "names on the run's own network"),
    "DriverOpts": (REFUSED, "per-endpoint driver options (interface sysctls)"),
    "EndpointID": (IGNORED, "set by the engine"), "Gateway": (IGNORED, "set by the engine"),
    "GlobalIPv6Address": (IGNORED, "set by the engine"), "GlobalIPv6PrefixLen": (IGNORED, "set by the engine"),
    "IPAMConfig": (ALLOWED, "addresses on the run's own network, allocated by the engine"),
    "IPAddress": (IGNORED, "set by the engine"), "IPPrefixLen": (IGNORED, "set by the engine"),
    "IPv6Gateway": (IGNORED, "set by the engine"),
    "Links": (REFUSED, "legacy links name other containers"),
    "MacAddress": (ALLOWED, "on the run's own network"),
    "NetworkID": (FORCED, "the broker sets the id of the network it decided on: the engine joins the network "
                          "a NetworkID names (any network's, by id or name) and otherwise looks the key's name up "
                          "again at start"),
}
_NETWORK = "the engine chooses the bridge, its options and the subnet (shared by all runs)"

FIELDS: dict[str, dict[str, tuple[str, str]]] = {
    "ContainerCreate": {
        **_CONFIG, **_HOST,
        "NetworkingConfig.EndpointsConfig": (CHECKED, "networks of the run's own (the default one becomes the "
                                                      "run's network)"),
        **{f"NetworkingConfig.EndpointsConfig{{}}.{k}": v for k, v in _ENDPOINT.items()},
    },
    "ContainerUpdate": {
        **_RESOURCES,
        "RestartPolicy": (BOUNDED, "no only: a restarting container outlives its run"),
    },
    "ContainerExec": {
        "AttachStderr": (ALLOWED, _INSIDE), "AttachStdin": (ALLOWED, _INSIDE), "AttachStdout": (ALLOWED, _INSIDE),
        "Cmd": (ALLOWED, _INSIDE), "ConsoleSize": (ALLOWED, _INSIDE), "DetachKeys": (ALLOWED, _INSIDE),
        "Env": (ALLOWED, _INSIDE), "Tty": (ALLOWED, _INSIDE), "WorkingDir": (ALLOWED, _INSIDE),
        "Privileged": (REFUSED, "all capabilities in a running container"),
        "User": (BOUNDED, "root and uid or gid 0 refused, numbers read as the engine reads them (00, +0)"),
    },
    "ExecStart": {"ConsoleSize": (ALLOWED, _INSIDE), "Detach": (ALLOWED, _INSIDE), "Tty": (ALLOWED, _INSIDE)},
    "NetworkCreate": {
        "Name": (BOUNDED, "a name of the run's choosing: letters, digits and _.- (the broker; names reach root's "
                          "terminal through kooi gc)"), "CheckDuplicate": (ALLOWED, "deprecated; harmless"),
        "Driver": (BOUNDED, "bridge only"), "Internal": (ALLOWED, "only cuts the network off"),
        "Attachable": (ALLOWED, "swarm only"), "Labels": (FORCED, "the run's labels added"),
        "EnableIPv6": (REFUSED, _NETWORK), "Ingress": (REFUSED, "swarm only"), "ConfigOnly": (REFUSED, _NETWORK),
        "ConfigFrom": (REFUSED, _NETWORK), "Scope": (REFUSED, _NETWORK),
        "Options": (FORCED, "the bridge's name only, and only kooi's (kr…/kp…: the run's, which the host's egress "
                            "rules know; a bridge named otherwise is outside them); the broker sets it, the plugin "
                            "refuses any other: " + _NETWORK),
        "IPAM": (BOUNDED, "the default driver with nothing else: " + _NETWORK),
    },
    "NetworkConnect": {
        "Container": (CHECKED, "a container of the run's own, on a network of the run's own"),
        "EndpointConfig": (CHECKED, "as a create's EndpointsConfig"),
        **{f"EndpointConfig.{k}": v for k, v in _ENDPOINT.items()},
    },
    "NetworkDisconnect": {
        "Container": (CHECKED, "a network of the run's own"), "Force": (ALLOWED, "the run's own network"),
    },
    "VolumeCreate": {
        "Name": (ALLOWED, "a name of the run's choosing"), "Labels": (FORCED, "the run's labels added"),
        "Driver": (BOUNDED, "local only"), "DriverOpts": (REFUSED, "o=bind,device=... reaches host paths"),
        "ClusterVolumeSpec": (REFUSED, "swarm only"),
    },
}


# Fields real clients send that the specification does not list (the engine's JSON
# decoder ignores them): a verdict all the same, or such a client's requests would be
# refused. Kept apart, since the coverage test checks every other verdict against the
# specification.
OUTSIDE_SPEC: dict[str, dict[str, tuple[str, str]]] = {
    "ContainerExec": {"Container": (IGNORED, "sent by docker-py (Testcontainers for Python); the engine has no such "
                                             "field and takes the container from the path")},
}
for _body, _extra in OUTSIDE_SPEC.items():
    FIELDS[_body].update(_extra)

# Objects that are read field by field: no verdict of their own, every field below them
# needs one.
FIELD_BY_FIELD = {"ContainerCreate": ("HostConfig", "NetworkingConfig")}


def verdict(body: str, path: str) -> tuple[str, str, str] | None:
    """The verdict on field PATH of BODY: (the table's key that decides, verdict, why),
    from the longest key that is PATH or above it."""
    table = FIELDS.get(body, {})
    probe = path
    while True:
        if probe in table:
            return (probe, *table[probe])
        cut = max(probe.rfind("."), probe.rfind("[]"), probe.rfind("{}"))
        if cut <= 0:
            return None
        probe = probe[:cut]


def known(body: str, prefix: str = "") -> frozenset[str]:
    """The fields directly below PREFIX ("" for the top level, "HostConfig." for the
    HostConfig) that BODY's table names, folded as the engine matches them."""
    out = set()
    for key in FIELDS[body]:
        if key.startswith(prefix):
            name = key[len(prefix):]
            out.add(fold(name.split(".", 1)[0].split("[", 1)[0].split("{", 1)[0]))
    return frozenset(out)
