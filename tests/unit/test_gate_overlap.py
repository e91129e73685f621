"""The gate's overlap check weighs what the drop can cost: a drop of ``overlap_ratio`` past its threshold whose
size times the current run's communication a step (``comm_ms``) is within ``exposed_comm_ms``'s threshold is a
warning ("not material"), never a failure; a drop of a job with much communication fails as before (also where the
runs' own exposed time, which holds waits, fell), and so does one where the current run lacks its communication
time."""

from __future__ import annotations

import io

import numpy as np

from ddpdoctor.compare.gate import gate
from ddpdoctor.compare.snapshot import Snapshot
from ddpdoctor.compare.thresholds import load_config, parse_threshold
from ddpdoctor.report import gate_text

ENV = {"mode": "ddp", "world_size": 2, "backend": "gloo", "devices": ["cpu"], "torch_version": "2.13.0"}


def _run(overlap: float, exposed: float | None, comm: float | None, seed: int) -> Snapshot:
    rng = np.random.default_rng(seed)
    ratios = np.clip(overlap + rng.normal(0, 0.01, 40), 0, 1).tolist()
    steps = (33 * (1 + rng.normal(0, 0.01, 40))).tolist()
    metrics = {"step_ms.median": float(np.median(steps)), "overlap_ratio": float(np.median(ratios))}
    samples = {"step_ms": steps, "overlap_ratio": ratios}
    if exposed is not None:
        exposures = (exposed + rng.normal(0, 0.01, 40)).tolist()
        metrics["exposed_comm_ms"] = float(np.median(exposures))
        samples["exposed_comm_ms"] = exposures
    if comm is not None:
        metrics["comm_ms"] = comm
    return Snapshot(f"runs/r{seed}", dict(ENV), metrics, samples, findings=[], rules_evaluated=[])


def _overlap(result):
    return next(c for c in result.metrics if c.metric == "overlap_ratio")


def _flaky(config=None):
    # the clean-clone CI run's two healthy runs of one job (2026-12-06): 0.324 -> 0.016 of about 0.7 ms a step
    return _overlap(gate(_run(0.016, 0.76, 0.77, 2), _run(0.324, 0.47, 0.70, 1), config or load_config(cwd="/")))


def test_an_overlap_drop_of_a_job_with_little_communication_warns_with_the_times():
    result = gate(_run(0.016, 0.76, 0.77, 2), _run(0.324, 0.47, 0.70, 1), load_config(cwd="/"))
    check = _overlap(result)
    assert check.verdict == "not material" and check.outcome == "warn" and not result.failed, check
    assert "of 0.77 ms of communication a step the drop leaves at most 0.24 ms more exposed" in check.message
    text = io.StringIO()
    gate_text.render(result, text)
    said = " ".join(text.getvalue().split())
    assert "not material" in said and "warning: overlap_ratio: " in said and "(+2 ms)" in said, said
    assert any(
        "overlap\\_ratio: " in line and "0.24 ms more exposed" in line for line in gate_text.markdown_lines(result)
    )


def test_an_overlap_drop_of_a_job_with_much_communication_still_fails():
    # CI, 2026-12-07: one big bucket, 0.644 -> 0.083 of 85 ms; the runs' exposed time fell (30.4 -> 18.0 ms: the
    # noisy baseline's held waits), yet the drop leaves 48 ms more of the communication unhidden
    check = _overlap(gate(_run(0.083, 18.0, 85.0, 2), _run(0.644, 30.4, 85.0, 1), load_config(cwd="/")))
    assert check.verdict == "regression" and check.outcome == "fail", check
    # the user's own exposed-time threshold decides what is material
    config = load_config(cwd="/")
    config.thresholds["exposed_comm_ms"] = parse_threshold("exposed_comm_ms", "+0.1ms")
    assert _flaky(config).verdict == "regression"


def test_without_the_current_runs_communication_time_an_overlap_drop_stands():
    check = _overlap(gate(_run(0.016, 0.76, None, 2), _run(0.324, 0.47, 0.70, 1), load_config(cwd="/")))
    assert check.verdict == "regression" and check.outcome == "fail", check


def test_exposed_time_gated_off_still_weighs_the_overlap_by_its_default():
    config = load_config(cwd="/")
    config.thresholds.pop("exposed_comm_ms")
    check = _flaky(config)
    assert check.verdict == "not material" and "(+2 ms)" in check.message, check
