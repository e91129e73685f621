"""The reviewed verdicts on every trace set in ../shared/traces: what ddpdoctor must find, must not find, and must
leave "not evaluated" (with a reason true for that input). The table, with the numbers that justify each verdict
against the reference figures of ../shared/traces/README.md (HTA 0.5.0, torch-tb-profiler 0.4.3), is
tests/real_traces/EXPECTED.md; these tests hold ddpdoctor to it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from ddpdoctor.diagnosis import evaluate, load_rules
from ddpdoctor.load import load
from ddpdoctor.metrics import analyze

DDP_ONLY = (
    "poor-comm-compute-overlap",
    "find-unused-parameters-cost",
    "ddp-bucket-size-mismatch",
    "broadcast-buffers-cost",
    "missing-distributed-sampler",
    "allreduce-every-microstep",
)


@cache
def _diagnose(root: str, name: str):  # noqa: ANN202
    metrics = analyze(load(Path(root) / name, workers=1))
    result = evaluate(load_rules(), metrics)
    findings = {f.name: f for f in result.findings}
    reasons = {n.name: n.reason for n in result.not_evaluated}
    return metrics, findings, reasons, set(result.passed)


def test_every_trace_set_has_a_reviewed_row(traces_dir: Path) -> None:
    sets = {str(p.parent.relative_to(traces_dir)) for p in traces_dir.glob("*/*/*.json*")}
    assert sets == set(PARALLELISM), "a new trace set needs its row in EXPECTED.md and here"
    table = (Path(__file__).parent / "EXPECTED.md").read_text()
    assert all(f"| {name} |" in table for name in sets)


PARALLELISM = {
    "tb-profiler/resnet50_num_workers_0": "single",
    "tb-profiler/resnet50_num_workers_4": "single",
    "hta/nccl_parser_config": "ddp",
    "hta/df_index_resolver": "ddp",
    "hta/ns_resolution_trace": "ddp",
    "astra-sim/megatron_tp8_a100_8ranks": "tp",
    "tracelens/mi300_resnet_act_checkpoint": "ddp",
}
FINDINGS = {
    "tb-profiler/resnet50_num_workers_0": {"dataloader-bound"},
    "tb-profiler/resnet50_num_workers_4": set(),
    "hta/nccl_parser_config": set(),
    "hta/df_index_resolver": {"poor-comm-compute-overlap"},
    "hta/ns_resolution_trace": set(),
    "astra-sim/megatron_tp8_a100_8ranks": {"rank-straggler"},
    "tracelens/mi300_resnet_act_checkpoint": {"poor-comm-compute-overlap"},
}


@pytest.mark.parametrize("name", sorted(PARALLELISM))
def test_parallelism_and_exactly_the_expected_findings(traces_dir: Path, name: str) -> None:
    metrics, findings, reasons, passed = _diagnose(str(traces_dir), name)
    assert metrics.run["parallelism"] == PARALLELISM[name], metrics.run["parallelism_evidence"]
    assert set(findings) == FINDINGS[name], {f: findings[f].message for f in findings}
    # every verdict is one of three: found, passed, or not evaluated with a reason
    assert all(reason for reason in reasons.values())


def test_resnet_without_workers_is_dataloader_bound_as_tb_profiler_says(traces_dir: Path) -> None:
    metrics, findings, _, passed = _diagnose(str(traces_dir), "tb-profiler/resnet50_num_workers_0")
    r = metrics.ranks[0]
    # tb-profiler: DataLoader 59,262 of 177,592 and 35,504 of 154,911 µs: about 28% of a step
    assert 0.2 < r["dataloader_ms"] / r["step_ms_median"] < 0.35
    assert findings["dataloader-bound"].ranks == (0,)
    # GPU memory from torch 1.9's size-only [memory] events: a lower bound, far from the 32 GiB V100's limit
    assert "gpu0-oom-risk" in passed
    assert 2 * 2**30 < metrics.run["gpu0_peak_reserved_bytes"] < 4 * 2**30
    assert metrics.run["gpu0_capacity_bytes"] == 34084028416  # deviceProperties[0].totalGlobalMem


def test_resnet_with_workers_is_not_dataloader_bound(traces_dir: Path) -> None:
    metrics, _, _, passed = _diagnose(str(traces_dir), "tb-profiler/resnet50_num_workers_4")
    r = metrics.ranks[0]
    assert "dataloader-bound" in passed and r["dataloader_ms"] / r["step_ms_median"] < 0.02  # tb: 1,186 / 141,068


def test_one_rank_of_two_no_bandwidth_verdict_and_overlap_below_the_exposed_threshold(traces_dir: Path) -> None:
    metrics, _, reasons, passed = _diagnose(str(traces_dir), "hta/nccl_parser_config")
    r = metrics.ranks[0]
    assert 100 * r["overlap_ratio"] == pytest.approx(14.31, abs=1.0)  # HTA
    assert "poor-comm-compute-overlap" in passed and r["exposed_comm_ms"] / r["step_ms_median"] < 0.05
    assert "only 1 of the 2 ranks is in the data" in reasons["low-collective-bandwidth"]
    assert "no [memory] events" in reasons["gpu0-oom-risk"]


def test_one_rank_of_two_without_gpu0_memory(traces_dir: Path) -> None:
    metrics, findings, reasons, _ = _diagnose(str(traces_dir), "hta/df_index_resolver")
    f = findings["poor-comm-compute-overlap"]
    assert f.ranks == (1,) and f.evidence["mean(overlap_ratio)"] == 0.0  # HTA: 0.0
    # no claim to have separated waiting from transfer: it says the exposed time includes the wait
    assert "not counting" not in f.message and "The data holds 1 of the 2 ranks" in f.message
    assert "only 1 of the 2 ranks is in the data" in reasons["low-collective-bandwidth"]
    assert reasons["gpu0-oom-risk"].endswith(
        "cuda:0 is not in the data: the loaded rank(s) 1 recorded memory on cuda:1 only"
    )
    assert metrics.ranks[0]["peak_reserved_bytes"] == 12782141440 < metrics.ranks[0]["capacity_bytes"]


def test_trace_without_nccl_kernels_has_no_overlap_verdict(traces_dir: Path) -> None:
    _, _, reasons, _ = _diagnose(str(traces_dir), "hta/ns_resolution_trace")
    assert "overlap_ratio" in reasons["poor-comm-compute-overlap"]  # HTA: NaN, no communication kernels
    # true for this input: the calls are there (7 per step), the kernels that would time them are not
    assert "7 collective call(s) per step but no communication kernels" in reasons["poor-comm-compute-overlap"]
    assert "no collective communication was found" not in reasons["poor-comm-compute-overlap"]


def test_megatron_tensor_parallel_two_slow_ranks(traces_dir: Path) -> None:
    metrics, findings, reasons, passed = _diagnose(str(traces_dir), "astra-sim/megatron_tp8_a100_8ranks")
    f = findings["rank-straggler"]
    assert f.ranks == (0, 6)  # HTA idle: 37.38% and 34.43%; every other rank 0.53-10.79%
    share = {r["rank"]: r["last_arrival_share"] for r in metrics.ranks}
    assert round(share[0] * 84) == 32 and round(share[6] * 84) == 34
    assert all(share[r] < 0.15 for r in (1, 2, 3, 4, 5, 7))
    assert metrics.run["slow_rank_count"] == 2 and metrics.run["straggler_collectives"] == 84
    assert 350 < metrics.run["straggler_wait_ms"] < 450  # the six others wait ~0.4 s of a 0.6 s step
    assert f.evidence["wait_caused_ms"]["0"] > 100 and f.evidence["wait_caused_ms"]["6"] > 100
    assert "Weak evidence: only 1 step(s) analysed" in f.message  # one ProfilerStep#3 in these traces
    for rule in DDP_ONLY:  # no DDP advice for a tensor-parallel job
        assert "tensor parallel (tp)" in reasons[rule], rule
    assert "no [memory] events" in reasons["gpu0-oom-risk"]  # README: no [memory] events
    # bandwidth from the last peer's arrival to the end (issue 26 item 3): the same on every rank, waiting left out
    busbw = {round(r["busbw_gbps"], 1) for r in metrics.ranks}
    assert busbw == {189.9}, busbw
    assert "low-collective-bandwidth" in passed


def test_mi300_one_rank_of_eight(traces_dir: Path) -> None:
    metrics, findings, reasons, _ = _diagnose(str(traces_dir), "tracelens/mi300_resnet_act_checkpoint")
    assert metrics.run["ranks_missing"] == 7
    assert metrics.ranks[0]["busbw_gbps"] is None  # withdrawn: waiting for 7 ranks is inside every collective
    assert "only 1 of the 8 ranks is in the data" in reasons["low-collective-bandwidth"]
    f = findings["poor-comm-compute-overlap"]
    assert "The data holds 1 of the 8 ranks" in f.message and "not counting" not in f.message


def test_two_ranks_of_eight_sampled_no_bandwidth_verdict(traces_dir: Path, tmp_path: Path) -> None:
    # HTA-style sampling: only ranks 0 and 1 of the eight Megatron ranks (links in a temporary folder)
    for r in (0, 1):
        name = f"megatron_kineto_{r}.json.gz"
        (tmp_path / name).symlink_to(traces_dir / "astra-sim/megatron_tp8_a100_8ranks" / name)
    metrics = analyze(load(tmp_path, workers=1))
    result = evaluate(load_rules(), metrics)
    reasons = {n.name: n.reason for n in result.not_evaluated}
    assert metrics.run["ranks_missing"] == 6 and all(r["busbw_gbps"] is None for r in metrics.ranks)
    assert "only 2 of the 8 ranks are in the data" in reasons["low-collective-bandwidth"]
    # rank 0 is slow against rank 1 too (last at most of the 84 all-reduces of the pair)
    found = {f.name: f for f in result.findings}
    assert found["rank-straggler"].ranks == (0,)
