"""pytest-testinfra entry point: every catalogue check must pass (or be n/a).

    pytest --pyargs kooi.checks --hosts=docker://NAME   (Molecule verify)
    pytest --pyargs kooi.checks --hosts=local://        (this host)
"""

from __future__ import annotations

import os

import pytest

from kooi.checks import CHECKS, Context
from kooi.checks.core import FAIL, Check, Host


@pytest.fixture(scope="module")
def ctx(host: Host) -> Context:
    return Context.from_host(host, probe_image=os.environ.get("KOOI_PROBE_IMAGE", "kooi-probe:latest"))


@pytest.mark.parametrize("chk", CHECKS, ids=[c.id for c in CHECKS])
def test_check(host: Host, ctx: Context, chk: Check) -> None:
    result = chk.run(host, ctx)
    print(f"{result.id}: {result.status}: {result.evidence}")
    assert result.status != FAIL, f"{result.id} ({result.title}): {result.evidence}"
