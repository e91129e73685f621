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


def test_a_gain_measured_on_a_quieter_host_than_every_control_is_no_verdict():
    # beside a test suite: controls 100 and 101 ms with other processes on 1.6 and 1.4 CPUs, the trial in a lull
    me = m.measure([_run(100, 1), _run(101, 2)], _run(70, 3), ([1.6, 1.4], 0.3))
    assert me.verdict == m.NO_EFFECT and me.reason.startswith("the host was quieter during the trial")
    assert any("0.30 CPUs during the trial and 1.60, 1.40 during the control runs" in n for n in me.notes)
    assert me.to_json()["other_cpu_cores"] == 0.3 and me.to_json()["control_other_cpu_cores"] == [1.6, 1.4]


def test_a_gain_on_a_host_as_busy_as_the_controls_stands():
    assert m.measure([_run(100, 1), _run(101, 2)], _run(70, 3), ([1.6, 1.4], 1.5)).verdict == m.HELPS
    # busier during the trial and faster still: the load cannot have made it faster
    assert m.measure([_run(100, 1), _run(101, 2)], _run(70, 3), ([0.1, 0.2], 1.5)).verdict == m.HELPS
    # only one control recorded the host (or none): the runs cannot be compared on it, the verdict stands
    assert m.measure([_run(100, 1), _run(101, 2)], _run(70, 3), ([1.6, None], 0.1)).verdict == m.HELPS
    assert m.measure([_run(100, 1), _run(101, 2)], _run(70, 3)).verdict == m.HELPS


def test_a_loss_on_a_busier_host_is_no_verdict_unless_the_knob_starts_the_processes():
    slower = m.measure([_run(100, 1), _run(101, 2)], _run(140, 3), ([0.1, 0.2], 1.2))
    assert slower.verdict == m.NO_EFFECT and "busier" in slower.reason
    # DataLoader workers count as other processes: their CPU is the knob's, and so is the loss
    workers = m.measure([_run(100, 1), _run(101, 2)], _run(140, 3), ([0.1, 0.2], 1.2), spawns_processes=True)
    assert workers.verdict == m.HURTS


def test_the_load_of_a_run_is_its_busiest_hosts_other_processes():
    from types import SimpleNamespace

    ranks = [{"other_cpu_cores": 0.4}, {"other_cpu_cores": float("nan")}, {"other_cpu_cores": 1.1}, {}]
    assert m.foreign_cpus(SimpleNamespace(metrics=SimpleNamespace(ranks=ranks))) == 1.1
    assert m.foreign_cpus(SimpleNamespace(metrics=SimpleNamespace(ranks=[{}]))) is None
    assert m.foreign_cpus(SimpleNamespace(metrics=None)) is None
