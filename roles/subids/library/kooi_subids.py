#!/usr/bin/python
"""Own the /etc/subuid and /etc/subgid entries of the users kooi manages."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kooi_subids
short_description: Own the subordinate uid/gid ranges of kooi-managed users
description:
  - Gives every listed user exactly one range in /etc/subuid and /etc/subgid, of at
    least 65536 ids, overlapping no other entry and no existing account's id.
  - Repairs duplicates (Debian's useradd adds ranges of its own), keeps ranges that
    still fit, preserves every other line in place.
  - Fails, changing nothing, on a conflict it must not resolve (an explicit start
    that overlaps an unmanaged entry).
options:
  users:
    description: Users to manage, each with C(name), optional C(count) and C(start).
    type: list
    elements: dict
    required: true
  subuid_path:
    description: Path of the subuid file.
    type: path
    default: /etc/subuid
  subgid_path:
    description: Path of the subgid file.
    type: path
    default: /etc/subgid
  mapped_groups:
    description:
      - Groups whose gid lies inside a managed range on purpose, so not counted as
        accounts' ids (kooi_gvisor_group, the workload's gid as the remapped engine maps
        it). Names that do not exist are ignored.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
"""

RETURN = r"""
ranges:
  description: user -> {subuid: [start, count], subgid: [start, count]}
  returned: always
  type: dict
"""

import grp
import os
import pwd
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.kooi_subids import SubidError, plan


def _read(path):
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        return ""


def main():
    module = AnsibleModule(
        argument_spec=dict(
            users=dict(type="list", elements="dict", required=True),
            subuid_path=dict(type="path", default="/etc/subuid"),
            subgid_path=dict(type="path", default="/etc/subgid"),
            mapped_groups=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    users = []
    for u in module.params["users"]:
        unknown = set(u) - {"name", "count", "start"}
        if unknown:
            module.fail_json(msg=f"kooi_subids: unknown keys {sorted(unknown)} in users entry {u}")
        users.append({k: v for k, v in u.items() if v is not None})
    mapped = set(module.params["mapped_groups"])
    files = {
        "subuid": (module.params["subuid_path"], {p.pw_uid for p in pwd.getpwall()}),
        "subgid": (module.params["subgid_path"], {g.gr_gid for g in grp.getgrall() if g.gr_name not in mapped}),
    }
    result = dict(changed=False, ranges={u["name"]: {} for u in users})
    diffs, writes = [], []
    for kind, (path, reserved) in files.items():
        before = _read(path)
        try:
            after, ranges = plan(before, users, reserved, path)
        except SubidError as exc:
            module.fail_json(msg=f"kooi_subids: {exc}", **result)
        for name, rng in ranges.items():
            result["ranges"][name][kind] = list(rng)
        if after != before:
            diffs.append(dict(before=before, after=after, before_header=path, after_header=path))
            writes.append((path, after))
    # Plan both files before writing either: a conflict in subgid changes nothing.
    for path, after in writes:
        result["changed"] = True
        if module.check_mode:
            continue
        d = os.path.dirname(path) or "."
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".kooi-subids.")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(after)
        os.chmod(tmp, 0o644)
        module.atomic_move(tmp, path)
    if module._diff:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
