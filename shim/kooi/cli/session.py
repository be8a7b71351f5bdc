"""`kooi session start|attach|exec|list|stop|reset`: a person's caged interactive
sessions (owner: kooi.sessions)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..hoststate import HostStateError
from ..hoststate import engine as engine_state
from ..neutral import neutral
from .exits import EXIT_OK, EXIT_USAGE, fail


def register(sub: Any) -> None:
    s = sub.add_parser("session", help="a person's caged interactive sessions: start, attach, exec, list, stop, "
                       "reset", description="Sessions of session workflows (docs/sessions.md). Exit codes as "
                       "kooi run's; 3: no running session.")
    ssub = s.add_subparsers(dest="action", required=True)

    def add(name: str, help_: str, workflow: str | None = "?") -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = ssub.add_parser(name, help=help_)
        if workflow:
            p.add_argument("workflow", nargs=workflow, help="the session's workflow (may be left out when the person "
                           "has one running session)" if workflow == "?" else "the session's workflow")
        p.add_argument("--person", help="whose session (root and the runner act for anyone; default: the caller's "
                       "account name)")
        p.add_argument("--config", default=str(engine_state.PATH), help=argparse.SUPPRESS)
        p.set_defaults(func=command)
        return p

    st = add("start", "start a session of a session workflow on a project", workflow=None)
    st.add_argument("workflow", help="a session workflow (its key `session`)")
    st.add_argument("--project", default=os.getcwd(), help="project directory (default: the current one)")
    st.add_argument("--attach", action="store_true", help="attach a terminal once it runs")
    add("attach", "a terminal into the session (tmux: detach with C-b d; the work goes on)")
    ex = add("exec", "run one command in the session (for scripts and IDE helpers)", workflow=None)
    ex.add_argument("workflow", help="the session's workflow")
    ex.set_defaults(tail=[])  # the command: everything after `--` (cli.main)
    ex.usage = "kooi session exec [-h] [--person PERSON] WORKFLOW -- COMMAND..."
    ls = add("list", "the sessions and kept homes", workflow=None)
    ls.add_argument("--all", action="store_true", help="everyone's (root and the runner)")
    ls.add_argument("--json", action="store_true")
    sp = add("stop", "end the session; its result is written")
    sp.add_argument("--json", action="store_true", help="print the session's result")
    add("reset", "remove the kept home (no session of it may be running)", workflow=None).add_argument(
        "workflow", help="the session workflow whose kept home goes")
    g = ssub.add_parser("gate", help="the SSH entry: sshd's forced command for the persons' login account",
                        description="Run by the host's sshd (ForceCommand, roles/session_ssh), never by hand: the "
                        "key sshd took names the person; the connection enters that person's session.")
    g.add_argument("--config", default=str(engine_state.PATH), help=argparse.SUPPRESS)
    g.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from .. import sessions

    where = f"kooi session {args.action}"
    try:
        cfg = engine_state.load(Path(args.config))
    except HostStateError as exc:
        return fail(where, exc, EXIT_USAGE)
    if args.action == "gate":
        return _gate(cfg, where)
    try:
        who = sessions.caller(cfg, args.person)
        if args.action == "start":
            return _start(sessions, cfg, who, args, where)
        sessions.as_runner(cfg)
        if args.action in ("attach", "exec"):
            return _enter(sessions, cfg, who, args, where)
        if args.action == "list":
            return _list(sessions, cfg, who, args)
        if args.action == "stop":
            res = sessions.stop(cfg, who, args.workflow)
            print(json.dumps(res, indent=2) if args.json else
                  neutral(f"{where}: {res['workflow']} of {res['session']['person']}: {res['message']} (result "
                          f"{res['run_id']}, {len(res['refused'])} refusal(s))"))
            return EXIT_OK
        print(neutral(sessions.reset(cfg, who, args.workflow)))
        return EXIT_OK
    except sessions.SessionError as exc:
        return fail(where, exc, exc.code)


def _gate(cfg: Any, where: str) -> int:
    from .. import sessions, sshgate

    try:
        cmd, env, said = sshgate.gate(cfg, os.environ, sys.stdin.isatty() and sys.stdout.isatty())
    except sessions.SessionError as exc:  # the gate's refusals (GateError) among them
        return fail(where, exc, exc.code)
    import syslog

    syslog.openlog("kooi-ssh", 0, syslog.LOG_AUTH)
    syslog.syslog(syslog.LOG_INFO, f"{said} ({os.environ.get('SSH_CONNECTION', '?')})")
    sys.stdout.flush()
    os.execve(cmd[0], cmd, env)
    return 70  # not reached


def _start(sessions: Any, cfg: Any, who: Any, args: argparse.Namespace, where: str) -> int:
    word = sessions.start(cfg, who, args.workflow, Path(args.project), engine_config=Path(args.config))
    if "result" in word:
        res = word["result"]
        return fail(where, res["message"], res["exit_code"] or 70)
    print(neutral(f"{where}: {args.workflow} of {who.person} runs (run {word['started']}, home {word['home']}); "
                  f"attach: kooi session attach {args.workflow}" + (f" --person {who.person}" if args.person else "")))
    if not args.attach:
        return EXIT_OK
    sessions.as_runner(cfg)
    return _enter(sessions, cfg, who, argparse.Namespace(**{**vars(args), "action": "attach"}), where)


def _enter(sessions: Any, cfg: Any, who: Any, args: argparse.Namespace, where: str) -> int:
    from ..run.session import attach_argv, entry

    s = sessions.one(cfg, who, args.workflow)
    tty = sys.stdin.isatty() and sys.stdout.isatty()
    if args.action == "attach":
        if not tty:
            return fail(where, "a terminal needs one: run it in a terminal, or use `kooi session exec`", EXIT_USAGE)
        inner = attach_argv(sessions.debugger_of(cfg, s))
    else:
        argv = args.tail
        if not argv:
            return fail(where, "give the command to run: kooi session exec WORKFLOW -- COMMAND...", EXIT_USAGE)
        inner = entry(argv, sessions.debugger_of(cfg, s))
    cmd = sessions.entry_argv(cfg, s, inner, tty)
    sys.stdout.flush()
    os.execve(cmd[0], cmd, sessions.docker_env(cfg))
    return 70  # not reached


def _list(sessions: Any, cfg: Any, who: Any, args: argparse.Namespace) -> int:
    found = sessions.find(cfg, who, everyone=args.all)
    homes = sessions.homes(cfg, who, everyone=args.all)
    if args.json:
        print(json.dumps({"sessions": [s.as_dict() for s in found], "homes": homes}, indent=2))
        return EXIT_OK
    from ..neutral import one_line

    # Labels the runner's engine answers: each field one line (review 29: a newline in a
    # project label printed a row of its own in root's list).
    rows: list[tuple[str, ...]] = [("PERSON", "WORKFLOW", "STATE", "STARTED", "PROJECT", "RUN")]
    rows += [tuple(map(one_line, (s.person, s.workflow, ("running" if s.running else "ended")
                                  + ("" if s.supervised else " (unsupervised)"), s.started, s.project, s.run_id)))
             for s in found]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    if homes:
        print("kept homes: " + ", ".join(one_line(f"{h['workflow']} of {h['person']}") for h in homes))
    return EXIT_OK
