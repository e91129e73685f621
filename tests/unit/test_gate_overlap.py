"""The gate's overlap check weighs the exposed communication: a drop of ``overlap_ratio`` past its threshold that
left no more than ``exposed_comm_ms``'s threshold more communication exposed a step is a warning ("not material"),
never a failure; a drop that exposed more fails as before, and so does one where either run lacks the time."""

from __future__ import annotations

import io

import numpy as np

from ddpdoctor.compare.gate import gate
from ddpdoctor.compare.snapshot import Snapshot
from ddpdoctor.compare.thresholds import load_config, parse_threshold
from ddpdoctor.report import gate_text

ENV = {"mode": "ddp", "world_size": 2, "backend": "gloo", "devices": ["cpu"], "torch_version": "2.13.0"}


def _run(overlap: float, exposed: float | None, seed: int) -> Snapshot:
    rng = np.random.default_rng(seed)
    ratios = np.clip(overlap + rng.normal(0, 0.01, 40), 0, 1).tolist()
    steps = (33 * (1 + rng.normal(0, 0.01, 40))).tolist()
    metrics = {"step_ms.median": float(np.median(steps)), "overlap_ratio": float(np.median(ratios))}
    samples = {"step_ms": steps, "overlap_ratio": ratios}
    if exposed is not None:
        exposures = (exposed + rng.normal(0, 0.01, 40)).tolist()
        metrics["exposed_comm_ms"] = float(np.median(exposures))
        samples["exposed_comm_ms"] = exposures
    return Snapshot(f"runs/r{seed}", dict(ENV), metrics, samples, findings=[], rules_evaluated=[])


def _overlap(result):
    return next(c for c in result.metrics if c.metric == "overlap_ratio")


def test_an_overlap_drop_that_exposed_a_fraction_of_a_millisecond_more_warns_with_the_times():
    # the clean-clone CI run's two healthy runs of one job (2026-12-06): 0.324 -> 0.016, 0.47 -> 0.76 ms exposed
    result = gate(_run(0.016, 0.76, 2), _run(0.324, 0.47, 1), load_config(cwd="/"))
    check = _overlap(result)
    assert check.verdict == "not material" and check.outcome == "warn" and not result.failed, check
    assert "the communication left exposed went from 0.47 to 0.76 ms a step, within exposed_comm_ms's threshold" in (
        check.message
    )
    text = io.StringIO()
    gate_text.render(result, text)
    said = " ".join(text.getvalue().split())
    assert "not material" in said and "warning: overlap_ratio: " in said and "(+2 ms)" in said, said
    assert any("overlap\\_ratio: " in line and "0.47 to 0.76 ms" in line for line in gate_text.markdown_lines(result))


def test_an_overlap_drop_that_exposed_more_than_the_threshold_still_fails():
    check = _overlap(gate(_run(0.1, 6.0, 2), _run(0.8, 1.0, 1), load_config(cwd="/")))
    assert check.verdict == "regression" and check.outcome == "fail", check
    # the user's own exposed-time threshold decides what is material
    config = load_config(cwd="/")
    config.thresholds["exposed_comm_ms"] = parse_threshold("exposed_comm_ms", "+0.1ms")
    check = _overlap(gate(_run(0.016, 0.76, 2), _run(0.324, 0.47, 1), config))
    assert check.verdict == "regression" and check.outcome == "fail", check


def test_without_the_exposed_time_on_either_side_an_overlap_drop_stands():
    for base, cur in ((None, 0.76), (0.47, None)):
        check = _overlap(gate(_run(0.016, cur, 2), _run(0.324, base, 1), load_config(cwd="/")))
        assert check.verdict == "regression" and check.outcome == "fail", (base, cur, check)


def test_exposed_time_gated_off_still_weighs_the_overlap_by_its_default():
    config = load_config(cwd="/")
    config.thresholds.pop("exposed_comm_ms")
    check = _overlap(gate(_run(0.016, 0.76, 2), _run(0.324, 0.47, 1), config))
    assert check.verdict == "not material" and "(+2 ms)" in check.message, check
