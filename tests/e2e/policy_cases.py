"""`docker run` flags that kooi's request policy refuses, with the reason each refusal
must name: shared by the plugin (test_authz) and the broker (test_broker) tests."""

from __future__ import annotations


def refused_runs(workspace: str, below: str = "resolves to /etc") -> list[tuple[list[str], str]]:
    """BELOW: the reason for a bind of a path below the workspace that resolves outside
    it (the plugin resolves it; a broker binds nothing below the workspace root)."""
    return [
        (["--privileged"], "privileged containers are refused"),
        (["--cap-add", "SYS_ADMIN"], "added capabilities are refused"),
        (["-v", "/:/host"], "outside the workspace"),
        (["-v", f"{workspace}/etc-link:/x"], below),
        (["--pid", "host"], "PidMode=host"),
        (["--network", "host"], "NetworkMode=host"),
        (["--userns", "host"], "UsernsMode=host"),
        (["--device", "/dev/null"], "Devices are refused"),
        (["--security-opt", "systempaths=unconfined"], "MaskedPaths refused"),
        (["--security-opt", "seccomp=unconfined"], "SecurityOpt"),
        (["--cgroup-parent", "/"], "CgroupParent refused"),
        (["--oom-kill-disable"], "OomKillDisable refused"),
        (["--pids-limit", "-1"], "PidsLimit"),
        (["--log-driver", "syslog"], "log driver 'syslog' refused"),
        (["--cpu-rt-runtime", "1000"], "CpuRealtimeRuntime refused"),
    ]


def assert_refused(res, who: str, reason: str) -> None:
    """A docker CLI call refused by WHO ("kooi-authz" or "kooi broker") for REASON."""
    assert res.returncode != 0, res.stdout
    assert who in res.stderr and reason in res.stderr, res.stderr
