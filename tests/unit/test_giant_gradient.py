"""One giant gradient (issue 26 item 4): a parameter that is most of the bytes DDP all-reduces is its own cost, and
no bucket_cap_mb changes it. Recorded runs of tests/integration/giant_embedding_job.py
(tests/fixtures/make_giant_gradient.py): ``giant`` (a 20 MB embedding, 98% of the gradient bytes, ready last) and
``spread`` (the same bytes in five equal layers: a real bucket-size case)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from ddpdoctor.diagnosis import evaluate, load_rules
from ddpdoctor.pipeline import analyze_run

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "giant_gradient"


@pytest.fixture(scope="module")
def giant():
    return analyze_run(FIXTURES / "giant")


@pytest.fixture(scope="module")
def spread():
    return analyze_run(FIXTURES / "spread")


def _findings(analysis):
    return {f.name: f for f in analysis.diagnosis.findings}


def test_the_giant_embedding_is_measured_from_ddps_own_parameters(giant):
    for rank in giant.metrics.ranks:
        assert rank["ddp_largest_grad_name"] == "emb.weight"
        assert rank["ddp_largest_grad_module"] == "Embedding"
        assert rank["ddp_largest_grad_bytes"] == 80_000 * 64 * 4
        assert rank["ddp_largest_grad_share"] == pytest.approx(0.984, abs=0.001)
        assert rank["ddp_largest_grad_sparse"] is False


def test_a_giant_gradient_gets_advice_that_can_change_the_number_not_bucket_cap_mb(giant):
    found = _findings(giant)
    assert "ddp-bucket-size-mismatch" not in found
    giant_finding = found["ddp-giant-gradient"]
    assert "emb.weight" in giant_finding.message and "98%" in giant_finding.message
    assert "bucket_cap_mb cannot change" in giant_finding.message
    assert "sparse=True" in giant_finding.recommendation
    assert "lower it" not in giant_finding.recommendation
    # the overlap finding does not point at the bucket count either
    overlap = found.get("poor-comm-compute-overlap")
    if overlap is not None:
        assert "gradient bucket(s), so the first all-reduce" not in overlap.message
        assert "will not help here" in overlap.message


def test_a_normal_spread_of_parameters_still_gets_the_bucket_advice(spread):
    """``spread`` was recorded on a very busy host (its training loops waited 64% of the window for a CPU, their
    other threads up to 309 ms a step against 82 ms of exposed transfer): there the bucket rule cannot tell the
    exposure from the host's and says so; the advice is that of the same metrics on a quiet host."""
    found = _findings(spread)
    assert "ddp-giant-gradient" not in found
    assert max(r["ddp_largest_grad_share"] for r in spread.metrics.ranks) < 0.25
    assert "ddp-bucket-size-mismatch" not in found
    why = {n.name: n.reason for n in spread.diagnosis.not_evaluated}["ddp-bucket-size-mismatch"]
    assert why.startswith("the host was busy, and communication waited for a CPU too"), why
    quiet = copy.deepcopy(spread.metrics)
    quiet.run["host_contended"], quiet.run["host_comm_cpu_wait_ms"] = False, 0.0  # as hostload_metrics sets them
    found = {f.name: f for f in evaluate(load_rules(), quiet).findings}
    assert "ddp-giant-gradient" not in found
    advice = found["ddp-bucket-size-mismatch"].recommendation  # a cap below the current one, from the bytes sent
    assert "Lower bucket_cap_mb on DistributedDataParallel below its 25 MB" in advice, advice
    assert "(e.g. 5 MB)" in advice, advice


def test_the_giant_gradient_rule_prescribes_knobs_try_can_measure():
    from ddpdoctor.diagnosis import find_rule, load_rules

    rule = find_rule(load_rules(), "ddp-giant-gradient")
    assert {p.knob for p in rule.prescriptions} == {"embedding.sparse", "ddp.comm_hook"}
