"""The workload container's create body (the Engine API's ContainerCreate): the few
helpers the container backend and the brokered engine both edit it with."""

from __future__ import annotations

from typing import Any

WORKSPACE = "/workspace"  # where the project is mounted in the workload's container


def env_of(body: dict[str, Any]) -> dict[str, str]:
    """The environment of a create BODY as a mapping."""
    return dict(e.split("=", 1) if "=" in e else (e, "") for e in body.get("Env") or [])


def set_env(body: dict[str, Any], env: dict[str, str]) -> None:
    body["Env"] = [f"{k}={v}" for k, v in env.items()]


def bind(target: str, source: str, read_only: bool = False) -> dict[str, Any]:
    """A bind mount of SOURCE (host) at TARGET (container)."""
    return {"Target": target, "Source": source, "Type": "bind", "ReadOnly": read_only}
