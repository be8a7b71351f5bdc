"""/etc/kooi/ssh.json: the SSH entry into sessions (roles/session_ssh): the account the
persons log in as, and each person's keys, session workflow and project.

sshd takes a key of /etc/kooi/ssh/authorized_keys for the login account and runs only
kooi's gate (`kooi session gate`, its ForceCommand); the gate reads which key it was
(ExposeAuthInfo) and finds its person here. Root-owned like every description: a
person, a workload or the runner cannot add a key or change whose it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from . import _json, paths, read
from .errors import HostStateError

PATH = Path(paths.SSH)
# A public key as OpenSSH writes it: type, base64, an optional comment.
KEY_RE = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521)|sk-ssh-ed25519@openssh\.com|"
                    r"sk-ecdsa-sha2-nistp256@openssh\.com) ([A-Za-z0-9+/]+={0,3})(?: [^\n]*)?$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}\Z")


@dataclass(frozen=True)
class Person:
    keys: tuple[tuple[str, str], ...]  # (type, base64)
    workflow: str
    project: str


@dataclass(frozen=True)
class SshConfig:
    login_user: str
    persons: dict[str, Person]

    def person_of(self, key_type: str, key_b64: str) -> str | None:
        """Whose key (TYPE, BASE64) is; None for a key of nobody's."""
        return next((n for n, p in self.persons.items() if (key_type, key_b64) in p.keys), None)


def key_of(line: str) -> tuple[str, str]:
    """(type, base64) of an OpenSSH public key line; ValueError for anything else."""
    m = KEY_RE.match(line.strip())
    if m is None:
        raise ValueError(f"not an OpenSSH public key: {line.strip()[:40]!r}")
    return m.group(1), m.group(2)


def parse(text: str, source: str = str(PATH)) -> SshConfig:
    raw = _json.obj(text, source, "SSH entry description")
    unknown = sorted(set(raw) - {"login_user", "persons"})
    if unknown:
        raise HostStateError(f"{source}: unknown keys {', '.join(unknown)}; re-run site.yml")
    login = raw.get("login_user")
    persons = raw.get("persons")
    if not isinstance(login, str) or not login or not isinstance(persons, dict):
        raise HostStateError(f"{source}: login_user (a name) and persons (an object) are required; re-run site.yml")
    out: dict[str, Person] = {}
    seen: dict[tuple[str, str], str] = {}
    for name, p in persons.items():
        where = f"{source}: persons.{name}"
        if not NAME_RE.match(str(name)) or not isinstance(p, dict) or set(p) != {"keys", "workflow", "project"}:
            raise HostStateError(f"{where}: a person is a name (a-z 0-9 . _ -) with keys, workflow and project; "
                                 "re-run site.yml")
        if not isinstance(p["keys"], list) or not p["keys"] or not isinstance(p["workflow"], str) \
                or not isinstance(p["project"], str) or not p["project"].startswith("/"):
            raise HostStateError(f"{where}: keys (a non-empty list), workflow (a name) and project (an absolute "
                                 "path); re-run site.yml")
        try:
            keys = tuple(key_of(str(k)) for k in p["keys"])
        except ValueError as exc:
            raise HostStateError(f"{where}: {exc}; re-run site.yml") from None
        for k in keys:
            if seen.setdefault(k, str(name)) != name:
                raise HostStateError(f"{where}: a key of {seen[k]}'s too: one key is one person's; re-run site.yml")
        out[str(name)] = Person(keys, p["workflow"], p["project"])
    return SshConfig(login, out)


def load(path: Path = PATH) -> SshConfig | None:
    text = read(path)
    return None if text is None else parse(text, str(path))
