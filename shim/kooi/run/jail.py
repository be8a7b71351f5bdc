"""The jail backend: the workflow's command in a bubblewrap jail on the host.

Only /usr, /etc and the project are bound, /tmp is private, every namespace is
unshared, the session is new, kooi's seccomp filter is installed by bwrap and the
jail's AppArmor profile by aa-exec. network: proxy gets a socket bridge to the proxy
and a forwarder on the jail's own loopback, never a network.
"""

from __future__ import annotations

import codecs
import os
import secrets
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import IO

from .. import apparmor, egress
from ..workflow import Workflow
from . import filters, jailscope
from . import limits as run_limits
from .context import RunContext
from .errors import EXIT_UNAVAILABLE, RunError

WORKSPACE = "/workspace"
JAIL_PROXY_DIR = "/run/kooi"


def bwrap_argv(wf: Workflow, project: Path, proxy: tuple[Path, int] | None = None,
               seccomp_fd: int | None = None, shadows: list[tuple[str, Path]] | None = None,
               plan: run_limits.Plan | None = None, cgroup: bool = False) -> list[str]:
    """PROXY: (the bridge's directory, the proxy port) for network: proxy: the jail gets
    the bridge socket and a forwarder on its own loopback, never a network.
    SECCOMP_FD: a readable fd holding kooi's seccomp program (kooi/seccomp.py), which
    bwrap installs right before it executes the workload. SHADOWS: (path in the
    project, a throwaway copy) bound over the project's (run.guard). PLAN: the run's
    limits (run.limits.for_jail), set by prlimit inside the jail, and a lower priority.
    CGROUP: the jail runs in a systemd scope of its own (run.jailscope), whose cgroup
    the wrapper binds read-only at /sys/fs/cgroup (bwrap gives the jail a cgroup
    namespace rooted there), as in a container."""
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
             "--bind", str(project), WORKSPACE]
    if cgroup:
        argv += ["--ro-bind", jailscope.CGROUP_MARK, "/sys/fs/cgroup"]
    for rel, copy in shadows or []:
        argv += ["--bind", str(copy), f"{WORKSPACE}/{rel}"]
    argv += ["--chdir", str(Path(WORKSPACE) / wf.workdir),
             "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
             "--setenv", "HOME", "/tmp/home", "--setenv", "LANG", "C.UTF-8", "--setenv", "TMPDIR", "/tmp",
             # no compiled Python in the project (the guard removes what the run wrote)
             "--setenv", "PYTHONDONTWRITEBYTECODE", "1"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    env: dict[str, str] = {}
    command = list(wf.command)
    if proxy is not None:
        bridge_dir, port = proxy
        argv += ["--bind", str(bridge_dir), JAIL_PROXY_DIR]
        env = egress.proxy_env("127.0.0.1", port, [])
        env["MAVEN_ARGS"] = f"--global-settings {JAIL_PROXY_DIR}/maven-settings.xml"
        command = ["/usr/bin/python3", "-I", "-c", egress.JAIL_FORWARDER, f"{JAIL_PROXY_DIR}/proxy.sock",
                   str(port), *command]
    if plan is not None:
        if plan.max_ram is not None:
            env["JAVA_TOOL_OPTIONS"] = run_limits.java_options(
                wf.environment.get("JAVA_TOOL_OPTIONS", env.get("JAVA_TOOL_OPTIONS", "")), plan.max_ram)
        # After bwrap made the jail's user namespace: RLIMIT_NPROC counts the jail's
        # processes only (set before, it would count every process of the runner's).
        command = [*plan.prlimit_argv(), *(["nice", "-n", str(plan.nice)] if plan.nice else []), *command]
    environment = dict(wf.environment)
    if "JAVA_TOOL_OPTIONS" in env:
        environment.pop("JAVA_TOOL_OPTIONS", None)
    for k, v in {**env, **environment}.items():
        argv += ["--setenv", k, v]
    return argv + ["--", *command]


class JailBackend:
    poll_interval = 0.5

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.pump: threading.Thread | None = None
        self.first: list[str] = []
        self.bridge: egress.JailBridge | None = None
        self.fds: list[int] = []
        self.status_r: int | None = None  # bwrap's --json-status-fd, read end
        self.argv: list[str] = []
        self.ctx: RunContext | None = None
        self.plan: run_limits.Plan | None = None
        self.scope: Path | None = None  # the scope's report files (run.jailscope), where a jail has one

    def prepare(self, ctx: RunContext) -> None:
        self.ctx = ctx
        wf, res, log = ctx.wf, ctx.res, ctx.log
        self.plan = plan = run_limits.for_jail(ctx.limits, ctx.limit_origin, scope=jailscope.controllers())
        res.limits.update(plan.record)
        log.note(plan.summary())
        for info in plan.info:
            log.note(f"limits: {info}")
        for note in plan.notes:
            res.warn(log, f"limits: {note}")
        proxy = None
        eg = ctx.egress_preflight()
        if eg is not None:
            self.bridge = bridge = egress.JailBridge(ctx.run_dir / "jails" / secrets.token_hex(8), ctx.proxy_port)
            (bridge.dir / "maven-settings.xml").write_text(egress.maven_settings("127.0.0.1", ctx.proxy_port, []))
            assert res.egress is not None
            res.egress["proxy"] = f"http://127.0.0.1:{ctx.proxy_port}"
            log.note("egress: through the proxy only (a socket bridge; the jail has no network)")
            proxy = (bridge.dir, ctx.proxy_port)
        conf, prefix = ctx.confinement(apparmor.for_jail)
        res.apparmor = conf.as_dict()
        log.note(conf.note)
        filt = filters.program(wf.debugger)
        res.seccomp = {"engine": None, "kooi": True, "note": filters.NOTE + " (bwrap --seccomp)"
                       + ("; ptrace allowed (debugger: true)" if wf.debugger else "")}
        log.note("seccomp: " + res.seccomp["note"])
        rfd, wfd = os.pipe()
        self.fds.append(rfd)
        try:
            os.write(wfd, filt)
        finally:
            os.close(wfd)
        # bwrap says on this pipe when the workload's process exists ({"child-pid": N}):
        # until then a failure is bwrap's own, after it the exit code is the workload's,
        # whatever the workload printed (its output and bwrap's messages share a stream).
        self.status_r, status_w = os.pipe()
        self.fds.append(status_w)
        argv = bwrap_argv(wf, ctx.project, proxy, rfd, ctx.shadows(), plan, cgroup=bool(plan.scope))
        argv[1:1] = ["--json-status-fd", str(status_w)]
        jail = [*prefix, *argv]
        if plan.scope:
            self.scope = ctx.run_dir / "jails" / f"{ctx.run_id}.scope"
            self.scope.parent.mkdir(parents=True, exist_ok=True)
            unit = "kooi-jail-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in ctx.run_id)
            log.note(f"limits: the jail runs in the systemd user scope {unit}.scope")
            jail = [*jailscope.argv(unit, plan.scope, self.scope, tuple(self.fds)), *jail]
        self.argv = jail

    def start(self) -> None:
        assert self.ctx is not None
        log = self.ctx.log
        self.proc = proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, start_new_session=True,
                                            pass_fds=tuple(self.fds))
        assert proc.stdout is not None
        out: IO[bytes] = proc.stdout

        def pump() -> None:
            # In chunks, not lines (a line without an end held the whole output in
            # memory), decoded across them (review 25: a character split between two
            # writes became two U+FFFD).
            dec = codecs.getincrementaldecoder("utf-8")("replace")
            head = ""
            while chunk := os.read(out.fileno(), 1 << 16):
                text = dec.decode(chunk)
                if not self.first:
                    head += text
                    if "\n" in head or len(head) > 4096:
                        self.first.append(head.partition("\n")[0] + "\n")
                log.output(text)
            if text := dec.decode(b"", final=True):
                log.output(text)
            if not self.first and head + text:
                self.first.append(head + text)

        self.pump = threading.Thread(target=pump, daemon=True)
        self.pump.start()
        log.note(f"started bubblewrap jail (pid {proc.pid})")

    def wait(self, timeout: float) -> int | None:
        assert self.proc is not None and self.pump is not None
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self.pump.join(timeout=10)
        first = self.first
        started = self._workload_started()
        if self.scope is not None:
            if not jailscope.started(self.scope):
                raise RunError("unavailable", EXIT_UNAVAILABLE,
                               "systemd-run could not start the jail's scope under the runner's user manager: "
                               + (first[0].strip() if first else f"exit {rc}"))
            self._limits_reached(jailscope.reached(self.scope))
        if rc == 1 and first and first[0].startswith("bwrap: execvp"):
            return 127  # the workflow's command does not exist in the jail
        if rc == 1 and first and first[0].startswith("bwrap: ") and not started:
            # bubblewrap itself failed before the workload started (e.g. no unprivileged
            # user namespaces on this kernel): not the workload's exit code.
            raise RunError("unavailable", EXIT_UNAVAILABLE,
                           f"bubblewrap could not set up the jail: {first[0].strip()[7:]} (unprivileged user "
                           "namespaces must be allowed: sysctl kernel.unprivileged_userns_clone=1)")
        return rc if rc >= 0 else 128 - rc

    def _workload_started(self) -> bool:
        """bwrap reported the workload's process on its status pipe."""
        if self.status_r is None:
            return False
        os.set_blocking(self.status_r, False)
        data = b""
        try:
            while chunk := os.read(self.status_r, 65536):
                data += chunk
        except BlockingIOError:
            pass
        return b'"child-pid"' in data

    def kill(self) -> None:
        # bwrap dies; --die-with-parent and the pid namespace take every jailed process.
        if self.proc is None:
            return
        if self.scope is not None:
            self._limits_reached(jailscope.reached_now(self.scope))
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        if self.pump is not None:
            self.pump.join(timeout=5)

    def _limits_reached(self, hits: list[str]) -> None:
        assert self.ctx is not None
        res = self.ctx.res
        if hits and res.limit is None:
            res.limit = hits[0]
            res.warn(self.ctx.log, f"the workload reached its {' and '.join(hits)} limit" + ("s" if len(hits) > 1 else "")
                     + " (run.limits: " + ", ".join(f"{h} {res.limits.get(h, {}).get('requested')}" for h in hits) + ")")

    def cleanup(self) -> None:
        if self.scope is not None:
            jailscope.cleanup(self.scope)
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()
        if self.status_r is not None:
            os.close(self.status_r)
            self.status_r = None
        if self.bridge is not None:
            self.bridge.close()
            shutil.rmtree(self.bridge.dir, ignore_errors=True)
