"""The engine's evidence rules: a rule whose inputs are absent is "not evaluated", never passed; the reason is the
one the metrics gave for this input; a rule that does not fit the job's parallelism is not evaluated."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from ddpdoctor.diagnosis import evaluate, load_rules, select_rules

INPUTS = Path(__file__).resolve().parents[1] / "golden" / "inputs"


def _metrics(**run: object) -> SimpleNamespace:
    data = json.loads((INPUTS / "ddp_4ranks.json").read_text())
    data["run"].update(run)
    frames = {k: pd.DataFrame(data[k]) for k in ("per_step", "collectives", "devices")}
    return SimpleNamespace(run=data["run"], ranks=data["ranks"], **frames)


def _one(metrics: SimpleNamespace, rule: str):  # noqa: ANN202
    return evaluate(select_rules(load_rules(), [rule]), metrics)


def test_tensor_parallel_job_gets_no_ddp_advice() -> None:
    m = _metrics(parallelism="tp", parallelism_evidence="84 collectives per step inside tensor-parallel layers")
    for rule in ("poor-comm-compute-overlap", "ddp-bucket-size-mismatch", "find-unused-parameters-cost"):
        result = _one(m, rule)
        assert result.findings == () and result.passed == ()
        (item,) = result.not_evaluated
        assert "this run is tensor parallel (tp) (84 collectives per step" in item.reason
    # the straggler and bandwidth checks fit any synchronous job
    assert [f.name for f in _one(m, "rank-straggler").findings] == ["rank-straggler"]
    assert [f.name for f in _one(m, "low-collective-bandwidth").findings] == ["low-collective-bandwidth"]


def test_a_mix_is_judged_by_every_part() -> None:
    # same data on every rank of a TP group is the design, not a missing DistributedSampler
    result = _one(_metrics(parallelism="tp+ddp", data_duplication_factor=2.0), "missing-distributed-sampler")
    assert result.findings == () and "tensor parallel (tp)" in result.not_evaluated[0].reason
    found = _one(_metrics(parallelism="ddp", data_duplication_factor=2.0), "missing-distributed-sampler")
    assert [f.name for f in found.findings] == ["missing-distributed-sampler"]


def test_absent_inputs_are_not_evaluated_with_the_reason_the_metrics_gave() -> None:
    why = "only 1 of the 8 ranks is in the data: a collective's time includes waiting for the 7 absent rank(s)"
    m = _metrics(not_measured={"busbw_gbps": why})
    for row in m.ranks:
        row["busbw_gbps"] = None
    result = _one(m, "low-collective-bandwidth")
    assert result.passed == () and result.findings == ()
    assert result.not_evaluated[0].reason == f"not measured in this run: busbw_gbps; {why}"


def test_never_passed_on_a_short_circuit_of_missing_data() -> None:
    # world_size > 1 is false for one rank, but the data duplication was never measured: not "passed"
    m = _metrics(world_size=1, data_duplication_factor=None)
    result = _one(m, "missing-distributed-sampler")
    assert result.passed == () and "data_duplication_factor" in result.not_evaluated[0].reason


def test_ranks_that_never_synchronise_lead_the_report() -> None:
    m = _metrics(parallelism="none")
    for row in m.ranks:
        row["collectives_per_step"] = 0.0
        row["ddp_bucket_count"] = None  # no DDP model anywhere
        row["ddp_ranges"] = False
    result = evaluate(load_rules(), m)
    errors = [f.name for f in result.findings if f.severity == "error"]
    assert [f.name for f in result.findings[: len(errors)]] == errors  # errors lead, before costlier warnings
    assert "ranks-never-synchronize" in errors
    reasons = {n.name: n.reason for n in result.not_evaluated}
    assert "without any synchronisation between its ranks" in reasons["poor-comm-compute-overlap"]
    # the healthy counterpart: collectives every step
    assert "ranks-never-synchronize" in evaluate(load_rules(), _metrics(parallelism="ddp")).passed


def test_a_verdict_on_a_threshold_edge_says_so() -> None:
    m = _metrics()
    m.ranks[2]["dataloader_ms"] = 12.6  # 10.5% of a 120 ms step, threshold 10%
    (f,) = _one(m, "dataloader-bound").findings
    assert "Close to its threshold" in f.message and "(threshold min_share = 0.1)" in f.message
    m.ranks[2]["dataloader_ms"] = 30.0  # 25%: far from it
    (f,) = _one(m, "dataloader-bound").findings
    assert "Close to its threshold" not in f.message


def test_an_edge_in_one_part_of_an_or_does_not_decide_it() -> None:
    # gpu0-oom-risk: 4% headroom (threshold 10%) fires on its own; the 1.37x vs 1.25x comparison is near its edge
    (f,) = _one(_metrics(), "gpu0-oom-risk").findings
    assert "Close to its threshold" not in f.message


def test_timings_from_one_step_are_weak_evidence_and_say_so() -> None:
    m = _metrics(steps_analyzed=1)
    (f,) = _one(m, "dataloader-bound").findings
    assert "Weak evidence: only 1 step(s) analysed" in f.message
    (f,) = _one(_metrics(), "dataloader-bound").findings  # 20 steps
    assert "Weak evidence" not in f.message


def test_a_ddp_model_inside_no_sync_is_not_called_unsynchronised() -> None:
    # gradient accumulation longer than the profiled window: no collective in it, but DDP is there
    m = _metrics(parallelism="none")
    for row in m.ranks:
        row["collectives_per_step"] = 0.0
        row["ddp_ranges"] = True
    result = _one(m, "ranks-never-synchronize")
    assert result.findings == () and result.passed == ("ranks-never-synchronize",)
