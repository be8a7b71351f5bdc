"""The kooi command line: argument forms and exit codes that scripts rely on."""

from __future__ import annotations

import os
import subprocess
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


def test_an_output_appears_whole_and_only_when_written(tmp_path):
    from kooi.outputs import Output

    f = tmp_path / "r.json"
    f.write_text("old result\n")
    out = Output(f, "--json")
    assert f.read_text() == "old result\n"  # a reader never sees a half-written result
    out.write("new\n")
    assert f.read_text() == "new\n" and [p.name for p in tmp_path.iterdir()] == ["r.json"]
    with Output(tmp_path / "never.json", "--json"):
        pass  # abandoned: nothing appears, nothing is left behind
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


@pytest.fixture
def as_nobody():
    """Run a script that imports kooi.outputs (as `outputs`, copied where nobody can read
    it, with Debian's python3) as root, which may drop to nobody (65534) itself."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="kooi-unit-", dir="/var/tmp"))
    os.chmod(d, 0o755)
    shutil.copy(REPO / "shim/kooi/outputs.py", d / "outputs.py")

    def run(script: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["/usr/bin/python3", "-I", "-c", f"import sys; sys.path.insert(0, {str(d)!r})\n"
                               + script, *args], capture_output=True, text=True)

    yield d, run
    shutil.rmtree(d)


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
def test_an_output_in_a_root_only_directory_survives_the_privilege_drop(as_nobody):
    """kooi run drops to the runner; a helper keeps the caller's right to put the result
    where the caller asked for it."""
    d, run = as_nobody
    private = d / "root-only"
    private.mkdir(mode=0o700)
    res = run("import os\nfrom outputs import Output\n"
              "out = Output(sys.argv[1], '--json'); out.keep_rights()\n"
              "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
              "out.write('written as nobody\\n')\n", str(private / "r.json"))
    assert res.returncode == 0, res.stderr
    assert (private / "r.json").read_text() == "written as nobody\n"
    assert [p.name for p in private.iterdir()] == ["r.json"]


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_a_writable_file_in_a_directory_the_caller_cannot_write_is_written_in_place(as_nobody):
    d, run = as_nobody
    f = d / "r.json"
    f.write_text("old, and longer than the new result\n")
    os.chown(f, 65534, 65534)
    res = run("import os\nos.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
              "from outputs import Output\nOutput(sys.argv[1], '--json').write('new\\n')\n", str(f))
    assert res.returncode == 0, res.stderr
    assert f.read_text() == "new\n"


def test_workload_text_is_shown_not_obeyed():
    """The eighth hostile review: a network name with terminal escapes reached root's
    terminal through `kooi gc`, and a workload's line separator or zero-width space
    passed into the output where a reader takes a line for kooi's own."""
    from kooi.run.errors import neutral

    assert neutral("network rv\x1b]0;OWNED\x07\x1b[2J") == "network rv\\x1b]0;OWNED\\x07\\x1b[2J"
    assert neutral("x\u2028kooi: ok\u200b\u2029") == "x\\u2028kooi: ok\\u200b\\u2029"
    assert neutral("tab\tand newline\n, émoji 👍") == "tab\tand newline\n, émoji 👍"


def test_kooi_lines_start_a_line_after_the_workloads_last_partial_line(tmp_path):
    """The eighth hostile review: kooi's verdict was glued onto the workload's last
    line when it had no newline (`...nofinalnewlinekooi: failed: ...`)."""
    from kooi.run.errors import Log

    log = Log(tmp_path / "run.log", None)
    log.output("kooi: ok: the workload succeeded (exit 0, 0.1 s)\nno final newline")
    log.note("failed: the workload failed (exit 137)")
    log.note("next")
    log.close()
    assert (tmp_path / "run.log").read_text().splitlines()[-2:] == [
        "kooi: failed: the workload failed (exit 137)", "kooi: next"]


def test_a_failure_line_never_sends_a_workloads_control_characters(capsys):
    """Sessions review (helper-15): a project file name with OSC/CSI sequences, quoted in
    kooi session stop's and start's messages, retitled and recoloured root's terminal."""
    from kooi.cli.exits import fail

    assert fail("kooi session stop", "cannot list .vscode/\x1b]0;PWNED\x07\x1b[41mRED") == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "PWNED" in err


def test_no_command_prints_an_engines_control_characters(tmp_path, capsys):
    """Review 25: `kooi engine status` as root printed the version and storage driver
    that the runner's socket answers (a compromised runner serves its own there) with
    their OSC/CSI sequences: every command's output is neutralised, its JSON still JSON."""
    import json
    import socketserver
    import threading
    from http.server import BaseHTTPRequestHandler

    evil = "20.10\x1b]0;PWNED-TITLE\x07\x1b[2K\rPASS FORGED\x1b[31m\x7f\u202e"

    class Engine(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?")[0].rsplit("/", 1)[-1]
            body = b"OK" if path == "_ping" else json.dumps(
                {"ServerVersion": evil, "Driver": evil, "ApiVersion": "1.41", "Version": evil}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain" if path == "_ping" else "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

        def get_request(self):  # http.server wants a client address
            sock, _ = super().get_request()
            return sock, ("local", 0)

    sock = tmp_path / "docker.sock"
    srv = Server(str(sock), Engine)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    (tmp_path / "daemon.json").write_text(json.dumps({"storage-driver": "vfs"}))
    cfg = tmp_path / "engine.json"
    cfg.write_text(json.dumps({"mode": "rootless", "runner_user": "kooi-runner", "runner_uid": 1001, "runner_gid": 1001,
                               "runner_home": "/home/kooi-runner", "socket": str(sock),
                               "daemon_config": str(tmp_path / "daemon.json")}))
    try:
        cli.main(["engine", "status", "--config", str(cfg)])
        text = capsys.readouterr()
        cli.main(["engine", "status", "--json", "--config", str(cfg)])
        doc = capsys.readouterr().out
    finally:
        srv.shutdown()
        srv.server_close()
    assert "PASS FORGED" in text.out and "drift" in text.out, text
    for c in ("\x1b", "\x07", "\r", "\x7f", "\u202e"):
        assert c not in text.out + text.err + doc, (c, text)
    assert json.loads(doc)["version"] == evil, doc


def test_gc_prints_each_item_on_one_line(monkeypatch, capsys):
    """Review 28 (F5): a file name the runner chose with a newline in it printed a line
    of its own in root's `kooi gc` (forging gc's summary)."""
    from kooi import run

    monkeypatch.setattr(run, "gc", lambda **kw: ["placeholders of run x\nkooi gc: removed 0 item(s)"])
    assert cli.main(["gc", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["would remove placeholders of run x\\nkooi gc: removed 0 item(s)", "kooi gc: would remove 1 item(s)"]


def test_root_lists_print_each_field_on_one_line(capsys):
    """Review 29 (F6): a newline in a session container's project label (the runner's
    engine answers it) printed a forged row in root's `kooi session list --all`; the
    engine's version string could do the same in `kooi engine status`."""
    import argparse

    from kooi import engine
    from kooi.cli import session as session_cli

    class Found:
        person, workflow, running, supervised, started, run_id = "alice", "agent", True, True, "t", "r1"
        project = "/home/p\n\nroot    deploy    running    /srv/prod"

    class Sessions:
        @staticmethod
        def find(cfg, who, everyone):
            return [Found()]

        @staticmethod
        def homes(cfg, who, everyone):
            return [{"workflow": "agent\nkooi: forged", "person": "alice"}]

    session_cli._list(Sessions, None, None, argparse.Namespace(all=True, json=False))
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and "/home/p\\n\\nroot" in out[1] and out[2].endswith("agent\\nkooi: forged of alice"), out
    st = engine.Status(mode="rootless", manager="systemd", running=True, socket="/s", pid=1, version="29\nPASS forged",
                       storage_driver="overlay2")
    assert not any(line.startswith("PASS") for line in engine.render(st, False).splitlines())
