"""The engine roles' seccomp profile filter (roles/kooi_defaults/filter_plugins)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROLE = Path(__file__).resolve().parents[2] / "roles/engine_common"
spec = importlib.util.spec_from_file_location("kooi_seccomp_filter", ROLE / "filter_plugins/kooi_seccomp.py")
flt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(flt)

IO_URING = ["io_uring_setup", "io_uring_enter", "io_uring_register"]


def allowed(profile: dict) -> set[str]:
    return {n for r in profile["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" for n in r["names"]}


def test_the_vendored_default_is_docker_20_10s_and_allows_io_uring():
    profile = json.loads((ROLE / "files/seccomp/docker-20.10-default.json").read_text())
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    assert set(IO_URING) <= allowed(profile)
    assert {"read", "write", "clone", "execve"} <= allowed(profile)


def test_the_vendored_26_1_default_refuses_io_uring_and_allows_tracing_until_kooi_removes_it():
    """Debian 13's docker.io 26.1: io_uring is refused already; ptrace and
    process_vm_readv/writev are allowed (conditionally) until kooi's filter removes them."""
    profile = json.loads((ROLE / "files/seccomp/docker-26.1-default.json").read_text())
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    assert not set(IO_URING) & allowed(profile)
    tracing = {"ptrace", "process_vm_readv", "process_vm_writev"}
    assert tracing <= allowed(profile) and {"read", "clone3", "execve"} <= allowed(profile)
    out = flt.kooi_seccomp_refuse(profile, sorted(tracing))
    assert allowed(out) == allowed(profile) - tracing


def test_refusing_io_uring_removes_exactly_those_names():
    profile = json.loads((ROLE / "files/seccomp/docker-20.10-default.json").read_text())
    out = flt.kooi_seccomp_refuse(profile, IO_URING)
    assert allowed(out) == allowed(profile) - set(IO_URING)
    assert not set(IO_URING) & allowed(out)
    # Everything else, conditional rules included, is untouched, and the input is not modified.
    assert [r for r in out["syscalls"] if r["names"] != [n for n in r["names"] if n not in IO_URING]] == []
    assert len(out["syscalls"]) == len(profile["syscalls"])
    assert {k: v for k, v in out.items() if k != "syscalls"} == {k: v for k, v in profile.items() if k != "syscalls"}
    assert set(IO_URING) <= allowed(profile)


def test_a_rule_left_without_names_is_dropped_and_errno_rules_stay():
    profile = {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
        {"names": ["bpf"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["bpf", "read"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["bpf"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]}
    out = flt.kooi_seccomp_refuse(profile, ["bpf"])
    assert out["syscalls"] == [{"names": ["read"], "action": "SCMP_ACT_ALLOW"},
                               {"names": ["bpf"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]


@pytest.mark.parametrize("profile, names, message", [
    ({"syscalls": "x"}, ["bpf"], "not a Docker seccomp profile"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []}, ["bpf"], "would allow what it removes"),
    ({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": []}, "bpf", "list of syscall names"),
])
def test_bad_input_is_a_clear_error(profile, names, message):
    with pytest.raises(flt.AnsibleFilterError, match=message):
        flt.kooi_seccomp_refuse(profile, names)
