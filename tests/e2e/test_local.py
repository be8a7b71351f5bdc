"""site.yml provisions this machine (no systemd), `kooi engine start` brings up the
runner's rootless daemon, every check passes, and a second run changes nothing."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

import pytest

from .conftest import KOOI, playbook, recap


def test_second_run_changes_nothing(provisioned):
    first, second = provisioned
    assert recap(first.stdout)["failed"] == 0
    r = recap(second.stdout)
    changed = [task for task, block in re.findall(r"TASK \[([^\]]+)\][^\n]*\n(.*?)(?=\nTASK \[|\nPLAY RECAP)",
                                                  second.stdout, re.S) if "changed:" in block]
    assert r["changed"] == 0 and r["failed"] == 0, f"changed on the second run: {changed}"


def test_engine_status_reports_the_rootless_daemon(engine):
    res = subprocess.run([KOOI, "engine", "status", "--json"], capture_output=True, text=True)
    st = json.loads(res.stdout)
    assert res.returncode == 0 and st["running"] and st["mode"] == "rootless"
    assert st["storage_driver"] == engine["storage_driver"]


def _fingerprint() -> dict[str, str]:
    out = {}
    for p in ("/etc/subuid", "/etc/subgid", "/etc/passwd", "/etc/group", "/etc/kooi/engine.json"):
        out[p] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


@pytest.fixture
def admin_user():
    subprocess.run(["groupadd", "-f", "sudo"], check=True)
    subprocess.run(["useradd", "-m", "-G", "sudo", "kooi-e2e-admin"], check=False)
    yield "kooi-e2e-admin"
    subprocess.run(["userdel", "-r", "kooi-e2e-admin"], check=False, capture_output=True)


@pytest.fixture
def unmanaged_range():
    saved = {p: Path(p).read_text() for p in ("/etc/subuid", "/etc/subgid")}
    for p in saved:
        Path(p).write_text(saved[p] + "kooi-e2e-other:700000:65536\n")
    yield 710000
    for p, text in saved.items():
        Path(p).write_text(text)


@pytest.mark.parametrize("extra,names", [
    ({"kooi_engine_mode": "bogus"}, "kooi_engine_mode"),
    ({"kooi_runner_subid_count": 1000}, "kooi_runner_subid_count"),
    ({"kooi_storage_driver": "fuse-overlayfs"}, "kooi_fuse_enabled"),
    ({"kooi_runner_user": "root"}, "kooi_runner_user"),
    ({"kooi_gvisor_enabled": True}, "kooi_gvisor_enabled=true needs kooi_engine_mode=userns_remap"),
    ({"kooi_gvisor_platform": "kvm"}, "kooi_gvisor_platform"),
])
def test_bad_variables_stop_the_play_before_any_change(provisioned, extra, names):
    before = _fingerprint()
    res = playbook("-e", json.dumps(extra), check=False)
    assert res.returncode != 0
    assert names in res.stdout + res.stderr
    assert recap(res.stdout)["changed"] == 0
    assert _fingerprint() == before


def test_switch_to_userns_remap_next_to_a_foreign_rootful_daemon_is_refused(provisioned):
    """This machine kind has no systemd and a rootful dockerd that kooi did not start
    (the test hosts' engine): kooi could not restart it with userns-remap, so the switch
    is refused before anything changes (issue 16: it used to half-switch the host and
    end in a traceback). The engine.json, daemon.json and running engine stay as they were."""
    assert not Path("/run/systemd/system").exists(), "this test needs a host without systemd"
    probe = subprocess.run(["docker", "-H", "unix:///var/run/docker.sock", "version", "-f", "{{.Server.Version}}"],
                           capture_output=True, text=True, check=False)
    assert probe.returncode == 0, "needs a rootful dockerd on /var/run/docker.sock (scripts/test.sh starts one): " \
        + probe.stderr
    daemon_json = Path("/etc/docker/daemon.json")
    before = _fingerprint(), daemon_json.read_bytes() if daemon_json.exists() else None
    res = playbook("-e", json.dumps({"kooi_engine_mode": "userns_remap"}), check=False)
    assert res.returncode != 0
    assert "a rootful dockerd that kooi did not start" in res.stdout and "Nothing was changed" in res.stdout, \
        res.stdout[-3000:]
    assert "Traceback" not in res.stdout + res.stderr
    assert recap(res.stdout)["changed"] == 0
    assert (_fingerprint(), daemon_json.read_bytes() if daemon_json.exists() else None) == before
    st = subprocess.run([KOOI, "engine", "status"], capture_output=True, text=True, check=False)
    assert st.returncode == 0 and "engine (rootless" in st.stdout, st.stdout + st.stderr


def test_runner_that_already_has_sudo_is_refused(provisioned, admin_user):
    before = _fingerprint()
    res = playbook("-e", json.dumps({"kooi_runner_user": admin_user}), check=False)
    assert res.returncode != 0
    assert f"kooi_runner_user={admin_user} already exists with admin rights" in res.stdout
    assert recap(res.stdout)["changed"] == 0
    assert _fingerprint() == before


def test_overlapping_explicit_range_is_refused(provisioned, unmanaged_range):
    before = _fingerprint()
    res = playbook("-e", json.dumps({"kooi_runner_subid_start": unmanaged_range}), check=False)
    assert res.returncode != 0
    assert "overlaps the unmanaged entry kooi-e2e-other" in res.stdout
    assert recap(res.stdout)["changed"] == 0
    assert _fingerprint() == before


def _workflow_dir() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in Path("/etc/kooi/workflows").iterdir()}


@pytest.mark.parametrize("extra,names", [
    ({"kooi_workflows": {"bad": {"command": "make", "colour": "red"}}},
     ["kooi_workflows", "bad: unknown key 'colour'", "key 'command': 'make' is not of type 'array'"]),
    ({"kooi_workflows": {"Bad Name": {"command": ["x"]}}}, ["kooi_workflows"]),
    ({"kooi_schedules": [{"name": "n", "workflow": "python-example", "project": "/srv/p",
                          "on_calendar": "daily"}]}, ["kooi_schedules", "systemd does not run on this host"]),
    ({"kooi_schedules": [{"name": "n", "workflow": "python-example", "project": "/srv/p",
                          "cron": "0 3 * *"}]}, ["kooi_schedules"]),
    ({"kooi_schedules": [{"name": "n", "workflow": "no-such-flow", "project": "/srv/p",
                          "cron": "0 3 * * *"}]}, ["kooi_schedules", "no-such-flow"]),
    # The argument spec's (preflight no longer repeats it): exactly one of the two.
    ({"kooi_schedules": [{"name": "n", "workflow": "python-example", "project": "/srv/p",
                          "cron": "0 3 * * *", "on_calendar": "daily"}]}, ["exclusive:", "cron|on_calendar"]),
    # Retired variables that named fixed places (kooi_paths) or were renamed.
    ({"shim_bin_link": "/usr/bin/kooi", "authz_socket": "/run/x.sock"},
     ["authz_socket,", "shim_bin_link:", "kooi_bin.", "kooi_paths"]),
])
def test_bad_workflows_and_schedules_stop_the_play_before_any_change(provisioned, extra, names):
    before, wfs = _fingerprint(), _workflow_dir()
    res = playbook("-e", json.dumps(extra), check=False)
    assert res.returncode != 0
    for name in names:
        assert name in res.stdout + res.stderr, (name, res.stdout[-3000:])
    assert recap(res.stdout)["changed"] == 0
    assert _fingerprint() == before and _workflow_dir() == wfs


def _crontab(user: str) -> str:
    return subprocess.run(["crontab", "-l", "-u", user], capture_output=True, text=True).stdout


def test_cron_schedules_are_added_and_removed(provisioned, engine):
    sched = {"kooi_schedules": [{"name": "nightly-python", "workflow": "python-example",
                                 "project": "/home/kooi-runner/kooi-examples/python-example", "cron": "15 3 * * *"}]}
    # Schedules are the shim role's tag `schedules` (as an operator would change them):
    # the role's other tasks (the packed shim, the workflows) took 100 s a run on a
    # loaded CI machine and prove nothing about schedules.
    playbook("-t", "schedules", "-e", json.dumps(sched))
    tab = _crontab(engine["runner_user"])
    assert "#Ansible: kooi nightly-python" in tab
    assert ("15 3 * * * /usr/local/bin/kooi run python-example --project "
            "/home/kooi-runner/kooi-examples/python-example --quiet --json /var/lib/kooi/runs/last-nightly-python.json") in tab
    # Idempotent: Molecule's rootless scenario converges a cron schedule twice.
    playbook("-t", "schedules")
    assert "kooi nightly-python" not in _crontab(engine["runner_user"])
