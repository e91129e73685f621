"""``ddpdoctor gate --junit FILE``: JUnit XML that CI systems show as tests.

One ``<testcase>`` for the runs' completion (``ddpdoctor.gate.run``: a failure per reason a run did not
complete), one per gated metric (classname ``ddpdoctor.gate.metrics``), per rule
(``ddpdoctor.gate.rules``) and one for the environment (``ddpdoctor.gate.environment``). A regression, a new
finding at or above fail-on and, with ``--strict-env``, a different environment are ``<failure>``s; a metric
not measured in either run is ``<skipped>``; every testcase's ``<system-out>`` carries the numbers
(baseline, current, change, interval).
"""

from __future__ import annotations

import socket
import xml.etree.ElementTree as ET

from ddpdoctor import escape
from ddpdoctor.compare.gate import FAIL, GateResult
from ddpdoctor.report.gate_text import incomplete_lines, verdict_line


def _case(
    suite: ET.Element,
    classname: str,
    name: str,
    message: str,
    failure: str | None = None,
    skipped: str | None = None,
) -> None:
    case = ET.SubElement(suite, "testcase", classname=classname, name=escape.xml(name), time="0")
    if failure is not None:
        ET.SubElement(case, "failure", message=escape.xml(message), type=failure).text = escape.xml(message)
    elif skipped is not None:
        ET.SubElement(case, "skipped", message=escape.xml(skipped))
    ET.SubElement(case, "system-out").text = escape.xml(message)


def build(result: GateResult) -> ET.Element:
    """The ``<testsuites>`` element of ``result``."""
    root = ET.Element("testsuites", name="ddpdoctor gate")
    suite = ET.SubElement(root, "testsuite", name="ddpdoctor gate", hostname=socket.gethostname(), time="0")
    props = ET.SubElement(suite, "properties")
    for key, value in (
        ("baseline", result.baseline.label),
        ("current", result.current.label),
        ("verdict", verdict_line(result)),
    ):
        ET.SubElement(props, "property", name=key, value=escape.xml(value))
    for line in incomplete_lines(result):
        _case(suite, "ddpdoctor.gate.run", line.split(":")[0], line, failure="run incomplete")
    if not result.incomplete:
        _case(suite, "ddpdoctor.gate.run", "completed", "both runs completed")
    for m in result.metrics:
        both_missing = m.baseline is None and m.current is None
        _case(
            suite,
            "ddpdoctor.gate.metrics",
            m.metric,
            m.message,
            failure=m.verdict if m.outcome == FAIL else None,
            skipped="not measured in either run" if both_missing else None,
        )
    for r in result.rules:
        _case(suite, "ddpdoctor.gate.rules", r.rule, r.message, failure=r.verdict if r.outcome == FAIL else None)
    env_text = (
        "; ".join(f"{d.key}: baseline {d.baseline}, current {d.current}" for d in result.env_diffs)
        or "same environment as the baseline"
    )
    _case(
        suite,
        "ddpdoctor.gate.environment",
        "environment",
        env_text,
        failure="environment differs" if result.env_failed else None,
    )
    if result.notes:  # the notes every other format shows (a noisy baseline's blind spots first)
        ET.SubElement(suite, "system-out").text = escape.xml("\n".join(result.notes))
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
    suite.set("skipped", str(sum(1 for c in cases if c.find("skipped") is not None)))
    suite.set("errors", "0")
    for key in ("tests", "failures", "skipped", "errors"):
        root.set(key, suite.get(key, "0"))
    return root


def to_bytes(result: GateResult) -> bytes:
    root = build(result)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"
