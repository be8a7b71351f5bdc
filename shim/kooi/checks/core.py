"""Check registry and the context checks run in."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Callable

PASS, FAIL, NA = "pass", "fail", "na"


@dataclass(frozen=True)
class Result:
    id: str
    title: str
    status: str
    evidence: str
    threat: str

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    threat: str
    func: Callable[["object", "Context"], tuple[str, str]]
    modes: tuple[str, ...] = ("rootless", "userns_remap")

    def run(self, host, ctx: "Context") -> Result:
        if ctx.mode not in self.modes:
            return Result(self.id, self.title, NA, f"not applicable to engine mode {ctx.mode}",
                          self.threat)
        try:
            status, evidence = self.func(host, ctx)
        except Exception as exc:  # a check that crashes has not proven anything
            status, evidence = FAIL, f"check raised {type(exc).__name__}: {exc}"
        return Result(self.id, self.title, status, evidence, self.threat)


CHECKS: list[Check] = []


def check(id: str, title: str, threat: str, modes: tuple[str, ...] = ("rootless", "userns_remap")):
    def deco(func):
        if any(c.id == id for c in CHECKS):
            raise ValueError(f"duplicate check id {id}")
        CHECKS.append(Check(id, title, threat, func, modes))
        return func
    return deco


@dataclass
class Context:
    """What the host says about itself (/etc/kooi/engine.json) plus test settings."""

    engine: dict
    probe_image: str = "kooi-probe:latest"
    cache: dict = field(default_factory=dict)

    @property
    def mode(self) -> str:
        return self.engine.get("mode", "")

    @property
    def runner(self) -> str:
        return self.engine["runner_user"]

    @property
    def managed_subid_users(self) -> list[str]:
        users = [self.runner]
        if self.mode == "userns_remap" and self.engine.get("remap_user"):
            users.append(self.engine["remap_user"])
        return users

    @classmethod
    def from_host(cls, host, path: str = "/etc/kooi/engine.json", **kw) -> "Context":
        f = host.file(path)
        if not f.exists:
            raise RuntimeError(f"{path} is missing on the host: it was not provisioned by kooi")
        return cls(engine=json.loads(f.content_string), **kw)

    def as_runner(self, cmd: str) -> str:
        """A shell command line that runs `cmd` as the runner user with its engine."""
        env = [f"HOME={self.engine['runner_home']}", f"DOCKER_HOST=unix://{self.engine['socket']}"]
        if self.mode == "rootless":
            env.append(f"XDG_RUNTIME_DIR=/run/user/{self.engine['runner_uid']}")
        return (f"runuser -u {shlex.quote(self.runner)} -- env {' '.join(map(shlex.quote, env))} "
                f"sh -c {shlex.quote(cmd)}")


def run_all(host, ctx: Context, ids: list[str] | None = None) -> list[Result]:
    return [c.run(host, ctx) for c in CHECKS if ids is None or c.id in ids]
