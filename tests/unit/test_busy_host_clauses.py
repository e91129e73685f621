"""A busy host in the overlap and bucket findings (issue 25): where a rank's training loop waited for a CPU at least
half as long as the exposed transfer, the finding says so and what to do before tuning DDP; on a quiet host it
does not. Measured metrics of the recorded straggler sample, with the host's run-queue wait set per case."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from ddpdoctor.diagnosis import evaluate, load_rules
from ddpdoctor.load import load
from ddpdoctor.metrics import analyze

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "recorded" / "ddp_straggler"
RULES = ("poor-comm-compute-overlap", "ddp-bucket-size-mismatch")


@pytest.fixture(scope="module")
def metrics():
    return analyze(load(SAMPLE, workers=1))


def _findings(metrics, cpu_wait_ms: float, exposed_ms: float) -> dict:
    m = copy.deepcopy(metrics)
    for r in m.ranks:
        r["cpu_wait_ms"] = cpu_wait_ms
        r["exposed_transfer_ms"] = r["ddp_exposed_transfer_ms"] = exposed_ms
        r["overlap_ratio"] = 0.1
    rules = [r for r in load_rules() if r.name in RULES]
    return {f.name: f.message for f in evaluate(rules, m).findings}


def test_a_busy_host_is_named_in_the_overlap_and_bucket_findings(metrics) -> None:
    found = _findings(metrics, cpu_wait_ms=20.0, exposed_ms=12.0)
    assert set(found) == set(RULES), found
    for message in found.values():
        assert "The host was busy too" in message and "20.0 ms per step for a CPU" in message, message


def test_a_quiet_host_or_a_small_wait_is_not_mentioned(metrics) -> None:
    for wait in (0.0, 5.0):  # 5 ms of CPU wait against 12 ms exposed: under half, the finding stands alone
        found = _findings(metrics, cpu_wait_ms=wait, exposed_ms=12.0)
        assert set(found) == set(RULES), found
        assert not any("host was busy" in m for m in found.values()), found


def test_a_job_that_already_uses_static_graph_is_not_told_to_use_it(metrics) -> None:
    """DDP's logging data says static_graph=True: the overlap finding says the buckets are already in order and its
    advice leaves static_graph out; without it, the advice names it."""
    m = copy.deepcopy(metrics)
    for r in m.ranks:
        r["cpu_wait_ms"], r["exposed_transfer_ms"], r["overlap_ratio"] = 0.0, 12.0, 0.1
        r["ddp_exposed_transfer_ms"] = 12.0
    rule = [r for r in load_rules() if r.name == "poor-comm-compute-overlap"]
    plain = evaluate(rule, m).findings[0]
    assert "use static_graph=True" in plain.recommendation and "static_graph=True here" not in plain.message
    for r in m.ranks:
        r["ddp_static_graph"], r["ddp_find_unused_parameters"] = 1, None
    static = evaluate(rule, m).findings[0]
    assert "DDP runs with static_graph=True here" in static.message, static.message
    assert "use static_graph=True" not in static.recommendation, static.recommendation
    assert "bucket_cap_mb" in static.recommendation
