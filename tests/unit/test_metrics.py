"""Metrics on the recorded 2-rank gloo DDP run, where rank 1 sleeps 20 ms per step before its forward pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ddpdoctor.load import load
from ddpdoctor.metrics import analyze, summarize_rank
from ddpdoctor.metrics import intervals as iv
from ddpdoctor.metrics.comm import bus_factor, kind_of
from ddpdoctor.metrics.result import RANK_METRICS, RUN_METRICS

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank"
STRAGGLER_SLEEP_MS = 20.0  # tests/fixtures/make_ddp_gloo_2rank.py


@pytest.fixture(scope="module")
def run():
    return load(FIXTURE, workers=1)


@pytest.fixture(scope="module")
def metrics(run):
    return analyze(run)


def test_every_contract_metric_is_reported(metrics) -> None:
    for r in metrics.ranks:
        assert set(RANK_METRICS) <= set(r)
    assert set(RUN_METRICS) <= set(metrics.run)
    json.dumps(metrics.to_json())  # serialisable


def test_breakdown_sums_to_the_step(metrics) -> None:
    ps = metrics.per_step
    names = ["dataloader_ms", "forward_ms", "backward_ms", "optimizer_ms", "exposed_comm_ms", "other_ms"]
    parts = np.column_stack([ps[n].astype(float) for n in names])
    # other_ms is the remainder, so the parts add up to the step up to float rounding
    assert np.allclose(parts.sum(axis=1), ps["step_ms"], rtol=1e-9, atol=1e-6)
    assert (parts >= 0).all()
    assert len(ps) == 12 and ps["analyzed"].all()  # CPU only: nothing can be in flight at a step's end


def test_straggler_is_the_rank_that_sleeps(metrics) -> None:
    assert metrics.run["straggler_rank"] == 1
    r0, r1 = metrics.rank(0), metrics.rank(1)
    # rank 0 waits in its all-reduces for the sleeping rank; allow 50% for a shared 2-core machine's noise
    assert r0["collective_wait_ms"] == pytest.approx(STRAGGLER_SLEEP_MS, rel=0.5)
    assert r1["collective_wait_ms"] < 0.25 * r0["collective_wait_ms"]
    assert r1["late_arrival_ms"] > 0.5 * STRAGGLER_SLEEP_MS and r0["late_arrival_ms"] < 1.0
    # the run-level figure is rank 0's wait in its median step (robust to one descheduled step)
    assert metrics.run["straggler_wait_ms"] == pytest.approx(STRAGGLER_SLEEP_MS, rel=0.5)
    assert metrics.run["straggler_late_share"] >= 0.8
    # the waiting shows up as exposed communication on rank 0, not on rank 1
    assert r0["exposed_comm_ms"] > 0.5 * STRAGGLER_SLEEP_MS > r1["exposed_comm_ms"]


def test_comm_sizes_bandwidth_and_ddp_config(metrics) -> None:
    c = metrics.collectives
    assert set(c["kind"]) == {"all_reduce"}
    # 2 buckets of 267786 + 131584 floats per step, 6 steps
    assert c["bytes"][c["rank"] == 0][0] == 6 * (267786 + 131584) * 4
    r = metrics.rank(0)
    assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * bus_factor("all_reduce", 2))
    assert 0 <= r["overlap_ratio"] <= 1
    assert r["ddp_bucket_count"] == 2 and r["ddp_bucket_cap_mb"] == pytest.approx(0.5)
    assert r["ddp_find_unused_parameters"] is False and r["ddp_broadcast_buffers"] is True
    assert 0 <= r["ddp_reported_overlap_ratio"] <= 1
    assert r["local_world_size"] == 2 and r["cpu_count"] >= 1
    assert r["gpu_util_ratio"] is None and r["dp_replicas"] is None


def test_summaries_give_the_same_metrics_as_traces(tmp_path: Path, run, metrics) -> None:
    shutil.copytree(FIXTURE, tmp_path / "run")
    for rt in run.ranks:
        summary = summarize_rank(rt, run.capture[rt.rank])
        (tmp_path / "run" / "ranks" / f"rank{rt.rank}.summary.json").write_text(json.dumps(summary))
    fast = load(tmp_path / "run", use_summaries=True)
    assert all(r.summary is not None and not r.has_trace for r in fast.ranks)
    again = analyze(fast)
    assert again.to_json()["ranks"] == metrics.to_json()["ranks"]
    assert again.run["straggler_rank"] == metrics.run["straggler_rank"]


def test_interval_algebra() -> None:
    a = iv.union(np.array([0.0, 5, 6, 20]), np.array([4.0, 8, 7, 30]))
    assert a[0].tolist() == [0, 5, 20] and a[1].tolist() == [4, 8, 30]
    b = iv.union(np.array([2.0, 25]), np.array([6.0, 40]))
    assert iv.total(iv.intersect(a, b)) == 2 + 1 + 5
    assert iv.total(iv.subtract(a, b)) == iv.total(a) - 8
    assert iv.coverage(a, np.array([0.0, 3, 21]), np.array([10.0, 5, 50])).tolist() == [7, 1, 9]


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("nccl:all_reduce", "all_reduce"),
        ("gloo:all_reduce", "all_reduce"),
        ("allgather", "all_gather"),
        ("nccl:_reduce_scatter_base", "reduce_scatter"),
        ("ncclDevKernel_AllGather_RING_LL(x)", "all_gather"),
        ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*)", "broadcast"),
        ("nccl:all_to_all", "all_to_all"),
        ("gloo:barrier", "barrier"),
        ("nccl:send", "send"),
        ("nccl:recv", "recv"),
        ("nccl:reduce", "reduce"),
    ],
)
def test_collective_kinds(name: str, kind: str) -> None:
    assert kind_of(name) == kind


def test_a_rank_row_from_the_template_is_the_row_of_metric_by_metric_lookups() -> None:
    from ddpdoctor.metrics import analysis
    from ddpdoctor.metrics.result import RANK_METRICS

    run = load(Path(__file__).resolve().parents[2] / "samples" / "recorded" / "ddp_straggler", use_summaries=True)
    summaries = [rt.summary for rt in run.ranks]
    for row in analyze(run).ranks:  # every rank metric in catalog order after the rank, then the others
        assert list(row)[: 1 + len(RANK_METRICS)] == ["rank", *RANK_METRICS]
    partial = {k: v for i, (k, v) in enumerate(summaries[0]["metrics"].items()) if i % 3}  # metrics left out
    for metrics, rank in [*((s["metrics"], s["rank"]) for s in summaries), (partial, 7)]:
        want = {"rank": rank, **{k: metrics.get(k) for k in RANK_METRICS}}
        assert metrics.keys() <= analysis._ROW_KEYS
        got = analysis._ROW_TEMPLATE.copy()
        got.update(metrics)
        got["rank"] = rank
        assert got == want and list(got) == list(want)
