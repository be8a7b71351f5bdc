"""RUN-* checks: `kooi run` is honest with pipelines and cron.

They run the built-in workflow kooi-runcheck (installed by the shim role, timeout 10 s)
through the host's `kooi run`, as root (dropping to the runner, like cron and
pipelines do), with a script they write into a scratch project the runner owns:
an exit code that must come back unchanged, a workload that outlives its timeout, a
second run while the first holds the lock. Afterwards nothing of these runs may be
left on the engine or in the process table.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import time
from typing import Any

from ..hoststate import paths
from ..hoststate.secrets import parse as parse_secrets
from .confinement import SYSTEM_PATH
from .core import FAIL, NA, PASS, Context, Host, Outcome, check, scratch

WORKFLOW = "kooi-runcheck"
PROJECT = paths.RUNCHECK_PROJECT
SCRIPT = ".kooi-runcheck.sh"
KEYS = {"workflow", "run_id", "project", "mode", "isolation", "image_digest", "start", "end",
        "duration_s", "exit_code", "reason", "message", "log"}


def _available(host: Host, ctx: Context) -> str | None:
    if "runcheck" not in ctx.cache:
        if not host.file(f"{paths.WORKFLOWS}/{WORKFLOW}.yml").exists:
            ctx.cache["runcheck"] = f"no {WORKFLOW} workflow on this host (re-run site.yml, role shim)"
        elif "runner" not in (ctx.described(host, "images") or {}):
            ctx.cache["runcheck"] = "no runner image on this host (kooi_runner_image_build: false)"
        else:
            ctx.cache["runcheck"] = None
    why: str | None = ctx.cache["runcheck"]
    return why


def _script(host: Host, ctx: Context, body: str) -> None:
    res = host.run(f"{ctx.runner_prefix} mkdir -p {PROJECT} && "
                   f"{ctx.runner_session} sh -c {shlex.quote(f'cat > {PROJECT}/{SCRIPT}')} <<'KOOI_EOF'\n{body}\nKOOI_EOF")
    if res.rc != 0:
        raise RuntimeError(f"cannot write the script into {PROJECT}: {res.stderr.strip()}")


def _run(host: Host, ctx: Context, name: str, background: bool = False,
         workflow: str = WORKFLOW) -> tuple[int | None, dict[str, Any] | None, str]:
    """kooi run kooi-runcheck (or WORKFLOW); returns (rc, result or None, output)."""
    out = f"{scratch(host, ctx)}/{name}.json"
    host.run(f"rm -f {out}")
    cmd = f"PATH={SYSTEM_PATH} {shlex.quote(ctx.engine.kooi_bin)} run {workflow} --project {PROJECT} --json {out}"
    if background:
        # Its own session: kooi run treats SIGHUP as an interruption (and ends the run),
        # and the end of the caller's session (docker exec, ssh) may send one.
        host.run(f"setsid -f sh -c {shlex.quote(cmd)} </dev/null >/dev/null 2>&1")
        return None, None, ""
    res = host.run(cmd)
    f = host.file(out)
    return res.rc, (json.loads(f.content_string) if f.exists else None), res.stdout + res.stderr


def _leftovers(host: Host, ctx: Context, run_id: str) -> list[str]:
    res = host.run(ctx.as_runner(f"docker ps -aq --filter label=org.kooi.run={shlex.quote(run_id)}; "
                                 f"docker network ls -q --filter label=org.kooi.run={shlex.quote(run_id)}"))
    ids: list[str] = res.stdout.split()
    return ids


@check("RUN-RESULT", "kooi run returns the workload's exit code and an honest JSON result and log",
       "a pipeline or cron job that reports success for a failed build (or the reverse)", scope="workload")
def run_result(host: Host, ctx: Context) -> Outcome:
    if (why := _available(host, ctx)) is not None:
        return NA, why
    _script(host, ctx, "echo KOOI-RUNCHECK-OUT; exit 3")
    rc, res, out = _run(host, ctx, "runcheck-result")
    if res is None:
        return FAIL, f"no JSON result (rc={rc}): {out.strip()[-200:]}"
    bad = []
    if rc != 3 or res.get("exit_code") != 3 or res.get("reason") != "failed":
        bad.append(f"exit 3 came back as rc={rc}, exit_code={res.get('exit_code')}, reason={res.get('reason')}")
    if missing := KEYS - set(res):
        bad.append(f"result lacks {sorted(missing)}")
    if "KOOI-RUNCHECK-OUT" not in ctx.runner_text(host, res.get("log")):
        bad.append(f"the run's log {res.get('log')} lacks the workload's output")
    _script(host, ctx, "exit 0")
    rc0, res0, out0 = _run(host, ctx, "runcheck-result-ok")
    if rc0 != 0 or not res0 or res0.get("reason") != "ok":
        bad.append(f"exit 0 came back as rc={rc0}, reason={(res0 or {}).get('reason')}: {out0.strip()[-160:]}")
    if bad:
        return FAIL, "; ".join(bad)
    return PASS, f"exit 3 -> rc 3, reason failed; exit 0 -> rc 0, reason ok; log {res['log']}"


@check("RUN-TIMEOUT", "a timeout kills the whole workload (every process) and is reported as such",
       "a hung or hostile workload that outlives its run (and keeps its access)", scope="workload")
def run_timeout(host: Host, ctx: Context) -> Outcome:
    if (why := _available(host, ctx)) is not None:
        return NA, why
    # Durations unique to this call: the host's process table may hold other hosts'
    # runchecks (Molecule test hosts are containers on the same kernel).
    tag = f"{secrets.randbelow(10**6):06d}"
    _script(host, ctx, f"sleep 6071.{tag} & sleep 6072.{tag}")
    t0 = time.monotonic()
    rc, res, out = _run(host, ctx, "runcheck-timeout")
    took = time.monotonic() - t0
    if res is None:
        return FAIL, f"no JSON result (rc={rc}): {out.strip()[-200:]}"
    bad = []
    if rc != 124 or res.get("reason") != "timeout":
        bad.append(f"rc={rc}, reason={res.get('reason')} (want 124, timeout)")
    if took > 60:
        bad.append(f"the 10 s timeout took {took:.0f} s")
    procs = host.run(f"pgrep -af 'sleep 607[12][.]{tag}'").stdout.strip()
    if procs:
        bad.append(f"workload processes survived: {procs[:200]}")
    if left := _leftovers(host, ctx, res.get("run_id", "")):
        bad.append(f"left on the engine: {left}")
    if bad:
        return FAIL, "; ".join(bad)
    return PASS, f"killed after {took:.1f} s: rc 124, reason timeout, no process or container left"


@check("RUN-LOCK", "two runs on the same project do not collide (one run per project at a time)",
       "concurrent builds corrupting each other's output (cron overlapping a pipeline)", scope="workload")
def run_lock(host: Host, ctx: Context) -> Outcome:
    if (why := _available(host, ctx)) is not None:
        return NA, why
    marker = f"{PROJECT}/.kooi-runcheck-started"
    host.run(f"rm -f {marker}")
    _script(host, ctx, "touch /workspace/.kooi-runcheck-started; sleep 6")
    _run(host, ctx, "runcheck-lock-first", background=True)
    for _ in range(150):
        if host.file(marker).exists:
            break
        time.sleep(0.2)
    else:
        return FAIL, "the first run never started its workload (30 s)"
    rc, res, out = _run(host, ctx, "runcheck-lock-second")
    first = f"{scratch(host, ctx)}/runcheck-lock-first.json"
    for _ in range(150):
        if host.file(first).exists:
            break
        time.sleep(0.2)
    if rc != 75 or not res or res.get("reason") != "busy":
        return FAIL, f"a second run while the first held the lock: rc={rc}, reason={(res or {}).get('reason')}" \
                     f" (want 75, busy): {out.strip()[-160:]}"
    if not host.file(first).exists:
        return FAIL, "the first run did not finish within 30 s of the second"
    done = json.loads(host.file(first).content_string)
    if done.get("reason") != "ok":
        return FAIL, f"the first run was disturbed: reason {done.get('reason')}"
    return PASS, "second run refused with rc 75 (busy) while the first ran; the first finished ok"


@check("RUN-PROJECT-GUARD", "the project's git directories are throwaway copies (git's data bound in) while a run "
       "lasts; the project's other protected paths are put back after it",
       "a workload leaving a git hook, git configuration or an .envrc that runs on the host at the next git "
       "command or cd, outside the cage", scope="workload")
def run_project_guard(host: Host, ctx: Context) -> Outcome:
    if (why := _available(host, ctx)) is not None:
        return NA, why
    prep = (f"mkdir -p {PROJECT}/.git/hooks && rm -f {PROJECT}/.envrc {PROJECT}/.git/hooks/post-checkout && "
            f"rm -rf {PROJECT}/.kooi-removed")  # earlier checks' archives of what they kept
    host.run(f"{ctx.runner_prefix} sh -c {shlex.quote(prep)}")
    _script(host, ctx, "cd /workspace; (echo evil > .git/hooks/post-checkout) 2>/dev/null && echo HOOK=written; "
                       "echo evil > .envrc; echo GUARD-DONE")
    rc, res, out = _run(host, ctx, "runcheck-guard")
    if res is None:
        return FAIL, f"no JSON result (rc={rc}): {out.strip()[-200:]}"
    bad = []
    text = ctx.runner_text(host, res.get("log"))
    if "GUARD-DONE" not in text:
        bad.append(f"the workload did not run to its end (rc={rc}, reason {res.get('reason')}: "
                   f"{res.get('message')}; its log ends {text.strip()[-160:]!r})")
    if "HOOK=written" not in text:
        bad.append("the hook write into the throwaway copy of .git failed")
    if host.file(f"{PROJECT}/.git/hooks/post-checkout").exists or host.file(f"{PROJECT}/.envrc").exists:
        bad.append("a protected path the workload wrote is still there after the run")
    guard = res.get("project_guard") or {}
    refused = [{k: r.get(k) for k in ("path", "change", "how")} for r in guard.get("refused", [])]
    # Shadowed, not put back: the write never reached the project, even while the run lasted.
    if {"path": ".git/hooks/post-checkout", "change": "created", "how": "shadowed"} not in refused:
        bad.append(f"the result does not list the hook written into the copy: {refused}")
    # Put back (and the workload's version kept in the run's archive, `kept`).
    if {"path": ".envrc", "change": "created", "how": "put back"} not in refused:
        bad.append(f"the result does not list the .envrc it put back: {refused}")
    if bad:
        return FAIL, "; ".join(bad)
    return PASS, ("the hook landed in a throwaway copy of .git, never in the project; the .envrc it created "
                  "was removed; both listed")


NETCHECK = "kooi-netcheck"
NETCHECK_SCRIPT = """python3 - <<'KOOI_PY'
import os, socket, urllib.parse
u = urllib.parse.urlsplit(os.environ.get("HTTP_PROXY", ""))
def reach(port):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect((u.hostname, port))
        return "connected"
    except OSError as exc:
        return f"refused({exc.errno})"
    finally:
        s.close()
other = next(p for p in (FIRST, FIRST + 1) if p != u.port)
print(f"NETCHECK own={reach(u.port)} main={reach(MAIN)} other={reach(other)}")
KOOI_PY
"""


@check("RUN-EGRESS-OWN-WAY", "a run's containers reach the host only on the run's own proxy port and the injector's "
       "(rootless and userns-remap engines)",
       "a workload using the main proxy port or another run's, its refusals in no run's result or in another's", scope="workload")
def net_run_own_way(host: Host, ctx: Context) -> Outcome:
    if (why := _available(host, ctx)) is not None:
        return NA, why
    if not ctx.engine.egress:
        return NA, "this host has no egress control (kooi_egress_enabled: false)"
    eg = ctx.described(host, "egress")
    if eg is None:
        return FAIL, "egress control is meant to be on, but the host describes none: re-run site.yml (role egress)"
    if ctx.engine.mode == "userns_remap" and eg.run_bridges < 1:
        return FAIL, "the host's egress rules give runs no ways of their own (an older role): re-run site.yml"
    if eg.run_port_count < 2:
        return NA, "fewer than two per-run proxy ports (egress_run_port_count): nothing to tell runs apart by"
    if not host.file(f"{paths.WORKFLOWS}/{NETCHECK}.yml").exists:
        return FAIL, f"no {NETCHECK} workflow on this host: re-run site.yml (role shim)"
    _script(host, ctx, NETCHECK_SCRIPT.replace("MAIN", str(int(eg.port))).replace("FIRST", str(int(eg.run_port_first))))
    rc, res, out = _run(host, ctx, "runcheck-net", workflow=NETCHECK)
    if res is None:
        return FAIL, f"no JSON result (rc={rc}): {out.strip()[-200:]}"
    text = ctx.runner_text(host, res.get("log"))
    m = re.search(r"NETCHECK own=(\S+) main=(\S+) other=(\S+)", text)
    if m is None:
        return FAIL, (f"the workload did not report (rc={rc}, reason {res.get('reason')}: {res.get('message')}; "
                      f"its log ends {text.strip()[-160:]!r})")
    own, main, other = m.groups()
    if own != "connected":
        return FAIL, f"the run could not reach its own proxy port ({own})"
    if "connected" in (main, other):
        reached = f"main proxy port {eg.port}" if main == "connected" else "port of another run"
        return FAIL, (f"the run reached the {reached}: its refusals would be in no run's result or another's; "
                      "re-run site.yml, then `kooi verify` again")
    return PASS, f"the run reached its own proxy port; the main one ({eg.port}) was {main}, another run's {other}"


SECRETCHECK = "kooi-secretcheck"
CANARY = "KOOI_CANARY=kooi-canary-a-plain-environment-value"


LIMITS_SCRIPT = """cat /proc/self/limits
for f in /sys/fs/cgroup/pids.max /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/memory.max \\
         /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpu/cpu.cfs_quota_us; do
  [ -r "$f" ] && echo "KOOI-CGROUP $f $(cat "$f")"
done
echo "KOOI-NICE $(nice)"
echo "KOOI-JAVA $JAVA_TOOL_OPTIONS"
"""
RLIMIT_ROWS = {"Max processes": "nproc", "Max data size": "data", "Max open files": "nofile",
               "Max core file size": "core"}


def parse_limits_output(out: str) -> tuple[dict[str, str], dict[str, str], str | None]:
    """(hard rlimits by prlimit name, cgroup files by controller, niceness) as a workload saw them."""
    rl: dict[str, str] = {}
    cg: dict[str, str] = {}
    nice = None
    for line in out.splitlines():
        cols = re.split(r"\s{2,}", line.strip())
        if cols[0] in RLIMIT_ROWS and len(cols) >= 3:
            rl[RLIMIT_ROWS[cols[0]]] = cols[2]
        elif line.startswith("KOOI-CGROUP "):
            _, path, value = line.split(" ", 2)
            name = path.rsplit("/", 1)[-1]
            ctl = {"pids.max": "pids", "memory.max": "memory", "memory.limit_in_bytes": "memory",
                   "cpu.max": "cpus", "cpu.cfs_quota_us": "cpus"}[name]
            cg[ctl] = value.strip()
        elif line.startswith("KOOI-NICE "):
            nice = line.split()[1]
    return rl, cg, nice


def limit_problems(record: dict[str, Any], rl: dict[str, str], cg: dict[str, str], nice: str | None) -> list[str]:
    """What a run's limits record says is bounded but the workload did not see bounded."""
    from ..hoststate.limits import size

    bad = []
    for key in ("memory", "cpus", "pids", "files", "core"):
        if key not in record:
            bad.append(f"the result has no limits.{key}")
    if bad:
        return bad
    pids, mem = record["pids"], record["memory"]
    want = str(pids["requested"])
    if pids["by"].startswith("cgroup"):
        if cg.get("pids") != want:
            bad.append(f"pids: the result says cgroup pids {want}, the workload saw pids.max {cg.get('pids')}")
    elif rl.get("nproc") != want:
        bad.append(f"pids: the result says RLIMIT_NPROC {want}, the workload saw {rl.get('nproc')}")
    want = str(size(str(mem["requested"])))
    if mem["by"].startswith("cgroup"):
        if cg.get("memory") != want:
            bad.append(f"memory: the result says cgroup memory {want}, the workload saw {cg.get('memory')}")
    elif rl.get("data") != want:
        bad.append(f"memory: the result says RLIMIT_DATA {want}, the workload saw {rl.get('data')}")
    if record["cpus"]["by"].startswith("cgroup"):
        if cg.get("cpus") in (None, "max", "-1") or (cg.get("cpus") or "").startswith("max "):
            bad.append(f"cpus: the result says a CPU quota, the workload saw {cg.get('cpus')}")
    elif nice != "10":
        bad.append(f"cpus: the result says nice 10, the workload runs at nice {nice}")
    if rl.get("nofile") != str(record["files"]["requested"]):
        bad.append(f"files: the result says {record['files']['requested']}, the workload saw {rl.get('nofile')}")
    if rl.get("core") != "0":
        bad.append(f"core dumps: the workload may write {rl.get('core')} bytes")
    return bad


@check("RUN-LIMITS", "every run is bounded by the host's default limits: pids and memory by the engine's cgroups "
       "where it has them, by rlimits where it does not (and the result says which), no core dumps",
       "a fork bomb or a runaway build in one workload that takes the host down for every other run", scope="workload")
def run_limits(host: Host, ctx: Context) -> Outcome:
    if (why := _available(host, ctx)) is not None:
        return NA, why
    _script(host, ctx, LIMITS_SCRIPT)
    rc, res, out = _run(host, ctx, "runcheck-limits")
    if res is None or rc != 0:
        return FAIL, f"the self-test run failed (rc={rc}): {out.strip()[-300:]}"
    text = ctx.runner_text(host, res.get("log")) or out
    record = res.get("limits") or {}
    bad = limit_problems(record, *parse_limits_output(text))
    if bad:
        return FAIL, "; ".join(bad)
    parts: list[str] = []
    reasons: list[str] = []
    for k in ("pids", "memory", "cpus", "files"):
        how, _, reason = record[k]["by"].partition("; ")
        parts.append(f"{k} {record[k]['requested']}: {how}")
        if reason and reason not in reasons:
            reasons.append(reason)
    return PASS, "; ".join(parts) + "; no core dumps" + "".join(f" ({r})" for r in reasons)


@check("RUN-SECRETS-HIDDEN", "a workload that names inject secrets holds placeholders, never a value: not in its "
       "environment, any process's, its output, the run's result or log, the injector's or proxy's logs",
       "an API key a hostile dependency reads from the environment or /proc and sends anywhere it likes", scope="workload")
def run_secrets_hidden(host: Host, ctx: Context) -> Outcome:
    if not host.file(f"{paths.WORKFLOWS}/{SECRETCHECK}.yml").exists:
        return NA, f"no {SECRETCHECK} workflow: this host holds no inject secrets (or no egress control)"
    if (why := _available(host, ctx)) is not None:
        return NA, why
    desc = parse_secrets(host.file(paths.SECRETS).content_string, paths.SECRETS)
    names = sorted(desc.injected)
    # Everything of its environment a workload can read, and what it can read of its
    # processes' (the check reads it back from the run's log).
    _script(host, ctx, "env | sed 's/^/ENV /'; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < \"$f\" "
                       "2>/dev/null | sed 's/^/PROC /'; done; echo SECRETS-DONE")
    rc, res, out = _run(host, ctx, "runcheck-secrets", workflow=SECRETCHECK)
    if res is None:
        return FAIL, f"no JSON result (rc={rc}): {out.strip()[-200:]}"
    text = ctx.runner_text(host, res.get("log"))
    bad = []
    if rc != 0 or "SECRETS-DONE" not in text:
        bad.append(f"the workload did not run to its end (rc={rc}): {out.strip()[-200:]}")
    # The negative control: a plain environment value shows up where the check looks,
    # in the workload's environment and in its processes'.
    if f"ENV {CANARY}" not in text or f"PROC {CANARY}" not in text:
        bad.append("the negative control failed: the plain environment value KOOI_CANARY is not where the check "
                   "looks, so the check could not see a secret there either")
    for name in names:
        env = desc.secrets[name].env
        if env and f"ENV {env}=kooi-placeholder-" not in text:
            bad.append(f"{env} (secret {name}) does not hold a placeholder")
    eg = ctx.described(host, "egress")
    where = [res.get("log") or "", f"{scratch(host, ctx)}/runcheck-secrets.json", desc.injector.access_log, PROJECT]
    where += [eg.access_log, eg.run_log] if eg is not None else []
    for name in names:
        # grep takes the value from the store itself (-f): it is never on a command
        # line, in this process or in any output.
        store = shlex.quote(f"{paths.SECRETS_DIR}/{name}")
        hit = host.run(f"test -s {store} || echo EMPTY; grep -rlF -f {store} "
                       f"{' '.join(shlex.quote(p) for p in where if p)} 2>/dev/null; "
                       f"if [ -d /run/systemd/system ]; then timeout 120 journalctl -b -q -o cat --no-pager "
                       f"| grep -qF -f {store} && echo the-journal; fi").stdout.split()
        if "EMPTY" in hit:
            bad.append(f"secret {name} has no value in the store")
        elif hit:
            bad.append(f"the value of secret {name} is in {', '.join(hit)}")
    if bad:
        return FAIL, "; ".join(bad)
    return PASS, (f"{', '.join(names)}: placeholders only, the values in no output, result or log (nor this "
                  f"boot's journal, where systemd runs); the plain "
                  "environment canary was found where the check looks (negative control)")


@check("RUN-CLEANUP", "nothing of a finished run is left: containers, networks, the scratch script's runs",
       "leftover containers holding the project, the engine or resources after their run", scope="workload")
def run_cleanup(host: Host, ctx: Context) -> Outcome:
    if (why := _available(host, ctx)) is not None:
        return NA, why
    _script(host, ctx, "exit 0")
    rc, res, out = _run(host, ctx, "runcheck-cleanup")
    if rc != 0 or not res:
        return FAIL, f"a trivial run failed: rc={rc}: {out.strip()[-200:]}"
    left = _leftovers(host, ctx, res["run_id"])
    older = host.run(ctx.as_runner(f"docker ps -aq --filter label=org.kooi.workflow={WORKFLOW}")).stdout.split()
    if left or older:
        return FAIL, f"left on the engine: this run {left}, earlier {WORKFLOW} runs {older}"
    timer = ""
    if host.file("/run/systemd/system").is_directory:
        state = host.run("systemctl is-enabled kooi-gc.timer; systemctl is-active kooi-gc.timer").stdout.split()
        if state != ["enabled", "active"]:
            return FAIL, f"kooi-gc.timer is {' '.join(state) or 'missing'} (want enabled, active): re-run site.yml"
        timer = "; kooi-gc.timer enabled and active"
    else:
        tab = host.run(f"crontab -l -u {shlex.quote(ctx.runner)}").stdout
        if " gc " not in tab.replace("\n", " ") or "#Ansible: kooi gc" not in tab:
            return FAIL, "no kooi gc entry in the runner's crontab (hosts without systemd): re-run site.yml"
        if host.run("pgrep -x cron").rc != 0:
            return FAIL, "kooi gc is in the runner's crontab, but cron is not running: `service cron start`"
        timer = "; kooi gc hourly from the runner's crontab, cron running"
    return PASS, f"run {res['run_id']}: no container or network left (nor of earlier {WORKFLOW} runs){timer}"
