"""The layout shows the architecture: no module of the shim over 600 lines, and the
command line a package of thin commands, one module per group, over their owners."""

from __future__ import annotations

from pathlib import Path

from kooi import cli, verify
from kooi.cli import verify as cli_verify

SHIM = Path(__file__).resolve().parents[2] / "shim" / "kooi"


def test_no_module_is_over_600_lines():
    long = {str(p.relative_to(SHIM)): n for p in SHIM.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 600}
    assert not long, f"split these by concern: {long}"


def test_every_command_group_registers_itself_and_stays_thin():
    for group in cli.GROUPS:
        assert callable(group.register), group.__name__
        lines = len(Path(group.__file__).read_text().splitlines())
        assert lines <= 200, f"{group.__name__}: {lines} lines; move the logic to its owner"


def test_verify_formats_behind_one_interface():
    assert set(cli_verify.FORMAT_HELP) == set(verify.FORMATS)
