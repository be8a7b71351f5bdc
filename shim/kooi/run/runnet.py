"""A run's own way to the host (issue 29, findings 6 and 7): rootless and userns-remap.

Every container of the rootless engine reaches the host's loopback, where the egress
proxy and the secrets injector listen, at one address (10.0.2.2, slirp4netns): on any
port, so a workload could use the default proxy port or another run's (its refusals
then in no result, or in another run's), and hold thousands of connections (Squid and
slirp4netns at ~3000 descriptors each, measured). So each run's networks are bridges
named after the run (`kr` + 8 hex digits of the run's id + the network's number: the
run's own network is 0, the ones its workload creates through its broker 1-8), and in
the engine's network namespace (the runner is root there, in rootlesskit's user
namespace) one table says, per run:

    from the run's bridges, to 10.0.2.2:
        the run's proxy port and the injector's: at most MAX_CONNECTIONS at once
        anything else: rejected (administratively prohibited)
    from a bridge of no live run: rejected
    from any other bridge (docker0, where no run's workload is: the broker puts every
        container of a run on the run's networks): the main proxy port only
    from the run's bridges to anywhere else (past its own bridges): rejected, before
        slirp4netns opens a socket for it (one run's UDP to 24000 destinations had
        filled its descriptors, cutting every run off the proxy)

A run's proxy port is not given to another run while a run's rules name it (a run
whose kooi run died keeps its container to its deadline: its refusals would go into
the next run's result). The rules go with the run (cleanup) or, for a run whose kooi
run died, with `kooi gc`;
the table goes with the engine's namespace when the engine stops. Image builds use
the engine's own namespace (`network_mode: host`), which no bridge rule sees.

The userns-remap engine's bridges are in the host's namespace, where the runner is not
root: there the rules are the egress role's, fixed (roles/egress, egress.nft.j2), and a
run's bridges are named after its proxy port instead (`kp` + port + `n` + number): from
`kpPORTnN`, the host on PORT and the injector's port only, at most MAX_CONNECTIONS at
once; from docker0 and br-*, the main proxy port and the injector's. A port is given to
no run while a bridge named after it exists (a dead run's network, until `kooi gc`).
A run that shares the main port (every run port taken) gets no bridges of its own: the
engine names them, and they reach the main port only.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

from ..egress import NFT, ROOTLESS_HOST_LOOPBACK, RUN_CONNECTIONS
from ..hoststate.egress import EgressConfig
from ..hoststate.engine import EngineConfig

TABLE = "kooi_runs"
# Connections a run's containers hold to the host at once (the proxy's and the
# injector's together): each is a descriptor in Squid or the injector and a socket in
# slirp4netns, which every run shares.
MAX_CONNECTIONS = RUN_CONNECTIONS
# The run's network and the most its workload may create (broker.RunScope.max_networks).
BRIDGES = 9


class RunNetError(Exception):
    """The engine's namespace cannot be given the run's rules; the message says what to do."""


def _tag(run_id: str) -> str:
    return hashlib.sha256(run_id.encode()).hexdigest()[:8]


def bridge(run_id: str, n: int) -> str:
    """The name of the run's Nth bridge on the rootless engine (an interface name: at
    most 15 bytes)."""
    return f"kr{_tag(run_id)}{n}"


def bridges(cfg: EngineConfig, eg: EgressConfig | None, run_id: str, port: int) -> tuple[str, ...]:
    """The names of the bridges of the run RUN_ID holding proxy PORT, its own network's
    first; () where runs get none (no egress; userns-remap rules without them, or the
    run shares the main port)."""
    if eg is None:
        return ()
    if cfg.mode == "rootless":
        return tuple(bridge(run_id, n) for n in range(BRIDGES))
    if cfg.mode == "userns_remap" and eg.run_bridges > 0 and port != eg.port:
        return tuple(f"kp{int(port)}n{n}" for n in range(min(eg.run_bridges, BRIDGES)))
    return ()


def _chain(run_id: str) -> str:
    return f"run_{_tag(run_id)}"


def applies(cfg: EngineConfig) -> bool:
    """Does kooi run write the runs' rules itself (rootless: in the engine's namespace)?"""
    return cfg.mode == "rootless"


def _engine_pid(cfg: EngineConfig) -> str:
    pid_file = Path(cfg.socket).parent / "docker.pid"
    try:
        pid = pid_file.read_text().strip()
    except OSError as exc:
        raise RunNetError(f"cannot read the rootless engine's pid from {pid_file} ({exc.strerror or exc}); "
                          "`kooi engine status`") from None
    if not pid.isdigit():
        raise RunNetError(f"{pid_file} holds no pid")
    return pid


def _nft(cfg: EngineConfig, script: str, *args: str) -> str:
    cmd = ["nsenter", "-U", "--preserve-credentials", "-n", "-t", _engine_pid(cfg), NFT, *args]
    try:
        r = subprocess.run(cmd, input=script, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RunNetError(f"nft in the engine's network namespace: {exc}") from None
    if r.returncode != 0:
        raise RunNetError(f"nft in the engine's network namespace failed: {r.stderr.strip()[-400:]}")
    return r.stdout


def _base(main_port: int) -> str:
    return f"""table inet {TABLE} {{
  map runs {{ type ifname : verdict; }}
  chain forward {{ type filter hook forward priority -10; policy accept; }}
  chain to_host {{ }}
}}
flush chain inet {TABLE} forward
flush chain inet {TABLE} to_host
add rule inet {TABLE} forward ip daddr {ROOTLESS_HOST_LOOPBACK} jump to_host
add rule inet {TABLE} forward iifname "kr*" oifname != "kr*" counter reject with icmpx admin-prohibited
add rule inet {TABLE} to_host iifname vmap @runs
add rule inet {TABLE} to_host iifname "kr*" counter reject with icmpx admin-prohibited
add rule inet {TABLE} to_host ct state established,related accept
add rule inet {TABLE} to_host tcp dport {int(main_port)} accept
add rule inet {TABLE} to_host counter reject with icmpx admin-prohibited
"""


def pin(cfg: EngineConfig, run_id: str, ports: list[int], lock: str, main_port: int) -> None:
    """From RUN_ID's bridges, the host only on PORTS, MAX_CONNECTIONS at once; LOCK (the
    run's project lock) tells `kooi gc` whether the run lives. Other bridges (docker0:
    no run's workload is there, the broker puts its containers on the run's networks)
    keep the main proxy port MAIN_PORT only."""
    c = _chain(run_id)
    plist = ", ".join(str(p) for p in sorted(set(ports)))
    elems = ", ".join(f'"{bridge(run_id, n)}" : jump {c}' for n in range(BRIDGES))
    script = _base(main_port) + f"""add chain inet {TABLE} {c} {{ comment "kooi run {run_id} {lock}"; }}
flush chain inet {TABLE} {c}
add rule inet {TABLE} {c} ct state established,related accept
add rule inet {TABLE} {c} tcp dport {{ {plist} }} ct count over {MAX_CONNECTIONS} counter reject with tcp reset
add rule inet {TABLE} {c} tcp dport {{ {plist} }} accept
add rule inet {TABLE} {c} counter reject with icmpx admin-prohibited
add element inet {TABLE} runs {{ {elems} }}
"""
    _nft(cfg, script, "-f", "-")


def unpin(cfg: EngineConfig, run_id: str) -> None:
    """RUN_ID's rules gone (none there: nothing to do)."""
    c = _chain(run_id)
    names = ", ".join(f'"{bridge(run_id, n)}"' for n in range(BRIDGES))
    for script in (f"delete element inet {TABLE} runs {{ {names} }}\n", f"delete chain inet {TABLE} {c}\n"):
        try:
            _nft(cfg, script, "-f", "-")
        except RunNetError as exc:
            if "No such file or directory" not in str(exc):
                raise


_CHAIN = re.compile(r"^\s*chain (run_[0-9a-f]{8}) \{\n(.*?)^\s*\}", re.M | re.S)
_COMMENT = re.compile(r'^\s*comment "kooi run (\S+) (\S+)"', re.M)
_PORTS = re.compile(r"tcp dport (\{[^}]*\}|\d+) accept")


def pinned(cfg: EngineConfig) -> dict[str, tuple[str, set[int]]]:
    """The runs with rules in the engine's namespace: run id -> (its project lock's
    name, the ports its bridges reach). From nft's text: its JSON leaves out the chains'
    comments (nft 1.0.6)."""
    try:
        text = _nft(cfg, "", "list", "table", "inet", TABLE)
    except RunNetError as exc:
        if "No such file or directory" in str(exc):
            return {}
        raise
    out = {}
    for m in _CHAIN.finditer(text):
        c = _COMMENT.search(m.group(2))
        if c is None:
            continue
        ports = {int(p) for spec in _PORTS.findall(m.group(2)) for p in re.findall(r"\d+", spec)}
        out[c.group(1)] = (c.group(2), ports)
    return out


_PORT_BRIDGE = re.compile(r"kp(\d{1,5})n\d+")


def ports_in_use(cfg: EngineConfig, net_dir: Path = Path("/sys/class/net")) -> set[int]:
    """The ports some run's bridges reach: a run whose kooi run died keeps its container
    (to its deadline) and its rules until it is finished, and its port stays its own
    until then (else its workload's refusals would go into the next run's result).
    userns-remap: the ports bridges in the host's namespace are named after."""
    if cfg.mode == "userns_remap":
        try:
            names = [e.name for e in os.scandir(net_dir)]
        except OSError as exc:
            raise RunNetError(f"cannot list the host's interfaces in {net_dir} ({exc.strerror or exc})") from None
        return {int(m.group(1)) for n in names if (m := _PORT_BRIDGE.fullmatch(n))}
    if not applies(cfg):
        return set()
    return {p for _, ports in pinned(cfg).values() for p in ports}


def sweep(cfg: EngineConfig, run_dir: Path, dry_run: bool = False) -> list[str]:
    """`kooi gc`: the rules of runs whose kooi run died (no live process holds their
    project's lock)."""
    from .project import lock_held

    if not applies(cfg):
        return []
    try:
        runs = pinned(cfg)
    except RunNetError as exc:
        return [f"warning: the runs' ways to the host not swept: {exc}"]
    out = []
    for run_id, (lock, _) in sorted(runs.items()):
        if "/" in lock or lock_held(run_dir / "locks" / lock):
            continue
        out.append(f"rules of run {run_id}'s way to the host")
        if not dry_run:
            try:
                unpin(cfg, run_id)
            except RunNetError as exc:
                out[-1] += f" (not removed: {exc})"
    return out
