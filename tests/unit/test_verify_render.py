"""kooi verify's report formats, from a fixed report (the e2e tests run the real thing)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema

from kooi import verify
from kooi.checks import CHECKS, cis

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
for _c in REPORT["checks"]:
    _c["cis"] = cis.items_for(_c["id"])
REPORT["benchmark"] = cis.BENCHMARK
REPORT["cis"] = cis.summarize(REPORT["checks"], "rootless")


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


def test_every_check_says_which_cis_items_it_covers():
    ids = [c.id for c in CHECKS]
    assert sorted(cis.MAP) == sorted(ids), "a check without a CIS mapping (use [] for none) or a stale entry"
    for items in cis.MAP.values():
        assert set(items) <= set(cis.ITEMS)
    assert set(cis.UNCOVERED) <= set(cis.ITEMS)
    covered = {i for items in cis.MAP.values() for i in items}
    assert covered | set(cis.UNCOVERED) == set(cis.ITEMS), "an item neither covered nor explained"


def test_cis_items_fail_when_a_covering_check_fails_and_rootless_notes_show():
    by_item = {it["item"]: it for it in REPORT["cis"]}
    # 1.1.2 is covered by HOST-RUNNER-NODOCKER (fails here) among others
    assert by_item["1.1.2"]["status"] == "fail" and "HOST-RUNNER-NODOCKER" in by_item["1.1.2"]["checks"]
    # 2.9: HOST-ENGINE-USERNS-REMAP is n/a, nothing else of 2.9 ran: n/a; rootless note shown
    assert by_item["2.9"]["status"] == "na" and "runner's user namespace" in by_item["2.9"]["note"]
    assert by_item["2.1"]["status"] == "pass"
    assert by_item["5.16"]["status"] == "uncovered" and by_item["5.16"]["note"]
    text = verify.render_cis(REPORT)
    assert "FAIL      1.1.2" in text and text.splitlines()[-1].startswith("cis: ")


def test_evidence_prints_no_terminal_control_and_no_line_of_its_own():
    """Review 17 (F4): evidence carries text the runner can write (a run's log path, a
    result it swapped in); root's terminal got its OSC title, an erase-line and a
    carriage return raw, and a forged `PASS` line."""
    evil = "log \x1b]0;TITLE\x07\x1b[2K\rPASS ALL-IS-WELL\nFAIL FORGED\u202e"
    report = {**REPORT, "checks": [{**REPORT["checks"][0], "evidence": evil}]}
    for text in (verify.render_text(report), verify.render_cis(report)):
        assert not any(ord(c) < 32 and c != "\n" or c == "\x7f" or c == "\u202e" for c in text), repr(text)
        assert not any(line.startswith(("PASS ALL", "FAIL FORGED")) for line in text.splitlines()), text


# What starts a container or a kooi run inside a check (the self-test, a probe
# container, `kooi run`): such a check is a "workload" or "image" one. The negative
# controls and tests/e2e skip those after a host setting changed (no running engine sees
# it), so a check that starts workloads but says "host" would make every control pay
# for its containers, and one that says "workload" but reads only host state would go
# unchecked by them.
STARTS_WORKLOADS = ("_get(host", "_judge(host", "_selftest(host", "_run(host", "_in_image(host", "docker run",
                    "kooi run", "_probe_ready(")
# Judges the engine's policy (what it refuses); one ordinary run shows it admits the rest.
HOST_WITH_A_CONTAINER = {"POL-AUTHZ-REFUSES"}


def test_a_checks_scope_says_whether_it_starts_workloads():
    import inspect
    for c in CHECKS:
        func = inspect.unwrap(c.func)
        # and what a wrapper (per_runtime, egress_check) calls
        src = inspect.getsource(func) + "".join(inspect.getsource(cell.cell_contents) for cell in func.__closure__ or ()
                                                if inspect.isfunction(cell.cell_contents))
        starts = any(s in src for s in STARTS_WORKLOADS)
        if c.id in HOST_WITH_A_CONTAINER:
            assert starts and c.scope == "host", c.id
        else:
            assert (c.scope != "host") == starts, (c.id, c.scope)
