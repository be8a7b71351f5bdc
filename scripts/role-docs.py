#!/usr/bin/env python3
"""Render the role variables' documentation from the roles' argument specs.

Each role's meta/argument_specs.yml is the one source of its variables' types, choices,
defaults and descriptions (Ansible validates them when the role starts). This script
writes a Markdown variables section from it into roles/ROLE/README.md and, one section
per role, into docs/variables.md, between the markers

    <!-- BEGIN GENERATED VARIABLES (scripts/role-docs.py) -->
    <!-- END GENERATED VARIABLES -->

and checks what it cannot render: every variable of a role's defaults/main.yml has an
option in the spec whose default equals it exactly (and no option lacks one), and
ansible/inventories/example/group_vars/all.yml names every kooi-wide variable (set to
its default, or commented out).

    scripts/role-docs.py          rewrite the generated sections
    scripts/role-docs.py --check  change nothing; exit 1 naming each file whose
                                  generated section differs (a diff follows)

Both exit 1 on an inconsistency (printed, one a line), which they cannot repair.
Output depends only on the files read: rerunning changes nothing.

Python 3.11 and PyYAML only (.venv/bin/python scripts/role-docs.py)."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ROLES = REPO / "roles"
VARIABLES_DOC = REPO / "docs" / "variables.md"
EXAMPLE_VARS = REPO / "ansible" / "inventories" / "example" / "group_vars" / "all.yml"
SHARED_ROLE = "kooi_defaults"
BEGIN = "<!-- BEGIN GENERATED VARIABLES (scripts/role-docs.py) -->"
END = "<!-- END GENERATED VARIABLES -->"
# Defaults longer than this (rendered) go below the table instead of into a cell.
CELL_LIMIT = 80


class Problem(Exception):
    pass


def load_yaml(path: Path):
    with path.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def role_names() -> list[str]:
    # Roles with a `main` entry point are the ones an inventory configures; a role that
    # only other roles import (engine_common: entry points packages and configure)
    # documents its parameters in its own README.
    names = sorted(p.parent.parent.name for p in ROLES.glob("*/meta/argument_specs.yml")
                   if "main" in ((load_yaml(p) or {}).get("argument_specs") or {}))
    # The kooi-wide settings first, then the roles by name.
    return sorted(names, key=lambda n: (n != SHARED_ROLE, n))


def entry_point(role: str) -> dict:
    path = ROLES / role / "meta" / "argument_specs.yml"
    data = load_yaml(path) or {}
    main = (data.get("argument_specs") or {}).get("main")
    if not isinstance(main, dict):
        raise Problem(f"{rel(path)}: no argument_specs.main entry point")
    return main


def role_defaults(role: str) -> dict:
    path = ROLES / role / "defaults" / "main.yml"
    if not path.exists():
        return {}
    data = load_yaml(path)
    return data if isinstance(data, dict) else {}


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


# ---- rendering -------------------------------------------------------------------


def scalar(value) -> str:
    """A scalar as YAML spells it; quoted strings in double quotes where that is exact."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and not value:
        return '""'
    text = yaml.safe_dump(value, default_flow_style=True, width=float("inf"), allow_unicode=True).strip()
    if text.endswith("..."):
        text = text[:-3].strip()
    if isinstance(value, str) and text.startswith("'") and not any(c in value for c in '"\\\n'):
        text = f'"{value}"'
    return text


def flow(value) -> str:
    """A value as one line of YAML (flow style), the way an inventory would spell it."""
    if isinstance(value, list):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{scalar(k)}: {flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str) and "\n" in value:
        return scalar(" ".join(value.split()))
    return scalar(value)


def block(name: str, value) -> list[str]:
    """NAME: VALUE as a YAML block (a long default below the table)."""
    if isinstance(value, str) and "\n" in value:
        return [f"{name}: |-"] + [f"  {line}".rstrip() for line in value.split("\n")]
    if isinstance(value, (list, dict)):
        dumped = yaml.safe_dump({name: value}, default_flow_style=None, sort_keys=False, width=88,
                                allow_unicode=True)
        return dumped.rstrip("\n").splitlines()
    return [f"{name}: {scalar(value)}"]


def code(text: str) -> str:
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def cell(text: str) -> str:
    """Text for a table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def prose(text: str) -> str:
    """Description text for a cell: also no emphasis or HTML outside `code spans`."""
    parts = cell(text).split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("*", "\\*").replace("<", "&lt;")
    return "`".join(parts)


def description(opt: dict) -> str:
    desc = opt.get("description", "")
    if isinstance(desc, list):
        desc = " ".join(str(d) for d in desc)
    return prose(str(desc))


def constraints(opt: dict) -> str:
    """The sub-options' dependencies (required_one_of, mutually_exclusive, ...) in words."""
    def names(group) -> str:
        return ", ".join(code(str(n)) for n in group)
    one_of = [list(g) for g in opt.get("required_one_of") or []]
    exclusive = [list(g) for g in opt.get("mutually_exclusive") or []]
    out = []
    for group in one_of:
        if any(sorted(group) == sorted(g) for g in exclusive):
            out.append(f"exactly one of {names(group)}")
        else:
            out.append(f"at least one of {names(group)}")
    for group in exclusive:
        if not any(sorted(group) == sorted(g) for g in one_of):
            out.append(f"at most one of {names(group)}")
    for group in opt.get("required_together") or []:
        out.append(f"all or none of {names(group)}")
    for key, value, needed, *rest in opt.get("required_if") or []:
        which = "one of" if rest and rest[0] else "all of"
        out.append(f"{which} {names(needed)} when {code(str(key))} is {code(flow(value))}")
    for key, needed in (opt.get("required_by") or {}).items():
        needed = [needed] if isinstance(needed, str) else needed
        out.append(f"{names(needed)} with {code(str(key))}")
    if not out:
        return ""
    each = "Each entry needs " if opt.get("type") == "list" else "Needs "
    return " " + each + "; ".join(out) + "."


def type_name(opt: dict) -> str:
    t = opt.get("type", "str")
    if t == "list" and opt.get("elements"):
        return f"list of {opt['elements']}"
    return str(t)


def rows(options: dict, prefix: str, long_defaults: list) -> list[str]:
    out = []
    for name, opt in options.items():
        opt = opt or {}
        full = f"{prefix}{name}"
        if opt.get("required"):
            default = "required"
        elif "default" in opt:
            rendered = flow(opt["default"])
            multiline = isinstance(opt["default"], str) and "\n" in opt["default"]
            if len(rendered) > CELL_LIMIT or multiline:
                long_defaults.append((full, opt["default"]))
                default = "see below"
            else:
                default = cell(code(rendered))
        else:
            default = ""
        choices = ", ".join(cell(code(flow(c))) for c in opt.get("choices") or [])
        text = (description(opt) + constraints(opt)).strip()
        out.append(f"| {cell(code(full))} | {type_name(opt)} | {default} | {choices} | {text} |")
        sub = opt.get("options")
        if sub:
            inner = f"{full}[]." if opt.get("type") == "list" else f"{full}."
            out.extend(rows(sub, inner, long_defaults))
    return out


def render_role(role: str) -> str:
    """The generated Markdown of one role's variables (no markers, no heading)."""
    spec = entry_point(role)
    options = spec.get("options") or {}
    src = f"roles/{role}/meta/argument_specs.yml"
    lines = []
    if not options:
        lines.append(f"None of its own (`{src}` lists none); it reads the kooi-wide settings of role "
                     f"`{SHARED_ROLE}` (docs/variables.md).")
        return "\n".join(lines)
    long_defaults: list = []
    lines.append(f"From `{src}`: Ansible checks these types, choices and sub-options when the role starts.")
    lines.append("")
    lines.append("| variable | type | default | choices | description |")
    lines.append("|---|---|---|---|---|")
    lines.extend(rows(options, "", long_defaults))
    for name, value in long_defaults:
        lines.append("")
        lines.append(f"Default of `{name}`:")
        lines.append("")
        lines.append("```yaml")
        lines.extend(block(name, value))
        lines.append("```")
    return "\n".join(lines)


def render_variables_doc() -> str:
    parts = []
    for role in role_names():
        spec = entry_point(role)
        body = [f"## Role `{role}`", ""]
        short = spec.get("short_description", "").strip()
        if short:
            body += [short if short.endswith(".") else f"{short}.", ""]
        body.append(render_role(role))
        parts.append("\n".join(body))
    return "\n\n".join(parts)


# ---- files -----------------------------------------------------------------------


def splice(path: Path, generated: str) -> tuple[str, str]:
    """(the file's text, the text with GENERATED between its markers)."""
    text = path.read_text(encoding="utf-8")
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise Problem(f"{rel(path)}: needs exactly one pair of markers {BEGIN} ... {END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return text, f"{head}{BEGIN}\n\n{generated}\n\n{END}{tail}"


def targets() -> list[tuple[Path, str]]:
    out = [(ROLES / role / "README.md", render_role(role)) for role in role_names()]
    out.append((VARIABLES_DOC, render_variables_doc()))
    return out


# ---- consistency -----------------------------------------------------------------


def same(a, b) -> bool:
    """Equal values of equal types (YAML's true is not 1, "3" is not 3)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def consistency() -> list[str]:
    problems = []
    for role in role_names():
        spec_path = f"roles/{role}/meta/argument_specs.yml"
        options = entry_point(role).get("options") or {}
        defaults = role_defaults(role)
        for name, value in defaults.items():
            if name not in options:
                problems.append(f"{spec_path}: {name} (roles/{role}/defaults/main.yml) has no option")
            elif "default" not in (options[name] or {}):
                problems.append(f"{spec_path}: {name} has no default; defaults/main.yml has {flow(value)}")
            elif not same(options[name]["default"], value):
                problems.append(f"{spec_path}: {name} default {flow(options[name]['default'])} differs from "
                                f"defaults/main.yml {flow(value)}")
        for name in options:
            if name not in defaults:
                problems.append(f"{spec_path}: {name} is not in roles/{role}/defaults/main.yml "
                                "(Ansible does not apply an argument spec's default)")
    shared = role_defaults(SHARED_ROLE)
    example_text = EXAMPLE_VARS.read_text(encoding="utf-8")
    example = load_yaml(EXAMPLE_VARS) or {}
    for name, value in shared.items():
        if name in example:
            if not same(example[name], value):
                problems.append(f"{rel(EXAMPLE_VARS)}: {name} is {flow(example[name])}, its default is "
                                f"{flow(value)} (set the default or comment the line out)")
        elif not re.search(rf"^#\s*{re.escape(name)}:", example_text, re.M):
            problems.append(f"{rel(EXAMPLE_VARS)}: {name} is missing (add it, commented out, with its default)")
    for name in example:
        if name not in shared:
            problems.append(f"{rel(EXAMPLE_VARS)}: {name} is not a kooi-wide setting of {SHARED_ROLE}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 when a generated section is out of date")
    args = parser.parse_args(argv)
    failed = False
    try:
        for path, generated in targets():
            old, new = splice(path, generated)
            if old == new:
                continue
            if args.check:
                failed = True
                print(f"{rel(path)}: generated variables section is out of date "
                      "(run scripts/role-docs.py):")
                sys.stdout.writelines(difflib.unified_diff(
                    old.splitlines(keepends=True), new.splitlines(keepends=True),
                    fromfile=f"a/{rel(path)} (committed)", tofile=f"b/{rel(path)} (generated)"))
            else:
                path.write_text(new, encoding="utf-8")
                print(f"{rel(path)}: rewritten")
        for problem in consistency():
            failed = True
            print(problem)
    except Problem as exc:
        print(exc)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
