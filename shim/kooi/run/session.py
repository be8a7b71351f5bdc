"""A session's container: how it differs from a run's (the container backend asks).

A session is a run of a session workflow whose workload is a terminal server: tmux in
the foreground (`tmux -D`), under kooi's init and filter like any workload. Every
terminal and command enters it with `docker exec` through kooi's filter (`entry`):
nothing runs in a session without it. Its home is an engine volume kept per person
and workflow instead of the run's tmpfs; the workflow's `session.seed` files are
written into it from inside, when missing, and never read on the host. The init ends
the container at the workflow's timeout (its lifetime) and after `session.idle_timeout`
without an entry and without CPU activity (kooi/seccomp.py), whether or not kooi is
still there.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from .. import labels
from ..seccomp import idle_mark
from ..workflow import Workflow
from . import filters
from .context import RunContext, SessionRun
from .spec import env_of, set_env

# The tmux session every terminal attaches to (created by the first one).
TMUX_SESSION = "main"
TMUX_CONF = "/tmp/kooi-tmux.conf"
SEED_ENV, CONF_ENV = "KOOI_SESSION_SEED", "KOOI_TMUX_CONF"
# The workload: seed the kept home, write tmux's configuration, become the terminal
# server (standard library only; the image's python3, under kooi's filter already).
KEEPER = f"""
import json, os
home = os.environ["HOME"]
for rel, text in json.loads(os.environ.pop("{SEED_ENV}", "{{}}")).items():
    path = os.path.join(home, rel)
    if not os.path.lexists(path):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        os.write(fd, text.encode())
        os.close(fd)
fd = os.open("{TMUX_CONF}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
os.write(fd, os.environ.pop("{CONF_ENV}").encode())
os.close(fd)
os.execvp("tmux", ["tmux", "-D", "-f", "{TMUX_CONF}"])
"""


def home_volume(person: str, workflow: str) -> str:
    """The engine volume kept as PERSON's home in sessions of WORKFLOW."""
    return f"{labels.HOME_VOLUME_PREFIX}{person}.{workflow}"


def tmux_conf(wf: Workflow) -> str:
    """The terminal server's settings: scrollback, colours, the session's shell."""
    assert wf.session is not None
    return "\n".join([
        "set -g history-limit 50000",
        "set -g default-terminal tmux-256color",
        f"set -g default-command {shlex.quote('exec ' + shlex.join(wf.session.shell))}",
        "set -g destroy-unattached off",
        "set -g set-titles on",
        "set -sg escape-time 10",
        f"set -g status-left {shlex.quote(f'[kooi {wf.name}] ')}",
        "set -g status-left-length 40",
        "set -g status-right '%H:%M'",
        "",
    ])


def shape(body: dict[str, Any], wf: Workflow, session: SessionRun, img_attrs: dict[str, Any]) -> None:
    """Make the workload container's create body BODY a session's: the terminal server
    as the workload, the kept home instead of the home tmpfs, its labels."""
    assert wf.session is not None
    home = next((e.split("=", 1)[1] for e in (img_attrs.get("Config") or {}).get("Env") or []
                 if e.startswith("HOME=")), "")
    if not home or home in ("/", "/tmp", "/workspace"):
        from .errors import refused

        raise refused(f"a session keeps its home across starts; image has no home of its own (HOME={home!r})")
    host = body["HostConfig"]
    host["Tmpfs"].pop(home, None)
    host["Mounts"].append({"Type": "volume", "Source": session.home, "Target": home, "ReadOnly": False})
    body["Cmd"] = ["python3", "-I", "-S", "-c", KEEPER]
    body["Labels"].update(labels.session_labels(session.person))
    set_env(body, {**env_of(body), SEED_ENV: json.dumps(dict(wf.session.seed)), CONF_ENV: tmux_conf(wf)})


def end_of(ctx: RunContext, tail: str, token: str) -> None:
    """After the container ended: how (the init's idle report, kooi session stop's mark)."""
    if ctx.res.session is None:
        return
    if stop_mark(ctx.run_dir, ctx.run_id).exists():
        ctx.res.session["end"] = "stopped"
    elif token and any(idle_mark(token) in line for line in tail.strip().splitlines()[-3:]):
        ctx.res.session["end"] = "idle"


def stop_mark(run_dir: Path, run_id: str) -> Path:
    """Left by `kooi session stop` before it signals the session: its end was asked for."""
    return run_dir / "sessions" / f"{run_id}.stop"


# Every entry that comes right after the start waits for the keeper: the home seeded,
# the terminal server up (a tmux client that found no server would start one of its
# own, outside the init's tree; a command found the home not yet seeded: CI, session 33).
READY = 'for i in $(seq 100); do [ -S "/tmp/tmux-$(id -u)/default" ] && break; sleep 0.1; done'
ATTACH = f"{READY}; exec tmux -u new-session -A -s {TMUX_SESSION}"


def _filtered(argv: list[str], debugger: bool) -> list[str]:
    """ARGV under kooi's filter, which the image's python3 installs first."""
    return ["python3", "-I", "-S", "-c", filters.SOURCE, "--", *(["--debugger"] if debugger else []), *argv]


def entry(argv: list[str], debugger: bool = False) -> list[str]:
    """How ARGV enters a session: under kooi's filter, once the session is ready."""
    return _filtered(["sh", "-c", f'{READY}; exec "$@"', "sh", *argv], debugger)


def attach_argv(debugger: bool = False) -> list[str]:
    """A terminal into the session: tmux's, whose session the first one creates."""
    return _filtered(["sh", "-c", ATTACH], debugger)


def ensure_home(client: Any, ctx: RunContext) -> None:
    """The session's kept home: created (labelled as a home, not as the run's) the first
    time; the engine fills a new volume from the image's home."""
    from .. import engineapi
    from .errors import unavailable

    assert ctx.session is not None
    name = ctx.session.home
    try:
        vol = client.request("GET", f"/volumes/{name}")
    except engineapi.NotFound:
        vol = None
    except (engineapi.APIError, OSError) as exc:
        raise unavailable(f"the engine does not answer about the session's home {name}: {exc}") from None
    want = labels.home_labels(ctx.session.person, ctx.wf.name)
    if vol is not None:
        if {k: (vol.get("Labels") or {}).get(k) for k in want} != want:
            from .errors import refused

            raise refused(f"volume {name} exists but is not kooi's home of {ctx.session.person} for "
                          f"{ctx.wf.name}; remove it or let `kooi session reset` do so")
        ctx.log.note(f"session: home {name} kept from an earlier session")
        return
    try:
        client.request("POST", "/volumes/create", body={"Name": name, "Labels": want})
    except (engineapi.APIError, OSError) as exc:
        raise unavailable(f"cannot create the session's home {name}: {exc}") from None
    ctx.log.note(f"session: new home {name}")
