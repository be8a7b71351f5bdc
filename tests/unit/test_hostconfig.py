"""The host description the roles write and the shim reads."""

from __future__ import annotations

import json

import pytest

from kooi import cli
from kooi.hoststate import HostStateError
from kooi.hoststate import engine as hostconfig

GOOD = {
    "mode": "rootless", "runner_user": "kooi-runner", "runner_uid": "1001", "runner_gid": 1001,
    "runner_home": "/home/kooi-runner", "socket": "/run/user/1001/docker.sock",
    "daemon_config": "/etc/kooi/engine/kooi-runner/daemon.json",
}


def write(tmp_path, data):
    p = tmp_path / "engine.json"
    p.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return p


def test_loads_and_coerces_ids(tmp_path):
    cfg = hostconfig.load(write(tmp_path, GOOD))
    assert cfg.runner_uid == 1001 and cfg.runtime_dir == "/run/user/1001"


@pytest.mark.parametrize("data,msg", [
    ({**GOOD, "mode": "rootful"}, "is not one of"),
    ({**GOOD, "surprise": 1}, "unknown keys surprise"),
    ({k: v for k, v in GOOD.items() if k != "socket"}, "missing keys socket"),
    ({**GOOD, "runner_uid": "x"}, "must be an integer"),
    ("{not json", "cannot read"),
    ("[]", "must be a JSON object"),
])
def test_bad_descriptions_say_what_is_wrong(tmp_path, data, msg):
    with pytest.raises(HostStateError, match=msg):
        hostconfig.load(write(tmp_path, data))


def test_missing_description_tells_the_operator_to_provision(tmp_path, capsys):
    rc = cli.main(["engine", "status", "--config", str(tmp_path / "nope.json")])
    assert rc == cli.EXIT_USAGE
    assert "run ansible-playbook site.yml" in capsys.readouterr().err


def test_status_of_a_stopped_engine_is_not_running(tmp_path, capsys):
    cfg = {**GOOD, "socket": str(tmp_path / "docker.sock")}
    rc = cli.main(["engine", "status", "--json", "--config", str(write(tmp_path, cfg))])
    out = json.loads(capsys.readouterr().out)
    assert rc == cli.EXIT_NOT_RUNNING and out["running"] is False


def test_a_daemon_that_runs_differently_from_its_configuration_is_drift():
    from kooi.drift import drift
    from kooi.hoststate.engine import EngineConfig

    remap = EngineConfig(mode="userns_remap", runner_user="r", runner_uid=1001, runner_gid=1001,
                         runner_home="/home/r", socket="/run/docker.sock", daemon_config="/etc/docker/daemon.json")
    conf = {"userns-remap": "kooi-remap", "seccomp-profile": "/etc/kooi/seccomp/docker-20.10-kooi.json",
            "storage-driver": "overlay2", "authorization-plugins": ["kooi-authz"]}
    good = {"SecurityOptions": ["name=seccomp,profile=/etc/kooi/seccomp/docker-20.10-kooi.json", "name=userns"],
            "Driver": "overlay2", "Plugins": {"Authorization": ["kooi-authz"]}}
    assert drift(remap, good, conf) == []
    # The case: switched to userns_remap, the old rootful daemon never restarted.
    stale = {"SecurityOptions": ["name=seccomp,profile=default"], "Driver": "vfs", "Plugins": {"Authorization": None}}
    found = drift(remap, stale, conf)
    assert len(found) == 4, found
    assert found[0].startswith("configured userns_remap, but the daemon runs without userns-remap")
    assert any("storage driver: configured overlay2, running vfs" in f for f in found)
    assert any("authorization plugins: configured ['kooi-authz'], running none" in f for f in found)
    rootless = EngineConfig(mode="rootless", runner_user="r", runner_uid=1001, runner_gid=1001, runner_home="/home/r",
                            socket="/run/user/1001/docker.sock", daemon_config="/etc/kooi/engine/r/daemon.json")
    assert drift(rootless, {"SecurityOptions": ["name=seccomp,profile=builtin", "name=rootless"]}, {}) == []
    assert drift(rootless, {"SecurityOptions": ["name=seccomp,profile=builtin"]}, {}) == [
        "configured rootless, but the daemon on the socket is not rootless"]
