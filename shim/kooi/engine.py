"""`kooi engine start|stop|status`: the runner's container engine, on demand.

On systemd hosts the roles install a user unit (rootless) or configure docker.service
(userns-remap), and this module asks systemd. On hosts without systemd (WSL2 without
systemd, minimal VMs, CI machines) it runs the very same launcher, with the same
root-owned configuration, as the runner user and keeps a root-owned pid file.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions

from .drift import drift
from .engineapi import EngineError as EngineError  # re-exported: the engine commands raise it
from .hoststate import paths
from .hoststate.engine import EngineConfig
from .neutral import one_line

STATE_DIR = Path(os.environ.get("KOOI_STATE_DIR", paths.ENGINE_STATE_DIR))
START_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0


@dataclass
class Status:
    running: bool
    mode: str
    socket: str
    manager: str
    pid: int | None
    version: str | None = None
    storage_driver: str | None = None
    detail: str = ""
    # How the running daemon differs from its configuration (engine.json, daemon.json):
    # empty when it runs as configured.
    drift: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def has_systemd() -> bool:
    return Path("/run/systemd/system").is_dir()


def _user_manager_running(cfg: EngineConfig) -> bool:
    return Path(cfg.runtime_dir, "systemd").is_dir()


def manager(cfg: EngineConfig) -> str:
    """Who runs the engine on this host: 'systemd' or 'direct' (kooi itself)."""
    if cfg.systemd_unit and has_systemd():
        if cfg.mode == "userns_remap" or _user_manager_running(cfg):
            return "systemd"
    return "direct"


def operator_headers(cfg: EngineConfig) -> dict[str, str]:
    """Root's provisioning calls (image builds) carry the operator token that the
    authorization plugin honours; nobody else can read it."""
    from . import authz

    token_file = cfg.authz.token_file if cfg.authz else None
    if not token_file or os.geteuid() != 0:
        return {}
    try:
        token = authz.read_token(Path(token_file))
    except OSError:
        return {}
    return {authz.TOKEN_HEADER: token} if token else {}


def client(cfg: EngineConfig, timeout: int = 10, operator: bool = False,
           version: str | None = "auto") -> docker.DockerClient:
    """A client of the runner's engine. VERSION None: the SDK's API version, without the
    extra round trip that negotiates one ("auto")."""
    c = docker.DockerClient(base_url=f"unix://{cfg.socket}", timeout=timeout, version=version)
    if operator:
        c.api.headers.update(operator_headers(cfg))
    return c


def ping(cfg: EngineConfig) -> tuple[bool, str]:
    from . import authz

    if (down := authz.plugin_down(cfg.authz)) is not None:
        return False, down
    try:
        c = client(cfg, timeout=5)
    except docker.errors.DockerException as exc:
        return False, str(exc)
    try:
        return bool(c.ping()), ""
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        return False, str(exc)
    finally:
        c.close()


def _pidfile(cfg: EngineConfig) -> Path:
    return STATE_DIR / f"engine-{cfg.runner_user}.pid"


def _read_pid(cfg: EngineConfig) -> int | None:
    try:
        pid = int(_pidfile(cfg).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _systemctl(cfg: EngineConfig, verb: str) -> subprocess.CompletedProcess[str]:
    if cfg.mode == "rootless":
        if os.geteuid() == cfg.runner_uid:
            cmd = ["systemctl", "--user", verb, cfg.systemd_unit]
        else:
            cmd = ["systemctl", "--user", f"--machine={cfg.runner_user}@.host", verb, cfg.systemd_unit]
    else:
        cmd = ["systemctl", verb, cfg.systemd_unit]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def _daemon_config(cfg: EngineConfig) -> dict[str, Any] | None:
    try:
        doc = json.loads(Path(cfg.daemon_config).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def status(cfg: EngineConfig) -> Status:
    mgr = manager(cfg)
    ok, why = ping(cfg)
    st = Status(running=ok, mode=cfg.mode, socket=cfg.socket, manager=mgr,
                pid=_read_pid(cfg) if mgr == "direct" else None, detail=why)
    if ok:
        try:
            c = client(cfg)
            try:
                info = c.info()
            finally:
                c.close()
            st.version = info.get("ServerVersion")
            st.storage_driver = info.get("Driver")
            st.drift = drift(cfg, info, _daemon_config(cfg))
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            st.detail = f"ping answered but info failed: {exc}"
    return st


def _child_env(cfg: EngineConfig, as_runner: bool) -> dict[str, str]:
    env = {
        "PATH": "/usr/share/docker.io/contrib:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
    }
    if as_runner:
        env.update(HOME=cfg.runner_home, USER=cfg.runner_user, LOGNAME=cfg.runner_user,
                   XDG_RUNTIME_DIR=cfg.runtime_dir)
    env.update(cfg.environment)
    return env


def _prepare_runtime_dir(cfg: EngineConfig) -> None:
    rd = Path(cfg.runtime_dir)
    if os.geteuid() == 0:
        rd.parent.mkdir(mode=0o755, exist_ok=True)
        rd.mkdir(mode=0o700, exist_ok=True)
        os.chown(rd, cfg.runner_uid, cfg.runner_gid)
        os.chmod(rd, 0o700)
    elif not (rd.is_dir() and os.access(rd, os.W_OK)):
        raise EngineError(f"{rd} does not exist or is not writable: run `kooi engine start` as root "
                          "once, or log in through a PAM session that creates it")


def start(cfg: EngineConfig, timeout: float = START_TIMEOUT) -> Status:
    ok, _ = ping(cfg)
    if ok:
        st = status(cfg)
        if not st.drift:
            return st
        # Running, but not as configured (a mode switch, a changed daemon.json): a daemon
        # kooi manages is restarted with its configuration; anything else is the operator's.
        if st.manager == "direct" and st.pid is None:
            raise EngineError("the daemon on " + cfg.socket + " runs differently from its configuration ("
                              + "; ".join(st.drift) + ") and was not started by kooi; stop it (e.g. the "
                              "distribution's docker service) and run `kooi engine start` again")
        stop(cfg)
    mgr = manager(cfg)
    if mgr == "systemd":
        res = _systemctl(cfg, "start")
        if res.returncode != 0:
            raise EngineError(f"systemctl start {cfg.systemd_unit} failed: {res.stderr.strip()}")
    else:
        _start_direct(cfg)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ok, why = ping(cfg)
        if ok:
            return status(cfg)
        if mgr == "direct" and _read_pid(cfg) is None:
            raise EngineError("the engine exited while starting:\n" + _log_tail(cfg))
        time.sleep(0.25)
    raise EngineError(f"the engine did not answer on {cfg.socket} within {timeout:.0f}s "
                      f"({why}):\n" + _log_tail(cfg))


def _log_tail(cfg: EngineConfig, lines: int = 25) -> str:
    if not cfg.log_file:
        return "(no log file configured)"
    try:
        return "\n".join(Path(cfg.log_file).read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(cannot read {cfg.log_file}: {exc})"


def _check_tun() -> None:
    """slirp4netns needs /dev/net/tun with the distribution's mode 0666 (udev sets it;
    hosts without udev leave it 0600)."""
    tun = Path("/dev/net/tun")
    if not tun.exists():
        raise EngineError("/dev/net/tun is missing: the rootless engine's network (slirp4netns) "
                          "needs it (modprobe tun; in a container: --device /dev/net/tun)")
    mode = tun.stat().st_mode & 0o777
    if mode != 0o666:
        if os.geteuid() != 0:
            raise EngineError(f"/dev/net/tun has mode {mode:o}; run `kooi engine start` as root "
                              "once, or restore the distribution's mode 0666")
        os.chmod(tun, 0o666)


def _start_direct(cfg: EngineConfig) -> None:
    if not cfg.launcher:
        raise EngineError("the host description names no launcher; re-run site.yml")
    as_runner = cfg.mode == "rootless"
    me = os.geteuid()
    if as_runner and me not in (0, cfg.runner_uid):
        raise EngineError(f"only root or {cfg.runner_user} can start this engine")
    if not as_runner and me != 0:
        raise EngineError("the userns-remap engine is a root daemon: start it as root")
    if as_runner:
        _prepare_runtime_dir(cfg)
        _check_tun()
    STATE_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    log_path = Path(cfg.log_file or STATE_DIR / f"engine-{cfg.runner_user}.log")
    log_path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    log = open(log_path, "ab", buffering=0)  # opened by us: the daemon cannot rewrite it
    kwargs: dict[str, Any] = {}
    if as_runner and me == 0:
        pw = pwd.getpwnam(cfg.runner_user)
        kwargs.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
    try:
        proc = subprocess.Popen(
            cfg.launcher, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=_child_env(cfg, as_runner), cwd=cfg.runner_home if as_runner else "/",
            start_new_session=True, umask=0o077, close_fds=True, **kwargs)
    except OSError as exc:
        raise EngineError(f"cannot run {cfg.launcher[0]}: {exc}") from None
    finally:
        log.close()
    _pidfile(cfg).write_text(f"{proc.pid}\n")


def stop(cfg: EngineConfig, timeout: float = STOP_TIMEOUT) -> Status:
    mgr = manager(cfg)
    if mgr == "systemd":
        res = _systemctl(cfg, "stop")
        if res.returncode != 0:
            raise EngineError(f"systemctl stop {cfg.systemd_unit} failed: {res.stderr.strip()}")
        return status(cfg)
    pid = _read_pid(cfg)
    if pid is None:
        return status(cfg)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.2)
    if _alive(pid):
        try:
            os.killpg(pid, signal.SIGKILL)  # its own session: only what we started
        except ProcessLookupError:
            pass
    _pidfile(cfg).unlink(missing_ok=True)
    return status(cfg)


def _alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
    return True


def render(st: Status, as_json: bool) -> str:
    if as_json:
        return json.dumps(st.as_dict(), indent=2, sort_keys=True)
    state = "running" if st.running else "not running"
    parts = [f"engine ({st.mode}, managed by {st.manager}): {state}", f"socket: {st.socket}"]
    if st.pid:
        parts.append(f"pid: {st.pid}")
    if st.version:
        # the engine's answer: one line, whatever it holds (review 29)
        parts.append(one_line(f"version: {st.version}, storage driver: {st.storage_driver}"))
    if st.detail and not st.running:
        parts.append(f"detail: {st.detail}")
    for d in st.drift:
        parts.append(f"drift: {d}")
    if st.drift:
        parts.append("the daemon runs differently from its configuration: `kooi engine start` restarts it "
                     "with its configuration (or re-run site.yml)")
    return "\n".join(parts)
