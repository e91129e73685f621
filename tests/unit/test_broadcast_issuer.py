"""Which code issued a broadcast (issue 26 item 1), on synthetic 2-rank gloo traces: DDP's buffer broadcast is issued
inside ``DistributedDataParallel.forward``; ZeroRedundancyOptimizer's parameter broadcasts inside its
``Optimizer.step#ZeroRedundancyOptimizer.step``; without either range the trace cannot tell, and
``buffer_broadcast_ms`` is not measured (broadcast-buffers-cost says so instead of guessing). Two broadcasts run at
once on gloo's two threads, [100, 300) and [150, 350): 250 µs of wall time, not 400. What they cost is their
transfer (``buffer_broadcast_transfer_ms``), from the moment the last rank arrived: a rank that waits in them for a
late one spends longer there, and that wait is not theirs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.diagnosis import evaluate, load_rules
from ddpdoctor.load import load
from ddpdoctor.metrics import analyze

MAIN = 100


def _x(name: str, cat: str, ts: float, dur: float, tid: int = MAIN, **args: object) -> dict:
    e: dict = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def _trace(rank: int, issuer: str | None, late_us: float = 0.0) -> dict:
    """``late_us``: rank 1 reaches the broadcasts that much later, and rank 0 waits that much longer in them."""
    sized = {"Input Dims": [[1000]], "Input type": ["float"]}
    call = late_us if rank == 1 else 0.0
    waits = late_us if rank == 0 else 0.0
    events: list[dict] = []
    for s in range(3):
        t0 = 10_000.0 + s * 1000.0
        events.append(_x(f"ProfilerStep#{s + 1}", "user_annotation", t0, 1000.0))
        if issuer is not None:
            events.append(_x(issuer, "user_annotation", t0 + 50.0, 400.0))
        for ts, tid in ((100.0 + call, 201), (150.0 + call, 202)):
            events.append(_x("c10d::broadcast_", "cpu_op", t0 + ts, 5.0, **sized))
            events.append(_x("gloo:broadcast", "user_annotation", t0 + ts, 200.0 + waits, tid=tid, **sized))
        events.append(_x("c10d::allreduce_", "cpu_op", t0 + 600.0, 5.0, **sized))
        events.append(_x("gloo:all_reduce", "user_annotation", t0 + 600.0, 100.0, tid=201, **sized))
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2},
        "traceEvents": events,
    }


def _metrics(tmp_path: Path, issuer: str | None, late_us: float = 0.0):  # noqa: ANN202
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.pt.trace.json").write_text(json.dumps(_trace(rank, issuer, late_us)))
    return analyze(load(tmp_path, workers=1))


def test_broadcasts_in_ddp_forward_are_buffer_broadcasts_counted_once(tmp_path: Path) -> None:
    metrics = _metrics(tmp_path, "DistributedDataParallel.forward")
    assert [r["buffer_broadcast_ms"] for r in metrics.ranks] == pytest.approx([0.250, 0.250], abs=1e-6)
    assert [r["buffer_broadcast_transfer_ms"] for r in metrics.ranks] == pytest.approx([0.250, 0.250], abs=1e-6)
    assert [r["optimizer_collectives_per_step"] for r in metrics.ranks] == [0.0, 0.0]


def test_the_wait_for_a_late_rank_is_not_the_broadcasts_transfer(tmp_path: Path) -> None:
    """Rank 1 reaches DDP's forward 200 µs after rank 0, which waits for it in both broadcasts: rank 0 spends 450 µs
    in them, rank 1 250 µs; each moves data for 200 µs from the moment rank 1 arrived (250 µs unioned) on both.
    Without broadcast_buffers rank 0 would wait for rank 1 at the next collective: the wait is no cost of them."""
    metrics = _metrics(tmp_path, "DistributedDataParallel.forward", late_us=200.0)
    assert [r["buffer_broadcast_ms"] for r in metrics.ranks] == pytest.approx([0.450, 0.250], abs=1e-6)
    assert [r["buffer_broadcast_transfer_ms"] for r in metrics.ranks] == pytest.approx([0.250, 0.250], abs=1e-6)


def test_broadcasts_in_zero_s_step_are_its_parameter_sync(tmp_path: Path) -> None:
    metrics = _metrics(tmp_path, "Optimizer.step#ZeroRedundancyOptimizer.step")
    assert [r["buffer_broadcast_ms"] for r in metrics.ranks] == [0.0, 0.0]
    assert [r["buffer_broadcast_transfer_ms"] for r in metrics.ranks] == [0.0, 0.0]
    assert [r["optimizer_collectives_per_step"] for r in metrics.ranks] == [2.0, 2.0]
    assert metrics.run["parallelism"].endswith("+zero1") or metrics.run["parallelism"] == "zero1"


def test_without_ranges_the_issuer_is_not_guessed(tmp_path: Path) -> None:
    metrics = _metrics(tmp_path, None)
    assert [r["buffer_broadcast_ms"] for r in metrics.ranks] == [None, None]
    assert [r["buffer_broadcast_transfer_ms"] for r in metrics.ranks] == [None, None]
    reasons = {n.name: n.reason for n in evaluate(load_rules(), metrics).not_evaluated}
    assert "buffer_broadcast_ms" in reasons["broadcast-buffers-cost"]
    assert "cannot be told" in reasons["broadcast-buffers-cost"]
