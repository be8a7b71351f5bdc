"""The container backend: the pinned runner image on the runner's unprivileged engine.

Non-root user, cap-drop ALL, no-new-privileges, read-only root, the engine's seccomp
profile with kooi's filter stacked on it, AppArmor where the engine can apply it,
limits where the engine enforces them, the project at /workspace, no engine socket and
no network, unless the workflow asks for the proxy (network: proxy) or for a policed
engine of its own (testcontainers: brokered.BrokeredEngine).
"""

from __future__ import annotations

import codecs
import json
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import apparmor, engineapi, image, labels
from ..hoststate import paths
from ..hoststate.egress import EgressConfig
from ..hoststate.engine import EngineConfig
from ..seccomp import TOKEN_ENV, limit_mark, limits_reached
from ..workflow import Workflow
from . import filters, releases, runnet, session
from . import limits as run_limits
from .brokered import ENGINE_HOST, BrokeredEngine
from .context import RunContext
from .errors import EXIT_ERROR, Result, refused, unavailable
from .project import SUBGID, grant_search, grant_workspace, host_uid_of, share_with_group, subid_start
from .spec import WORKSPACE, bind, env_of, set_env

MAVEN_SETTINGS = "/run/kooi/maven-settings.xml"


def engine_limits(info: dict[str, Any]) -> dict[str, bool]:
    """What this engine's cgroups can bound (rootless needs cgroup v2 with delegated
    controllers): the engine's own report (GET /info)."""
    return {"memory": bool(info.get("MemoryLimit")), "pids": bool(info.get("PidsLimit")),
            "cpus": bool(info.get("CpuCfsQuota")) and bool(info.get("CPUShares", True))}


def container_args(wf: Workflow, cfg: EngineConfig, img_attrs: dict[str, Any], project: Path, run_id: str,
                   plan: run_limits.Plan, res: Result,
                   shadows: list[tuple[str, Path]] | None = None) -> dict[str, Any]:
    """The workload container's create body (the Engine API's ContainerCreate, without
    the image, which the caller adds: the pinned id). PLAN: the run's limits as this
    engine bounds them (run.limits). SHADOWS: (path in the project, a throwaway copy)
    mounted over the project's (run.guard)."""
    user = (img_attrs.get("Config") or {}).get("User") or ""
    if image.default_user_is_root(img_attrs):
        raise refused(f"image {res.image_digest} runs as root by default; kooi runs only non-root images")
    uid = int(user.split(":", 1)[0]) if user.split(":", 1)[0].isdigit() else None
    if uid is None:
        raise refused(f"image user {user!r} is not numeric; set USER uid:gid")
    home = next((e.split("=", 1)[1] for e in (img_attrs.get("Config") or {}).get("Env") or []
                 if e.startswith("HOME=")), "/tmp")
    size = wf.tmpfs_size
    tmpfs = {"/tmp": f"rw,exec,nosuid,nodev,size={size},mode=1777"}
    if home not in ("/tmp", WORKSPACE):
        tmpfs[home] = f"rw,exec,nosuid,nodev,size={size},uid={uid},gid={user.split(':')[-1]},mode=0700"
    host: dict[str, Any] = {
        "NetworkMode": "none", "CapDrop": ["ALL"], "SecurityOpt": ["no-new-privileges:true"],
        "ReadonlyRootfs": True, "Tmpfs": tmpfs, "Init": True, "IpcMode": "private",
        "Mounts": [bind(WORKSPACE, str(project))] + [bind(f"{WORKSPACE}/{rel}", str(copy))
                                                     for rel, copy in shadows or []],
    }
    body: dict[str, Any] = {
        "Cmd": list(wf.command), "User": user, "WorkingDir": str(Path(WORKSPACE) / wf.workdir),
        "Hostname": wf.name[:63], "Labels": labels.run_labels(wf.name, str(project), run_id),
        "HostConfig": host,
    }
    # Compiled Python written into the project runs instead of its source on the host
    # (the guard removes what the run wrote): none is written unless the workflow says so.
    set_env(body, {"PYTHONDONTWRITEBYTECODE": "1", **wf.environment})
    host.update(plan.host_config)
    host["Ulimits"] = plan.ulimits()
    res.limits.update(plan.record)
    for note in plan.notes:
        res.warnings.append(f"limits: {note}")
    return body


def cgroup_limits_reached(pid: int) -> list[str]:
    """Which cgroup limit the container of host process PID has reached so far, from its
    cgroup's event counters on the host (kooi run reads them before it kills a run at
    its timeout; the container's init reads the same files when the workload ends)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return []
    where: dict[str, str] = {}
    for line in lines:
        _, ctls, path = line.split(":", 2)
        for ctl in (ctls.split(",") if ctls else ["unified"]):
            where[ctl] = path.lstrip("/")
    events: list[tuple[str, str, str]] = []
    if "pids" in where:
        events.append((f"/sys/fs/cgroup/pids/{where['pids']}/pids.events", "max", "pids"))
    if "memory" in where:
        events.append((f"/sys/fs/cgroup/memory/{where['memory']}/memory.oom_control", "oom_kill", "memory"))
    if "unified" in where:
        events += [(f"/sys/fs/cgroup/{where['unified']}/pids.events", "max", "pids"),
                   (f"/sys/fs/cgroup/{where['unified']}/memory.events", "oom_kill", "memory")]
    return limits_reached(tuple(events))


class ContainerBackend:
    poll_interval = 2.0

    def __init__(self) -> None:
        self.ctx: RunContext | None = None
        self.client: engineapi.Engine | None = None
        self.container: str | None = None  # its id
        self.name = ""
        self.access: BrokeredEngine | None = None
        self.settings: Path | None = None
        self.pump: threading.Thread | None = None
        self.proxy_host: str | None = None
        self.registered = False
        self.owed: releases.Owed | None = None  # the run's release, until the injector has released it
        self.plan: run_limits.Plan | None = None
        self.tail = ""  # the end of the workload's output (the init's limit report)
        self.token = ""  # the init's secret: only its limit report carries it
        self.hits_seen: list[str] = []  # limits kooi saw reached itself (before killing the run)
        self.pid: int | None = None  # the container's init, as the host sees it
        self.run_net: str | None = None  # the run's own network, where no broker made one
        self.run_net_gateway: str | None = None
        self.pinned = False  # the run's way to the host (run.runnet)

    def prepare(self, ctx: RunContext) -> None:
        self.ctx = ctx
        wf, cfg, res, log = ctx.wf, ctx.cfg, ctx.res, ctx.log
        try:
            self.client = client = engineapi.connect(cfg)
        except engineapi.EngineError as exc:
            raise unavailable(str(exc)) from None
        self._sweep()
        pin = image.read_pins().get(wf.image)
        if pin is None:
            raise unavailable(f"no pinned image {wf.image!r} in {image.PINS_PATH}; provision it with site.yml "
                              "(role runner_image)")
        res.image, res.image_digest = pin.tag or None, pin.id
        try:
            img = client.image(pin.id)
        except engineapi.NotFound:
            raise unavailable(f"the engine does not hold the pinned image {pin.id}; re-run site.yml "
                              "(role runner_image)") from None
        user = ((img.get("Config") or {}).get("User") or "0").split(":")[0] or 0
        host_uid = host_uid_of(cfg, int(user))
        grant_workspace(ctx.project, host_uid, cfg.runner_uid, log)
        shadows = ctx.shadows()
        if ctx.guard and ctx.guard.shadow:
            grant_workspace(ctx.guard.shadow, host_uid, cfg.runner_uid, log, note=False)
        try:
            info = client.info()
        except (engineapi.APIError, OSError) as exc:
            raise unavailable(f"the engine does not answer GET /info: {exc}") from None
        self.plan = plan = run_limits.for_container(ctx.limits, ctx.limit_origin, engine_limits(info),
                                                    info.get("NCPU"), cfg.mode, client.hard_rlimits())
        body = container_args(wf, cfg, img, ctx.project, ctx.run_id, plan, res, shadows)
        if ctx.session is not None:
            session.shape(body, wf, ctx.session, img)
            session.ensure_home(client, ctx)
        log.note(plan.summary())
        for line in plan.info:
            log.note(f"limits: {line}")
        if wf.debugger:
            profile = next((o.split("profile=", 1)[1] for o in info.get("SecurityOptions") or []
                            if o.startswith("name=seccomp,") and "profile=" in o), "")
            if profile.startswith(paths.SECCOMP_DIR + "/"):
                raise refused(f"workflow {wf.name} asks for a debugger (debugger: true), but this host's engine "
                              f"profile ({profile}, kooi_engine_seccomp: auto) refuses ptrace for every container; "
                              "set kooi_engine_seccomp: engine and re-run site.yml to allow debugger workflows here")
        res.seccomp = filters.stack_on_container(body, img, wf.timeout, plan.nice, wf.debugger,
                                                 wf.session.idle_timeout if wf.session else None)
        if res.seccomp["kooi"]:
            self.token = secrets.token_hex(16)
            set_env(body, {**env_of(body), TOKEN_ENV: self.token})
        if wf.debugger:
            res.seccomp["note"] += "; ptrace allowed (debugger: true)"
        log.note("seccomp: " + res.seccomp["note"])
        deadline = wf.timeout + filters.DEADLINE_GRACE
        res.limits["deadline"] = {"requested": deadline, "enforced": res.seccomp["kooi"],
                                  "by": "the container's init" if res.seccomp["kooi"] else "kooi run only"}
        if not res.seccomp["kooi"]:
            res.warn(log, f"deadline: only kooi run ends this run at its timeout (image {res.image_digest} is not "
                          "kooi's runner image, whose init would end it even without kooi run)")
        for w in res.warnings:
            log.note(f"warning: {w}")
        if res.isolation == "gvisor":
            # runsc ignores AppArmor profiles (it logs and drops them): gVisor's sentry,
            # a kernel of the sandbox's own, is the boundary instead.
            conf = apparmor.Confinement(None, "AppArmor: not applied, runsc ignores AppArmor profiles; gVisor's "
                                              "sentry (a kernel of the sandbox's own) confines the workload")
        else:
            conf = ctx.confinement(lambda state: apparmor.for_container(cfg.mode, state))
        res.apparmor = conf.as_dict()
        log.note(conf.note)
        if conf.profile:
            body["HostConfig"]["SecurityOpt"].append(f"apparmor={conf.profile}")
        eg = ctx.egress_preflight()
        # The run's networks are bridges named after it (rootless) or after its proxy
        # port (userns-remap), which reach the host only on the run's own ports (run.runnet).
        bridges = runnet.bridges(cfg, eg, ctx.run_id, ctx.proxy_port)
        own_way = bool(bridges)
        if wf.testcontainers:
            self.access = BrokeredEngine(client, ctx, conf.profile)
            self.access.open(body, plan.ceilings(), ctx.guard.nested_shadows if ctx.guard else [], bridges)
        elif own_way:
            self.run_net = f"kooi-{ctx.run_id}"
            from .. import egress

            try:
                self.run_net_gateway = egress.gateway(client.create_network(
                    self.run_net, labels.run_labels(wf.name, str(ctx.project), ctx.run_id),
                    options={engineapi.BRIDGE_NAME: bridges[0]}))
            except (engineapi.APIError, OSError) as exc:
                raise unavailable(f"cannot create the run's network {self.run_net}: {exc}") from None
            body["HostConfig"]["NetworkMode"] = self.run_net
        if eg is not None:
            self.settings = self._wire_egress(eg, body, img)
        if wf.secrets:
            self._wire_secrets(body)
        if own_way and runnet.applies(cfg):
            ports = [ctx.proxy_port] + ([ctx.secrets.injector.port] if self.registered and ctx.secrets else [])
            try:
                assert eg is not None
                runnet.pin(cfg, ctx.run_id, ports, labels.lock_key(str(ctx.project)), eg.port)
            except runnet.RunNetError as exc:
                raise unavailable(f"egress: {exc}") from None
            self.pinned = True
            log.note(f"egress: the run's networks reach the host on port(s) {', '.join(map(str, sorted(set(ports))))} "
                     f"only, at most {runnet.MAX_CONNECTIONS} connections at once")
        elif own_way:
            log.note(f"egress: the run's networks (bridges {bridges[0][:-1]}*) reach the host on port "
                     f"{ctx.proxy_port} and the injector's only, at most {runnet.MAX_CONNECTIONS} connections at once "
                     "(the host's rules)")
        if plan.max_ram is not None:
            env = env_of(body)
            env["JAVA_TOOL_OPTIONS"] = run_limits.java_options(env.get("JAVA_TOOL_OPTIONS", ""), plan.max_ram)
            set_env(body, env)
        if res.isolation == "gvisor":
            self._under_gvisor(body)
        self.name = f"kooi-{ctx.run_id}"
        self.container = client.create({**body, "Image": pin.id}, name=self.name)
        if self.access:
            self.access.protect(self.container)

    def _under_gvisor(self, body: dict[str, Any]) -> None:
        """min_isolation: gvisor: the workload runs under runsc, and runsc's gofer, which
        opens every bind source itself as the remap range's root, may reach them."""
        assert self.ctx is not None and self.ctx.cfg.gvisor is not None
        ctx, cfg, g = self.ctx, self.ctx.cfg, self.ctx.cfg.gvisor
        body["HostConfig"]["Runtime"] = g.runtime
        # The project's group is the host gid of the workload's gid 1000 (roles/gvisor):
        # an image whose user has another gid could not write it under runsc.
        user = str(body.get("User") or "")
        gid = user.split(":")[1] if ":" in user else ""
        want = g.group - subid_start(cfg.remap_user or "kooi-remap", SUBGID)
        if gid != str(want):
            raise refused(f"image user {user!r}: under gVisor the workload's gid must be {want}, whose host group "
                          f"({g.group}, kooi_gvisor_group) holds the project (gVisor ignores POSIX ACLs); use "
                          "kooi's runner image or set USER uid:" + str(want))
        root = host_uid_of(cfg, 0)
        grant_workspace(ctx.project, root, cfg.runner_uid, ctx.log)
        if ctx.guard and ctx.guard.shadow:
            grant_workspace(ctx.guard.shadow, root, cfg.runner_uid, ctx.log, note=False)
            # The throwaway git directories hold the index and HEAD git writes: gVisor
            # judges them by mode bits alone, as it does the project.
            share_with_group(ctx.guard.shadow, g.group, cfg.runner_user, ctx.log)
        for m in body["HostConfig"]["Mounts"]:
            if m.get("Type") == "bind":
                grant_search(Path(m["Source"]), root, cfg.runner_uid, ctx.log)
        ctx.res.gvisor = {"runtime": g.runtime, "runsc": g.version, "platform": g.platform, "network": g.network}
        ctx.log.note(f"gvisor: runtime {g.runtime} (runsc {g.version}, platform {g.platform}, network {g.network})")

    def _sweep(self) -> None:
        """Remove what an earlier run on this project left when its kooi run died (kill -9,
        the OOM killer): this run holds the project's run lock now, so nothing
        of theirs is alive. Its workload ended at its own deadline (kooi's init); the
        containers its broker started did not. One filtered list: cheap enough for every run."""
        ctx, client = self.ctx, self.client
        assert ctx is not None and client is not None
        flt = {"label": [f"{labels.MANAGED}=1", f"{labels.PROJECT}={ctx.project}"]}
        try:
            left = client.request("GET", "/containers/json", query={"all": "1", "filters": json.dumps(flt)}) or []
        except (engineapi.APIError, OSError) as exc:
            raise unavailable(f"the engine does not list containers: {exc}") from None
        gone = []
        for c in left:
            name = (c.get("Names") or ["?"])[0].lstrip("/")
            try:
                client.remove(c["Id"])
                gone.append(f"{name} (run {(c.get('Labels') or {}).get(labels.RUN, '?')})")
            except engineapi.NotFound:
                continue
            except (engineapi.APIError, OSError) as exc:
                raise unavailable(f"cannot remove {name}, left by an earlier run on this project: "
                                  f"{exc}") from None
        if gone:
            ctx.res.warn(ctx.log, f"removed {len(gone)} container(s) left by earlier runs on this project whose "
                                  f"kooi run died: {', '.join(gone)}")

    def _wire_egress(self, eg: EgressConfig, body: dict[str, Any], img_attrs: dict[str, Any]) -> Path:
        """Give the workload a network whose only way out is the proxy, and the proxy in
        the form each tool reads; returns the per-run Maven settings file (removed by cleanup)."""
        from .. import egress

        assert self.ctx is not None and self.client is not None
        ctx, cfg, res = self.ctx, self.ctx.cfg, self.ctx.res
        host_config = body["HostConfig"]
        if cfg.mode == "rootless":
            host = egress.ROOTLESS_HOST_LOOPBACK
        elif self.access is not None:
            host = self.access.gateway or ""  # the run network's
        elif self.run_net is not None:
            if not self.run_net_gateway:
                raise unavailable(f"the run network {self.run_net} has no gateway address")
            host = self.run_net_gateway
        else:
            try:
                host = egress.bridge_gateway(self.client.network("bridge"))
            except egress.EgressError as exc:
                raise unavailable(str(exc)) from None
        if self.access is None and self.run_net is None:
            host_config["NetworkMode"] = "bridge"
        # Nested containers and the engine's addresses are reached directly, never through
        # the proxy (which refuses private destinations anyway).
        # The host itself by name too (the injector listens there; not every client
        # reads CIDRs in no_proxy).
        # The run network's gateway by its name (brokered.ENGINE_HOST) too.
        java_skip = [host, ENGINE_HOST, "10.*", "172.*", "192.168.*"]
        env = egress.proxy_env(host, ctx.proxy_port, [host, ENGINE_HOST, "10.0.0.0/8", "172.16.0.0/12",
                                                      "192.168.0.0/16"], java_skip)
        self.proxy_host = host
        settings_dir = ctx.run_dir / "egress"
        settings_dir.mkdir(mode=0o755, exist_ok=True)
        settings = settings_dir / f"{ctx.run_id}-maven-settings.xml"
        settings.write_text(egress.maven_settings(host, ctx.proxy_port, java_skip))
        settings.chmod(0o644)
        host_config["Mounts"].append(bind(MAVEN_SETTINGS, str(settings), read_only=True))
        image_env = dict(e.split("=", 1) for e in (img_attrs.get("Config") or {}).get("Env") or [] if "=" in e)
        mine = env_of(body)
        maven_args = mine.get("MAVEN_ARGS", image_env.get("MAVEN_ARGS", ""))
        mine["MAVEN_ARGS"] = f"{maven_args} --global-settings {MAVEN_SETTINGS}".strip()
        set_env(body, {**env, **mine})
        assert res.egress is not None
        res.egress["proxy"] = f"http://{host}:{ctx.proxy_port}"
        ctx.log.note(f"egress: through the proxy at {res.egress['proxy']} only")
        return settings

    def _wire_secrets(self, body: dict[str, Any]) -> None:
        """Register the run with the injector: the workload gets a placeholder and the
        injector's address for each inject secret (the value stays on the host) and
        the value of each environment secret."""
        from .. import inject

        assert self.ctx is not None and self.ctx.secrets is not None
        ctx, sc, res = self.ctx, self.ctx.secrets, self.ctx.res
        injected = [n for n in ctx.wf.secrets if sc.secrets[n].mode == "inject"]
        if injected and not self.proxy_host:
            raise unavailable(f"secrets {', '.join(injected)}: the injector is reached on the run's proxy path, "
                              "and this host has no egress control (kooi_egress_enabled); enable it and re-run "
                              "site.yml")
        self.owed = releases.Owed(ctx.run_dir, ctx.run_id)
        try:
            doc = inject.call(sc, {"op": "register", "run": ctx.run_id, "workflow": ctx.wf.name,
                                   "directory": str(ctx.wf.path.parent),
                                   **({"person": ctx.session.person} if ctx.session else {})})
        except inject.InjectError as exc:
            # Not registered, or registered and its answer lost: released by the next
            # run or `kooi gc` either way.
            self.owed.close()
            raise unavailable(f"secrets: {exc}") from None
        self.registered = True
        env: dict[str, str] = {}
        base = f"http://{self.proxy_host}:{sc.injector.port}"
        record: dict[str, Any] = {"injected": {}, "environment": []}
        for name, token in doc["placeholders"].items():
            sdef = sc.secrets[name]
            env[sdef.env] = token
            if sdef.base_url_env:
                env[sdef.base_url_env] = base
            record["injected"][name] = {"env": sdef.env, "base_url": base, "upstream": sdef.upstream,
                                        "paths": list(sdef.paths)}
        for name in ctx.wf.secrets:
            if sc.secrets[name].mode == "environment":
                record["environment"].append(name)
        env.update(doc["environment"])
        set_env(body, {**env_of(body), **env})
        res.secrets = record
        parts = [f"{n} injected by the host for {sc.secrets[n].upstream} (the workload holds a placeholder)"
                 for n in record["injected"]]
        parts += [f"{n} as plain environment ${sc.secrets[n].env} (readable by the whole workload)"
                  for n in record["environment"]]
        ctx.log.note("secrets: " + "; ".join(parts))

    def start(self) -> None:
        assert self.ctx is not None and self.client is not None and self.container is not None
        client, cid, log = self.client, self.container, self.ctx.log
        # Attached before it starts: every byte, with backpressure (engineapi.attach).
        try:
            stream: Iterator[bytes] = client.attach(cid)
        except (engineapi.APIError, OSError) as exc:
            self.ctx.res.warn(log, f"output: the engine refused to attach ({exc}); following its log file instead, "
                                   "which loses what its rotation removes before kooi reads it")
            stream = client.logs(cid)
        client.start(cid)
        try:
            self.pid = int((client.inspect(cid).get("State") or {}).get("Pid") or 0) or None
        except (engineapi.APIError, OSError):
            self.pid = None
        log.note(f"started {self.name} ({(self.ctx.res.image_digest or '')[:19]}) on the "
                 f"{self.ctx.cfg.mode} engine")

        def follow() -> None:
            # Decoded across chunks (review 25: a character split between two writes
            # became two U+FFFD in the log and on stdout).
            dec = codecs.getincrementaldecoder("utf-8")("replace")
            try:
                for chunk in stream:
                    text = dec.decode(chunk)
                    self.tail = (self.tail + text)[-512:]
                    log.output(text)
            except Exception:  # noqa: BLE001 - the container went away; the wait says why
                pass
            if text := dec.decode(b"", final=True):
                log.output(text)

        self.pump = threading.Thread(target=follow, daemon=True)
        self.pump.start()

    def wait(self, timeout: float) -> int | None:
        assert self.ctx is not None and self.pump is not None and self.client is not None
        assert self.container is not None
        try:
            st = self.client.wait(self.container, timeout=max(0.1, timeout))
        except OSError as exc:
            if self._engine_answers():
                return None  # a hiccup: the next wait asks again
            assert self.ctx is not None
            grace = self.ctx.res.limits.get("deadline", {})
            raise unavailable(
                f"the engine stopped answering during the run ({exc.__class__.__name__}: {exc}); the workload "
                + (f"ends at its own deadline, {grace['requested']:g} s after it started (kooi's init), "
                   if grace.get("enforced") else "may run on until the engine is back, ")
                + "and `kooi engine start` then `kooi gc` remove its container") from None
        if st is None:
            return None
        self.pump.join(timeout=10)
        self._limits_reached(self.client.inspect(self.container).get("State", {}).get("OOMKilled"))
        if self.ctx.session is not None:
            session.end_of(self.ctx, self.tail, self.token)
        return int(st.get("StatusCode", EXIT_ERROR))

    def _engine_answers(self, tries: int = 3) -> bool:
        assert self.client is not None
        for i in range(tries):
            try:
                self.client.request("GET", "/_ping", timeout=5, versioned=False)
                return True
            except (engineapi.APIError, OSError):
                if i + 1 < tries:
                    time.sleep(1)
        return False

    def _limits_reached(self, oom_killed: bool, stats: dict[str, Any] | None = None) -> None:
        """Which limit the workload reached: the engine's OOM record, its stats (a run
        killed at its timeout while at its pids limit), or kooi's init, whose last line
        reads its cgroup's event counters (kooi/seccomp.py)."""
        assert self.ctx is not None
        hits = ["memory"] if oom_killed else []
        hits += [h for h in self.hits_seen if h not in hits]
        mark = limit_mark(self.token)
        for line in self.tail.strip().splitlines()[-3:] if self.token else []:
            # Only the init's report counts (it carries the run's secret): a line the
            # workload printed sets no limit of the result. The report may follow a
            # partial last line of the workload's on the same line.
            at = line.find(mark)
            if at >= 0:
                hits += [h for h in line[at + len(mark):].split() if h in ("pids", "memory") and h not in hits]
        pids = (stats or {}).get("pids_stats") or {}
        if pids.get("limit") and pids.get("current", 0) >= pids["limit"] and "pids" not in hits:
            hits.append("pids")
        if hits and self.ctx.res.limit is None:
            self.ctx.res.limit = hits[0]
            self.ctx.res.warn(self.ctx.log, f"the workload reached its {' and '.join(hits)} limit"
                              + ("s" if len(hits) > 1 else "") + " (run.limits: " + ", ".join(
                                  f"{h} {self.ctx.res.limits.get(h, {}).get('requested')}" for h in hits) + ")")

    def kill(self) -> None:
        assert self.client is not None and self.container is not None
        hits = cgroup_limits_reached(self.pid) if self.pid else []
        if hits:
            self.hits_seen += hits  # what the init would have said
        try:
            stats = self.client.request("GET", f"/containers/{self.container}/stats",
                                        query={"stream": "0", "one-shot": "1"}, timeout=10)
            self._limits_reached(False, stats if isinstance(stats, dict) else None)
        except (engineapi.APIError, OSError):
            self._limits_reached(False)  # no stats: the cgroup's own counters only
        try:
            self.client.kill(self.container)
            self.client.wait(self.container, timeout=30)
        except (engineapi.APIError, OSError):
            pass  # it ended meanwhile

    def leftovers(self) -> list[str]:
        """After the project check: what of the run exists now (review 48: a container
        made by a request in flight at the broker's end wrote into the project after the
        check); removed (broker.cleanup, one listing), its containers named."""
        if self.access is None or self.ctx is None:
            return []
        from .. import broker

        try:
            got = broker.cleanup(self.access.cfg.socket, self.ctx.run_id, passes=1)
        except OSError as exc:
            return [f"(the engine did not list the run's containers: {exc})"]
        return [*got["containers"], *got["failed"]]

    def cleanup(self) -> None:
        assert self.ctx is not None
        left = None
        if self.container is not None and self.client is not None:
            try:
                self.client.remove(self.container)
            except engineapi.NotFound:
                pass
            except OSError as exc:
                # The engine is gone: the rest of the cleanup still runs (secrets,
                # settings); the container is for `kooi gc` once the engine is back.
                self.ctx.res.warn(self.ctx.log, f"could not remove {self.name}: the engine does not answer "
                                                f"({exc}); `kooi engine start`, then `kooi gc`")
                left = self.name
        if self.access:
            self.access.close(self.ctx.res)
        if self.run_net is not None and self.client is not None and left is None:
            try:
                self.client.request("DELETE", f"/networks/{self.run_net}")
            except engineapi.NotFound:
                pass
            except (engineapi.APIError, OSError) as exc:
                self.ctx.res.warn(self.ctx.log, f"could not remove the run's network {self.run_net} ({exc}); "
                                                "`kooi gc` removes it")
        if self.pinned:
            try:
                runnet.unpin(self.ctx.cfg, self.ctx.run_id)
                self.pinned = False
            except runnet.RunNetError as exc:
                self.ctx.res.warn(self.ctx.log, f"egress: the run's rules are left ({exc}); `kooi gc` removes them")
        if self.registered and self.ctx.secrets is not None:
            self._release_secrets()
        if self.settings is not None:
            self.settings.unlink(missing_ok=True)
        if left:
            res = self.ctx.res
            res.cleanup = {**(res.cleanup or {}), "failed": [*((res.cleanup or {}).get("failed") or []), left]}

    def _release_secrets(self) -> None:
        """The placeholders die with the run; the injector's record of the run (what it
        forwarded, what it refused) goes into the result."""
        from .. import inject

        assert self.ctx is not None and self.ctx.secrets is not None and self.owed is not None
        res = self.ctx.res
        try:
            rec = releases.release(self.ctx.run_dir, self.ctx.secrets, self.ctx.run_id) or {}
        except inject.InjectError as exc:
            self.owed.close()
            res.warn(self.ctx.log, f"secrets: could not release the run's placeholders ({exc}); the next run "
                     "on this host or `kooi gc` releases them (run.releases), at the latest they expire ten "
                     "minutes after the run's timeout")
            return
        self.owed.paid()
        self.registered = False
        if res.secrets is not None:
            res.secrets["forwarded"] = rec.get("forwarded", 0)
            if rec.get("not_logged"):
                res.secrets["not_logged"] = rec["not_logged"]
            res.secrets["refused"] = rec.get("refused", [])
            res.secrets["requests"] = rec.get("requests", [])
        for r in rec.get("refused", []):
            self.ctx.log.note(f"secrets: the injector refused {r['method']} {r['path']} ({r['status']}: "
                              f"{r.get('reason', '')})")
