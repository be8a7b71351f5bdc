"""kooi verify's report formats, from a fixed report (the e2e tests run the real thing)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema

from kooi import verify

REPO = Path(__file__).resolve().parents[2]
REPORT = {
    "schema": 1, "host": "local://h", "engine_mode": "rootless", "probe_image": "sha256:" + "a" * 64,
    "time": "2026-11-29T00:00:00+00:00", "summary": {"pass": 1, "fail": 1, "na": 1}, "ok": False,
    "checks": [
        {"id": "HOST-RUNNER-USER", "title": "t1", "status": "pass", "evidence": "e1", "threat": "x"},
        {"id": "HOST-RUNNER-NODOCKER", "title": "t2", "status": "fail", "evidence": "in docker", "threat": "y"},
        {"id": "HOST-ENGINE-USERNS-REMAP", "title": "t3", "status": "na", "evidence": "rootless", "threat": "z"},
    ],
}


def test_the_schema_accepts_a_report_and_rejects_a_bad_one():
    schema = json.loads((REPO / "docs/verify.schema.json").read_text())
    jsonschema.validate(REPORT, schema)
    bad = {**REPORT, "checks": [{**REPORT["checks"][0], "status": "maybe"}]}
    assert not jsonschema.Draft202012Validator(schema).is_valid(bad)


def test_text_ends_with_the_summary():
    text = verify.render_text(REPORT)
    assert "FAIL HOST-RUNNER-NODOCKER" in text and "NA   HOST-ENGINE-USERNS-REMAP" in text
    assert text.splitlines()[-1] == "verify: 1 passed, 1 failed, 1 not applicable"


def test_junit_marks_failures_and_skips():
    root = ET.fromstring(verify.render_junit(REPORT))
    suite = root.find("testsuite")
    assert suite.get("tests") == "3" and suite.get("failures") == "1" and suite.get("skipped") == "1"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert cases["HOST-RUNNER-NODOCKER"].find("failure").get("message") == "in docker"
    assert cases["HOST-ENGINE-USERNS-REMAP"].find("skipped") is not None
    assert cases["HOST-RUNNER-USER"].find("failure") is None


def test_every_catalogue_id_matches_the_schema_pattern():
    import re
    schema = json.loads((REPO / "docs/verify.schema.json").read_text())
    pat = schema["properties"]["checks"]["items"]["properties"]["id"]["pattern"]
    assert all(re.match(pat, i) for i in verify.known_ids())
