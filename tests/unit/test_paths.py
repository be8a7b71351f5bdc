"""kooi's fixed places: the roles' kooi_paths and the shim's hoststate.paths are one table."""

from __future__ import annotations

from pathlib import Path

import yaml

from kooi.hoststate import engine, paths

REPO = Path(__file__).resolve().parents[2]


def test_the_roles_and_the_shim_name_the_same_places() -> None:
    roles = yaml.safe_load((REPO / "roles/kooi_defaults/vars/main.yml").read_text())["kooi_paths"]
    assert roles == paths.ALL


def test_the_table_names_every_place_the_shim_defines() -> None:
    defined = {v for k, v in vars(paths).items() if k.isupper() and isinstance(v, str)} - {paths.BIN}
    assert defined == set(paths.ALL.values())


def test_kooi_bin_defaults_to_the_roles_default() -> None:
    defaults = yaml.safe_load((REPO / "roles/kooi_defaults/defaults/main.yml").read_text())
    assert defaults["kooi_bin"] == paths.BIN == engine.EngineConfig.__dataclass_fields__["kooi_bin"].default


def test_no_role_writes_a_fixed_place_by_its_literal_path() -> None:
    """Each fixed place is spelt once on the Ansible side, in kooi_paths."""
    literal = {paths.ENGINE, paths.IMAGES, paths.IMAGE_LOCK, paths.EGRESS, paths.APPARMOR, paths.FUSE,
               paths.WORKFLOWS, paths.AUTHZ_TOKEN, paths.AUTHZ_SOCKET, paths.RUNS, paths.BIN,
               paths.ENGINE_STATE_DIR}
    offenders = []
    for f in sorted((REPO / "roles").rglob("*")):
        if f.suffix not in (".yml", ".j2") or f.name == "argument_specs.yml" or not f.is_file():
            continue
        if f.relative_to(REPO).as_posix() in ("roles/kooi_defaults/vars/main.yml", "roles/kooi_defaults/defaults/main.yml"):
            continue
        for n, line in enumerate(f.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if code.lstrip().startswith(("- name:", "name:")):
                continue  # a task's name may say where it writes
            offenders += [f"{f.relative_to(REPO)}:{n}: {p}" for p in literal
                          if p in code and not any(p + c in code for c in "/.-_")]
    assert not offenders, "\n".join(offenders)
