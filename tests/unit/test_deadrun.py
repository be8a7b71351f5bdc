"""run.deadrun against what the fifth hostile review did to a dead run's record: the
project reached through a bind mount of a directory inside another run's project, a
check killed half-way (the run's own, or a finisher's), a record whose project is no
longer where it was. Real directories, real mounts (in a mount namespace of the test's
own), real processes killed part-way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kooi.run import deadrun
from kooi.run import guard as guardmod
from kooi.run.errors import Log, Result
from kooi.run.guard import Guard
from kooi.run.shadows import Throwaway

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a",
           "GIT_COMMITTER_EMAIL": "a@b", "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"}


def git(cwd: Path, *args: str, git_dir: Path | None = None) -> str:
    env = {**GIT_ENV, **({"GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(cwd)} if git_dir else {})}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def run_dir(base: Path) -> Path:
    for sub in ("results", "locks", "guards", "shadows", "logs"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    return base


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    p = tmp_path / "p"
    p.mkdir()
    git(p, "init", "-q")
    (p / "src.txt").write_text("code\n")
    (p / "lib").mkdir()
    git(p / "lib", "init", "-q")
    (p / "lib/l.txt").write_text("l\n")
    git(p / "lib", "add", "-A")
    git(p / "lib", "commit", "-qm", "lib")
    git(p, "add", "src.txt")
    git(p, "commit", "-qm", "one")
    return p


def workload(repo: Path, mounts: list[tuple[str, Path]]) -> None:
    """What a workload does through its view of the project (the throwaways mounted, the
    data directories bound in: symlinked here): a commit (kept), a pager in the git
    config and an .envrc (refused)."""
    m = dict(mounts)
    for rel, src in mounts:
        if rel.startswith(".git/") and src.is_relative_to(repo):
            target = m[".git"] / rel.split("/", 1)[1]
            target.rmdir()
            target.symlink_to(src)
    view = m[".git"]
    (repo / "src.txt").write_text("fixed\n")
    git(repo, "add", "src.txt", git_dir=view)
    git(repo, "commit", "-qm", "work", git_dir=view)
    git(repo, "config", "core.pager", "touch /tmp/pwned", git_dir=view)
    (repo / ".envrc").write_text("touch /tmp/pwned\n")


def die(where: str) -> None:
    """In a forked child: the check dies (SIGKILL, as far as the record knows) at WHERE."""
    if where == "in-the-throwaways":
        calls = [0]
        real = Guard._check_bound

        def bound(self: Guard, t: Throwaway) -> None:
            calls[0] += 1
            if calls[0] == 2:  # the second git directory's data copied back, not yet checked
                os._exit(9)
            real(self, t)
        Guard._check_bound = bound  # type: ignore[method-assign]
    elif where == "removing-the-throwaways":
        real_remove = guardmod.remove_path

        def remove(p: Path) -> None:
            if p.name == "r1":  # the shadows: the first throwaway gone, then killed
                real_remove(p / "g0")
                os._exit(9)
            real_remove(p)
        guardmod.remove_path = remove  # type: ignore[assignment]


@pytest.mark.parametrize("where", ["in-the-throwaways", "removing-the-throwaways", "after-the-check"])
def test_a_check_killed_half_way_is_finished_by_the_next_holder(repo, tmp_path, where):
    """The review: kooi run killed during its own check (after the throwaways' put-back,
    before the result) left a record the next holder re-checked from the start: the
    throwaways gone, 19 bogus changes to .git, `restored: false`, the project refused
    until the record was removed by hand; killed after the record was dropped: no result."""
    rd = run_dir(tmp_path / "runs")
    config = (repo / ".git/config").read_bytes()
    status = git(repo, "status", "--porcelain")
    g = Guard(repo)
    g.snapshot()
    g.snapshot_watched()
    mounts = g.shadows(rd / "shadows" / "r1")
    res = Result(workflow="w", run_id="r1", project=str(repo), mode="jail", start="t")
    path = deadrun.keep(rd, g, res)
    workload(repo, mounts)
    pid = os.fork()
    if pid == 0:  # the run's own check, killed at WHERE
        try:
            die(where)
            g.check()
            os._exit(9)
        finally:
            os._exit(3)
    _, how = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(how) == 9
    assert path.exists(), "the record went before the run's result was written"
    said = deadrun.finish(path, json.loads(path.read_text()), None, Log(None, None), "the test")
    assert said and "r1" in said
    assert not path.exists()
    result = json.loads((rd / "results/r1.json").read_text())
    rec = result["project_guard"]
    assert rec["restored"], rec
    refused = {(r["path"], r["how"]) for r in rec["refused"]}
    assert {(".git/config", "shadowed"), (".envrc", "put back")} <= refused, rec
    bogus = [r for r in rec["refused"] if r["path"] not in (".git/config", ".envrc")]
    assert bogus == [], rec
    assert (repo / ".git/config").read_bytes() == config and not (repo / ".envrc").exists()
    assert git(repo, "log", "--format=%s").split() == ["work", "one"]
    assert git(repo, "status", "--porcelain") == status
    assert not (rd / "shadows/r1").exists()


MOUNTED = r"""
import json, os, subprocess, sys
from pathlib import Path
from types import SimpleNamespace
from kooi.run import deadrun
from kooi.run.errors import Log, Result, RunError
from kooi.run.guard import Guard
from kooi.run.project import RunLock, check_project

a, b, c, rd = map(Path, sys.argv[1:])
out = {}

def both(p, q):
    first = RunLock(rd, "", p)
    first.acquire(0)
    try:
        second = RunLock(rd, "", q)
        second.acquire(0)
        second.release()
        return "both ran"
    except RunError as exc:
        return exc.reason
    finally:
        first.release()

out["b then a"], out["a then b"] = both(b, a), both(a, b)

def dead(p, run_id):
    g = Guard(p)
    g.snapshot()
    g.snapshot_watched()
    path = deadrun.keep(rd, g, Result(workflow="w", run_id=run_id, project=str(p), mode="jail", start="t"))
    (p / ".envrc").write_text("touch /tmp/pwned\n")
    return path

# a run on b (a bind of a/sub) died; the next run on a finishes it
rec = dead(b, "rb")
lock = RunLock(rd, "", a)
lock.acquire(0)
try:
    deadrun.finish_held(rd, a, None, Log(None, None), Result(workflow="w", run_id="ra", project=str(a), mode="jail"))
finally:
    lock.release()
out["finished by a"] = [not (a / "sub/.envrc").exists(), not rec.exists(), (rd / "results/rb.json").exists()]
# another died; b unmounted before kooi gc: it must not check the directory now there
rec = dead(b, "rb2")
subprocess.run(["umount", str(b)], check=True)
said = deadrun.finish_all(rd, None)
out["gc after umount"] = [rec.exists(), sorted(os.listdir(b)), (a / "sub/.envrc").exists(),
                          any("rb2" in s for s in said)]
# a project with a mount inside: a run would reach what is mounted there
subprocess.run(["mount", "--bind", str(c), str(a / "sub")], check=True)
try:
    check_project(a, SimpleNamespace(runner_uid=0, runner_home="/nonexistent", socket="/nonexistent/docker.sock"))
    out["mount inside"] = "accepted"
except RunError as exc:
    out["mount inside"] = exc.reason
print(json.dumps(out))
"""


def test_a_project_reached_through_a_bind_mount_of_a_directory_inside_another(tmp_path):
    """The review: B a bind mount of A/sub. A run on B and one on A ran at once (the lock
    took B's path parents, not A); a dead run on B was not finished by the run on A; and
    after B was unmounted, `kooi gc` "checked" the empty directory under it (making .git
    files there) and wrote a bogus result, leaving A/sub's leftovers for the next run."""
    assert os.geteuid() == 0, "this test mounts: run the unit tests as root (scripts/test.sh does)"
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d in (a / "sub", b, c):
        d.mkdir(parents=True)
    rd = run_dir(tmp_path / "runs")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        'mount --bind "$2/sub" "$3" && exec "$1" -c "$6" "$2" "$3" "$4" "$5"', "sh", sys.executable,
                        str(a), str(b), str(c), str(rd), MOUNTED], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["b then a"] == "busy" and out["a then b"] == "busy", out
    assert out["finished by a"] == [True, True, True], out
    kept, left, envrc, said = out["gc after umount"]
    assert kept and left == [] and envrc and said, out
    assert out["mount inside"] == "refused", out


def test_two_finishers_of_one_record_take_turns(repo, tmp_path):
    """Runs on sibling projects both hold the directory around them, and both find a
    dead run's record there: one finishes it, the other waits and finds it gone, even
    while the first one's check replaces the record with its progress."""
    rd = run_dir(tmp_path / "runs")
    g = Guard(repo)
    g.snapshot()
    g.snapshot_watched()
    mounts = g.shadows(rd / "shadows" / "r1")
    path = deadrun.keep(rd, g, Result(workflow="w", run_id="r1", project=str(repo), mode="jail", start="t"))
    workload(repo, mounts)
    doc = json.loads(path.read_text())
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the first finisher, slow once its check has saved its progress
        try:
            real = Guard._progress

            def slow(self: Guard, phase: str, record: dict | None = None) -> None:
                real(self, phase, record)
                if phase == "checking" and self.progress and self.progress["gits"]:
                    os.write(w, b"x")
                    import time
                    time.sleep(1)
            Guard._progress = slow  # type: ignore[method-assign]
            said = deadrun.finish(path, doc, None, Log(None, None), "the first")
            os._exit(0 if said else 4)
        finally:
            os._exit(3)
    os.close(w)
    assert os.read(r, 1) == b"x"
    second = deadrun.finish(path, doc, None, Log(None, None), "the second")
    _, how = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(how) == 0
    assert second is None, second
    result = json.loads((rd / "results/r1.json").read_text())
    assert "the first" in result["message"] and result["project_guard"]["restored"], result
    assert {r["path"] for r in result["project_guard"]["refused"]} == {".git/config", ".envrc"}, result


MOUNTED_LATER = r"""
import json, os, subprocess, sys
from pathlib import Path
from kooi.run import deadrun
from kooi.run.errors import Log, Result, RunError
from kooi.run.guard import Guard, GuardError

a, c, rd = map(Path, sys.argv[1:])
out = {}
def dead():
    g = Guard(a)
    g.snapshot()
    g.snapshot_watched()
    return g, deadrun.keep(rd, g, Result(workflow="w", run_id="ra", project=str(a), mode="jail", start="t"))

# a run's own check, with a mount made inside the project while it ran
g, rec = dead()
subprocess.run(["mount", "--bind", str(c), str(a / "sub")], check=True)
try:
    g.check()
    out["own check"] = "checked"
except GuardError as exc:
    out["own check"] = "refused"
out["c intact"] = [(c / ".git/config").read_text().count("[remote"), (c / ".envrc").exists()]
# ... and its record, finished by gc while the mount is there
said = deadrun.finish_all(rd, None)
out["gc"] = [rec.exists(), any("mount" in s for s in said)]
out["c intact after gc"] = [(c / ".git/config").read_text().count("[remote"), (c / ".envrc").exists()]
print(json.dumps(out))
"""


def test_a_mount_inside_the_project_after_its_start_is_never_worked_on(tmp_path):
    """The sixth hostile review: the mount check ran once, before the lock; a mount made
    inside the project while the run ran (or before its dead run was finished) had the
    guard's walks cross into it and "put back" another repository: its remote, hooks
    and .envrc were deleted. Nothing is checked then, and the record stays."""
    assert os.geteuid() == 0, "this test mounts: run the unit tests as root (scripts/test.sh does)"
    a, c = tmp_path / "a", tmp_path / "c"
    (a / "sub").mkdir(parents=True)
    git(a, "init", "-q")
    c.mkdir()
    git(c, "init", "-q")
    git(c, "remote", "add", "origin", "https://example.invalid/c.git")
    (c / ".envrc").write_text("use nix\n")
    rd = run_dir(tmp_path / "runs")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", MOUNTED_LATER,
                        str(a), str(c), str(rd)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["c intact"] == [1, True] and out["c intact after gc"] == [1, True], out
    assert out["own check"] == "refused" and out["gc"] == [True, True], out


def test_a_dead_runs_project_moved_into_another_is_finished_before_its_snapshot(repo, tmp_path):
    """The sixth hostile review: the dead run's project A moved into B (mv A B/A); the
    run on B took A's leftovers into its snapshot, as its own, and the record stayed
    unfinished."""
    rd = run_dir(tmp_path / "runs")
    g = Guard(repo)
    g.snapshot()
    g.snapshot_watched()
    path = deadrun.keep(rd, g, Result(workflow="w", run_id="r1", project=str(repo), mode="jail", start="t"))
    (repo / ".envrc").write_text("touch /tmp/pwned\n")
    b = tmp_path / "b"
    b.mkdir()
    repo.rename(b / "a")
    from kooi.run.project import RunLock

    lock = RunLock(rd, "", b)
    lock.acquire(0)
    try:
        res = Result(workflow="w", run_id="rb", project=str(b), mode="jail")
        deadrun.finish_held(rd, b, None, Log(None, None), res)
    finally:
        lock.release()
    assert not (b / "a/.envrc").exists() and not path.exists()
    result = json.loads((rd / "results/r1.json").read_text())
    assert ".envrc" in {r["path"] for r in result["project_guard"]["refused"]}, result
    assert any("r1" in w for w in res.warnings), res.warnings


def test_a_record_whose_project_is_gone_waits_then_goes_with_a_result(repo, tmp_path):
    """gc keeps a record whose project is not where it was (a run on it where it is now
    finishes it), and drops it, with a result that says so, once it waited longer than
    logs and results are kept."""
    rd = run_dir(tmp_path / "runs")
    g = Guard(repo)
    g.snapshot()
    g.snapshot_watched()
    path = deadrun.keep(rd, g, Result(workflow="w", run_id="r1", project=str(repo), mode="jail", start="t"))
    import shutil

    shutil.rmtree(repo)
    said = deadrun.finish_all(rd, None, keep_days=14)
    assert path.exists() and any("not there now" in s for s in said), said
    old = time.time() - 15 * 86400
    os.utime(path, (old, old))
    said = deadrun.finish_all(rd, None, keep_days=14)
    assert not path.exists() and any("dropped without a check" in s for s in said), said
    result = json.loads((rd / "results/r1.json").read_text())
    assert result["reason"] == "interrupted" and "not found" in result["message"], result


def test_a_live_runs_record_is_left_alone_when_its_project_moved_or_went(repo, tmp_path):
    """The run holds its project's lock by the names it took at its start; gc asked by
    the project's path, which named another lock once the directory moved or went, and
    took the live run for a dead one (CI, stop 37: it then removed the live session's
    container). The record's own lock names are what say whether its run lives."""
    import shutil

    from kooi.run.project import RunLock

    rd = run_dir(tmp_path / "runs")
    g = Guard(repo)
    g.snapshot()
    g.snapshot_watched()
    lock = RunLock(rd, "w", repo)
    lock.acquire(0)
    try:
        path = deadrun.keep(rd, g, Result(workflow="w", run_id="r1", project=str(repo), mode="jail", start="t"))
        for gone in ("moved", "deleted"):
            if gone == "moved":
                repo.rename(tmp_path / "elsewhere")
            else:
                shutil.rmtree(tmp_path / "elsewhere")
            said = deadrun.finish_all(rd, None, keep_days=0)
            assert said == [] and path.exists(), (gone, said)
    finally:
        lock.release()


def test_a_link_in_the_locks_directory_is_never_followed(tmp_path):
    """The eighth hostile review: the runner linked `locks/x.lock` to a root-only file,
    and root's `kooi gc` opened it read-write and took a lock on it (and, were it
    locked by someone else, took that for a live run)."""
    import fcntl

    from kooi.run.project import lock_held

    target = tmp_path / "root-only"
    target.write_text("canary\n")
    target.chmod(0o600)
    holder = os.open(target, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)  # someone else's lock on the file the link names
    try:
        (tmp_path / "x.lock").symlink_to(target)
        assert lock_held(tmp_path / "x.lock") is False
        os.mkfifo(tmp_path / "f.lock")
        assert lock_held(tmp_path / "f.lock") is False  # neither blocks nor counts
    finally:
        os.close(holder)
