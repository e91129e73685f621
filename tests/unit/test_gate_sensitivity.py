"""Issue 25 item 1: the gate's run-to-run noise is the range of the baseline runs' own values (robust to a
variance blown up by one wild run with 3 runs), never wider than the metric can move, and a baseline too noisy to
gate on says so when it is written and in every gate report."""

from __future__ import annotations

import io
import json

import numpy as np

from ddpdoctor.compare.gate import gate
from ddpdoctor.compare.snapshot import Snapshot, combine
from ddpdoctor.compare.thresholds import load_config
from ddpdoctor.report import Document, OutputFormat, junit, renderer

ENV = {"mode": "ddp", "world_size": 2, "backend": "gloo", "devices": ["cpu"], "torch_version": "2.13.0"}


def _run(step_ms: float, overlap: float, seed: int, name: str) -> Snapshot:
    rng = np.random.default_rng(seed)
    steps = (step_ms * (1 + rng.normal(0, 0.05, 30))).tolist()
    ov = np.clip(overlap + rng.normal(0, 0.01, 30), 0, 1).tolist()
    return Snapshot(
        source=name,
        environment=dict(ENV),
        metrics={"step_ms.median": float(np.median(steps)), "overlap_ratio": float(np.mean(ov))},
        samples={"step_ms": steps, "overlap_ratio": ov},
        findings=[],
        rules_evaluated=[],
    )


# the busy machine: step medians 161, 90 and 101 ms; overlap 0.72, 0.70 and 0.55 (a t interval of their
# deviation, t = 9.9 at 2 degrees of freedom, is wider than the 0-1 ratio)
BASE = combine([_run(161, 0.72, 1, "runs/a"), _run(90, 0.70, 2, "runs/b"), _run(101, 0.55, 3, "runs/c")])


def _check(result, name):
    return next(c for c in result.metrics if c.metric == name)


def test_one_big_bucket_fails_against_a_noisy_three_run_baseline():
    current = _run(110, 0.004, 4, "runs/bigbucket")
    result = gate(current, BASE, load_config(cwd="/"))
    overlap = _check(result, "overlap_ratio")
    assert overlap.verdict == "regression" and result.failed, overlap.message
    # the margin is twice the range of the runs' overlap (0.55 to 0.72), not a t interval of +-1.5 on a 0-1 ratio
    assert overlap.run_spread is not None and 0.25 < overlap.run_spread < 0.45


def test_a_healthy_rerun_passes_the_same_baseline():
    result = gate(_run(120, 0.71, 5, "runs/rerun"), BASE, load_config(cwd="/"))
    assert not result.failed, [c.message for c in result.failures()]


def test_the_noise_never_exceeds_what_the_metric_can_move():
    wild = combine([_run(100, 0.9, 6, "a"), _run(100, 0.1, 7, "b"), _run(100, 0.5, 8, "c")])
    overlap = _check(gate(_run(100, 0.5, 9, "cur"), wild, load_config(cwd="/")), "overlap_ratio")
    assert overlap.run_spread is not None and overlap.run_spread <= wild.value("overlap_ratio") + 1e-9


def test_a_noisy_baseline_says_what_it_cannot_detect_in_every_format():
    result = gate(_run(120, 0.71, 5, "runs/rerun"), BASE, load_config(cwd="/"))
    loud = [n for n in result.notes if "cannot detect a change smaller than" in n]
    assert loud and "the 3 baseline runs differ by" in loud[0] and "step_ms.median" in loud[0], result.notes
    for fmt in OutputFormat:
        out = io.StringIO()
        renderer(Document.GATE, fmt)(result, out)
        text = out.getvalue().replace("\n", " ")
        assert "cannot detect a change smaller than" in " ".join(text.split()), fmt
    assert b"cannot detect a change smaller than" in junit.to_bytes(result)


def test_baseline_command_announces_a_noisy_baseline(tmp_path, capsys, monkeypatch):
    from ddpdoctor.cli.gate_cmd import noise_warnings

    lines = noise_warnings(BASE, load_config(cwd="/"))
    assert lines and "cannot detect a change smaller than" in lines[0]
    doc = json.loads(json.dumps(BASE.to_json()))
    assert doc["runs"]


# CI's busy machine: one of three healthy runs had no overlap at all (its comm thread got no CPU during backward)
WILD = combine([_run(100, 0.50, 11, "runs/a"), _run(104, 0.49, 12, "runs/b"), _run(98, 0.003, 13, "runs/c")])


def test_one_wild_baseline_run_does_not_blind_the_gate():
    # a range over all three runs (0.5) is all the ratio can fall: the one-big-bucket run passed as noise
    overlap = _check(gate(_run(100, 0.002, 14, "runs/bigbucket"), WILD, load_config(cwd="/")), "overlap_ratio")
    assert overlap.verdict == "regression" and overlap.outcome == "fail", overlap.message
    assert overlap.spread is not None and overlap.spread.left_out == 2 and not overlap.spread.bounded
    assert "baseline run 3's 0.0" in overlap.message and "left out as wild" in overlap.message, overlap.message


def test_a_wild_baseline_run_is_announced_in_every_report_and_when_written():
    from ddpdoctor.cli.gate_cmd import noise_warnings

    result = gate(_run(100, 0.49, 15, "runs/rerun"), WILD, load_config(cwd="/"))
    assert not result.failed, [c.message for c in result.failures()]
    loud = [n for n in result.notes if "left out of the run-to-run range" in n]
    assert len(loud) == 1 and "run 3's overlap_ratio 0.0" in loud[0] and "(the others: 0.5" in loud[0], result.notes
    for fmt in OutputFormat:
        out = io.StringIO()
        renderer(Document.GATE, fmt)(result, out)
        assert "left out of the run-to-run range" in " ".join(out.getvalue().split()), fmt
    assert any("left out of the run-to-run range" in line for line in noise_warnings(WILD, load_config(cwd="/")))
    # written into the baseline's notes, the note is not repeated by the gate
    noted = Snapshot(**{**WILD.__dict__, "notes": noise_warnings(WILD, load_config(cwd="/"))})
    again = gate(_run(100, 0.49, 15, "runs/rerun"), noted, load_config(cwd="/"))
    assert sum("left out of the run-to-run range" in n for n in again.notes) == 1, again.notes


def test_runs_that_spread_evenly_or_within_the_threshold_have_no_wild_one():
    from ddpdoctor.compare import stats

    assert stats.wild_run([0.9, 0.1, 0.5]) is None  # evenly spread: the range is the noise
    assert stats.wild_run([0.50, 0.50, 0.45], floor=0.1) is None  # 0.05 off: within the threshold
    assert stats.wild_run([0.50, 0.50, 0.45], floor=0.01) == 2
    assert stats.wild_run([0.50, 0.0]) is None  # with two runs neither is the wild one
    assert stats.wild_run([0.50, None, 0.49, 0.0]) == 3  # the index among the runs, gaps kept
    assert stats.wild_run([5.0, 5.0, 5.0]) is None
    # no wild run: the margin stays twice the range of all of them
    overlap = _check(gate(_run(100, 0.5, 9, "cur"), BASE, load_config(cwd="/")), "overlap_ratio")
    assert overlap.spread is not None and overlap.spread.left_out is None


def test_a_wild_slow_run_is_kept_in_a_timings_range():
    # busy machines make slow runs: leaving one out would fail the next healthy run that lands as slow
    slow = combine([_run(100, 0.5, 16, "a"), _run(102, 0.5, 17, "b"), _run(300, 0.5, 18, "c")])
    step = _check(gate(_run(250, 0.5, 19, "cur"), slow, load_config(cwd="/")), "step_ms.median")
    assert step.spread is not None and step.spread.left_out is None and step.outcome != "fail", step.message
    assert "left out" not in step.message
    assert not any(
        "left out of the run-to-run range" in n for n in gate(_run(250, 0.5, 19, "c"), slow, load_config(cwd="/")).notes
    )


def test_a_wild_good_run_stays_in_the_range():
    # bench_gate_noise under load: healthy overlaps 0.52, 0.89, 0.53 and a healthy rerun at 0.40. Leaving the 0.89
    # out of the range while it still lifts the baseline's value failed that rerun as a regression.
    lucky = combine([_run(100, 0.52, 20, "a"), _run(100, 0.89, 21, "b"), _run(100, 0.53, 22, "c")])
    overlap = _check(gate(_run(100, 0.40, 23, "cur"), lucky, load_config(cwd="/")), "overlap_ratio")
    assert overlap.outcome != "fail" and overlap.spread is not None and overlap.spread.left_out is None, overlap.message
    from ddpdoctor.compare import stats

    assert stats.wild_run([0.52, 0.89, 0.53], 0.1, worse="down") is None
    assert stats.wild_run([0.52, 0.89, 0.53], 0.1, worse="up") == 1
    assert stats.wild_run([0.50, 0.49, 0.0], 0.1, worse="down") == 2


def test_a_lucky_good_run_does_not_blind_the_gate():
    # bench_gate_noise under load: healthy overlaps 0.52, 0.44, 0.89; one big bucket 0.08. Twice their range (0.9)
    # is more than the 0.62 an overlap can fall; the worse side reaches 0.08 below the median.
    lucky = combine([_run(100, 0.52, 24, "a"), _run(100, 0.44, 25, "b"), _run(100, 0.89, 26, "c")])
    big = _check(gate(_run(100, 0.08, 27, "big"), lucky, load_config(cwd="/")), "overlap_ratio")
    assert big.verdict == "regression" and big.spread is not None and big.spread.one_sided, big.message
    assert not big.spread.bounded and "from its worse side" in big.message, big.message
    for healthy in (0.40, 0.47, 0.53):  # the other healthy runs of that benchmark
        check = _check(gate(_run(100, healthy, 28, "rerun"), lucky, load_config(cwd="/")), "overlap_ratio")
        assert check.outcome != "fail", check.message
    # a baseline whose worse side alone spans all the metric can move stays blind, and says so
    low = combine([_run(100, 0.5, 29, "a"), _run(100, 0.3, 30, "b"), _run(100, 0.1, 31, "c")])
    blind = _check(gate(_run(100, 0.0, 32, "big"), low, load_config(cwd="/")), "overlap_ratio")
    assert blind.spread is not None and blind.spread.bounded and blind.outcome != "fail", blind.message
