"""`kooi session`: a person's long-lived, caged container for one project (docs/sessions.md).

A session is a run (run.execute, the same backend, checks and result record) of a
session workflow, supervised by a `kooi` process of its own that outlives the command
that started it and writes the result when the session ends; run.session says how its
container differs from a run's. The engine's labels are the list of sessions: whose
(org.kooi.person), which workflow, which run. A person sees and enters only their own
sessions; root and the runner see all of them.

Every entry is `docker exec` on the runner's engine into the session's container,
through kooi's filter (run.session.entry): a terminal (`attach`, tmux's, with its
scrollback, several at once) or one command (`exec`).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import engineapi, labels, workflow
from .hoststate.engine import EngineConfig
from .run.errors import EXIT_INVALID, EXIT_REFUSED, EXIT_UNAVAILABLE


class SessionError(Exception):
    """A session command that cannot be carried out; CODE is its exit code."""

    def __init__(self, message: str, code: int = EXIT_INVALID) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Caller:
    """Who asks: the person whose sessions these are, and whether they see everyone's."""

    person: str
    sees_all: bool


@dataclass(frozen=True)
class Session:
    """One session, as the engine's labels and state describe it."""

    person: str
    workflow: str
    run_id: str
    project: str
    container: str
    running: bool
    started: str
    supervised: bool  # its kooi supervisor is alive (it writes the result)
    lock: str = ""  # the run lock its supervisor holds (labels.lock_key_of)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "lock"}


def caller(cfg: EngineConfig, person: str | None = None) -> Caller:
    """The caller: root or the runner (who own every session), acting for PERSON (by
    default the name of the account that calls)."""
    if os.geteuid() not in (0, cfg.runner_uid):
        raise SessionError(f"kooi session runs as root or the runner user {cfg.runner_user}, not as uid "
                           f"{os.geteuid()}", EXIT_REFUSED)
    name = person or pwd.getpwuid(os.getuid()).pw_name
    if not workflow.NAME_RE.match(name):
        raise SessionError(f"{name!r} is not a person's name (lower-case letters, digits, . _ -)")
    return Caller(name, True)


def _client(cfg: EngineConfig) -> engineapi.Engine:
    try:
        return engineapi.connect(cfg)
    except engineapi.EngineError as exc:
        raise SessionError(str(exc), EXIT_UNAVAILABLE) from None


def find(cfg: EngineConfig, who: Caller, name: str | None = None, everyone: bool = False,
         run_dir: Path | None = None) -> list[Session]:
    """The sessions WHO may see (EVERYONE: all of them, where WHO sees all), of workflow
    NAME if given, newest first."""
    from .run import RUN_DIR
    from .run.project import lock_held

    flt = [f"{labels.SESSION}=1"]
    if not (everyone and who.sees_all):
        flt.append(f"{labels.PERSON}={who.person}")
    if name:
        flt.append(f"{labels.WORKFLOW}={name}")
    try:
        found = _client(cfg).request("GET", "/containers/json",
                                     query={"all": "1", "filters": json.dumps({"label": flt})}) or []
    except (engineapi.APIError, OSError) as exc:
        raise SessionError(f"the engine does not list containers: {exc}", EXIT_UNAVAILABLE) from None
    locks = (run_dir or RUN_DIR) / "locks"
    out = []
    for c in found:
        lab = c.get("Labels") or {}
        if lab.get(labels.NESTED) == "1":
            continue  # a workload's container, whatever its image says (review 45)
        lock = labels.lock_key_of(lab)
        out.append(Session(person=lab.get(labels.PERSON, "?"), workflow=lab.get(labels.WORKFLOW, "?"),
                           run_id=lab.get(labels.RUN, "?"), project=lab.get(labels.PROJECT, "?"), container=c["Id"],
                           running=c.get("State") == "running",
                           started=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(c.get("Created") or 0))),
                           supervised=lock_held(locks / lock), lock=lock))
    return sorted(out, key=lambda s: s.started, reverse=True)


def one(cfg: EngineConfig, who: Caller, name: str | None) -> Session:
    """WHO's one running session (of workflow NAME, which may be left out when WHO has
    only one)."""
    live = [s for s in find(cfg, who, name) if s.running]
    if len(live) == 1:
        return live[0]
    if not live:
        raise SessionError(f"{who.person} has no running session" + (f" of {name}" if name else "")
                           + "; start one with `kooi session start WORKFLOW`", 3)
    raise SessionError(f"{who.person} has {len(live)} running sessions ({', '.join(s.workflow for s in live)}): "
                       "name the workflow")


def as_runner(cfg: EngineConfig) -> None:
    """Everything after the caller's check runs as the runner (root drops to it), who
    owns the engine and the run directory."""
    from .run.identity import drop_to_runner

    drop_to_runner(cfg)


def start(cfg: EngineConfig, who: Caller, name: str, project: Path, timeout: float = 600.0,
          workflow_dir: Path | None = None, engine_config: Path | None = None) -> dict[str, Any]:
    """Start WHO's session of workflow NAME on PROJECT, supervised by a process of its
    own; returns once its container runs ({"started": run id, "log": ...}) or the run
    ended before that ({"result": the run's result})."""

    try:
        wf = workflow.load(name, workflow_dir or workflow.WORKFLOW_DIR)
    except workflow.WorkflowError as exc:
        raise SessionError(str(exc)) from None
    if wf.session is None:
        raise SessionError(f"{wf.path}: not a session workflow (no key 'session'); run it with `kooi run {name}`")
    # One start at a time per person and workflow, from the look for a running one until
    # it runs (review 14: two at once, e.g. VS Code's parallel SSH connections, both
    # started, on one kept home, and every later command refused the pair).
    lock = _take_start_lock(cfg, who.person, name, timeout)
    try:
        return _start_locked(cfg, who, name, project, wf, timeout, workflow_dir, engine_config, lock)
    finally:
        os.close(lock)


def start_lock_path(run_dir: Path, person: str, name: str) -> Path:
    """The start lock of PERSON's sessions of workflow NAME: `+` is in neither name
    (review 49: `alice.x`'s of `y` and `alice`'s of `x.y` shared `alice.x.y`, and one
    person's logins held the other's start and reset)."""
    return run_dir / "sessions" / f"{person}+{name}.start-lock"


def _take_start_lock(cfg: EngineConfig, person: str, name: str, timeout: float) -> int:
    from .run import RUN_DIR

    return _start_lock(start_lock_path(RUN_DIR, person, name), timeout, cfg.runner_uid, cfg.runner_gid)


def _start_lock(path: Path, timeout: float, runner_uid: int, runner_gid: int) -> int:
    import fcntl

    try:
        if os.geteuid() == 0:
            # The runner's, as every directory of the run state (one that root's first
            # start made root's refused the runner's stop marks there, and every `kooi
            # session stop` failed): made, or given back, without following a link.
            try:
                os.mkdir(path.parent, 0o755)
            except FileExistsError:
                pass
            st = os.lstat(path.parent)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == 0:
                os.chown(path.parent, runner_uid, runner_gid, follow_symlinks=False)
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        if os.geteuid() == 0:
            os.fchown(fd, runner_uid, -1)  # the runner (the SSH gate) takes it too
    except OSError as exc:
        raise SessionError(f"cannot take {path} ({exc.strerror or exc}); re-run site.yml", EXIT_UNAVAILABLE) from None
    end = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > end:
                os.close(fd)
                raise SessionError(f"another start of this session holds {path} for {timeout:g} s", 75) from None
            time.sleep(0.1)


def _start_locked(cfg: EngineConfig, who: Caller, name: str, project: Path, wf: Any, timeout: float,
                  workflow_dir: Path | None, engine_config: Path | None, lock: int) -> dict[str, Any]:
    from .run.context import SessionRun
    from .run.execute import execute
    from .run.session import home_volume

    if any(s.running for s in find(cfg, who, name)):
        raise SessionError(f"{who.person}'s session of {name} is running already: `kooi session attach {name}`", 75)
    home = home_volume(who.person, name)
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() == 0:  # the supervisor: detached from the caller's session and terminal
        code = 0
        try:
            os.close(r)
            os.close(lock)  # the start lock is the caller's, until the session runs (a flock is shared on fork)
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)

            def tell(doc: dict[str, Any]) -> None:
                try:
                    os.write(w, (json.dumps(doc) + "\n").encode())
                except OSError:
                    pass  # the caller went away: the session goes on, its result is written

            res = execute(name, project, None, echo=None, workflow_dir=workflow_dir, engine_config=engine_config,
                          session=SessionRun(who.person, home, lambda ctx: tell(
                              {"started": ctx.run_id, "log": ctx.res.log, "home": home})))
            tell({"result": res.as_dict()})
        except BaseException as exc:  # noqa: BLE001 - the supervisor never returns into the caller's code
            code = 70
            # Said to a caller still waiting for the first word (a session that never
            # started), not "ended without a word".
            try:
                os.write(w, (json.dumps({"result": {"message": f"the session's supervisor failed: "
                                                               f"{exc.__class__.__name__}: {exc}",
                                                    "exit_code": 70}}) + "\n").encode())
            except OSError:
                pass
        finally:
            os._exit(code)
    os.close(w)
    return _first_word(r, timeout)


def _first_word(fd: int, timeout: float) -> dict[str, Any]:
    import select

    buf = b""
    end = time.monotonic() + timeout
    try:
        while b"\n" not in buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise SessionError(f"the session did not start within {timeout:g} s; see `kooi session list` and "
                                   "its log", EXIT_UNAVAILABLE)
            chunk = os.read(fd, 65536)
            if not chunk:
                raise SessionError("the session's supervisor ended without a word; see the run logs", 70)
            buf += chunk
    finally:
        os.close(fd)
    doc: dict[str, Any] = json.loads(buf.split(b"\n", 1)[0])
    return doc


def entry_argv(cfg: EngineConfig, s: Session, argv: list[str], tty: bool, interactive: bool = True) -> list[str]:
    """The docker CLI command line that enters session S with ARGV (run.session.entry
    wraps it in kooi's filter), as the image's user, in the workflow's directory."""
    docker = shutil.which("docker")
    if docker is None:
        raise SessionError("the docker command line is missing (Debian: docker.io or docker-cli)", EXIT_UNAVAILABLE)
    env = ["-e", "KOOI_INIT_TOKEN="]  # the init's secret is not the entries' to see
    if tty:
        env += ["-e", f"TERM={os.environ.get('TERM') or 'xterm-256color'}"]
    return [docker, "--host", f"unix://{cfg.socket}", "exec", *(["-i"] if interactive else []),
            *(["-t"] if tty else []), *env, s.container, *argv]


def docker_env(cfg: EngineConfig) -> dict[str, str]:
    """The docker CLI's environment: nothing of the runner's CLI configuration (plugins,
    credential helpers, contexts) is read."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "TERM", "LANG", "LC_ALL", "HOME", "USER")}
    return {**keep, "DOCKER_CONFIG": "/nonexistent/kooi", "DOCKER_CLI_HINTS": "false"}


def debugger_of(cfg: EngineConfig, s: Session) -> bool:
    """Whether the session's filter allows a debugger (its workflow said so at start)."""
    try:
        ins = _client(cfg).inspect(s.container)
    except (engineapi.APIError, OSError) as exc:
        raise SessionError(f"the engine does not describe {s.container[:12]}: {exc}", EXIT_UNAVAILABLE) from None
    ep = (ins.get("Config") or {}).get("Entrypoint") or []
    return "--debugger" in ep[: ep.index("--") + 4] if "--" in ep else False


def stop(cfg: EngineConfig, who: Caller, name: str | None, timeout: float = 120.0,
         run_dir: Path | None = None) -> dict[str, Any]:
    """End WHO's session (of workflow NAME): its terminal server is asked to end
    (SIGTERM), then killed after 20 s; returns its result once its supervisor, or a
    finisher in its place, wrote it."""
    from .run import RUN_DIR
    from .run.session import stop_mark

    run_dir = run_dir or RUN_DIR
    s = one(cfg, who, name)
    client = _client(cfg)
    mark = stop_mark(run_dir, s.run_id)
    mark.parent.mkdir(mode=0o755, exist_ok=True)
    mark.touch()
    try:
        client.request("POST", f"/containers/{s.container}/kill", query={"signal": "SIGTERM"})
        if client.wait(s.container, timeout=20) is None:
            client.kill(s.container)
    except engineapi.NotFound:
        pass
    except (engineapi.APIError, OSError) as exc:
        raise SessionError(f"cannot stop {s.workflow}: {exc}", EXIT_UNAVAILABLE) from None
    from .run.project import lock_held

    result = run_dir / "results" / f"{s.run_id}.json"
    lock = run_dir / "locks" / s.lock
    end = time.monotonic() + timeout
    while not result.exists() and time.monotonic() < end:
        if not lock_held(lock):
            from .run import deadrun

            deadrun.finish_all(run_dir, cfg)  # its supervisor died: finish it here, as gc would
            break
        time.sleep(0.5)
    mark.unlink(missing_ok=True)
    if not result.exists():
        raise SessionError(f"{s.workflow}'s session ended, but its result is not written yet ({result})", 70)
    doc: dict[str, Any] = json.loads(result.read_text())
    return doc


def reset(cfg: EngineConfig, who: Caller, name: str, timeout: float = 60) -> str:
    """Remove WHO's kept home for sessions of workflow NAME (none may be running)."""
    # Under the start lock (review 48: a reset between a start's look at the home and its
    # container's create removed the home; the engine made an unlabelled one in its
    # place, and every later start and reset of that person's session refused it).
    lock = _take_start_lock(cfg, who.person, name, timeout)
    try:
        return _reset_locked(cfg, who, name)
    finally:
        os.close(lock)


def _reset_locked(cfg: EngineConfig, who: Caller, name: str) -> str:
    from .run.session import home_volume

    if any(s.running for s in find(cfg, who, name)):
        raise SessionError(f"{who.person}'s session of {name} is running: `kooi session stop {name}` first", 75)
    vol = home_volume(who.person, name)
    client = _client(cfg)
    try:
        info = client.request("GET", f"/volumes/{vol}")
    except engineapi.NotFound:
        return f"{who.person} has no kept home for {name}"
    except (engineapi.APIError, OSError) as exc:
        raise SessionError(f"the engine does not answer: {exc}", EXIT_UNAVAILABLE) from None
    if (info.get("Labels") or {}) != {**(info.get("Labels") or {}), **labels.home_labels(who.person, name)}:
        # its own person's and workflow's (review 45: alice.x's `y` and alice's `x.y` share a name)
        raise SessionError(f"volume {vol} is not {who.person}'s kept home of {name}; not removing it", EXIT_REFUSED)
    try:
        # Exited session containers of this home (kept for nothing) go first.
        for s in find(cfg, who, name):
            client.remove(s.container)
        client.request("DELETE", f"/volumes/{vol}")
    except (engineapi.APIError, OSError) as exc:
        raise SessionError(f"cannot remove {vol}: {exc}", EXIT_UNAVAILABLE) from None
    return f"removed {who.person}'s kept home for {name} ({vol})"


def homes(cfg: EngineConfig, who: Caller, everyone: bool = False) -> list[dict[str, str]]:
    """The kept homes WHO may see: person, workflow, volume."""
    flt = [f"{labels.HOME}=1"] + ([] if everyone and who.sees_all else [f"{labels.PERSON}={who.person}"])
    try:
        vols = (_client(cfg).request("GET", "/volumes", query={"filters": json.dumps({"label": flt})}) or {})
    except (engineapi.APIError, OSError) as exc:
        raise SessionError(f"the engine does not list volumes: {exc}", EXIT_UNAVAILABLE) from None
    return sorted(({"person": (v.get("Labels") or {}).get(labels.PERSON, "?"),
                    "workflow": (v.get("Labels") or {}).get(labels.WORKFLOW, "?"), "volume": v["Name"]}
                   for v in vols.get("Volumes") or []), key=lambda h: (h["person"], h["workflow"]))
