"""``try``'s verdict carries its reason (issue 27): a gain beyond the interval against each control run, no change
within the interval, or control runs that drifted apart (the machine's load changed)."""

from __future__ import annotations

import io

from helpers import step_snapshot

from ddpdoctor.trial import measure as m


def _run(median: float, seed: int, spread: float = 0.03):
    return step_snapshot(median, seed, spread)


def test_a_real_gain_says_it_holds_against_each_control():
    me = m.measure([_run(100, 1), _run(101, 2)], _run(70, 3))
    assert me.verdict == m.HELPS and "against each control run" in me.reason
    assert me.to_json()["verdict_reason"] == me.reason


def test_no_change_says_the_interval_includes_none():
    me = m.measure([_run(100, 1), _run(100, 2)], _run(100, 3))
    assert me.verdict == m.NO_EFFECT and me.reason == "the interval of B/A includes no change"


def test_drifted_controls_are_the_reason_for_no_verdict():
    # the machine got busier between the two control runs; B sits between them
    me = m.measure([_run(90, 1, 0.01), _run(110, 2, 0.01)], _run(92, 3, 0.01))
    assert me.verdict == m.NO_EFFECT and "drifted" in me.reason, (me.verdict, me.reason)


def test_the_verdict_line_prints_the_reason():
    from types import SimpleNamespace

    from ddpdoctor.trial import render

    me = m.measure([_run(100, 1), _run(101, 2)], _run(70, 3))
    outcome = SimpleNamespace(
        run=SimpleNamespace(label="bucket_cap_mb=5", out="t/1", log="t/1.log", error=None),
        measurement=me,
        prescribed=[],
        code_lines=lambda: ["DDP(model, bucket_cap_mb=5)"],
    )
    out = io.StringIO()
    render._outcome(outcome, out)
    assert f"verdict: {m.HELPS} ({me.reason})" in out.getvalue()


def test_the_findings_table_header_says_its_columns_are_gains():
    from types import SimpleNamespace

    from ddpdoctor.trial import render

    me = m.measure([_run(100, 1), _run(101, 2)], _run(70, 3))
    prescription = SimpleNamespace(rule="poor-comm-compute-overlap", estimated_gain_ms=26.0)
    outcome = SimpleNamespace(
        run=SimpleNamespace(label="ddp.bucket_cap_mb=2", out="t/1", log="t/1.log", error=None),
        measurement=me,
        prescribed=[prescription],
        verdict=me.verdict,
        code_lines=lambda: ["DDP(model, bucket_cap_mb=2)"],
    )
    session = SimpleNamespace(outcomes=[outcome], best=lambda: [("poor-comm-compute-overlap", outcome)])
    out = io.StringIO()
    render._findings(session, out)
    lines = out.getvalue().splitlines()
    header = lines[lines.index("Prescriptions tried") + 1].split("  ")
    cells = [c.strip() for c in header if c.strip()]
    assert cells == ["finding", "knob", "estimated gain", "measured gain per step (95% interval)", "verdict"]
    row = lines[lines.index("Prescriptions tried") + 2]
    assert "26.0 ms" in row and f"{me.gain_ms:.1f}" in row and m.HELPS in row  # the gain in ms, not B/A
