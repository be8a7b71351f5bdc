"""HOST-SSH-*: the SSH entry into sessions (roles/session_ssh; docs/sessions.md).

Where the operator opted in (/etc/kooi/ssh.json exists), sshd's effective configuration
for the login account (`sshd -T` for that user: what the daemon applies to a
connection of its) must run only kooi's gate, forward nothing and take only the keys of
root's file; that file and the description must be root's, and hold the persons' keys
and nothing else. Not opted in: no drop-in of kooi's may be left."""

from __future__ import annotations

import shlex

from ..hoststate import paths
from ..hoststate import ssh as ssh_state
from .core import FAIL, NA, PASS, Context, Host, Outcome, check

DROPIN = "/etc/ssh/sshd_config.d/50-kooi-sessions.conf"  # roles/session_ssh's session_ssh_dropin default
# What sshd must apply to the login account: keyword (as `sshd -T` prints it) -> value.
WANT = {
    "disableforwarding": "yes", "allowtcpforwarding": "no", "allowstreamlocalforwarding": "no",
    "allowagentforwarding": "no", "x11forwarding": "no", "permittunnel": "no", "gatewayports": "no",
    "permitopen": "none", "permitlisten": "none", "permituserrc": "no", "permituserenvironment": "no",
    "exposeauthinfo": "yes", "authenticationmethods": "publickey", "passwordauthentication": "no",
    "kbdinteractiveauthentication": "no", "hostbasedauthentication": "no", "authorizedkeyscommand": "none",
    "authorizedkeysfile": paths.SSH_KEYS,
}


def _conf(host: Host) -> ssh_state.SshConfig | None:
    f = host.file(paths.SSH)
    return ssh_state.parse(f.content_string, paths.SSH) if f.exists else None


@check("HOST-SSH-ENTRY", "sshd runs only kooi's gate for the persons' login account and forwards nothing for it "
       "(no TCP, socket, agent or X11 forwarding, no tunnels, no ~/.ssh/rc, keys only from root's file, "
       "publickey only)", "a person's key opens a shell on the host, or a forward reaches the engine, the "
       "proxy, the injector or another session past the cage")
def ssh_entry(host: Host, ctx: Context) -> Outcome:
    conf = _conf(host)
    if conf is None:
        if host.file(DROPIN).exists:
            return FAIL, f"{DROPIN} is there but {paths.SSH} is not: re-run site.yml"
        return NA, "not opted in (kooi_ssh_enabled)"
    res = host.run(f"/usr/sbin/sshd -T -C {shlex.quote(f'user={conf.login_user},host=kooi-verify,addr=127.0.0.1')}")
    if res.rc != 0:
        return FAIL, f"sshd -T fails: {(res.stderr or res.stdout).strip()[-300:]}"
    got: dict[str, list[str]] = {}
    for line in res.stdout.splitlines():
        k, _, v = line.partition(" ")
        got.setdefault(k.lower(), []).append(v.strip())
    bad = [f"{k} {' '.join(got.get(k, ['(unset)']))} (want {v})" for k, v in WANT.items() if got.get(k) != [v]]
    force = f"{ctx.engine.kooi_bin} session gate"
    if got.get("forcecommand") != [force]:
        bad.append(f"forcecommand {' '.join(got.get('forcecommand', ['(unset)']))} (want {force})")
    accepted = [e for v in got.get("acceptenv", []) for e in v.split()]
    if any(e == "*" or e.startswith("SSH_") or e.startswith("LD_") or e.startswith("PYTHON") for e in accepted):
        bad.append(f"acceptenv {' '.join(accepted)} (a client's environment reaches the gate)")
    if bad:
        return FAIL, f"for {conf.login_user}: " + "; ".join(bad)
    return PASS, (f"for {conf.login_user}: forcecommand {force}, disableforwarding yes, keys only from "
                  f"{paths.SSH_KEYS}, publickey only, no ~/.ssh/rc")


@check("HOST-SSH-KEYS", "the persons' keys and their description are root's, and sshd's key file holds exactly the "
       "described persons' keys, each restricted", "the runner or a workload adds a key, or moves a key to "
       "another person's session")
def ssh_keys(host: Host, ctx: Context) -> Outcome:
    try:
        conf = _conf(host)
    except Exception as exc:  # noqa: BLE001 - the gate would refuse it: the check says why
        return FAIL, f"{paths.SSH}: {exc}"
    if conf is None:
        return NA, "not opted in (kooi_ssh_enabled)"
    bad = []
    for p in (paths.SSH, paths.SSH_KEYS, paths.SSH_KEYS.rsplit("/", 1)[0], paths.ETC):
        f = host.file(p)
        if not f.exists or f.user != "root" or int(f.mode) & 0o022:
            bad.append(f"{p} is {f.user if f.exists else 'missing'} {int(f.mode) if f.exists else 0:04o} "
                       "(want root's, not writable by others)")
    want = {k for p in conf.persons.values() for k in p.keys}
    found: set[tuple[str, str]] = set()
    text = host.file(paths.SSH_KEYS).content_string if host.file(paths.SSH_KEYS).exists else ""
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        opts, _, key = line.partition(" ")
        try:
            k = ssh_state.key_of(key)
        except ValueError:
            bad.append(f"{paths.SSH_KEYS}:{n}: not `restrict,pty KEY`")
            continue
        if opts != "restrict,pty":
            bad.append(f"{paths.SSH_KEYS}:{n}: options {opts!r} (want restrict,pty)")
        if k not in want:
            bad.append(f"{paths.SSH_KEYS}:{n}: a key of nobody's in {paths.SSH}")
        found.add(k)
    if want - found:
        bad.append(f"{len(want - found)} described key(s) missing from {paths.SSH_KEYS}")
    if bad:
        return FAIL, "; ".join(bad)
    return PASS, f"{len(conf.persons)} person(s), {len(found)} key(s), root's files"
