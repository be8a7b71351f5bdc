"""The host-state layer: the root-owned descriptions kooi's roles write under /etc/kooi.

One module per description, each with its fixed path, its schema as a frozen dataclass
and a `parse(text)` that is the only parser of that file: the shim reads the host's own
files with `load()`, the checks parse what a (possibly remote) host returns with
`parse()`, and the roles validate what they write with `python3 -m kooi.hoststate KIND
FILE` (Ansible's `validate:`). The files are root-owned and read-only for everyone
else, so a workload cannot change them; a malformed one is an error that says to
re-run site.yml, never a guess.

    engine   /etc/kooi/engine.json   the engine, the runner, and what the host is meant to enforce
    images   /etc/kooi/images.json   the pinned images `kooi run` resolves names by
    egress   /etc/kooi/egress.json   the proxy and the nftables table (roles/egress)
    apparmor /etc/kooi/apparmor.json kooi's profiles (roles/apparmor)
    fuse     /etc/kooi/fuse.json     whether /dev/fuse is opted in (roles/fuse)
    limits   /etc/kooi/limits.json   the runs' default and maximum limits (roles/shim)
    ssh      /etc/kooi/ssh.json      the SSH entry into sessions: persons and keys (roles/session_ssh)
    subids   /etc/subuid, /etc/subgid (not kooi's, but read and planned by kooi)
"""

from __future__ import annotations

from pathlib import Path

from .errors import HostStateError

__all__ = ["HostStateError", "read"]


def read(path: Path) -> str | None:
    """The text of PATH, None when it does not exist; other errors say to re-run site.yml."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise HostStateError(f"{path}: cannot read it ({exc.strerror or exc}); re-run site.yml") from None
