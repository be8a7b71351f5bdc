"""Fault tests on the test hosts (both engine modes, systemd hosts): a fork bomb and a
memory hog in a runner container end at their limits. Where the engine has cgroup
controllers (userns_remap here) the result names the limit the workload reached;
on the rootless hosts (cgroup v1, no delegation) rlimits bound it and the workload
sees the refusals itself. tests/e2e/test_limits.py does the same on the CI machine
with a probe of the host's responsiveness, and for jails."""

from __future__ import annotations

import shlex

import pytest

from kooi.checks import Context
from kooi.checks.runs import SCRIPT, _run, _script
from kooi.hoststate import paths

WORKFLOW = "kooi-faultcheck"
FLOW = f"""# Written by molecule/shared/test_faults.py for one test; removed after it.
mode: container
image: runner
timeout: 10
limits: {{pids: 200, memory: 256m}}
command: [sh, /workspace/{SCRIPT}]
"""


@pytest.fixture(scope="module")
def ctx(host):
    c = Context.from_host(host)
    path = f"{paths.WORKFLOWS}/{WORKFLOW}.yml"
    host.run(f"cat > {path} <<'KOOI_EOF'\n{FLOW}KOOI_EOF\nchmod 0644 {path}")
    try:
        yield c
    finally:
        host.run(f"rm -f {shlex.quote(path)}")


def test_a_fork_bomb_ends_at_its_pids_limit(host, ctx):
    _script(host, ctx, "bomb() { bomb | bomb & }; bomb; sleep 60")
    rc, res, out = _run(host, ctx, "faultcheck-bomb", workflow=WORKFLOW)
    assert res is not None, out[-2000:]
    # It runs until its timeout, or its own shell gives up when a fork fails.
    assert rc != 0 and res["reason"] in ("timeout", "failed"), out[-2000:]
    pids = res["limits"]["pids"]
    assert pids["requested"] == 200 and pids["enforced"], pids
    if pids["by"].startswith("cgroup"):
        assert res["limit"] == "pids", (res["limit"], res["warnings"])
    else:
        # RLIMIT_NPROC refusals: dash says "Cannot fork", bash "Resource temporarily unavailable".
        assert "Cannot fork" in out or "Resource temporarily unavailable" in out, out[-2000:]
    assert host.run(ctx.as_runner(f"docker ps -aq --filter label=org.kooi.run={res['run_id']}")).stdout.strip() == ""


def test_a_memory_hog_ends_at_its_memory_limit(host, ctx):
    _script(host, ctx, "exec python3 -c '\nimport sys\nheld = []\ntry:\n    while True:\n"
                       "        held.append(bytearray(16 << 20))\nexcept MemoryError:\n"
                       "    print(\"HOG-REFUSED\", len(held) * 16, flush=True)\n    sys.exit(3)\n'")
    rc, res, out = _run(host, ctx, "faultcheck-hog", workflow=WORKFLOW)
    assert res is not None, out[-2000:]
    mem = res["limits"]["memory"]
    if mem["by"].startswith("cgroup"):
        assert rc == 137 and res["limit"] == "memory", (rc, res["limit"], out[-2000:])
        assert "reached its memory limit" in res["message"]
    else:
        line = next(x for x in out.splitlines() if x.startswith("HOG-REFUSED"))
        assert rc == 3 and int(line.split()[1]) <= 256, out[-2000:]
