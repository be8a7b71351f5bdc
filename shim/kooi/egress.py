"""`kooi egress`: the host-side egress control that roles/egress sets up.

roles/egress writes /etc/kooi/egress.json (root-owned): where the proxy listens, the
nftables table, the rules file, Squid's configuration and access log. This module
starts the proxy and re-applies the rules on hosts without systemd (as `kooi engine
start` does for the engine), tells whether the rules are in force for the calling
user without privileges, gives workloads the proxy the way each tool expects it, and
reads the proxy's access log.
"""

from __future__ import annotations

import collections
import errno
import os
import signal
import socket
import socketserver
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .hoststate.egress import EgressConfig
from .jailfwd import relay

if TYPE_CHECKING:
    import docker

SQUID = "/usr/sbin/squid"
NFT = "/usr/sbin/nft"
# The rules reject with "administratively prohibited": connect() from a confined uid to
# a closed loopback port fails with EHOSTUNREACH (or EACCES), not ECONNREFUSED.
PROBE_PORT = 9
# How a workload reaches the proxy on the rootless engine: slirp4netns maps 10.0.2.2
# to the host's loopback (rootlesskit --disable-host-loopback=false, roles/egress).
ROOTLESS_HOST_LOOPBACK = "10.0.2.2"


class EgressError(Exception):
    """Egress is configured but not in force; the message says what to do."""


# --- state -------------------------------------------------------------------------


def rules_enforced(cfg: EgressConfig, timeout: float = 3.0) -> tuple[bool, str]:
    """Are the rules in force for the calling user? Unprivileged: connect to a closed
    loopback port; the rules answer 'administratively prohibited' (EHOSTUNREACH or
    EACCES), an unconfined user gets ECONNREFUSED. Meaningful for confined users only
    (the runner and its subordinate uids)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(("127.0.0.1", PROBE_PORT))
        return False, f"127.0.0.1:{PROBE_PORT} accepted a connection (something listens there; the probe needs it closed)"
    except OSError as exc:
        if exc.errno in (errno.EHOSTUNREACH, errno.EACCES, errno.EPERM, errno.ENETUNREACH):
            return True, f"127.0.0.1:{PROBE_PORT}: {os.strerror(exc.errno)} (the rules reject it)"
        return False, f"127.0.0.1:{PROBE_PORT}: {exc.strerror or exc} (no rules in force for uid {os.geteuid()})"
    finally:
        s.close()


def proxy_up(cfg: EgressConfig, timeout: float = 3.0) -> tuple[bool, str]:
    try:
        with socket.create_connection(("127.0.0.1", cfg.port), timeout=timeout):
            return True, f"the proxy answers on 127.0.0.1:{cfg.port}"
    except OSError as exc:
        return False, f"the proxy does not answer on 127.0.0.1:{cfg.port} ({exc.strerror or exc})"


def table_loaded(cfg: EgressConfig) -> bool:
    """Root only: is kooi's table in the ruleset?"""
    res = subprocess.run([NFT, "list", "table", "inet", cfg.table], capture_output=True, text=True, check=False)
    return res.returncode == 0


def _squid_pid(cfg: EgressConfig) -> int | None:
    try:
        pid = int(Path(cfg.pid_file).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except PermissionError:
        return pid  # alive, someone else's (the caller is not root)
    except OSError:
        return None
    return pid


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise EgressError(f"kooi egress {what} needs root (the rules and the proxy are the host's)")


def status(cfg: EgressConfig) -> dict[str, Any]:
    up, why = proxy_up(cfg)
    out: dict[str, dict[str, Any]] = {"proxy": {"up": up, "detail": why, "port": cfg.port, "listen": cfg.listen,
                     "pid": _squid_pid(cfg), "systemd_unit": cfg.systemd_unit},
           "rules": {"table": f"inet {cfg.table}", "file": cfg.rules_file}}
    if os.geteuid() == 0:
        out["rules"]["loaded"] = table_loaded(cfg)
    return out


def start(cfg: EgressConfig, timeout: float = 30.0) -> dict[str, bool]:
    """Root: apply the rules if the table is missing and start the proxy if it is down
    (hosts without systemd; on systemd hosts the units do both)."""
    _need_root("start")
    done = {"rules_applied": False, "started": False}
    if not table_loaded(cfg):
        res = subprocess.run([NFT, "-f", cfg.rules_file], capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise EgressError(f"nft -f {cfg.rules_file} failed: {res.stderr.strip()}; re-run site.yml")
        done["rules_applied"] = True
    if proxy_up(cfg, timeout=1)[0]:
        return done
    if cfg.systemd_unit and Path("/run/systemd/system").is_dir():
        res = subprocess.run(["systemctl", "start", cfg.systemd_unit], capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise EgressError(f"systemctl start {cfg.systemd_unit} failed: {res.stderr.strip()}")
    else:
        Path(cfg.pid_file).parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        res = subprocess.run([SQUID, "-f", cfg.squid_config], capture_output=True, text=True, check=False,
                             stdin=subprocess.DEVNULL)
        # "already running": another start (a role's handler, a root run) got there
        # first and that squid is not answering yet; wait for it like for our own.
        if res.returncode != 0 and "already running" not in (res.stderr + res.stdout):
            raise EgressError(f"squid -f {cfg.squid_config} failed: {(res.stderr or res.stdout).strip()}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proxy_up(cfg, timeout=1)[0]:
            done["started"] = True
            return done
        time.sleep(0.2)
    raise EgressError(f"the proxy did not answer on 127.0.0.1:{cfg.port} within {timeout:.0f} s; "
                      f"see {Path(cfg.access_log).with_name('cache.log')}")


def stop(cfg: EgressConfig, timeout: float = 30.0) -> bool:
    """Root: stop the proxy (the rules stay: the runner then has no egress at all)."""
    _need_root("stop")
    if cfg.systemd_unit and Path("/run/systemd/system").is_dir():
        subprocess.run(["systemctl", "stop", cfg.systemd_unit], check=False)
        return True
    pid = _squid_pid(cfg)
    if pid is None:
        return False
    subprocess.run([SQUID, "-f", cfg.squid_config, "-k", "shutdown"], capture_output=True, check=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _squid_pid(cfg) is not None:
        time.sleep(0.2)
    if _squid_pid(cfg) is not None:
        os.kill(pid, signal.SIGKILL)
    return True


def reload(cfg: EgressConfig) -> None:
    """Root: make a running proxy re-read its configuration and allowlist (starts it
    if it is down)."""
    _need_root("reload")
    if _squid_pid(cfg) is None:
        start(cfg)
        return
    res = subprocess.run([SQUID, "-f", cfg.squid_config, "-k", "reconfigure"], capture_output=True, text=True,
                         check=False)
    if res.returncode != 0:
        raise EgressError(f"squid -k reconfigure failed: {(res.stderr or res.stdout).strip()}")


# --- what a workload gets -----------------------------------------------------------


def proxy_env(host: str, port: int, no_proxy: list[str], java_no_proxy: list[str] | None = None) -> dict[str, str]:
    """The proxy for every tool: curl, pip, git, npm read the *_proxy variables (both
    cases; NO_PROXY), the JVM its system properties (JAVA_TOOL_OPTIONS, whose
    nonProxyHosts take wildcards, not CIDRs: JAVA_NO_PROXY, default NO_PROXY); Maven's
    settings.xml is separate (maven_settings)."""
    url = f"http://{host}:{port}"
    skip = ["localhost", "127.0.0.1", "::1", *no_proxy]
    java_skip = "|".join(dict.fromkeys(["localhost", "127.*", "[::1]",
                                        *(no_proxy if java_no_proxy is None else java_no_proxy)]))
    env = {}
    for k in ("http_proxy", "https_proxy"):
        env[k] = env[k.upper()] = url
    env["no_proxy"] = env["NO_PROXY"] = ",".join(dict.fromkeys(skip))
    env["npm_config_proxy"] = env["npm_config_https_proxy"] = url
    env["JAVA_TOOL_OPTIONS"] = (f"-Dhttp.proxyHost={host} -Dhttp.proxyPort={port} -Dhttps.proxyHost={host} "
                                f"-Dhttps.proxyPort={port} -Dhttp.nonProxyHosts={java_skip}")
    return env


def maven_settings(host: str, port: int, no_proxy: list[str]) -> str:
    """A global settings.xml with the proxy (Maven's resolver ignores the JVM's proxy
    properties and the *_proxy variables)."""
    skip = "|".join(dict.fromkeys(["localhost", "127.0.0.1", *no_proxy]))
    proxies = "".join(
        f"""    <proxy>
      <id>kooi-egress-{proto}</id>
      <active>true</active>
      <protocol>{proto}</protocol>
      <host>{host}</host>
      <port>{port}</port>
      <nonProxyHosts>{skip}</nonProxyHosts>
    </proxy>
""" for proto in ("http", "https"))
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by kooi run: the host's egress proxy (roles/egress). -->
<settings xmlns="http://maven.apache.org/SETTINGS/1.2.0">
  <proxies>
{proxies}  </proxies>
</settings>
"""


def gateway(net: dict[str, Any]) -> str | None:
    """The gateway address of a Docker network (its inspection: the SDK's attrs or the
    Engine API's answer)."""
    return next((c.get("Gateway") for c in (net.get("IPAM") or {}).get("Config") or [] if c.get("Gateway")),
                None)


def bridge_gateway(bridge: dict[str, Any]) -> str:
    """Where a container on the engine's default bridge (its inspection) reaches the host."""
    gw = gateway(bridge)
    if not gw:
        raise EgressError("the engine's default bridge has no gateway address")
    return gw


def container_proxy_host(mode: str, client: docker.DockerClient) -> str:
    """Where a container on the engine's default bridge reaches the proxy."""
    if mode == "rootless":
        return ROOTLESS_HOST_LOOPBACK
    return bridge_gateway(client.networks.get("bridge").attrs)


def build_args(cfg: EgressConfig, mode: str, client: docker.DockerClient) -> dict[str, str]:
    """Docker's predefined proxy build arguments (apt, curl, pip and npm read them; not
    kept in the image's history): image builds fetch through the proxy too."""
    url = f"http://{container_proxy_host(mode, client)}:{cfg.port}"
    return {"http_proxy": url, "https_proxy": url, "HTTP_PROXY": url, "HTTPS_PROXY": url,
            "no_proxy": "localhost,127.0.0.1", "NO_PROXY": "localhost,127.0.0.1"}


# --- jails: a unix-socket bridge to the proxy ----------------------------------------

# The forwarder inside the jail (kooi/jailfwd.py, standard library only): its source
# goes to the host's python3 with -c, since the kooi package is not in the jail.
JAIL_FORWARDER = Path(__file__).with_name("jailfwd.py").read_text()


# Connections one run holds to the host at once (the proxy's and the injector's): each
# is a descriptor in Squid or the injector (and, rootless, a socket in slirp4netns),
# which every run shares. kooi.run.runnet enforces it for containers, JailBridge for jails.
RUN_CONNECTIONS = 256


class JailBridge:
    """Host side: a unix socket (in a directory only the runner can enter) whose every
    connection is relayed to the proxy on 127.0.0.1 — the one destination the rules
    allow the runner. The jail gets the socket, never a network; at most
    max_connections (RUN_CONNECTIONS) of them at once, more closed unanswered (a jail
    held 1000)."""

    def __init__(self, directory: Path, port: int, max_connections: int = RUN_CONNECTIONS):
        self.dir, self.port = directory, port
        self.slots = threading.BoundedSemaphore(max_connections)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self.path = self.dir / "proxy.sock"
        self.path.unlink(missing_ok=True)
        bridge = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                if not bridge.slots.acquire(blocking=False):
                    return  # over the run's bound: closed unanswered
                try:
                    try:
                        up = socket.create_connection(("127.0.0.1", bridge.port), timeout=30)
                    except OSError:
                        return
                    up.settimeout(None)
                    self.request.settimeout(None)
                    t = threading.Thread(target=relay, args=(up, self.request), daemon=True)
                    t.start()
                    relay(self.request, up)
                    t.join()
                    up.close()
                finally:
                    bridge.slots.release()

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.server = Server(str(self.path), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="kooi-jail-bridge", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.path.unlink(missing_ok=True)


# --- the access log -----------------------------------------------------------------


def parse_line(line: str) -> dict[str, Any] | None:
    """One line of the 'kooi' logformat (roles/egress): time, the proxy port the request
    came in on, client, status/code, method, server, bytes, ms, and the URL last. Split
    on ASCII spaces only, the URL whatever is left (review 17: a URL with no-break
    spaces set the fields after it when the URL was in the middle and lines were split
    on any whitespace)."""
    f = line.rstrip("\r\n").split(" ", 8)
    if len(f) < 9 or "/" not in f[3] or not f[1].isdigit():
        return None
    try:
        ts = float(f[0])
        result, code = f[3].split("/", 1)
        entry: dict[str, Any] = {"time": datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds"),
                                 "client": f[2], "result": result, "status": int(code), "method": f[4], "url": f[8],
                                 "server": None if f[5] == "-" else f[5], "bytes": int(f[6]), "ms": int(f[7]),
                                 "port": int(f[1])}  # the proxy port it came in on
    except ValueError:
        return None
    # Refused: by the rules (DENIED), or as a request Squid would not even read (review
    # 25: `NONE_NONE/400 error:invalid-request`, a malformed name, was counted nowhere).
    entry["denied"] = "DENIED" in result or result.startswith("NONE") and 400 <= entry["status"] < 500
    host = entry["url"]
    if host.startswith("error:"):  # Squid's word for a request it could not read
        entry["host"] = host
        return entry
    if "://" in host:
        host = host.split("://", 1)[1]
    entry["host"] = host.split("/", 1)[0].rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
    return entry


def read_log(cfg: EgressConfig, denied_only: bool = False, follow: bool = False,
             poll: float = 0.5) -> Iterator[dict[str, Any]]:
    path = Path(cfg.access_log)
    try:
        fh = open(path, errors="replace")
    except FileNotFoundError:
        if not follow:
            return
        while not path.exists():
            time.sleep(poll)
        fh = open(path, errors="replace")
    with fh:
        while True:
            line = fh.readline()
            if not line:
                if not follow:
                    return
                time.sleep(poll)
                continue
            entry = parse_line(line)
            if entry and (entry["denied"] or not denied_only):
                yield entry


def run_log_position(cfg: EgressConfig) -> tuple[int, int]:
    """Where the run log ends now, as (inode, size): a run reads its own record from
    there on, not the whole log, and finds it again after logrotate renamed the file."""
    try:
        st = os.stat(cfg.run_log)
    except OSError:
        return (0, 0)
    return (st.st_ino, st.st_size)


def run_record(cfg: EgressConfig, port: int, since: float, until: float,
               position: tuple[int, int] = (0, 0)) -> dict[str, Any]:
    """What the proxy did for the run that held PORT from SINCE to UNTIL (epoch
    seconds), reading the run log from POSITION (run_log_position when the run took the
    port): from that file's offset on (the log itself, or `.1` where logrotate renamed
    it since), then the log after it; its requests counted, all of them, its refusals
    listed by destination (Refusals). A log rotated twice during the run (the older
    part compressed) is said in `note`."""
    path = Path(cfg.run_log)
    inode, offset = position
    refused = Refusals()
    counts = {"allowed": 0, "denied": 0}
    note = ""
    try:
        fh = open(path, "rb")
    except OSError as exc:
        return {"requests": None, "refused": [], "note": f"cannot read {path} ({exc.strerror or exc})"}
    files = []
    with fh:
        current = os.fstat(fh.fileno())
        if inode and current.st_ino != inode:
            rotated = path.with_name(path.name + ".1")
            try:
                old: Any = open(rotated, "rb")
            except OSError:
                old = None
            if old is not None and os.fstat(old.fileno()).st_ino == inode:
                old.seek(offset)
            else:
                # Rotated again since: `.1` is a later log (read whole), the run's first
                # part is compressed in an older one.
                note = (f"the proxy's run log was rotated more than once during the run: what it held before "
                        f"{rotated} began is not counted")
            if old is not None:
                files.append(old)
        elif offset <= current.st_size:
            fh.seek(offset)
        files.append(fh)
        try:
            for f in files:
                _count(f, port, since, until, refused, counts)
        finally:
            for f in files[:-1]:
                f.close()
    out: dict[str, Any] = {"requests": counts["allowed"] + counts["denied"], "refused": refused.listed()}
    if refused.omitted:
        out["refused_omitted"] = refused.omitted
        out["refused_omitted_note"] = (
            f"{refused.omitted} refusals to {refused.omitted_destinations} other destinations are not listed (a run "
            f"lists its first {MAX_REFUSED // 2} and last {MAX_REFUSED // 2} destinations): a workload can hide the one "
            f"that matters among decoys; {cfg.run_log} holds them all (port {port})")
    if note:
        out["note"] = note
    return out


# How many refused destinations (method, host, status) a run's record lists: the first
# half and the last half of them in the order they came, each with its count; what is
# between them is counted and said, never dropped silently (review 25: 120 refused
# decoys, then the request that mattered, and the record's first 100 held no trace of it).
MAX_REFUSED = 200


class Refusals:
    """A run's refusals by destination, bounded: the first MAX_REFUSED/2 destinations and
    the latest MAX_REFUSED/2 (one seen again moves to the end), the rest counted."""

    def __init__(self) -> None:
        self.first: dict[tuple[str, str, int], dict[str, Any]] = {}
        self.last: collections.OrderedDict[tuple[str, str, int], dict[str, Any]] = collections.OrderedDict()
        self.omitted = 0
        self.omitted_destinations = 0

    def add(self, e: dict[str, Any]) -> None:
        key = (e["method"], e["host"], e["status"])
        if (hit := self.first.get(key) or self.last.get(key)) is not None:
            hit["count"] += 1
            if key in self.last:
                self.last.move_to_end(key)
            return
        entry = {"time": e["time"], "method": e["method"], "host": e["host"], "status": e["status"], "count": 1}
        if len(self.first) < MAX_REFUSED // 2:
            self.first[key] = entry
            return
        self.last[key] = entry
        if len(self.last) > MAX_REFUSED // 2:
            _, gone = self.last.popitem(last=False)
            self.omitted += gone["count"]
            self.omitted_destinations += 1

    def listed(self) -> list[dict[str, Any]]:
        return [*self.first.values(), *self.last.values()]


def _count(fh: Any, port: int, since: float, until: float, refused: Refusals,
           counts: dict[str, int]) -> None:
    for raw in fh:
        line = raw.decode(errors="replace")
        f = line.split(maxsplit=1)
        try:
            ts = float(f[0])
        except (ValueError, IndexError):
            continue
        if ts < since - 1 or ts > until + 1:
            continue
        e = parse_line(line)
        if e is None or e["port"] != port:
            continue
        if e["denied"]:
            counts["denied"] += 1
            refused.add(e)
        else:
            counts["allowed"] += 1


def format_entry(e: dict[str, Any]) -> str:
    verdict = "DENIED" if e["denied"] else "allowed"
    return f"{e['time']}  {verdict:<7} {e['status']} {e['method']:<7} {e['url']}  ({e['client']}, {e['result']})"
