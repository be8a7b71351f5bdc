"""Workflow files: schema validation (kooi's validator agrees with jsonschema), clear
errors naming file and key, and the ownership rules of the workflow directory."""

from __future__ import annotations

import os
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kooi import workflow

REPO = Path(__file__).resolve().parents[2]


def test_the_schema_is_a_valid_json_schema():
    jsonschema.validators.validator_for(workflow.schema()).check_schema(workflow.schema())


@pytest.mark.parametrize("path", sorted((REPO / "examples/workflows").glob("*.yml"))
                         + [REPO / "roles/shim/files/kooi-selftest.yml", REPO / "roles/shim/files/kooi-runcheck.yml",
                            REPO / "examples/agent/agent-example.yml", REPO / "examples/agent/claude-session.yml"])
def test_shipped_workflows_are_valid(path):
    wf = workflow.parse(path)
    assert (wf.command or wf.session) and wf.mode in ("container", "jail")


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / f"{name}.yml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("text,expected", [
    ("command: [true]\nbogus: 1\n", "unknown key 'bogus'"),
    ("command: [x]\nlimits: {memory: 1g, swap: 2g}\n", "unknown key 'limits.swap'"),
    ("command: [x]\nlimits: {memory: lots}\n", "key 'limits.memory': 'lots' does not match"),
    ("command: [x]\ntimeout: '60'\n", "key 'timeout': '60' is not of type 'integer'"),
    ("command: [x]\ntimeout: 0\n", "key 'timeout': 0 is less than the minimum of 1"),
    ("command: []\n", "key 'command': [] should be non-empty"),
    ("mode: container\n", "'command' is a required property"),
    ("command: [x]\nmode: vm\n", "key 'mode': 'vm' is not one of"),
    ("command: [x]\nenvironment: {A: 1}\n", "key 'environment.A': 1 is not of type 'string'"),
    ("command: [x]\nenvironment: {1A: x}\n", "key 'environment.1A': not a valid name"),
    ("command: [x]\nnetwork: host\n", "key 'network': 'host' is not one of ['none', 'proxy']"),
    ("command: [x]\nworkdir: ../..\n", "key 'workdir'"),
    ("command: [x]\nworkdir: sub/../../x\n", "leaves the project"),
    ("command: [x]\nmode: jail\nimage: runner\n", "only container mode runs an image"),
    ("command: [x]\nmode: jail\ntestcontainers: true\n", "a jail gets no container engine"),
    ("command: [x]\ntestcontainers: 'yes'\n", "key 'testcontainers': 'yes' is not of type 'boolean'"),
    ("command: [x]\nname: other\n", "differs from the file name"),
    ("- command\n", "a workflow is a YAML mapping"),
    ("command: [x\n", "not valid YAML"),
])
def test_invalid_workflows_name_file_and_key(tmp_path, text, expected):
    p = write(tmp_path, "flow", text)
    with pytest.raises(workflow.WorkflowError) as exc:
        workflow.parse(p)
    assert str(p) in str(exc.value)
    assert expected in str(exc.value)


def test_defaults(tmp_path):
    wf = workflow.parse(write(tmp_path, "flow", "command: [make]\n"))
    assert (wf.name, wf.mode, wf.image, wf.workdir, wf.timeout, wf.network, wf.testcontainers) == \
        ("flow", "container", "runner", ".", 3600, "none", False)
    assert workflow.parse(write(tmp_path, "tc", "command: [mvn]\ntestcontainers: true\n")).testcontainers


scalar = st.one_of(st.none(), st.booleans(), st.integers(-5, 100000), st.floats(-1, 4096, allow_nan=False),
                   st.sampled_from(["", "x", "container", "jail", "none", "1g", "512m", "rootless", "..",
                                    "a/b", "UPPER", "runner", "12x", "gvisor"]))
values = st.recursive(scalar, lambda kids: st.one_of(
    st.lists(kids, max_size=3),
    st.dictionaries(st.sampled_from(["memory", "cpus", "pids", "A", "1A", "x"]), kids, max_size=3)), max_leaves=6)
keys = st.sampled_from(["name", "description", "mode", "image", "command", "workdir", "environment", "timeout",
                        "limits", "tmpfs_size", "network", "min_isolation", "testcontainers", "bogus"])


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(keys, values, max_size=6))
def test_kooi_validator_agrees_with_jsonschema(doc):
    ref = jsonschema.validators.validator_for(workflow.schema())(workflow.schema())
    ours = list(workflow.iter_errors(doc, workflow.schema()))
    assert (not ours) == ref.is_valid(doc), (doc, [e.message for e in ours])


def test_load_refuses_names_that_are_paths(tmp_path):
    for name in ("../x", "/etc/passwd", "a/b", "UPPER", ""):
        with pytest.raises(workflow.WorkflowError, match="not a workflow name"):
            workflow.load(name, tmp_path)


def test_load_lists_known_workflows(tmp_path):
    os.chmod(tmp_path, 0o755)
    write(tmp_path, "alpha", "command: [x]\n")
    if os.geteuid() == 0:
        with pytest.raises(workflow.WorkflowError, match=r"no workflow 'beta' .*known: alpha"):
            workflow.load("beta", tmp_path)


def test_load_refuses_files_others_can_write(tmp_path):
    os.chmod(tmp_path, 0o755)
    p = write(tmp_path, "flow", "command: [x]\n")
    os.chmod(p, 0o666)
    with pytest.raises(workflow.WorkflowError, match="writable by group or others|not root"):
        workflow.load("flow", tmp_path)


def test_load_refuses_a_directory_not_owned_by_root(tmp_path):
    d = tmp_path / "wf"
    d.mkdir()
    write(d, "flow", "command: [x]\n")
    if os.geteuid() == 0:
        os.chown(d, 65534, 65534)
    with pytest.raises(workflow.WorkflowError, match="not root"):
        workflow.load("flow", d)


def test_load_refuses_symlinks(tmp_path):
    os.chmod(tmp_path, 0o755)
    target = write(tmp_path, "real", "command: [x]\n")
    (tmp_path / "link.yml").symlink_to(target)
    with pytest.raises(workflow.WorkflowError, match="symlink|not root"):
        workflow.load("link", tmp_path)


def test_isolation_order():
    assert [workflow.isolation_rank(x) for x in ("jail", "userns_remap", "rootless", "gvisor")] == [0, 1, 2, 3]


def test_example_yaml_is_plain_yaml():
    for p in (REPO / "examples/workflows").glob("*.yml"):
        assert isinstance(yaml.safe_load(p.read_text()), dict)


def test_docs_workflows_md_key_table_is_generated_from_the_schema():
    import subprocess
    import sys

    res = subprocess.run([sys.executable, str(Path(__file__).parents[2] / "scripts" / "workflow-docs.py"), "--check"],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr


def test_defaults_come_from_the_schema_alone():
    props = workflow.schema()["properties"]
    wf = workflow.Workflow(name="d", path=Path("/x"), command=("true",))
    for key, prop in props.items():
        if "default" in prop:
            assert getattr(wf, key) == prop["default"], key


def test_a_session_workflow_has_no_command_and_runs_in_a_container(tmp_path):
    f = tmp_path / "s.yml"
    f.write_text("session: {idle_timeout: 60, seed: {.claude.json: '{}'}}\n")
    wf = workflow.parse(f)
    assert wf.session is not None and wf.session.shell == ("bash", "-l") and wf.command == ()
    assert wf.session.seed == ((".claude.json", "{}"),) and wf.session.idle_timeout == 60
    for text, why in (("session: {}\ncommand: [x]\n", "a session has no command"),
                      ("session: {}\nmode: jail\n", "container mode only"),
                      ("session: {seed: {a/../../b: x}}\n", "leaves the home"),
                      ("mode: container\n", "'command' is a required property"),
                      ("session: {idle_timeout: 5}\n", "minimum")):
        f.write_text(text)
        with pytest.raises(workflow.WorkflowError, match=why):
            workflow.parse(f)


def test_what_a_workflow_may_unprotect_is_what_the_guard_protects():
    """The schema's enum is run.protected's UNPROTECTABLE, declared there once."""
    from kooi.run.toolnames import UNPROTECTABLE

    assert workflow.schema()["properties"]["unprotected_paths"]["items"]["enum"] == list(UNPROTECTABLE)
