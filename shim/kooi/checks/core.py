"""Check registry and the context checks run in."""

from __future__ import annotations

import importlib
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, overload

from ..hoststate import HostStateError, paths
from ..hoststate import engine as engine_state
from ..hoststate.engine import EngineConfig

if TYPE_CHECKING:
    from ..hoststate.apparmor import AppArmorState
    from ..hoststate.egress import EgressConfig
    from ..hoststate.fuse import FuseState
    from ..hoststate.images import Pin

PASS, FAIL, NA = "pass", "fail", "na"

# A testinfra host (testinfra.host.Host: local://, docker://, ssh://); testinfra has no type hints.
Host = Any
# What a check returns: (status, evidence).
Outcome = tuple[str, str]
CheckFunc = Callable[[Host, "Context"], Outcome]


@dataclass(frozen=True)
class Result:
    id: str
    title: str
    status: str
    evidence: str
    threat: str

    def as_dict(self) -> dict[str, str]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    threat: str
    func: CheckFunc
    modes: tuple[str, ...] = ("rootless", "userns_remap")
    # What the check looks at: "host" (files, units, the engine's answers: seconds),
    # "workload" (it starts containers or kooi runs and judges what they see) or
    # "image" (it scans the pinned image's files in a container of it). A host setting
    # changed since the engine started changes only what "host" checks see.
    scope: str = "host"

    def run(self, host: Host, ctx: Context) -> Result:
        if ctx.mode not in self.modes:
            return Result(self.id, self.title, NA, f"not applicable to engine mode {ctx.mode}",
                          self.threat)
        try:
            status, evidence = self.func(host, ctx)
        except Exception as exc:  # noqa: BLE001 - a check that crashes has not proven anything
            status, evidence = FAIL, f"check raised {type(exc).__name__}: {exc}"
        return Result(self.id, self.title, status, evidence, self.threat)


CHECKS: list[Check] = []


SCOPES = ("host", "workload", "image")


def check(id: str, title: str, threat: str, modes: tuple[str, ...] = ("rootless", "userns_remap"),
          scope: str = "host") -> Callable[[CheckFunc], CheckFunc]:
    def deco(func: CheckFunc) -> CheckFunc:
        if any(c.id == id for c in CHECKS):
            raise ValueError(f"duplicate check id {id}")
        if scope not in SCOPES:
            raise ValueError(f"check {id}: scope {scope!r} is not one of {SCOPES}")
        CHECKS.append(Check(id, title, threat, func, modes, scope))
        return func
    return deco


# The defaults, not this process's overrides (KOOI_*_CONFIG): the checked host's files.
DEFAULT_PATHS = {kind: paths.ALL[kind] for kind in ("engine", "images", "egress", "apparmor", "fuse")}


# The runner's commands find only the system's programs (not ~/.local/bin).
RUNNER_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class Context:
    """What the host says about itself (/etc/kooi/engine.json) plus test settings."""

    engine: EngineConfig
    probe_image: str = "kooi-probe:latest"
    cache: dict[str, Any] = field(default_factory=dict)
    # The OCI runtime whose self-test the ID-* checks judge: runc, or runsc where the
    # engine has gVisor (checks.confinement.per_runtime judges both in turn).
    workload_runtime: str = "runc"

    @property
    def mode(self) -> str:
        return self.engine.mode

    @property
    def runner(self) -> str:
        return self.engine.runner_user

    @property
    def managed_subid_users(self) -> list[str]:
        users = [self.runner]
        if self.mode == "userns_remap" and self.engine.remap_user:
            users.append(self.engine.remap_user)
        return users

    @classmethod
    def from_host(cls, host: Host, path: str = DEFAULT_PATHS["engine"], **kw: Any) -> Context:
        f = host.file(path)
        if not f.exists:
            raise RuntimeError(f"{path} is missing on the host: it was not provisioned by kooi")
        try:
            return cls(engine=engine_state.parse(f.content_string, path), **kw)
        except HostStateError as exc:
            raise RuntimeError(str(exc)) from None

    @overload
    def described(self, host: Host, kind: Literal["images"]) -> dict[str, Pin] | None: ...
    @overload
    def described(self, host: Host, kind: Literal["egress"]) -> EgressConfig | None: ...
    @overload
    def described(self, host: Host, kind: Literal["apparmor"]) -> AppArmorState | None: ...
    @overload
    def described(self, host: Host, kind: Literal["fuse"]) -> FuseState | None: ...

    def described(self, host: Host, kind: str) -> Any:
        """The host's description KIND (kooi.hoststate.KIND: images, egress, apparmor,
        fuse), parsed by the shim's own parser; None where the file does not exist.
        A malformed file raises (the check fails and says why)."""
        key = f"hoststate:{kind}"
        if key not in self.cache:
            mod = importlib.import_module(f"kooi.hoststate.{kind}")
            path = DEFAULT_PATHS[kind]
            f = host.file(path)
            self.cache[key] = mod.parse(f.content_string, path) if f.exists else None
        return self.cache[key]

    @property
    def runner_prefix(self) -> str:
        """What goes before a command that runs as the runner, from root's checks: the
        runner's files may be a workload's (a .pth in ~/.local, ~/.docker/config.json),
        so the command gets no terminal of root's (its own session: TIOCSTI cannot type
        into root's; stdin from /dev/null), a clean environment and PATH, and Python
        in isolated mode (`python3 -I`, by the callers)."""
        return f"</dev/null {self.runner_session}"

    @property
    def runner_session(self) -> str:
        """runner_prefix without the stdin redirection (for a here-document of root's)."""
        return (f"setsid -w runuser -u {shlex.quote(self.runner)} -- env -i {RUNNER_PATH} "
                f"HOME={shlex.quote(self.engine.runner_home)} LANG=C.UTF-8")

    def runner_text(self, host: Host, path: str | None) -> str:
        """The text of PATH as the runner reads it ("" where it cannot): for files in
        the runner's directories (a run's log), which a workload that became the runner
        could have turned into a link to a file only root may read."""
        if not path:
            return ""
        res = host.run(f"{self.runner_prefix} cat -- {shlex.quote(path)}")
        return res.stdout if res.rc == 0 else ""

    def as_runner(self, cmd: str) -> str:
        """A shell command line that runs `cmd` as the runner user with its engine."""
        env = [f"DOCKER_HOST=unix://{self.engine.socket}"]
        if self.mode == "rootless":
            env.append(f"XDG_RUNTIME_DIR=/run/user/{self.engine.runner_uid}")
        return f"{self.runner_prefix} {' '.join(map(shlex.quote, env))} sh -c {shlex.quote(cmd)}"


def scratch(host: Host, ctx: Context) -> str:
    """A directory of the verifying user's own (0700) for the results of the runs the
    checks start: never the runner's run directory, where the runner swapped its own
    file onto root's temporary result and forged RUN-* verdicts (review 17)."""
    if "scratch" not in ctx.cache:
        res = host.run("mktemp -d /tmp/kooi-verify.XXXXXXXXXX")
        if res.rc != 0 or not res.stdout.strip().startswith("/tmp/kooi-verify."):
            raise RuntimeError(f"cannot make a scratch directory: {res.stderr.strip()}")
        ctx.cache["scratch"] = res.stdout.strip()
    return str(ctx.cache["scratch"])


def run_all(host: Host, ctx: Context, ids: list[str] | None = None) -> list[Result]:
    try:
        return [c.run(host, ctx) for c in CHECKS if ids is None or c.id in ids]
    finally:
        if "scratch" in ctx.cache:
            host.run(f"rm -rf {shlex.quote(ctx.cache.pop('scratch'))}")
