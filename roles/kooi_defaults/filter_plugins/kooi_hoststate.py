"""Filters of kooi's roles: host descriptions read and checked by the shim's own parsers.

`kooi_hoststate(text, kind)` parses TEXT (the JSON a role is about to write under
/etc/kooi) with the parser the shim and the checks use, kooi.hoststate.KIND, and returns
it unchanged; a description the shim would refuse fails the task before anything is
written, in check mode too.

`kooi_ssh_description(persons, login_user)` builds /etc/kooi/ssh.json's content from
kooi_ssh_persons.

`kooi_subid_ranges(text, user)` reads a user's subordinate ranges from /etc/subuid or
/etc/subgid text with kooi.hoststate.subids, the same parser.

Both run on the controller: kooi from the repository this role lives in (shim/), or an
installed kooi."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # used without Ansible (unit tests)
    class AnsibleFilterError(Exception):  # type: ignore[no-redef]
        pass

KINDS = ("engine", "images", "egress", "apparmor", "fuse", "secrets", "limits", "ssh")
_SHIM = Path(__file__).resolve().parents[3] / "shim"


def _module(kind: str):
    if (_SHIM / "kooi" / "hoststate").is_dir() and str(_SHIM) not in sys.path:
        sys.path.insert(0, str(_SHIM))
    return importlib.import_module(f"kooi.hoststate.{kind}")


def kooi_hoststate(text, kind):
    if kind not in KINDS:
        raise AnsibleFilterError(f"kooi_hoststate: unknown description {kind!r}; one of {', '.join(KINDS)}")
    mod = _module(kind)
    try:
        mod.parse(str(text), source=str(mod.PATH))
    except Exception as exc:  # noqa: BLE001 - HostStateError; anything else is a bug, shown as is
        raise AnsibleFilterError(f"kooi_hoststate: the {kind} description this role would write is "
                                 f"invalid: {exc}") from None
    return text


def kooi_subid_ranges(text, user):
    """USER's ranges in a subuid/subgid file's TEXT as 'FIRST-LAST' strings (nftables
    intervals), parsed by kooi.hoststate.subids like everything else that reads them."""
    subids = _module("subids")
    try:
        return [f"{a}-{b}" for a, b in subids.ranges_of(str(text), str(user), "/etc/subuid")]
    except subids.SubidError as exc:
        raise AnsibleFilterError(f"kooi_subid_ranges: {exc}") from None


def kooi_ssh_description(persons, login_user):
    """/etc/kooi/ssh.json's content from kooi_ssh_persons (workflow defaults to
    shell-session); a name given twice is an error (kooi_hoststate checks the rest)."""
    out = {}
    for p in persons or []:
        name = str(p.get("name", ""))
        if name in out:
            raise AnsibleFilterError(f"kooi_ssh_persons: {name!r} is listed twice; list each person once")
        out[name] = {"keys": [str(k) for k in p.get("keys") or []], "workflow": str(p.get("workflow") or
                                                                                   "shell-session"),
                     "project": str(p.get("project", ""))}
    return {"login_user": str(login_user), "persons": out}


class FilterModule:
    def filters(self):
        return {"kooi_hoststate": kooi_hoststate, "kooi_subid_ranges": kooi_subid_ranges,
                "kooi_ssh_description": kooi_ssh_description}
