"""`kooi run WORKFLOW`: run a workflow on a provisioned host, honestly, for cron and CI.

Container mode runs the pinned runner image on the runner's unprivileged engine
(non-root user, cap-drop ALL, no-new-privileges, read-only root, default seccomp,
limits where enforced, the project at /workspace, no engine socket, no network).
Jail mode runs the command in a bubblewrap jail on the host (only /usr, /etc and the
project bound, private /tmp, every namespace unshared, new session).

Exit codes: the workload's own, or one of the EXIT_* codes below; the JSON result's
`reason` tells which.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, TextIO

from . import apparmor, hostconfig, image, outputs, workflow
from .hostconfig import EngineConfig
from .workflow import Workflow

EXIT_INVALID = 2        # bad command line or workflow: nothing ran
EXIT_BUSY = 75          # the same workflow is running on the same project
EXIT_TIMEOUT = 124      # the workload ran past its timeout and was killed
EXIT_UNAVAILABLE = 125  # engine or pinned image unavailable
EXIT_REFUSED = 126      # a policy refused the run (isolation level, ownership, root)
EXIT_ERROR = 70         # kooi itself failed

RUN_DIR = Path(os.environ.get("KOOI_RUN_DIR", "/var/lib/kooi/runs"))
LABEL = "org.kooi"
WORKSPACE = "/workspace"
MAVEN_SETTINGS = "/run/kooi/maven-settings.xml"
ENGINE_SOCKET = "/run/kooi/docker.sock"  # where a testcontainers workload finds the broker


class RunError(Exception):
    def __init__(self, reason: str, code: int, message: str):
        super().__init__(message)
        self.reason = reason
        self.code = code


@dataclass
class Result:
    workflow: str
    run_id: str
    project: str
    mode: str = ""
    isolation: str = ""
    workflow_file: str = ""
    image: str | None = None
    image_digest: str | None = None
    start: str = ""
    end: str = ""
    duration_s: float = 0.0
    exit_code: int = EXIT_ERROR
    reason: str = "error"
    message: str = ""
    log: str = ""
    limits: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    broker: dict | None = None
    cleanup: dict | None = None
    egress: dict | None = None
    apparmor: dict | None = None
    seccomp: dict | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class Log:
    """Workload output to stdout and the run's log file, line-buffered."""

    def __init__(self, path: Path | None, echo: TextIO | None):
        self.path = path
        self.f = path.open("a", buffering=1) if path else None
        self.echo = echo
        self.lock = threading.Lock()

    def write(self, text: str) -> None:
        with self.lock:
            if self.f:
                self.f.write(text)
            if self.echo:
                self.echo.write(text)
                self.echo.flush()

    def note(self, text: str) -> None:
        self.write(f"kooi: {text}\n")

    def close(self) -> None:
        if self.f:
            self.f.close()


# --- identity and preparation -------------------------------------------------------


def check_identity(cfg: EngineConfig) -> None:
    """Only the runner user, or root (which drops to it), may run workflows."""
    uid = os.geteuid()
    if uid not in (0, cfg.runner_uid):
        raise RunError("refused", EXIT_REFUSED,
                       f"kooi run runs as the runner user {cfg.runner_user} (or root, which drops to it), "
                       f"not as uid {uid}")


def _import_roots() -> list[str]:
    """Where this interpreter may still import from: its search path and kooi itself."""
    roots = [p for p in sys.path if p] + [str(Path(__file__).resolve().parent)]
    return [p for p in dict.fromkeys(roots) if os.path.exists(p)]


def unreadable_by(uid: int, gid: int, groups: list[int], paths: list[str]) -> list[str]:
    """The PATHS that UID (with GID and GROUPS) cannot read (directories: list and enter).
    Asked with the effective ids switched and switched back, so it needs root."""
    saved = (os.getgroups(), os.getegid(), os.geteuid())
    bad = []
    try:
        os.setgroups(groups)
        os.setegid(gid)
        os.seteuid(uid)
        for p in paths:
            mode = os.R_OK | (os.X_OK if os.path.isdir(p) else 0)
            if not os.access(p, mode, effective_ids=True):
                bad.append(p)
    finally:
        os.seteuid(saved[2])
        os.setegid(saved[1])
        os.setgroups(saved[0])
    return bad


def check_runner_can_import(cfg: EngineConfig) -> None:
    """Root drops to the runner before the run and imports modules after that (lazily,
    and so do the libraries kooi uses). Refuse up front when this interpreter lives where
    the runner cannot read: a pyenv or conda Python, or a venv, under /root."""
    if os.geteuid() != 0 or cfg.runner_uid == 0:
        return
    bad = unreadable_by(cfg.runner_uid, cfg.runner_gid,
                        os.getgrouplist(cfg.runner_user, cfg.runner_gid), _import_roots())
    if bad:
        raise RunError(
            "unavailable", EXIT_UNAVAILABLE,
            f"kooi run drops to the runner user {cfg.runner_user}, who cannot read where this kooi's Python "
            f"imports from: {', '.join(bad)}. Use the kooi that site.yml installed (/usr/local/bin/kooi, the "
            "system python3), or install kooi with an interpreter and in a directory the runner can read")


def drop_to_runner(cfg: EngineConfig) -> None:
    """Run as the runner user from here on (root drops to it)."""
    check_identity(cfg)
    if os.geteuid() == cfg.runner_uid:
        return
    # The runner's own groups only (userns_remap: the socket group is one of them).
    os.setgroups(os.getgrouplist(cfg.runner_user, cfg.runner_gid))
    os.setgid(cfg.runner_gid)
    os.setuid(cfg.runner_uid)
    os.environ.update(HOME=cfg.runner_home, USER=cfg.runner_user, LOGNAME=cfg.runner_user,
                      XDG_RUNTIME_DIR=cfg.runtime_dir)


def subid_start(user: str, path: str = "/etc/subuid") -> int:
    for line in Path(path).read_text().splitlines():
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[0] in (user, str(_uid_or_none(user))):
            return int(parts[1])
    raise RunError("error", EXIT_ERROR, f"{path} has no range for {user}; re-run site.yml")


def _uid_or_none(user: str) -> int | None:
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def host_uid_of(cfg: EngineConfig, container_uid: int) -> int:
    """The host uid that a container uid becomes on this engine."""
    if cfg.mode == "rootless":
        return cfg.runner_uid if container_uid == 0 else subid_start(cfg.runner_user) + container_uid - 1
    return subid_start(cfg.remap_user or "kooi-remap") + container_uid


def grant_workspace(project: Path, host_uid: int, runner_uid: int, log: Log) -> None:
    """Let the container's (mapped, non-root) user write the project, and the runner keep
    access to what it writes: POSIX ACLs, set once (new files inherit the default ACL)."""
    if not shutil.which("setfacl"):
        raise RunError("unavailable", EXIT_UNAVAILABLE,
                       "setfacl is missing (package acl); re-run site.yml")
    want = (f"default:user:{host_uid}:rwx", f"user:{host_uid}:rwx", f"default:user:{runner_uid}:rwx")

    def granted() -> bool:
        acl = subprocess.run(["getfacl", "-pn", "--omit-header", str(project)], capture_output=True,
                             text=True).stdout
        return all(w in acl for w in want)

    if granted():
        return
    log.note(f"granting the workload's uid {host_uid} access to {project} (POSIX ACL, once)")
    spec = f"u:{host_uid}:rwX,d:u:{host_uid}:rwX,d:u:{runner_uid}:rwX,d:m::rwx,m::rwx"
    r = subprocess.run(["setfacl", "-R", "-m", spec, str(project)], capture_output=True, text=True)
    if r.returncode != 0:
        if not granted():
            raise RunError("error", EXIT_ERROR,
                           f"cannot set ACLs on {project} ({r.stderr.strip()[-300:]}); the project must be owned "
                           "by the runner user on a filesystem with POSIX ACLs")
        # Files a workload created earlier belong to its sub-uid and keep their own ACLs.
        log.note(f"warning: some entries kept their ACLs: {r.stderr.strip().splitlines()[0][:200]}")


def check_project(project: Path, cfg: EngineConfig) -> Path:
    try:
        real = project.resolve(strict=True)
    except FileNotFoundError:
        raise RunError("invalid", EXIT_INVALID, f"project {project} does not exist") from None
    if not real.is_dir():
        raise RunError("invalid", EXIT_INVALID, f"project {real} is not a directory")
    st = real.stat()
    if st.st_uid != cfg.runner_uid:
        raise RunError("refused", EXIT_REFUSED,
                       f"project {real} is owned by uid {st.st_uid}, not by the runner user "
                       f"{cfg.runner_user}; chown it (the workload writes there as that user's sub-id)")
    for bad in ("/", "/etc", "/usr", "/var", "/home", cfg.runner_home):
        if str(real) == bad:
            raise RunError("refused", EXIT_REFUSED, f"refusing {real} as a project (too broad)")
    return real


class RunLock:
    """One run of a workflow per project at a time (flock; released when the process dies)."""

    def __init__(self, run_dir: Path, wf: str, project: Path):
        key = hashlib.sha256(str(project).encode()).hexdigest()[:16]
        self.path = run_dir / "locks" / f"{wf}-{key}.lock"
        self.fd: int | None = None

    def acquire(self, wait: float) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o640)
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(self.fd)
                    self.fd = None
                    raise RunError("busy", EXIT_BUSY,
                                   f"another run of this workflow holds {self.path}; retry later or pass --wait")
                time.sleep(0.2)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def lock_held(path: Path) -> bool:
    """True if a live process holds the run lock at PATH."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


# --- container mode -----------------------------------------------------------------


def _parse_size(s: str) -> int:
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def engine_limits(info: dict) -> dict[str, bool]:
    """What this engine can enforce (rootless needs cgroup v2 with delegated controllers)."""
    return {"memory": bool(info.get("MemoryLimit")), "pids": bool(info.get("PidsLimit")),
            "cpus": bool(info.get("CpuCfsQuota"))}


class Interrupted(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def run_labels(wf: Workflow, project: Path, run_id: str) -> dict[str, str]:
    return {f"{LABEL}.managed": "1", f"{LABEL}.run": run_id, f"{LABEL}.workflow": wf.name,
            f"{LABEL}.project": str(project)}


def testcontainers_env(gateway: str) -> dict[str, str]:
    """What Java, Python and Node Testcontainers need to use the broker: the socket
    (also for a Ryuk mount, which the broker answers with itself), no Ryuk (the run
    cleans up by label), and the address where published ports are reached."""
    return {"TESTCONTAINERS_DOCKER_SOCKET_OVERRIDE": ENGINE_SOCKET, "TESTCONTAINERS_RYUK_DISABLED": "true",
            "TESTCONTAINERS_HOST_OVERRIDE": gateway, "TC_HOST": gateway,
            # Python: containers by their own address on their own network (the
            # workload is on every network of the run), not a published port.
            "TESTCONTAINERS_CONNECTION_MODE": "bridge_ip",
            # Java's start-up checks run an image from a registry (none is reachable).
            "TESTCONTAINERS_CHECKS_DISABLE": "true"}


def _container_args(wf: Workflow, cfg: EngineConfig, img_attrs: dict, project: Path, run_id: str,
                    enforce: dict[str, bool], res: Result) -> dict:
    import docker.types

    user = (img_attrs.get("Config") or {}).get("User") or ""
    if image.default_user_is_root(img_attrs):
        raise RunError("refused", EXIT_REFUSED,
                       f"image {res.image_digest} runs as root by default; kooi runs only non-root images")
    uid = int(user.split(":", 1)[0]) if user.split(":", 1)[0].isdigit() else None
    if uid is None:
        raise RunError("refused", EXIT_REFUSED, f"image user {user!r} is not numeric; set USER uid:gid")
    home = next((e.split("=", 1)[1] for e in (img_attrs.get("Config") or {}).get("Env") or []
                 if e.startswith("HOME=")), "/tmp")
    size = wf.tmpfs_size
    tmpfs = {"/tmp": f"rw,exec,nosuid,nodev,size={size},mode=1777"}
    if home not in ("/tmp", WORKSPACE):
        tmpfs[home] = f"rw,exec,nosuid,nodev,size={size},uid={uid},gid={user.split(':')[-1]},mode=0700"
    kw: dict = dict(
        command=list(wf.command), user=user, working_dir=str(Path(WORKSPACE) / wf.workdir),
        environment=dict(wf.environment), name=f"kooi-{run_id}", hostname=wf.name[:63],
        labels=run_labels(wf, project, run_id),
        network_mode="none", cap_drop=["ALL"], security_opt=["no-new-privileges:true"],
        read_only=True, tmpfs=tmpfs, init=True, ipc_mode="private",
        mounts=[docker.types.Mount(WORKSPACE, str(project), type="bind", read_only=False)],
    )
    lim = wf.limits
    for key, value, arg in (("memory", lim.memory, "mem_limit"), ("pids", lim.pids, "pids_limit"),
                            ("cpus", lim.cpus, "nano_cpus")):
        if value is None:
            continue
        res.limits[key] = {"requested": value, "enforced": enforce[key]}
        if not enforce[key]:
            res.warnings.append(f"limit {key}={value} is not enforced by this engine "
                                f"({cfg.mode}; needs cgroup v2 with delegated controllers)")
            continue
        kw[arg] = _parse_size(value) if key == "memory" else (int(value * 1e9) if key == "cpus" else value)
        if key == "memory":
            kw["memswap_limit"] = kw[arg]
    return kw


def run_container(wf: Workflow, cfg: EngineConfig, project: Path, run_id: str, res: Result, log: Log,
                  interrupted: Callable[[], int | None], run_dir: Path = RUN_DIR) -> int:
    import docker

    from . import authz

    if (down := authz.plugin_down(cfg.authz)) is not None:
        raise RunError("unavailable", EXIT_UNAVAILABLE, down)
    try:
        client = docker.DockerClient(base_url=f"unix://{cfg.socket}", timeout=30)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure to reach the engine is "unavailable"
        raise RunError("unavailable", EXIT_UNAVAILABLE,
                       f"the runner's engine at {cfg.socket} does not answer ({exc.__class__.__name__}); "
                       "start it with `kooi engine start` (as root) or check `kooi engine status`") from None
    pins = image.read_pins()
    pin = pins.get(wf.image)
    if not pin or not pin.get("id"):
        raise RunError("unavailable", EXIT_UNAVAILABLE,
                       f"no pinned image {wf.image!r} in {image.PINS_PATH}; provision it with site.yml "
                       "(role runner_image)")
    res.image, res.image_digest = pin.get("tag"), pin["id"]
    try:
        img = client.images.get(pin["id"])
    except docker.errors.ImageNotFound:
        raise RunError("unavailable", EXIT_UNAVAILABLE,
                       f"the engine does not hold the pinned image {pin['id']}; re-run site.yml "
                       "(role runner_image)") from None
    grant_workspace(project, host_uid_of(cfg, int(((img.attrs.get("Config") or {}).get("User") or "0")
                                                  .split(":")[0] or 0)), cfg.runner_uid, log)
    # The engine's cgroup support matters only when the workflow asks for limits.
    wants_limits = any(v is not None for v in (wf.limits.memory, wf.limits.cpus, wf.limits.pids))
    enforce = engine_limits(client.info()) if wants_limits else {"memory": False, "pids": False, "cpus": False}
    kw = _container_args(wf, cfg, img.attrs, project, run_id, enforce, res)
    res.seccomp = _container_seccomp(kw, img.attrs)
    log.note("seccomp: " + res.seccomp["note"])
    for w in res.warnings:
        log.note(f"warning: {w}")
    conf = _apparmor(lambda state: apparmor.for_container(cfg.mode, state))
    res.apparmor = conf.as_dict()
    log.note(conf.note)
    if conf.profile:
        kw["security_opt"] = [*kw["security_opt"], f"apparmor={conf.profile}"]
    eg = _egress_for(wf)
    if eg is not None:
        _egress_preflight(eg, res, log)
    access = BrokeredEngine(client, cfg, wf, project, run_id, run_dir, log, conf.profile) \
        if wf.testcontainers else None
    settings: Path | None = None
    container = None
    try:
        if access:
            access.open(kw)
        if eg is not None:
            settings = _egress_wire(eg, client, cfg, kw, img.attrs, access, run_dir, run_id, res, log)
        container = client.containers.create(pin["id"], **kw)
        if access:
            access.protect(container.id)
        return _supervise(client, container, wf, cfg, pin, res, log, interrupted)
    finally:
        if container is not None:
            try:
                container.remove(force=True, v=True)
            except docker.errors.NotFound:
                pass
        if access:
            access.close(res)
        if settings is not None:
            settings.unlink(missing_ok=True)


def _egress_config():
    from . import egress

    try:
        return egress.load()
    except egress.EgressError as exc:
        raise RunError("unavailable", EXIT_UNAVAILABLE, str(exc)) from None


def _egress_for(wf: Workflow):
    """The host's egress description if the workload gets a network (network: proxy,
    testcontainers); a workflow asking for the proxy where there is none is refused."""
    if wf.network != "proxy" and not wf.testcontainers:
        return None
    eg = _egress_config()
    if eg is None and wf.network == "proxy":
        raise RunError("refused", EXIT_REFUSED,
                       f"workflow {wf.name} asks for network: proxy, but this host has no egress control "
                       "(kooi_egress_enabled=false or not provisioned); enable it and re-run site.yml")
    return eg


def _egress_preflight(eg, res: Result, log: Log) -> None:
    """The rules must be in force for the runner before a workload gets a network (an
    engine started without them would reach anything); a proxy that is down only means
    no egress at all, which is said, not refused."""
    from . import egress

    ok, why = egress.rules_enforced(eg)
    if not ok:
        raise RunError("unavailable", EXIT_UNAVAILABLE,
                       f"the egress rules are not in force for {os.geteuid()} ({why}); run `kooi egress start` "
                       "as root (hosts without systemd, after a reboot) or re-run site.yml")
    up, detail = egress.proxy_up(eg)
    res.egress = {"proxy": "", "rules": why, "proxy_up": up}
    if not up:
        msg = f"{detail}: the workload has no egress at all (start it: kooi egress start)"
        res.warnings.append(msg)
        log.note(f"warning: {msg}")


def _egress_wire(eg, client, cfg: EngineConfig, kw: dict, img_attrs: dict, access: "BrokeredEngine | None",
                 run_dir: Path, run_id: str, res: Result, log: Log) -> Path:
    """Give the workload a network whose only way out is the proxy, and the proxy in the
    form each tool reads; returns the per-run Maven settings file (removed afterwards)."""
    import docker.types

    from . import egress

    if cfg.mode == "rootless":
        host = egress.ROOTLESS_HOST_LOOPBACK
    elif access is not None:
        host = access.gateway  # the run network's
    else:
        try:
            host = egress.container_proxy_host(cfg.mode, client)
        except egress.EgressError as exc:
            raise RunError("unavailable", EXIT_UNAVAILABLE, str(exc)) from None
    if access is None:
        kw["network_mode"] = "bridge"
    # Nested containers and the engine's addresses are reached directly, never through
    # the proxy (which refuses private destinations anyway).
    java_skip = ["10.*", "172.*", "192.168.*"]
    env = egress.proxy_env(host, eg.port, ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"], java_skip)
    settings_dir = run_dir / "egress"
    settings_dir.mkdir(mode=0o755, exist_ok=True)
    settings = settings_dir / f"{run_id}-maven-settings.xml"
    settings.write_text(egress.maven_settings(host, eg.port, java_skip))
    settings.chmod(0o644)
    kw["mounts"] = list(kw["mounts"]) + [
        docker.types.Mount(MAVEN_SETTINGS, str(settings), type="bind", read_only=True)]
    image_env = dict(e.split("=", 1) for e in (img_attrs.get("Config") or {}).get("Env") or [] if "=" in e)
    mine = dict(kw["environment"])
    maven_args = mine.get("MAVEN_ARGS", image_env.get("MAVEN_ARGS", ""))
    mine["MAVEN_ARGS"] = f"{maven_args} --global-settings {MAVEN_SETTINGS}".strip()
    kw["environment"] = {**env, **mine}
    res.egress["proxy"] = f"http://{host}:{eg.port}"
    log.note(f"egress: through the proxy at {res.egress['proxy']} only")
    return settings


def _supervise(client, container, wf: Workflow, cfg: EngineConfig, pin: dict, res: Result, log: Log,
               interrupted: Callable[[], int | None]) -> int:
    import requests

    container.start()
    log.note(f"started {container.name} ({pin['id'][:19]}) on the {cfg.mode} engine")

    def follow() -> None:
        try:
            for chunk in container.logs(stream=True, follow=True):
                log.write(chunk.decode("utf-8", "replace"))
        except Exception:  # noqa: BLE001 - the container went away; the wait says why
            pass

    pump = threading.Thread(target=follow, daemon=True)
    pump.start()
    deadline = time.monotonic() + wf.timeout
    while True:
        sig = interrupted()
        if sig:
            container.kill()
            raise Interrupted(sig)
        if time.monotonic() >= deadline:
            container.kill()
            container.wait(timeout=30)
            raise RunError("timeout", EXIT_TIMEOUT,
                           f"the workload ran past its timeout of {wf.timeout} s and was killed")
        try:
            st = client.api.wait(container.id, timeout=min(2, max(0.1, deadline - time.monotonic())))
            break
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            continue
    pump.join(timeout=10)
    container.reload()
    if container.attrs.get("State", {}).get("OOMKilled"):
        res.warnings.append("the workload was killed for exceeding its memory limit")
    return int(st.get("StatusCode", EXIT_ERROR))


class BrokeredEngine:
    """`testcontainers: true`: a network of the run's own, a kooi broker on a socket
    that is mounted as the workload's only engine socket, and cleanup of everything
    the run created (by label) when it ends."""

    def __init__(self, client, cfg: EngineConfig, wf: Workflow, project: Path, run_id: str, run_dir: Path,
                 log: Log, apparmor_profile: str | None = None):
        self.client, self.cfg, self.wf, self.project, self.run_id = client, cfg, wf, project, run_id
        self.run_dir, self.log = run_dir, log
        self.apparmor = apparmor_profile  # what the containers the workload starts get too
        self.broker = None
        self.network = None
        self.gateway: str | None = None

    def open(self, kw: dict) -> None:
        import docker.types

        from . import broker, egress
        from .policy import Policy

        labels = run_labels(self.wf, self.project, self.run_id)
        self.network = self.client.networks.create(f"kooi-{self.run_id}", driver="bridge", labels=labels)
        self.network.reload()
        self.gateway = gateway = egress.gateway(self.network)
        if not gateway:
            raise RunError("unavailable", EXIT_UNAVAILABLE,
                           f"the run network {self.network.name} has no gateway address")
        sock_dir = self.run_dir / "brokers"
        sock_dir.mkdir(mode=0o700, exist_ok=True)
        os.chmod(sock_dir, 0o700)
        path = sock_dir / f"{secrets.token_hex(8)}.sock"
        if len(str(path)) > 100:
            raise RunError("error", EXIT_ERROR, f"the broker socket path {path} is too long for a unix socket; "
                           "use a shorter KOOI_RUN_DIR")
        scope = broker.RunScope(self.run_id, {**labels, f"{LABEL}.nested": "1"}, network=self.network.name,
                                socket_aliases=(ENGINE_SOCKET,), path_map={WORKSPACE: str(self.project)})
        scope.apparmor = self.apparmor
        policy = Policy(workspace=str(self.project), apparmor_profiles=(self.apparmor,) if self.apparmor else ())
        self.broker = broker.Broker(str(path), self.cfg.socket, policy, scope, log=self.log.note)
        self.broker.start(mode=0o666)
        host = gateway
        if self.cfg.mode == "rootless":
            # The rootless engine publishes ports on 127.0.0.1 of its own network
            # namespace (rootlesskit's child, not the host's): the workload joins that
            # namespace, where the published ports of what it starts are reachable.
            kw["network_mode"] = "host"
            host = "127.0.0.1"
        else:
            kw["network_mode"] = self.network.name
        kw["mounts"] = list(kw["mounts"]) + [docker.types.Mount(ENGINE_SOCKET, str(path), type="bind")]
        kw["environment"] = {**testcontainers_env(host), **kw["environment"],
                             "DOCKER_HOST": f"unix://{ENGINE_SOCKET}"}
        self.log.note(f"testcontainers: broker at {ENGINE_SOCKET}, network {self.network.name} "
                      f"(published ports at {host})")

    def protect(self, container_id: str) -> None:
        """The workload's own container stays out of the broker's reach (no update of
        its limits, no exec, no commit)."""
        if self.broker:
            self.broker.scope.protected.add(container_id)
            if self.cfg.mode != "rootless":
                # Its own network namespace: join every network the run creates (the
                # rootless workload shares rootlesskit's, where all bridges live).
                self.broker.scope.attach = container_id

    def close(self, res: Result) -> None:
        from . import broker

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


# --- kooi's seccomp filter (kooi/seccomp.py) -------------------------------------------

SECCOMP_NOTE = ("kooi's filter: no io_uring, bpf, perf_event_open, userfaultfd, handle syscalls, modules, "
                "kexec, keyring, mounts, namespaces")
# Run by the image's python3 in containers of kooi's runner image (standard library only).
SECCOMP_SOURCE = Path(__file__).with_name("seccomp.py").read_text()


def _seccomp_program() -> bytes:
    from . import seccomp

    try:
        return seccomp.program()
    except ValueError as exc:
        raise RunError("unavailable", EXIT_UNAVAILABLE, str(exc)) from None


def _container_seccomp(kw: dict, img_attrs: dict) -> dict:
    """Stack kooi's filter on the engine's profile where the image is kooi's runner image
    (its python3 installs the filter, then executes the image's entrypoint and command)."""
    conf = img_attrs.get("Config") or {}
    if not (conf.get("Labels") or {}).get("org.kooi.image"):
        return {"engine": "default", "kooi": False,
                "note": "the engine's default profile only (kooi's filter is installed by the python3 of "
                        "kooi's runner image; this image is not one)"}
    _seccomp_program()
    kw["entrypoint"] = ["python3", "-I", "-c", SECCOMP_SOURCE, "--", *(conf.get("Entrypoint") or [])]
    return {"engine": "default", "kooi": True, "note": SECCOMP_NOTE + ", stacked on the engine's default profile"}


# --- jail mode ----------------------------------------------------------------------


JAIL_PROXY_DIR = "/run/kooi"


def bwrap_argv(wf: Workflow, project: Path, proxy: tuple[Path, int] | None = None,
               seccomp_fd: int | None = None) -> list[str]:
    """PROXY: (the bridge's directory, the proxy port) for network: proxy: the jail gets
    the bridge socket and a forwarder on its own loopback, never a network.
    SECCOMP_FD: a readable fd holding kooi's seccomp program (kooi/seccomp.py), which
    bwrap installs right before it executes the workload."""
    if not shutil.which("bwrap"):
        raise RunError("unavailable", EXIT_UNAVAILABLE, "bwrap is missing (package bubblewrap); re-run site.yml")
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = Path("/") / top
        if p.is_symlink():
            argv += ["--symlink", os.readlink(p), f"/{top}"]
        elif p.is_dir():
            argv += ["--ro-bind", str(p), f"/{top}"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/tmp/home",
             "--bind", str(project), WORKSPACE, "--chdir", str(Path(WORKSPACE) / wf.workdir),
             "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
             "--setenv", "HOME", "/tmp/home", "--setenv", "LANG", "C.UTF-8", "--setenv", "TMPDIR", "/tmp"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    env: dict[str, str] = {}
    command = list(wf.command)
    if proxy is not None:
        from . import egress

        bridge_dir, port = proxy
        argv += ["--bind", str(bridge_dir), JAIL_PROXY_DIR]
        env = egress.proxy_env("127.0.0.1", port, [])
        env["MAVEN_ARGS"] = f"--global-settings {JAIL_PROXY_DIR}/maven-settings.xml"
        command = ["/usr/bin/python3", "-I", "-c", egress.JAIL_FORWARDER, f"{JAIL_PROXY_DIR}/proxy.sock",
                   str(port), *command]
    for k, v in {**env, **wf.environment}.items():
        argv += ["--setenv", k, v]
    return argv + ["--", *command]


def run_jail(wf: Workflow, project: Path, res: Result, log: Log, interrupted: Callable[[], int | None],
             run_dir: Path = RUN_DIR) -> int:
    for key in ("memory", "pids", "cpus"):
        value = getattr(wf.limits, key)
        if value is not None:
            res.limits[key] = {"requested": value, "enforced": False}
            res.warnings.append(f"limit {key}={value} is not enforced in jail mode")
            log.note(f"warning: limit {key}={value} is not enforced in jail mode")
    bridge = None
    eg = _egress_for(wf)
    if eg is not None:
        from . import egress

        _egress_preflight(eg, res, log)
        bridge = egress.JailBridge(run_dir / "jails" / secrets.token_hex(8), eg.port)
        (bridge.dir / "maven-settings.xml").write_text(egress.maven_settings("127.0.0.1", eg.port, []))
        res.egress["proxy"] = f"http://127.0.0.1:{eg.port}"
        log.note("egress: through the proxy only (a socket bridge; the jail has no network)")
    conf, prefix = _apparmor(apparmor.for_jail)
    res.apparmor = conf.as_dict()
    log.note(conf.note)
    filt = _seccomp_program()
    res.seccomp = {"engine": None, "kooi": True, "note": SECCOMP_NOTE + " (bwrap --seccomp)"}
    log.note("seccomp: " + res.seccomp["note"])
    rfd, wfd = os.pipe()
    try:
        os.write(wfd, filt)
        os.close(wfd)
        wfd = -1
        argv = bwrap_argv(wf, project, (bridge.dir, eg.port) if bridge else None, rfd)
        return _run_bwrap([*prefix, *argv], wf, log, interrupted, pass_fds=(rfd,))
    finally:
        os.close(rfd)
        if wfd >= 0:
            os.close(wfd)
        if bridge is not None:
            bridge.close()
            shutil.rmtree(bridge.dir, ignore_errors=True)


def _run_bwrap(argv: list[str], wf: Workflow, log: Log, interrupted: Callable[[], int | None],
               pass_fds: tuple[int, ...] = ()) -> int:
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, pass_fds=pass_fds)
    assert proc.stdout is not None
    out = proc.stdout

    first: list[str] = []

    def pump() -> None:
        for line in iter(out.readline, b""):
            text = line.decode("utf-8", "replace")
            if not first:
                first.append(text)
            log.write(text)

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    log.note(f"started bubblewrap jail (pid {proc.pid})")
    deadline = time.monotonic() + wf.timeout

    def kill() -> None:
        # bwrap dies; --die-with-parent and the pid namespace take every jailed process.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    while True:
        sig = interrupted()
        if sig:
            kill()
            raise Interrupted(sig)
        try:
            rc = proc.wait(timeout=min(0.5, max(0.01, deadline - time.monotonic())))
            break
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                kill()
                t.join(timeout=5)
                raise RunError("timeout", EXIT_TIMEOUT,
                               f"the workload ran past its timeout of {wf.timeout} s and was killed") from None
    t.join(timeout=10)
    if rc == 1 and first and first[0].startswith("bwrap: execvp"):
        return 127  # the workflow's command does not exist in the jail
    if rc == 1 and first and first[0].startswith("bwrap: "):
        # bubblewrap itself failed before the workload started (e.g. no unprivileged
        # user namespaces on this kernel): not the workload's exit code.
        raise RunError("unavailable", EXIT_UNAVAILABLE,
                       f"bubblewrap could not set up the jail: {first[0].strip()[7:]} (unprivileged user "
                       "namespaces must be allowed: sysctl kernel.unprivileged_userns_clone=1)")
    return rc if rc >= 0 else 128 - rc


def _apparmor(decide):
    """DECIDE(state) with /etc/kooi/apparmor.json; a host whose profiles are not in force
    as the role left them cannot run (exit 125, not an unconfined run)."""
    try:
        return decide(apparmor.load_state())
    except apparmor.AppArmorError as exc:
        raise RunError("unavailable", EXIT_UNAVAILABLE, str(exc)) from None


# --- the command --------------------------------------------------------------------


def isolation_of(mode: str, cfg: EngineConfig) -> str:
    return "jail" if mode == "jail" else cfg.mode


def execute(name: str, project: Path, json_path: Path | None = None, wait: float = 0.0,
            echo: TextIO | None = sys.stdout, run_dir: Path | None = None,
            workflow_dir: Path | None = None, engine_config: Path | None = None) -> Result:
    """Run workflow NAME on PROJECT; always returns a Result (never raises for run failures)."""
    run_dir = run_dir or RUN_DIR
    run_id = f"{name if workflow.NAME_RE.match(name) else 'invalid'}-" \
             f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(3)}"
    res = Result(workflow=name, run_id=run_id, project=str(project), start=_now())
    t0 = time.monotonic()
    out: outputs.Output | None = None
    if json_path:
        # Before anything runs, and as the caller (not the runner it drops to).
        try:
            out = outputs.Output(json_path, "--json")
        except outputs.OutputError as exc:
            res.reason, res.exit_code, res.message = "invalid", EXIT_INVALID, str(exc)
            res.end = res.start
            return res
    log = Log(None, echo)
    lock: RunLock | None = None
    got_signal: list[int] = []
    old_handlers = {}

    def on_signal(signum, _frame):
        got_signal.append(signum)

    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            old_handlers[s] = signal.signal(s, on_signal)
    try:
        try:
            cfg = hostconfig.load(engine_config or hostconfig.DEFAULT_PATH)
        except hostconfig.ConfigError as exc:
            raise RunError("unavailable", EXIT_UNAVAILABLE, str(exc)) from None
        check_identity(cfg)
        check_runner_can_import(cfg)
        wf = workflow.load(name, workflow_dir or workflow.WORKFLOW_DIR)
        res.mode, res.workflow_file = wf.mode, str(wf.path)
        res.isolation = isolation_of(wf.mode, cfg)
        if wf.min_isolation and workflow.isolation_rank(res.isolation) < workflow.isolation_rank(wf.min_isolation):
            raise RunError("refused", EXIT_REFUSED,
                           f"workflow {name} requires isolation {wf.min_isolation} or stronger; "
                           f"this run would get {res.isolation} ({wf.mode} mode on a {cfg.mode} host)")
        from . import egress

        if os.geteuid() == 0 and (wf.network == "proxy" or wf.testcontainers):
            # Root (cron, a pipeline): re-apply the rules and start the proxy where no
            # service manager does (hosts without systemd, after a reboot).
            eg = _egress_config()
            if eg is not None:
                try:
                    egress.start(eg)
                except egress.EgressError as exc:
                    raise RunError("unavailable", EXIT_UNAVAILABLE, f"egress: {exc}") from None
        if os.geteuid() == 0:
            apparmor.remember_loaded()  # the kernel's profile list is root-only
            if out and cfg.runner_uid != 0:
                out.keep_rights()  # the runner may not write where the caller asked for the result
        drop_to_runner(cfg)
        project = check_project(project, cfg)
        res.project = str(project)
        for sub in ("logs", "results", "locks"):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        log.close()
        log = Log(run_dir / "logs" / f"{run_id}.log", echo)
        res.log = str(log.path)
        lock = RunLock(run_dir, wf.name, project)
        lock.acquire(wait)
        log.note(f"run {run_id}: workflow {wf.name} ({wf.mode}, isolation {res.isolation}) on {project}")

        def interrupted() -> int | None:
            return got_signal[0] if got_signal else None

        if wf.mode == "container":
            res.exit_code = run_container(wf, cfg, project, run_id, res, log, interrupted, run_dir)
        else:
            res.exit_code = run_jail(wf, project, res, log, interrupted, run_dir)
        res.reason = "ok" if res.exit_code == 0 else "failed"
        res.message = "the workload succeeded" if res.exit_code == 0 else \
            f"the workload exited with {res.exit_code}"
    except workflow.WorkflowError as exc:
        res.reason, res.exit_code, res.message = "invalid", EXIT_INVALID, str(exc)
    except RunError as exc:
        res.reason, res.exit_code, res.message = exc.reason, exc.code, str(exc)
    except Interrupted as exc:
        res.reason, res.exit_code = "interrupted", 128 + exc.signum
        res.message = f"kooi run got signal {exc.signum}; the workload was killed"
    except Exception as exc:  # noqa: BLE001 - report, never hide, an internal failure
        res.reason, res.exit_code = "error", EXIT_ERROR
        res.message = f"kooi run failed: {exc.__class__.__name__}: {exc}"
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
        if lock:
            lock.release()
        res.end = _now()
        res.duration_s = round(time.monotonic() - t0, 3)
        log.note(f"{res.reason}: {res.message} (exit {res.exit_code}, {res.duration_s} s)")
        log.close()
        doc = json.dumps(res.as_dict(), indent=2) + "\n"
        if res.log:
            try:
                (run_dir / "results" / f"{run_id}.json").write_text(doc)
            except OSError:
                pass
        if out:
            try:
                out.write(doc)
            except outputs.OutputError as exc:
                print(f"kooi run: {exc}", file=sys.stderr)
    return res


def gc(run_dir: Path | None = None, engine_config: Path | None = None, dry_run: bool = False,
       keep_days: float = 14.0) -> list[str]:
    """Remove what runs left behind: containers of runs that no live process owns, scan
    containers, and logs/results older than KEEP_DAYS."""
    import docker

    run_dir = run_dir or RUN_DIR
    cfg = hostconfig.load(engine_config or hostconfig.DEFAULT_PATH)
    removed = []
    client = docker.DockerClient(base_url=f"unix://{cfg.socket}", timeout=30)
    live_runs = set()
    for lockf in (run_dir / "locks").glob("*.lock") if (run_dir / "locks").is_dir() else []:
        if lock_held(lockf):
            live_runs.add(lockf.name)
    for c in client.containers.list(all=True, filters={"label": f"{LABEL}.managed=1"}):
        wf_name = c.labels.get(f"{LABEL}.workflow", "")
        proj = c.labels.get(f"{LABEL}.project", "")
        key = hashlib.sha256(proj.encode()).hexdigest()[:16]
        if f"{wf_name}-{key}.lock" in live_runs and (c.status == "running" or c.labels.get(f"{LABEL}.nested")):
            continue  # a live run's workload, or what it started through its broker
        removed.append(f"container {c.name}")
        if not dry_run:
            c.remove(force=True, v=True)
    for c in client.containers.list(all=True, filters={"label": "org.kooi.scan=1"}):
        removed.append(f"container {c.name}")
        if not dry_run:
            c.remove(force=True, v=True)
    # Networks and volumes of testcontainers runs that ended without cleaning up.
    for coll, kind in ((client.networks, "network"), (client.volumes, "volume")):
        for obj in coll.list(filters={"label": f"{LABEL}.managed=1"}):
            labels = obj.attrs.get("Labels") or {}
            key = hashlib.sha256(labels.get(f"{LABEL}.project", "").encode()).hexdigest()[:16]
            if f"{labels.get(f'{LABEL}.workflow', '')}-{key}.lock" in live_runs:
                continue
            removed.append(f"{kind} {obj.name}")
            if not dry_run:
                try:
                    obj.remove()
                except docker.errors.APIError as exc:
                    removed[-1] += f" (not removed: {exc.explanation})"
    cutoff = time.time() - keep_days * 86400
    for sub in ("logs", "results"):
        d = run_dir / sub
        for f in d.glob("*") if d.is_dir() else []:
            if f.stat().st_mtime < cutoff:
                removed.append(f"{sub[:-1]} {f}")
                if not dry_run:
                    f.unlink()
    return removed
