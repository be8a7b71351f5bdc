"""kooi.hoststate: one parser per root-owned host description, shared by the shim, the
checks and the roles (the kooi_hoststate filter validates what a role would write)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kooi.hoststate import HostStateError, apparmor, egress, engine, fuse, images, subids

REPO = Path(__file__).resolve().parents[2]
ENGINE = {"mode": "userns_remap", "runner_user": "kooi-runner", "runner_uid": 1001, "runner_gid": 1001,
          "runner_home": "/home/kooi-runner", "socket": "/var/run/docker.sock",
          "daemon_config": "/etc/docker/daemon.json", "egress": False,
          "authz": {"plugin": "kooi-authz", "socket": "/run/docker/plugins/kooi-authz.sock",
                    "token_file": "/etc/kooi/authz/token", "unit": "kooi-authz.service"}}
PIN = {"id": "sha256:" + "a" * 64, "tag": "kooi-runner:aaaa", "inputs": "b" * 64, "base": "sha256:" + "c" * 64,
       "built_at": "2026-12-02T21:40:01+00:00"}


def _filter():
    path = REPO / "roles/kooi_defaults/filter_plugins/kooi_hoststate.py"
    spec = importlib.util.spec_from_file_location("kooi_hoststate_filter", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_engine_description_with_intent_and_authz():
    cfg = engine.parse(json.dumps(ENGINE))
    assert cfg.egress is False and cfg.authz is not None and cfg.authz.token_file == "/etc/kooi/authz/token"
    assert engine.parse(json.dumps({k: v for k, v in ENGINE.items() if k not in ("egress", "authz")})).egress is True


GVISOR = {"runtime": "runsc", "path": "/usr/local/lib/kooi/runsc", "runsc": "/usr/bin/runsc",
          "args": ["--platform=systrap", "--oci-seccomp", "--host-uds=open"], "version": "20240729",
          "platform": "systrap", "network": "sandbox", "netns_workaround": True}


def test_engine_description_with_gvisor():
    assert engine.parse(json.dumps(ENGINE)).gvisor is None
    cfg = engine.parse(json.dumps({**ENGINE, "gvisor": GVISOR}))
    assert cfg.gvisor is not None and cfg.gvisor.args == ("--platform=systrap", "--oci-seccomp", "--host-uds=open")
    assert engine.parse(json.dumps({**ENGINE, "gvisor": {}})).gvisor is None  # the role's "off"


@pytest.mark.parametrize("change, says", [
    ({"gvisor": {**GVISOR, "platform": "kvm"}}, "gvisor platform 'kvm'"),
    ({"gvisor": {**GVISOR, "args": "--oci-seccomp"}}, "gvisor: args must be a list of strings"),
    ({"gvisor": {"runtime": "runsc"}}, "gvisor: missing keys"),
    ({"gvisor": ["runsc"]}, "gvisor must be an object"),
    ({"egress": "yes"}, "egress must be true or false"),
    ({"launcher": "dockerd"}, "launcher must be a list of strings"),
    ({"authz": {"plugin": "x"}}, "authz: missing keys socket, token_file"),
    ({"mode": "rootful"}, "is not one of"),
])
def test_engine_description_errors_name_the_key(change, says):
    with pytest.raises(HostStateError, match=says):
        engine.parse(json.dumps({**ENGINE, **change}))


def test_pins_round_trip_and_refuse_a_non_digest():
    pins = images.parse(json.dumps({"runner": PIN}))
    assert pins["runner"].id == PIN["id"] and images.parse(images.dump(pins)) == pins
    with pytest.raises(HostStateError, match="runner.id 'kooi-runner:x' is not sha256"):
        images.parse(json.dumps({"runner": {**PIN, "id": "kooi-runner:x"}}))


def test_egress_apparmor_fuse_descriptions(tmp_path):
    assert egress.parse('{"port": 3128}').table == "kooi_egress"
    st = apparmor.parse('{"enabled": true, "kernel": false, "runner_profile": "kooi-runner", "jail_profile": "kooi-jail"}')
    assert st.profiles == ["kooi-runner", "kooi-jail"]
    assert fuse.parse('{"enabled": false, "udev_rule": "/etc/udev/rules.d/60-kooi-fuse.rules"}').enabled is False
    assert fuse.load(tmp_path / "none.json") is None


def test_subid_entries_and_ranges():
    text = "# comment\nother:100000:65536\nkooi-runner:165536:65536\n"
    assert subids.entries(text) == [("other", 100000, 65536), ("kooi-runner", 165536, 65536)]
    assert subids.ranges_of(text, "kooi-runner") == [(165536, 231071)]
    with pytest.raises(subids.SubidError, match="line 1"):
        subids.entries("kooi-runner:x:1\n")


def test_the_roles_filter_accepts_what_the_shim_accepts_and_refuses_the_rest():
    f = _filter()
    text = json.dumps(ENGINE)
    assert f.kooi_hoststate(text, "engine") == text
    with pytest.raises(f.AnsibleFilterError, match="engine description this role would write is invalid"):
        f.kooi_hoststate(json.dumps({**ENGINE, "surprise": 1}), "engine")
    with pytest.raises(f.AnsibleFilterError, match="unknown description"):
        f.kooi_hoststate("{}", "nonsense")
    assert f.kooi_subid_ranges("kooi-runner:165536:65536\n", "kooi-runner") == ["165536-231071"]


def test_the_limits_description_is_checked_key_by_key():
    from kooi.hoststate import limits

    good = {"default": {"memory": "4g", "cpus": 2, "pids": 2048, "files": 65536}, "max": {"memory": "16g"}}
    cfg = limits.parse(json.dumps(good))
    assert cfg.default["pids"] == 2048 and cfg.max == {"memory": "16g"}
    assert limits.parse(json.dumps({**good, "default": {**good["default"], "pids": "300"}})).default["pids"] == 300
    for bad, why in [({**good, "default": {**good["default"], "memory": "lots"}}, "default.memory: 'lots' is not a size"),
                     ({**good, "default": {**good["default"], "pids": 3}}, "default.pids: 3 is outside 16..4194304"),
                     ({**good, "default": {"memory": "4g"}}, "default has no cpus, pids, files"),
                     ({**good, "max": {"memory": "1g"}}, "default.memory '4g' is above max.memory '1g'"),
                     ({**good, "other": 1}, "unknown keys other")]:
        with pytest.raises(HostStateError) as exc:
            limits.parse(json.dumps(bad), "x.json")
        assert why in str(exc.value), str(exc.value)


def test_a_host_without_a_limits_description_gets_kooi_s_defaults(tmp_path):
    from kooi.hoststate import limits

    cfg = limits.load(tmp_path / "missing.json")
    assert cfg.default == limits.BUILTIN and cfg.max == {} and "re-run site.yml" in cfg.source


def test_the_roles_default_limits_are_the_shims():
    import yaml

    from kooi.hoststate import limits

    vars_ = yaml.safe_load((REPO / "roles/kooi_defaults/vars/main.yml").read_text())["kooi_limits_builtin"]
    defaults = yaml.safe_load((REPO / "roles/kooi_defaults/defaults/main.yml").read_text())
    assert vars_ == {"default": limits.BUILTIN, "max": limits.BUILTIN_MAX}
    assert defaults["kooi_workflow_default_limits"] == limits.BUILTIN
    assert defaults["kooi_workflow_max_limits"] == limits.BUILTIN_MAX


def test_the_ssh_description_is_built_from_the_persons_and_checked_by_the_shims_parser():
    f = _filter()
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMXF8bLWPldQGM0YigOiegXdf4dXyPMHMUjrC//Yo9Ns alice@laptop"
    doc = f.kooi_ssh_description([{"name": "alice", "keys": [key], "project": "/srv/a"}], "kooi-runner")
    assert doc["persons"]["alice"]["workflow"] == "shell-session"
    text = json.dumps(doc)
    assert f.kooi_hoststate(text, "ssh") == text
    with pytest.raises(Exception, match="listed twice"):
        f.kooi_ssh_description([{"name": "a", "keys": [key], "project": "/x"}] * 2, "r")
    bad = json.dumps({**doc, "persons": {"alice": {**doc["persons"]["alice"], "keys": [key + "\nrestrict " + key]}}})
    with pytest.raises(Exception, match="not an OpenSSH public key"):
        f.kooi_hoststate(bad, "ssh")
