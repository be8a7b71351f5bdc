"""roles/shim/files/pack.py: the kooi package packs the same on every checkout, and a
changed module gets another mtime (so the host's bytecode cache never serves it stale)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("pack", REPO / "roles/shim/files/pack.py")
pack = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pack)


def _copy(tmp: Path, name: str, mtime: int) -> Path:
    dest = tmp / name / "kooi"
    shutil.copytree(REPO / "shim/kooi", dest, ignore=shutil.ignore_patterns("__pycache__"))
    for p in dest.rglob("*"):
        os.utime(p, (mtime, mtime))
    (dest / "__pycache__").mkdir(exist_ok=True)
    (dest / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"stale")
    return dest


def test_two_checkouts_pack_byte_for_byte_the_same(tmp_path):
    a, b = _copy(tmp_path, "a", 1_000_000), _copy(tmp_path, "b", 2_000_000)
    pack.pack(a, tmp_path / "a.tar")
    pack.pack(b, tmp_path / "b.tar")
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    with tarfile.open(tmp_path / "a.tar") as t:
        names = t.getnames()
    assert "kooi/cli/__init__.py" in names and "kooi/schemas/workflow.schema.json" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_a_changed_module_gets_another_mtime(tmp_path):
    a = _copy(tmp_path, "a", 1_000_000)
    pack.pack(a, tmp_path / "a.tar")
    (a / "cli/__init__.py").write_text((a / "cli/__init__.py").read_text().replace("kooi", "kOoi", 1))  # same size
    pack.pack(a, tmp_path / "b.tar")
    with tarfile.open(tmp_path / "a.tar") as ta, tarfile.open(tmp_path / "b.tar") as tb:
        ma, mb = ta.getmember("kooi/cli/__init__.py"), tb.getmember("kooi/cli/__init__.py")
        assert ma.size == mb.size and ma.mtime != mb.mtime
        assert ta.getmember("kooi/run/execute.py").mtime == tb.getmember("kooi/run/execute.py").mtime
