"""Which code issued a broadcast (issue 26 item 1), on synthetic 2-rank gloo traces: DDP's buffer broadcast is issued
inside ``DistributedDataParallel.forward``; ZeroRedundancyOptimizer's parameter broadcasts inside its
``Optimizer.step#ZeroRedundancyOptimizer.step``; without either range the trace cannot tell, and
``buffer_broadcast_ms`` is not measured (broadcast-buffers-cost says so instead of guessing). Two broadcasts run at
once on gloo's two threads, [100, 300) and [150, 350): 250 µs of wall time, not 400."""

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


def _trace(rank: int, issuer: str | None) -> dict:
    sized = {"Input Dims": [[1000]], "Input type": ["float"]}
    events: list[dict] = []
    for s in range(3):
        t0 = 10_000.0 + s * 1000.0
        events.append(_x(f"ProfilerStep#{s + 1}", "user_annotation", t0, 1000.0))
        if issuer is not None:
            events.append(_x(issuer, "user_annotation", t0 + 50.0, 400.0))
        for ts, tid in ((100.0, 201), (150.0, 202)):
            events.append(_x("c10d::broadcast_", "cpu_op", t0 + ts, 5.0, **sized))
            events.append(_x("gloo:broadcast", "user_annotation", t0 + ts, 200.0, tid=tid, **sized))
        events.append(_x("c10d::allreduce_", "cpu_op", t0 + 600.0, 5.0, **sized))
        events.append(_x("gloo:all_reduce", "user_annotation", t0 + 600.0, 100.0, tid=201, **sized))
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2},
        "traceEvents": events,
    }


def _metrics(tmp_path: Path, issuer: str | None):  # noqa: ANN202
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.pt.trace.json").write_text(json.dumps(_trace(rank, issuer)))
    return analyze(load(tmp_path, workers=1))


def test_broadcasts_in_ddp_forward_are_buffer_broadcasts_counted_once(tmp_path: Path) -> None:
    metrics = _metrics(tmp_path, "DistributedDataParallel.forward")
    assert [r["buffer_broadcast_ms"] for r in metrics.ranks] == pytest.approx([0.250, 0.250], abs=1e-6)
    assert [r["optimizer_collectives_per_step"] for r in metrics.ranks] == [0.0, 0.0]


def test_broadcasts_in_zero_s_step_are_its_parameter_sync(tmp_path: Path) -> None:
    metrics = _metrics(tmp_path, "Optimizer.step#ZeroRedundancyOptimizer.step")
    assert [r["buffer_broadcast_ms"] for r in metrics.ranks] == [0.0, 0.0]
    assert [r["optimizer_collectives_per_step"] for r in metrics.ranks] == [2.0, 2.0]
    assert metrics.run["parallelism"].endswith("+zero1") or metrics.run["parallelism"] == "zero1"


def test_without_ranges_the_issuer_is_not_guessed(tmp_path: Path) -> None:
    metrics = _metrics(tmp_path, None)
    assert [r["buffer_broadcast_ms"] for r in metrics.ranks] == [None, None]
    reasons = {n.name: n.reason for n in evaluate(load_rules(), metrics).not_evaluated}
    assert "buffer_broadcast_ms" in reasons["broadcast-buffers-cost"]
    assert "cannot be told" in reasons["broadcast-buffers-cost"]
