"""`testcontainers: true`: a policed engine of the run's own for the container backend.

A network of the run's own, a kooi broker on a socket that is mounted as the
workload's only engine socket, and cleanup of everything the run created (by label)
when it ends. The broker (kooi/broker.py) reads every request body and applies the
request policy (kooi/policy.py) before anything reaches the engine.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from .. import engineapi, labels
from ..engineapi import Engine
from .context import RunContext
from .errors import EXIT_ERROR, Result, RunError, unavailable
from .spec import WORKSPACE, bind, env_of, set_env

ENGINE_SOCKET = "/run/kooi/docker.sock"  # where a testcontainers workload finds the broker
# The name of the run network's gateway in the workload's /etc/hosts: where published
# ports are reached. A name, not the address: testcontainers-python without connection
# modes (4.8.2 and older) compares TC_HOST with the container's gateway address and, when
# they match, takes itself for a container on the same bridge and returns the container's
# own port, an int (the getting-started guide's `os.environ["DB_PORT"] =
# ...get_exposed_port(5432)` failed).
ENGINE_HOST = "engine.kooi.internal"


def testcontainers_env() -> dict[str, str]:
    """What Java, Python, Node and Go Testcontainers need to use the broker: the socket
    (also for a Ryuk mount, which the broker answers with itself), no Ryuk (the run
    cleans up by label), and the host where published ports are reached."""
    return {"TESTCONTAINERS_DOCKER_SOCKET_OVERRIDE": ENGINE_SOCKET, "TESTCONTAINERS_RYUK_DISABLED": "true",
            "TESTCONTAINERS_HOST_OVERRIDE": ENGINE_HOST, "TC_HOST": ENGINE_HOST,
            # Python: containers by their own address on their own network (the
            # workload is on every network of the run), not a published port.
            "TESTCONTAINERS_CONNECTION_MODE": "bridge_ip",
            # Java's start-up checks run an image from a registry (none is reachable).
            "TESTCONTAINERS_CHECKS_DISABLE": "true"}


class BrokeredEngine:
    """`testcontainers: true`: a network of the run's own, a kooi broker on a socket
    that is mounted as the workload's only engine socket, and cleanup of everything
    the run created (by label) when it ends."""

    def __init__(self, client: Engine, ctx: RunContext, apparmor_profile: str | None = None):
        self.client, self.cfg, self.run_id = client, ctx.cfg, ctx.run_id
        self.project, self.run_dir, self.log = ctx.project, ctx.run_dir, ctx.log
        self.run_labels = labels.run_labels(ctx.wf.name, str(ctx.project), ctx.run_id)
        self.apparmor = apparmor_profile  # what the containers the workload starts get too
        # isolation gvisor: the containers the workload starts run under runsc too.
        self.gvisor = ctx.res.isolation == "gvisor" and ctx.cfg.gvisor is not None
        self.broker: Any = None
        self.network: dict[str, Any] | None = None  # its inspection
        self.gateway: str | None = None

    def open(self, body: dict[str, Any], limits: dict[str, int] | None = None,
             shadows: list[tuple[str, Path]] | None = None, bridges: tuple[str, ...] = ()) -> None:
        """Create the run's network and broker, and point the workload's create BODY at
        them. BRIDGES: the names of the run's bridges (run.runnet), its own network's
        first; none: the engine names them. LIMITS: the run's (run.limits.Plan.ceilings), forced on and the most for
        every container the workload starts. SHADOWS: the guard's throwaway copies
        (path in the project, copy), mounted over the same paths in every container of
        the run that binds the workspace."""
        from .. import broker, egress
        from ..policy import Policy

        name = f"kooi-{self.run_id}"
        self.network = self.client.create_network(name, self.run_labels,
                                                  options={engineapi.BRIDGE_NAME: bridges[0]} if bridges else None)
        self.gateway = gateway = egress.gateway(self.network)
        if not gateway:
            raise unavailable(f"the run network {name} has no gateway address")
        sock_dir = self.run_dir / "brokers"
        sock_dir.mkdir(mode=0o700, exist_ok=True)
        os.chmod(sock_dir, 0o700)
        path = sock_dir / f"{secrets.token_hex(8)}.sock"
        if len(str(path)) > 100:
            raise RunError("error", EXIT_ERROR, f"the broker socket path {path} is too long for a unix socket; "
                           "use a shorter KOOI_RUN_DIR")
        scope = broker.RunScope(self.run_id, labels.nested_labels(self.run_id, self.run_labels),
                                network=name,
                                socket_aliases=(ENGINE_SOCKET,), path_map={WORKSPACE: str(self.project)})
        scope.apparmor = self.apparmor
        scope.shadows = tuple((rel, str(copy)) for rel, copy in shadows or [])
        scope.limits = dict(limits or {})
        scope.bridges = tuple(bridges[1:])
        runtimes: tuple[str, ...] = Policy.runtimes
        if self.gvisor and self.cfg.gvisor is not None:
            scope.runtime = self.cfg.gvisor.runtime
            runtimes = (scope.runtime,)
        # Binds only of the workspace itself (and the shadows): what the engine resolves
        # again at start must be nothing the workload can change (policy.Policy.whole_roots).
        policy = Policy(workspace=str(self.project), apparmor_profiles=(self.apparmor,) if self.apparmor else (),
                        limits=dict(limits or {}), runtimes=runtimes, whole_roots=True,
                        fixed_sources=tuple(copy for _, copy in scope.shadows))
        self.broker = broker.Broker(str(path), self.cfg.socket, policy, scope, log=self.log.note)
        self.broker.start(mode=0o666)
        host_config = body["HostConfig"]
        # A network namespace of the workload's own on every engine: the run's network.
        # Published ports stay inside the engine's namespace (userland-proxy off, also
        # on rootless: roles/engine_common), where hairpin NAT answers them at this
        # network's gateway.
        host_config["NetworkMode"] = name
        host_config["Mounts"].append(bind(ENGINE_SOCKET, str(path)))
        host_config["ExtraHosts"] = [*(host_config.get("ExtraHosts") or []), f"{ENGINE_HOST}:{gateway}"]
        set_env(body, {**testcontainers_env(), **env_of(body), "DOCKER_HOST": f"unix://{ENGINE_SOCKET}"})
        self.log.note(f"testcontainers: broker at {ENGINE_SOCKET}, network {name} "
                      f"(published ports at {ENGINE_HOST}, {gateway})")

    def protect(self, container_id: str) -> None:
        """The workload's own container stays out of the broker's reach (no update of
        its limits, no exec, no commit)."""
        if self.broker:
            self.broker.scope.protected.add(container_id)
            # Its own network namespace: join every network the run creates.
            self.broker.scope.attach = container_id

    def close(self, res: Result) -> None:
        from .. import broker

        if self.broker:
            self.broker.stop()
            res.broker = self.broker.summary()
        if self.network is None:
            return
        try:
            res.cleanup = broker.cleanup(self.cfg.socket, self.run_id)
        except OSError as exc:
            res.cleanup = {"failed": [f"cleanup: {exc}"]}
        if res.cleanup.get("failed"):
            msg = (f"could not remove what the run created: {', '.join(res.cleanup['failed'])}; "
                   "`kooi gc` retries")
            res.warnings.append(msg)
            self.log.note(f"warning: {msg}")
        else:
            n = sum(len(v) for k, v in res.cleanup.items() if k != "failed")
            self.log.note(f"testcontainers: removed {n} object(s) the run created")
