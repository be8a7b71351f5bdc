"""Filters of roles/egress: turn the egress variables into the proxy's allowlist.

`kooi_egress_allowlist(presets, chosen, allow)` expands the chosen presets, adds the
operator's names, validates every entry and returns a sorted list that Squid's
dstdomain accepts without warnings (exact names covered by a `.domain` wildcard are
dropped). `kooi_egress_hosts(names)` validates exact names (no wildcards), e.g. the
hosts allowed to resolve to private addresses. Bad input raises an error that names
the entry and says what is accepted."""

from __future__ import annotations

import ipaddress
import re

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # used without Ansible (unit tests)
    class AnsibleFilterError(Exception):  # type: ignore[no-redef]
        pass

LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
FORMS = ("an exact host name (repo.example.org) or a domain wildcard with a leading dot "
         "(.example.org: the domain and every name below it)")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.strip("[]"))
        return True
    except ValueError:
        return False


def check_name(entry, where: str, wildcard: bool = True) -> str:
    if not isinstance(entry, str):
        raise AnsibleFilterError(f"{where}: {entry!r} is not a string; use {FORMS}")
    name = entry.strip().lower().rstrip(".") if entry.strip() != "." else "."
    wild = name.startswith(".")
    body = name[1:] if wild else name
    if wild and not wildcard:
        raise AnsibleFilterError(f"{where}: {entry!r} is a wildcard; name the host exactly")
    if not body:
        raise AnsibleFilterError(f"{where}: {entry!r} is empty; use {FORMS}")
    if _is_ip(body) or re.fullmatch(r"[0-9.]+", body):
        raise AnsibleFilterError(f"{where}: {entry!r} is an IP address; the proxy refuses IP-literal "
                                 f"destinations, name the host instead")
    if any(c in body for c in "*/:@ ?#"):
        raise AnsibleFilterError(f"{where}: {entry!r} is not a host name; use {FORMS}")
    labels = body.split(".")
    if not all(LABEL.match(x) for x in labels):
        raise AnsibleFilterError(f"{where}: {entry!r} is not a valid host name; use {FORMS}")
    if wild and len(labels) < 2:
        raise AnsibleFilterError(f"{where}: {entry!r} would allow a whole top-level domain; "
                                 f"name a registrable domain (.example.org)")
    if len(body) > 253:
        raise AnsibleFilterError(f"{where}: {entry!r} is longer than 253 characters")
    return ("." if wild else "") + body


def _covered(name: str, wildcards: set[str]) -> bool:
    """Is NAME (exact or wildcard) inside another wildcard of WILDCARDS?"""
    body = name.lstrip(".")
    parts = body.split(".")
    for i in range(len(parts)):
        suffix = "." + ".".join(parts[i:])
        if suffix in wildcards and suffix != name:
            return True
    return False


def kooi_egress_allowlist(presets, chosen, allow) -> list[str]:
    if not isinstance(presets, dict):
        raise AnsibleFilterError("egress presets must be a mapping of preset name to a list of names")
    if not isinstance(chosen, list):
        raise AnsibleFilterError(f"kooi_egress_presets must be a list of preset names, got {chosen!r}")
    if not isinstance(allow, list):
        raise AnsibleFilterError(f"kooi_egress_allow must be a list of names, got {allow!r}; use {FORMS}")
    names: set[str] = set()
    for p in chosen:
        if p not in presets:
            raise AnsibleFilterError(f"kooi_egress_presets: unknown preset {p!r}; known: {', '.join(sorted(presets))}")
        for n in presets[p]:
            names.add(check_name(n, f"egress preset {p}"))
    for n in allow:
        names.add(check_name(n, "kooi_egress_allow"))
    wildcards = {n for n in names if n.startswith(".")}
    return sorted(n for n in names if not _covered(n, wildcards))


def kooi_egress_hosts(names, where: str = "kooi_egress_private_hosts") -> list[str]:
    if not isinstance(names, list):
        raise AnsibleFilterError(f"{where} must be a list of exact host names, got {names!r}")
    return sorted({check_name(n, where, wildcard=False) for n in names})


class FilterModule:
    def filters(self):
        return {"kooi_egress_allowlist": kooi_egress_allowlist, "kooi_egress_hosts": kooi_egress_hosts}
