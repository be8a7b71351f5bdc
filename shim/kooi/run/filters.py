"""kooi's seccomp filter (kooi/seccomp.py), as each backend installs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import unavailable

NOTE = ("kooi's filter: no io_uring, bpf, perf_event_open, userfaultfd, handle syscalls, modules, "
        "kexec, keyring, mounts, namespaces, ptrace")
# Run by the image's python3 in containers of kooi's runner image (standard library only).
SOURCE = (Path(__file__).resolve().parents[1] / "seccomp.py").read_text()


def program(debugger: bool = False) -> bytes:
    """The compiled filter (BPF), for bwrap --seccomp; DEBUGGER: ptrace allowed."""
    from .. import seccomp

    try:
        return seccomp.program(debugger=debugger)
    except ValueError as exc:
        raise unavailable(str(exc)) from None


# How long after the run's own timeout the container's init kills everything: kooi run
# ends a run at its timeout; the init's deadline only matters when kooi run is gone.
DEADLINE_GRACE = 10


def stack_on_container(body: dict[str, Any], img_attrs: dict[str, Any], timeout: float | None = None,
                       nice: int | None = None, debugger: bool = False, idle: float | None = None) -> dict[str, Any]:
    """Stack kooi's filter on the engine's profile where the image is kooi's runner image
    (its python3 installs the filter, then executes the image's entrypoint and command).
    With TIMEOUT, that python3 is also the container's init, and kills every process of
    it TIMEOUT + DEADLINE_GRACE seconds after it started, whether or not kooi run is
    still there (kooi/seccomp.py). NICE: the workload's niceness (where no cgroup bounds
    its CPU time; the engine's own Ulimits cannot lower a priority). IDLE: a session's idle
timeout, which the init enforces too."""
    from .. import labels

    conf = img_attrs.get("Config") or {}
    if not (conf.get("Labels") or {}).get(labels.IMAGE):
        return {"engine": "default", "kooi": False,
                "note": "the engine's default profile only (kooi's filter is installed by the python3 of "
                        "kooi's runner image; this image is not one)"}
    program()
    # -S: no site processing; the filter needs the standard library only (~15 ms less per run).
    init = ["--deadline", f"{timeout + DEADLINE_GRACE:g}"] if timeout else []
    if init and idle:
        init += ["--idle", f"{idle:g}"]
    opts = (["--nice", str(nice)] if nice else []) + (["--debugger"] if debugger else [])
    body["Entrypoint"] = ["python3", "-I", "-S", "-c", SOURCE, "--", *init, *opts, *(conf.get("Entrypoint") or [])]
    if init:
        body["HostConfig"]["Init"] = False  # kooi's python3 is pid 1 (the engine's init would be)
    return {"engine": "default", "kooi": True, "note": NOTE + ", stacked on the engine's default profile"}
