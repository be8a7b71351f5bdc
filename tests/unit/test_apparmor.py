"""kooi.apparmor: which profile a run gets, from the role's record and the kernel's
list, and the policy's and broker's handling of kooi's own profile name."""

from __future__ import annotations

import json

import pytest

from kooi import apparmor, broker, brokerrules
from kooi.engineapi import Engine
from kooi.hoststate import HostStateError
from kooi.hoststate import apparmor as apparmor_state
from kooi.policy import Policy, decide

RAW = {"enabled": True, "kernel": True, "abi": "3.0", "profile_dir": "/etc/apparmor.d",
       "runner_profile": "kooi-runner", "jail_profile": "kooi-jail", "rootlesskit_profile": None,
       "nested_runtimes": ["/usr/bin/podman"]}
STATE = apparmor_state.parse(json.dumps(RAW))


@pytest.fixture
def profiles(tmp_path):
    def write(lines: list[str]):
        p = tmp_path / "profiles"
        p.write_text("".join(line + "\n" for line in lines))
        return p
    return write


def test_the_kernels_list_is_read_with_modes(profiles):
    p = profiles(["kooi-runner (enforce)", "kooi-runner//nested (enforce)", "docker-default (complain)",
                  "/usr/bin/man (enforce)"])
    assert apparmor.loaded_profiles(p) == {"kooi-runner": "enforce", "kooi-runner//nested": "enforce",
                                           "docker-default": "complain", "/usr/bin/man": "enforce"}


def test_a_userns_remap_container_gets_the_runner_profile_in_enforce_mode(profiles):
    conf = apparmor.for_container("userns_remap", STATE, profiles(["kooi-runner (enforce)"]))
    assert conf.profile == "kooi-runner"
    assert conf.as_dict() == {"profile": "kooi-runner", "applied": True, "note": "AppArmor: kooi-runner (enforce)"}


@pytest.mark.parametrize("lines, says", [
    (["kooi-runner (complain)"], "in complain mode"),
    ([], "not loaded"),
    (["kooi-jail (enforce)"], "not loaded"),
])
def test_a_profile_not_in_enforce_mode_fails_the_run_instead_of_running_unconfined(profiles, lines, says):
    with pytest.raises(apparmor.AppArmorError, match=says):
        apparmor.for_container("userns_remap", STATE, profiles(lines))


def test_rootless_engines_say_they_cannot_apply_a_profile(profiles):
    conf = apparmor.for_container("rootless", STATE, profiles([]))
    assert conf.profile is None and "rootless Docker cannot" in conf.note


@pytest.mark.parametrize("state, says", [
    (None, "not provisioned"),
    (apparmor_state.parse(json.dumps({**RAW, "enabled": False})), "off"),
    (apparmor_state.parse(json.dumps({**RAW, "kernel": False})), "kernel has no AppArmor"),
])
def test_hosts_without_enforcement_run_unconfined_and_say_why(profiles, state, says):
    for conf in (apparmor.for_container("userns_remap", state, profiles([])),
                 apparmor.for_jail(state, profiles([]))[0]):
        assert conf.profile is None and says in conf.note
    assert apparmor.for_jail(state, profiles([]))[1] == []


def test_a_jail_starts_under_aa_exec(profiles, monkeypatch):
    monkeypatch.setattr(apparmor.shutil, "which", lambda name: f"/usr/bin/{name}")
    conf, prefix = apparmor.for_jail(STATE, profiles(["kooi-jail (enforce)"]))
    assert conf.profile == "kooi-jail" and prefix == ["/usr/bin/aa-exec", "-p", "kooi-jail", "--"]


def test_an_unreadable_record_is_an_error_not_an_unconfined_run(tmp_path):
    p = tmp_path / "apparmor.json"
    p.write_text("{not json")
    with pytest.raises(HostStateError, match="re-run site.yml"):
        apparmor_state.load(p)
    assert apparmor_state.load(tmp_path / "missing.json") is None


def _create(opts: list[str]) -> bytes:
    return json.dumps({"Image": "x", "HostConfig": {"SecurityOpt": opts}}).encode()


@pytest.mark.parametrize("profiles_allowed, opt, allowed", [
    ((), "apparmor=kooi-runner", False),
    (("kooi-runner",), "apparmor=kooi-runner", True),
    (("kooi-runner",), "apparmor:kooi-runner", True),
    (("kooi-runner",), "apparmor=unconfined", False),
    (("kooi-runner",), "apparmor=kooi-runner//nested", False),
    (("kooi-runner",), "apparmor=docker-default", False),
])
def test_the_policy_lets_a_create_name_only_koois_own_profile(profiles_allowed, opt, allowed):
    d = decide("POST", "/v1.41/containers/create", _create([opt]), Policy(apparmor_profiles=profiles_allowed))
    assert d.allow is allowed, d.reason


def _rules(profile: str | None) -> brokerrules.Rules:
    scope = broker.RunScope("r1", {"kooi.run": "r1"}, apparmor=profile)
    return brokerrules.Rules(scope, Engine("/nonexistent"))


def test_the_broker_gives_the_runs_profile_to_every_container_it_creates():
    doc = {"Image": "postgres", "HostConfig": {"SecurityOpt": ["no-new-privileges", "apparmor=kooi-runner"]}}
    assert _rules("kooi-runner").container_create(doc) is None
    assert doc["HostConfig"]["SecurityOpt"] == ["no-new-privileges", "apparmor=kooi-runner"]
    doc = {"Image": "postgres"}
    assert _rules("kooi-runner").container_create(doc) is None
    assert doc["HostConfig"]["SecurityOpt"] == ["apparmor=kooi-runner"]
    doc = {"Image": "postgres"}
    assert _rules(None).container_create(doc) is None
    assert "SecurityOpt" not in doc["HostConfig"]


def test_an_unreadable_list_applies_the_profile_and_says_the_mode_is_unverified(profiles, monkeypatch):
    p = profiles(["kooi-runner (complain)"])
    monkeypatch.setattr(apparmor, "loaded_profiles", lambda path: (_ for _ in ()).throw(PermissionError(13, "x")))
    conf = apparmor.for_container("userns_remap", STATE, p)
    assert conf.profile == "kooi-runner" and "not verified" in conf.note


def test_the_list_read_as_root_is_used_after_dropping_privileges(profiles, monkeypatch):
    monkeypatch.setattr(apparmor, "PROFILES_PATH", profiles(["kooi-runner (complain)"]))
    apparmor.remember_loaded(apparmor.PROFILES_PATH)
    try:
        with pytest.raises(apparmor.AppArmorError, match="complain"):
            apparmor._enforced("kooi-runner", apparmor.PROFILES_PATH)
    finally:
        apparmor._snapshot = None
