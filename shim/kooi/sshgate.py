"""The SSH entry into sessions: the forced command of the host's sshd for the persons'
login account (roles/session_ssh, docs/sessions.md).

sshd has taken a key of the root-owned list and runs this, never the client's command:
ExposeAuthInfo names the key (SSH_USER_AUTH), /etc/kooi/ssh.json names its person, and
the connection goes into that person's own session (started on the person's project
when none runs) and nowhere else. What the client asked for (SSH_ORIGINAL_COMMAND)
decides how:

    (nothing), a terminal     the session's terminal (tmux: detach with C-b d)
    (nothing), no terminal    the session's shell, reading standard input
    the sftp subsystem        sftp-server in the session: sftp and scp reach its files
    kooi-sshd                 an sshd of the session's own on standard input and output
                              (`sshd -i`), for a client's ProxyCommand: what that client
                              forwards (ssh -L, VS Code Remote-SSH) is opened inside the
                              session, to its own loopback only
    anything else             run by the session's shell (`ssh host make test`)

Every entry goes through kooi's filter, as `kooi session exec`. The host's sshd forwards
nothing for the login account (DisableForwarding, roles/session_ssh): the session's own
sshd, a process of the session like any other, is the only place a forward can start,
and it reaches what the session reaches (the cage's egress), no more.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .hoststate import HostStateError
from .hoststate import ssh as ssh_state
from .hoststate.engine import EngineConfig
from .neutral import neutral
from .run.errors import EXIT_INVALID, EXIT_REFUSED, EXIT_UNAVAILABLE
from .sessions import SessionError

SFTP_SERVER = "/usr/lib/openssh/sftp-server"  # the runner image's (openssh-sftp-server)
SSHD_WORD = "kooi-sshd"
# The session's own sshd (the image's openssh-server, as the session's user): its host
# key kept in the home (the client's known_hosts stays right across restarts), its
# configuration and the person's keys (the arguments) written fresh each time.
SESSION_SSHD = r"""
set -eu
umask 077
d=/tmp/kooi-sshd k="$HOME/.config/kooi/sshd"
mkdir -p "$d" "$k"
[ -f "$k/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -C kooi-session -f "$k/ssh_host_ed25519_key"
printf '%s
' "$@" > "$d/authorized_keys"
cat > "$d/sshd_config" <<CONF
HostKey $k/ssh_host_ed25519_key
AuthorizedKeysFile $d/authorized_keys
PidFile none
UsePAM no
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AllowTcpForwarding local
PermitOpen localhost:* 127.0.0.1:* [::1]:*
AllowStreamLocalForwarding no
AllowAgentForwarding no
X11Forwarding no
PermitTunnel no
GatewayPorts no
PermitUserRC no
PrintMotd no
Subsystem sftp internal-sftp
LogLevel ERROR
CONF
exec /usr/sbin/sshd -i -e -f "$d/sshd_config"
"""


class GateError(SessionError):
    """A login the gate refuses (by default exit 126) or cannot carry out."""

    def __init__(self, message: str, code: int = EXIT_REFUSED) -> None:
        super().__init__(message, code)


@dataclass(frozen=True)
class Entry:
    """How a connection enters its session: KIND, the argv inside (before kooi's
    filter), and whether it gets a terminal."""

    kind: str  # terminal, shell, sftp, sshd, command
    argv: tuple[str, ...]
    tty: bool


def person_of(conf: ssh_state.SshConfig, auth_info: str) -> str:
    """The person whose key sshd took, from ExposeAuthInfo's text (one `publickey TYPE
    BASE64` line a key; every key the login used must be the same person's)."""
    found = set()
    for line in auth_info.splitlines():
        parts = line.split()
        if parts[:1] == ["publickey"] and len(parts) >= 3:
            found.add(conf.person_of(parts[1], parts[2]))
    if not found:
        raise GateError("sshd did not say which key logged in: the login account's Match block needs "
                        "ExposeAuthInfo yes (re-run site.yml)")
    if None in found or len(found) != 1:
        raise GateError("this key is no person's of /etc/kooi/ssh.json (kooi_ssh_persons)")
    person = found.pop()
    assert person is not None
    return person


def plan(original: str, tty: bool, shell: tuple[str, ...], keys: tuple[str, ...] = ()) -> Entry:
    """What the client asked for (ORIGINAL: sshd's SSH_ORIGINAL_COMMAND), as an entry.
    SHELL is the session workflow's (session.shell); KEYS the person's public keys
    (for the session's own sshd)."""
    if not original.strip():
        if tty:
            return Entry("terminal", (), True)
        return Entry("shell", shell, False)
    if original.strip() in ("internal-sftp", SFTP_SERVER) or original.strip().endswith("/sftp-server"):
        return Entry("sftp", (SFTP_SERVER,), False)
    if original.strip() == SSHD_WORD:
        return Entry("sshd", ("sh", "-c", SESSION_SSHD, SSHD_WORD, *keys), False)
    return Entry("command", (shell[0], "-c", original), tty)


def _auth_info(environ: Mapping[str, str], login_uid: int) -> str:
    """What sshd wrote about the login (ExposeAuthInfo): a file of the login account's,
    which sshd names in SSH_USER_AUTH. A client cannot set that variable (sshd takes no
    such environment from it, and the file must be the account's own, 0600)."""
    path = environ.get("SSH_USER_AUTH", "")
    if not path:
        return ""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise GateError(f"cannot read sshd's record of the login ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != login_uid or st.st_mode & 0o077:
            raise GateError("sshd's record of the login is not the login account's own file (0600)")
        return os.read(fd, 1 << 16).decode(errors="replace")
    finally:
        os.close(fd)


def gate(cfg: EngineConfig, environ: Mapping[str, str], tty: bool) -> tuple[list[str], dict[str, str], str]:
    """Where this SSH connection goes: (the docker CLI command line that enters the
    person's session, its environment, a line for the log). Starts the person's session
    first when none runs."""
    from . import sessions, workflow
    from .run.session import attach_argv, entry

    try:
        conf = ssh_state.load()
    except HostStateError as exc:
        raise GateError(str(exc), EXIT_INVALID) from None
    if conf is None:
        raise GateError("the SSH entry is not set up on this host (kooi_ssh_enabled; re-run site.yml)", EXIT_INVALID)
    person = person_of(conf, _auth_info(environ, os.geteuid()))
    spec = conf.persons[person]
    who = sessions.Caller(person, sees_all=False)
    try:
        wf = workflow.load(spec.workflow)
    except workflow.WorkflowError as exc:
        raise GateError(f"{person}'s session workflow: {exc}", EXIT_INVALID) from None
    if wf.session is None:
        raise GateError(f"{person}'s workflow {spec.workflow} is not a session workflow", EXIT_INVALID)
    live = [s for s in sessions.find(cfg, who, spec.workflow) if s.running]
    if not live:
        word = sessions.start(cfg, who, spec.workflow, Path(spec.project))
        if "result" in word:
            raise GateError(f"{person}'s session did not start: {word['result']['message']}",
                            word["result"]["exit_code"] or EXIT_UNAVAILABLE)
    s = sessions.one(cfg, who, spec.workflow)
    sessions.as_runner(cfg)
    debugger = sessions.debugger_of(cfg, s)
    e = plan(environ.get("SSH_ORIGINAL_COMMAND", ""), tty, tuple(wf.session.shell),
             tuple(f"{t} {b}" for t, b in spec.keys))
    inner = attach_argv(debugger) if e.kind == "terminal" else entry(list(e.argv), debugger)
    said = neutral(f"{person}: {e.kind}" + (f" {shlex.quote(e.argv[-1])[:200]}" if e.kind == "command" else ""))
    return sessions.entry_argv(cfg, s, inner, e.tty), sessions.docker_env(cfg), said
