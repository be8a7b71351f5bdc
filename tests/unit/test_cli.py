"""The kooi command line: argument forms and exit codes that scripts rely on."""

from __future__ import annotations

from pathlib import Path

import pytest

from kooi import cli

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = str(REPO / "examples/workflows/python-example.yml")


@pytest.mark.parametrize("argv", [
    ["workflow", "check", EXAMPLE],
    ["workflow", "check", "--name", "python-example", EXAMPLE],
    ["workflow", "check", EXAMPLE, "--name", "python-example"],
    ["workflow", "check", EXAMPLE, "--inline", "{}"],
    ["workflow", "check", "--inline", '{"ok": {"command": ["true"]}}'],
])
def test_workflow_check_accepts_its_argument_forms(argv):
    assert cli.main(argv) == 0


def test_workflow_check_names_source_and_key(capsys):
    rc = cli.main(["workflow", "check", "--inline", '{"bad": {"command": "x", "colour": 1}}'])
    err = capsys.readouterr().err
    assert rc == 2
    assert "kooi_workflows: bad: unknown key 'colour'" in err
    assert "kooi_workflows: bad: key 'command': 'x' is not of type 'array'" in err


def test_workflow_check_refuses_names_that_differ_or_are_invalid(tmp_path, capsys):
    f = tmp_path / "flow.yml"
    f.write_text("name: flow\ncommand: [x]\n")
    assert cli.main(["workflow", "check", str(f)]) == 0
    assert cli.main(["workflow", "check", "--name", "other", str(f)]) == 2
    assert "differs from the file name 'other'" in capsys.readouterr().err
    rc = cli.main(["workflow", "check", "--inline", '{"Bad": {"command": ["x"]}}'])
    assert rc == 2 and "not a workflow name" in capsys.readouterr().err


def test_inline_must_be_a_json_mapping(capsys):
    assert cli.main(["workflow", "check", "--inline", "[1]"]) == 2
    assert cli.main(["workflow", "check", "--inline", "{nope"]) == 2


def test_usage_errors_exit_2():
    with pytest.raises(SystemExit) as exc:
        cli.main(["run"])
    assert exc.value.code == 2


def test_verify_output_in_a_missing_directory_is_refused_before_any_check(tmp_path, capsys):
    out = tmp_path / "nope" / "report.xml"
    assert cli.main(["verify", "--format", "junit", "--output", str(out), "--check", "HOST-RUNNER-USER"]) == 2
    err = capsys.readouterr().err
    assert f"--output {out}: cannot write there (No such file or directory)" in err and not out.exists()


@pytest.mark.parametrize("argv,option", [
    (["verify", "--output", "/nonexistent/dir/report.txt"], "--output /nonexistent/dir/report.txt"),
    (["image", "lock", "--lock", str(REPO / "images/runner/lock.yml"), "--pin-base", "x",
      "--out", "/nonexistent/dir/lock.yml"], "--out /nonexistent/dir/lock.yml"),
])
def test_unwritable_output_paths_are_refused_before_any_work(argv, option, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"{option}: cannot write there (No such file or directory)" in err


def test_an_output_keeps_its_old_content_until_written(tmp_path):
    from kooi.outputs import Output

    f = tmp_path / "r.json"
    f.write_text("old result, longer than the new one\n")
    out = Output(f, "--json")
    assert f.read_text().startswith("old result")
    out.write("new\n")
    assert f.read_text() == "new\n"
