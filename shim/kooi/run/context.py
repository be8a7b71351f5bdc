"""The run context: built once per run from the workflow and the host's state, then
handed to the backend. What the host is meant to enforce (engine.json), its egress and
AppArmor descriptions are read here, as root before the privilege drop where they
must be, and nowhere else in a run."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .. import apparmor
from ..hoststate import HostStateError
from ..hoststate import apparmor as apparmor_state
from ..hoststate import egress as egress_state
from ..hoststate import limits as limits_state
from ..hoststate import secrets as secrets_state
from ..hoststate.apparmor import AppArmorState
from ..hoststate.egress import EgressConfig
from ..hoststate.engine import EngineConfig
from ..hoststate.secrets import SecretsConfig
from ..workflow import Workflow
from . import runnet
from .errors import Log, Result, refused, unavailable
from .guard import Guard, GuardError

T = TypeVar("T")


@dataclass
class SessionRun:
    """What `kooi session start` adds to a run (run.session): whose session it is, the
    engine volume kept as its home, and whom to tell once its container runs."""

    person: str
    home: str
    started: Callable[[RunContext], None] | None = None


@dataclass
class RunContext:
    wf: Workflow
    cfg: EngineConfig
    project: Path
    run_id: str
    run_dir: Path
    res: Result
    log: Log
    interrupted: Callable[[], int | None]
    # Host state, read once (load_host_state): None where off by intent.
    egress: EgressConfig | None = None
    apparmor: AppArmorState | None = None
    secrets: SecretsConfig | None = None
    guard: Guard | None = None
    record: Path | None = None  # run.deadrun's record, dropped once the run's result is written
    # The run's limits (the workflow's, the host's defaults for the rest; run.limits)
    # and where each came from ("workflow" or "default").
    limits: dict[str, Any] = field(default_factory=lambda: dict(limits_state.BUILTIN))
    limit_origin: dict[str, str] = field(default_factory=dict)
    # The proxy port this run holds (egress_preflight): a per-run port where one is free.
    proxy_port: int = 0
    proxy_port_lock: int | None = None
    proxy_since: float = 0.0
    proxy_log_position: tuple[int, int] = (0, 0)
    cleanups: list[Callable[[], None]] = field(default_factory=list)
    session: SessionRun | None = None

    def confinement(self, decide: Callable[[AppArmorState | None], T]) -> T:
        """DECIDE(state) with /etc/kooi/apparmor.json; a host whose profiles are not in
        force as the role left them cannot run (exit 125, not an unconfined run)."""
        try:
            return decide(self.apparmor)
        except apparmor.AppArmorError as exc:
            raise unavailable(str(exc)) from None

    def shadows(self) -> list[tuple[str, Path]]:
        """The throwaway git directories (and `.git` files) to mount over the project's
        while the workload runs, with git's data bound in (run.guard): (path in the
        project, host path), parents first. guard.nested_shadows: the same for the
        containers the workload starts."""
        if self.guard is None:
            return []
        try:
            return self.guard.shadows(self.run_dir / "shadows" / self.run_id)
        except (GuardError, OSError) as exc:
            raise refused(f"project: cannot make the throwaway copies of its git directories ({exc})") from None

    def egress_preflight(self) -> EgressConfig | None:
        """The host's egress if the workload gets a network (network: proxy,
        testcontainers): the rules must be in force for the runner before it does (an
        engine started without them would reach anything); a proxy that is down only
        means no egress at all, which is said, not refused."""
        if not self.wants_network:
            return None
        from .. import egress

        eg = self.egress
        if eg is None:
            if self.wf.network == "proxy":
                raise refused(f"workflow {self.wf.name} asks for network: proxy, but this host has no egress "
                              "control (kooi_egress_enabled=false); enable it and re-run site.yml")
            return None
        ok, why = egress.rules_enforced(eg)
        if not ok:
            raise unavailable(f"the egress rules are not in force for {os.geteuid()} ({why}); run `kooi egress "
                              "start` as root (hosts without systemd, after a reboot) or re-run site.yml")
        up, detail = egress.proxy_up(eg)
        self.res.egress = {"proxy": "", "rules": why, "proxy_up": up}
        if not up:
            self.res.warn(self.log, f"{detail}: the workload has no egress at all (start it: kooi egress start)")
        self._hold_run_port(eg)
        return eg

    def _hold_run_port(self, eg: EgressConfig) -> None:
        """Hold a per-run proxy port (a lock for as long as the run lasts), so the
        proxy's log tells this run's requests from any other's; none a dead run's rules
        still name (run.runnet)."""
        import fcntl

        from .. import egress

        self.proxy_port = eg.port
        taken: set[int] = set()
        try:
            taken = runnet.ports_in_use(self.cfg)
        except runnet.RunNetError as exc:
            self.res.warn(self.log, f"egress: cannot read the runs' ways to the host ({exc})")
        for port in range(eg.run_port_first, eg.run_port_first + eg.run_port_count):
            if port in taken:
                continue  # a dead run's, whose container may still use it (run.runnet)
            fd = os.open(self.run_dir / "locks" / f"egress-port-{port}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.proxy_port, self.proxy_port_lock, self.proxy_since = port, fd, time.time()
            self.proxy_log_position = egress.run_log_position(eg)
            return
        if eg.run_port_count:
            self.res.warn(self.log, f"all {eg.run_port_count} per-run proxy ports are in use: this run shares "
                          f"port {eg.port}, and its egress refusals cannot be told from other runs'")

    def release_run_port(self) -> None:
        """After the run: the proxy's record of it into the result, and the port free."""
        if self.proxy_port_lock is None or self.egress is None or self.res.egress is None:
            return
        from .. import egress

        time.sleep(0.2)  # the proxy logs a request when it ends
        if self.res.egress.get("proxy_up"):
            up, detail = egress.proxy_up(self.egress)
            if not up:
                self.res.egress["proxy_up"] = False
                self.res.warn(self.log, f"egress: the proxy stopped during the run ({detail}): from then on the "
                                        "workload had no egress at all; start it again (kooi egress start, or "
                                        "systemctl restart kooi-egress)")
        rec = egress.run_record(self.egress, self.proxy_port, self.proxy_since, time.time(),
                                self.proxy_log_position)
        self.res.egress.update(rec)
        for r in rec["refused"]:
            self.log.note(f"egress: the proxy refused {r['method']} {r['host']} ({r['status']})"
                          + (f", {r['count']} times" if r.get("count", 1) > 1 else ""))
        if rec.get("refused_omitted"):
            self.res.warn(self.log, f"egress: {rec['refused_omitted_note']}")
        os.close(self.proxy_port_lock)
        self.proxy_port_lock = None

    @property
    def wants_network(self) -> bool:
        return self.wf.network == "proxy" or self.wf.testcontainers


def load_host_state(cfg: EngineConfig, wf: Workflow) -> tuple[EgressConfig | None, AppArmorState | None,
                                                             SecretsConfig | None]:
    """The egress, AppArmor and secrets descriptions (as root: kooi run reads them
    before it drops)."""
    try:
        eg = egress_state.load_for(cfg) if (wf.network == "proxy" or wf.testcontainers) else None
        aa = apparmor_state.load()
        sc = secrets_state.load() if wf.secrets else None
    except HostStateError as exc:
        raise unavailable(str(exc)) from None
    return eg, aa, sc
