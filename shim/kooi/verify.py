"""`kooi verify`: the check catalogue against a live host, as a report.

The same check functions Molecule's verify step runs (kooi.checks), through the same
testinfra backends: local:// (this host), ssh://user@host, docker://NAME. Checks are
read-only or clean up after themselves (the ID-* checks run the kooi-selftest
workflow on a scratch project). Output: text, JSON (docs/verify.schema.json) or JUnit.
"""

from __future__ import annotations

import json
import socket
import xml.etree.ElementTree as ET
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from .checks import CHECKS, Context, cis, run_all
from .checks.core import FAIL, NA, PASS, Host
from .neutral import neutral


def probe_image_for(host: Host, ctx: Context, requested: str | None) -> str:
    """The image the ESC-* probes run: the one asked for, else the pinned runner image
    (run as container root), else the busybox probe the test suite builds."""
    if requested:
        return requested
    runner = (ctx.described(host, "images") or {}).get("runner")
    return runner.id if runner is not None else "kooi-probe:latest"


def run(spec: str = "local://", probe_image: str | None = None, ids: list[str] | None = None) -> dict[str, Any]:
    import testinfra

    host = testinfra.get_host(spec)
    ctx = Context.from_host(host)
    ctx.probe_image = probe_image_for(host, ctx, probe_image)
    results = run_all(host, ctx, ids)
    summary = {s: sum(1 for r in results if r.status == s) for s in (PASS, FAIL, NA)}
    checks = [{**r.as_dict(), "cis": cis.items_for(r.id)} for r in results]
    return {
        "schema": 1,
        "host": spec if spec != "local://" else f"local://{socket.gethostname()}",
        "engine_mode": ctx.mode,
        "probe_image": ctx.probe_image,
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "summary": summary,
        "ok": summary[FAIL] == 0,
        "checks": checks,
        "benchmark": cis.BENCHMARK,
        "cis": cis.summarize(checks, ctx.mode),
    }


def shown(text: str) -> str:
    """Evidence as one line of printable text: it quotes what the runner and workloads
    can write (a run's log, a result file; review 17: an OSC title, an erase-line and a
    carriage return reached root's terminal raw, with a forged PASS line)."""
    return neutral(text).replace("\n", "\\n").replace("\t", " ")


def render_text(report: dict[str, Any]) -> str:
    lines = [f"kooi verify {report['host']} ({report['engine_mode']}, probe {report['probe_image'][:19]})"]
    for c in report["checks"]:
        lines.append(f"{c['status'].upper():4} {c['id']:<24} {shown(c['evidence'])}")
    s = report["summary"]
    lines.append(f"verify: {s['pass']} passed, {s['fail']} failed, {s['na']} not applicable")
    return "\n".join(lines) + "\n"


def render_cis(report: dict[str, Any]) -> str:
    """The report by benchmark item: which checks cover it, its status, and what it
    means on this engine (rootless notes)."""
    lines = [f"kooi verify {report['host']} ({report['engine_mode']}): {report['benchmark']}"]
    for it in report["cis"]:
        covered = ", ".join(it["checks"]) or "-"
        lines.append(f"{it['status'].upper():9} {it['item']:<6} {it['title']}  [{covered}]")
        if it["note"]:
            lines.append(f"{'':16} {shown(it['note'])}")
    counts = {s: sum(1 for it in report["cis"] if it["status"] == s) for s in (PASS, FAIL, NA, "uncovered")}
    lines.append(f"cis: {counts[PASS]} items pass, {counts[FAIL]} fail, {counts[NA]} not applicable, "
                 f"{counts['uncovered']} not covered by a check")
    return "\n".join(lines) + "\n"


def render_junit(report: dict[str, Any]) -> str:
    s = report["summary"]
    root = ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite", name="kooi.verify", tests=str(len(report["checks"])), failures=str(s["fail"]),
                      skipped=str(s["na"]), timestamp=report["time"], hostname=report["host"])
    for c in report["checks"]:
        case = ET.SubElement(suite, "testcase", classname="kooi.verify", name=c["id"])
        cis_items = ", ".join(c.get("cis") or []) or "-"
        evidence = shown(c["evidence"])  # XML 1.0 has no control characters
        ET.SubElement(case, "system-out").text = (f"{c['title']}\nthreat: {c['threat']}\n"
                                                  f"{report.get('benchmark', 'CIS')}: {cis_items}\n{evidence}")
        if c["status"] == FAIL:
            ET.SubElement(case, "failure", message=evidence[:500]).text = evidence
        elif c["status"] == NA:
            ET.SubElement(case, "skipped", message=evidence[:500])
    return ET.tostring(root, encoding="unicode") + "\n"


def known_ids() -> list[str]:
    return [c.id for c in CHECKS]


def render_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2) + "\n"


# Every report format, by the name `kooi verify --format` takes: one interface
# (report -> text), so a new format is one function here and nothing else.
FORMATS: dict[str, Callable[[dict[str, Any]], str]] = {
    "text": render_text, "json": render_json, "junit": render_junit, "cis": render_cis}
