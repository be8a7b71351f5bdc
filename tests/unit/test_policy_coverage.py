"""The policy is complete against the Engine API specification (issue 28): every
endpoint of API 1.41 and 1.45 has a row of kooi.policy.API, every field of a body the
policy reads has a verdict in kooi.verdicts (and no verdict names a field the
specification lacks), a set field without one is refused, and docs/policy.md's tables
are what scripts/policy-docs.py generates from the code."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kooi import policy, verdicts
from kooi.policy import Policy, decide

REPO = Path(__file__).resolve().parents[2]
SPECS = {p.stem.removeprefix("engine-api-"): json.loads(p.read_text())
         for p in sorted((REPO / "tests" / "data").glob("engine-api-*.json"))}


def test_the_specifications_of_both_engines_are_here():
    assert set(SPECS) == {"1.41", "1.45"}
    assert all(len(s["endpoints"]) > 100 and not s["truncated"] for s in SPECS.values())


def endpoints():
    return sorted({(e["method"], e["path"], e["body"]) for s in SPECS.values() for e in s["endpoints"]})


def read_bodies() -> set[str]:
    """The bodies whose endpoint's row reads them (and exec start's, which is recorded)."""
    out = {"ExecStart"}
    for method, path, body in endpoints():
        hit = policy.route(method, re.sub(r"\{[^}]+\}", "x", path))
        if hit is not None and hit.route.body and body not in (None, "binary"):
            out.add(body)
    return out


def gaps(table: dict[str, dict[str, tuple[str, str]]]) -> list[str]:
    """Fields of the specification without a verdict in TABLE, and verdicts on fields it
    does not have."""
    saved = verdicts.FIELDS
    verdicts.FIELDS = table
    try:
        out = []
        for version, spec in SPECS.items():
            for body in read_bodies():
                for path in spec["bodies"].get(body, {}):
                    if verdicts.verdict(body, path) is None and path not in verdicts.FIELD_BY_FIELD.get(body, ()):
                        out.append(f"{version} {body}: {path} has no verdict")
        for body, entries in table.items():
            for key in entries:
                if key in verdicts.OUTSIDE_SPEC.get(body, {}):
                    continue
                if not any(key in s["bodies"].get(body, {}) for s in SPECS.values()):
                    out.append(f"{body}: a verdict on {key}, which no specification has")
        return out
    finally:
        verdicts.FIELDS = saved


@pytest.mark.parametrize("method,path", [(m, p) for m, p, _ in endpoints()])
def test_every_endpoint_has_an_explicit_row(method, path):
    assert policy.route(method, re.sub(r"\{[^}]+\}", "x", path)) is not None, f"{method} {path}: no row"


def test_every_field_of_every_body_the_policy_reads_has_a_verdict():
    assert read_bodies() >= {"ContainerCreate", "ContainerExec", "ContainerUpdate", "NetworkCreate", "VolumeCreate",
                             "NetworkConnect", "NetworkDisconnect"}
    assert gaps(verdicts.FIELDS) == []


@pytest.mark.parametrize("body,key", [("ContainerCreate", "HostConfig.Privileged"),
                                      ("ContainerCreate", "HostConfig.Mounts"),
                                      ("ContainerExec", "User"), ("NetworkCreate", "IPAM")])
def test_a_field_without_its_verdict_fails_the_coverage(body, key):
    table = {b: dict(t) for b, t in verdicts.FIELDS.items()}
    del table[body][key]
    assert any(f"{body}: {key}" in g for g in gaps(table)), gaps(table)
    table[body]["HostConfig.NoSuchField"] = ("allowed", "")
    assert f"{body}: a verdict on HostConfig.NoSuchField, which no specification has" in gaps(table)


@pytest.mark.parametrize("uri,doc,what", [
    ("/containers/create", {"Image": "x", "Futuristic": True}, "field Futuristic"),
    ("/containers/create", {"Image": "x", "HostConfig": {"Capabilities": ["CAP_SYS_ADMIN"]}},
     "field HostConfig.Capabilities"),
    ("/containers/create", {"Image": "x", "Capabilities": ["CAP_SYS_ADMIN"]}, "field Capabilities"),
    ("/containers/c1/exec", {"Cmd": ["id"], "Capabilities": ["ALL"]}, "field Capabilities"),
    ("/containers/c1/update", {"Memory": 1 << 20, "Futuristic": 1}, "field Futuristic"),
    ("/volumes/create", {"Name": "v", "Futuristic": "x"}, "field Futuristic"),
])
def test_a_set_field_without_a_verdict_is_refused(uri, doc, what):
    d = decide("POST", uri, json.dumps(doc).encode(), Policy(workspace="/srv/ws"))
    assert not d.allow and what in d.reason and "no verdict" in d.reason, d.reason
    unset = {k: (None if k not in ("Image", "Cmd", "Name") else v) for k, v in doc.items()}
    if "HostConfig" in doc:
        unset["HostConfig"] = {k: None for k in doc["HostConfig"]}
    assert decide("POST", uri, json.dumps(unset).encode(), Policy(workspace="/srv/ws")).allow


def test_docs_policy_md_is_generated_from_the_code():
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "policy-docs.py"), "--check"],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
