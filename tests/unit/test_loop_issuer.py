"""The training loop's own collectives (``metrics.issuers.issuers`` "loop") against DDP's gradient all-reduce
("backward"), on synthetic 2-rank gloo traces whose times are exact: per step a forward inside
``DistributedDataParallel.forward``, a backward whose ``autograd::engine::evaluate_function`` range issues DDP's
all-reduce (hidden under a matmul), an optimizer step, then a logging all-reduce of 1.5 ms with nothing computing
(exposed). ``loop_exposed_transfer_ms`` is that 1.5 ms; ``poor-comm-compute-overlap`` leaves it out of DDP's time and
``loop-collectives-exposed`` fires on it. Without the backward range, or without DDP's forward range, nothing is
placed in the loop and nothing is left out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ddpdoctor.diagnosis import evaluate, load_rules
from ddpdoctor.load import load
from ddpdoctor.metrics import analyze

MAIN, GLOO = 100, 201
SIZED = {"Input Dims": [[1000]], "Input type": ["float"]}


def _x(name: str, cat: str, ts: float, dur: float, tid: int = MAIN, **args: object) -> dict:
    e: dict = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def _allreduce(ts: float, dur: float, tid: int = MAIN) -> list[dict]:
    return [
        _x("c10d::allreduce_", "cpu_op", ts, 5.0, tid=tid, **SIZED),
        _x("gloo:all_reduce", "user_annotation", ts, dur, tid=GLOO, **SIZED),
    ]


def _trace(
    rank: int,
    *,
    ddp: bool = True,
    autograd: bool = True,
    loop: bool = True,
    loop_tid: int = MAIN,
    closure: bool = False,
) -> dict:
    events: list[dict] = []
    for s in range(6):
        t0 = 10_000.0 + s * 5000.0
        events.append(_x(f"ProfilerStep#{s + 1}", "user_annotation", t0, 5000.0))
        if ddp:
            events.append(_x("DistributedDataParallel.forward", "user_annotation", t0 + 100.0, 900.0))
        events.append(_x("aten::mm", "cpu_op", t0 + 150.0, 800.0))  # forward
        if autograd:
            events.append(_x("autograd::engine::evaluate_function: MmBackward0", "cpu_op", t0 + 1100.0, 1200.0))
        events.append(_x("aten::mm", "cpu_op", t0 + 1110.0, 1180.0))  # backward's work: hides DDP's all-reduce
        if autograd:
            events.append(
                _x("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", "cpu_op", t0 + 1500.0, 20.0)
            )
        events += _allreduce(t0 + 1505.0, 600.0)  # DDP's bucket, issued from its hook, under the backward matmul
        if closure:  # Lightning's automatic optimisation, LBFGS: forward and backward run inside the step
            events.append(_x("Optimizer.step#SGD.step", "user_annotation", t0 + 50.0, 2650.0))
        else:
            events.append(_x("Optimizer.step#SGD.step", "user_annotation", t0 + 2400.0, 300.0))
        events.append(_x("aten::add_", "cpu_op", t0 + 2410.0, 280.0))
        if loop:
            events += _allreduce(t0 + 3000.0, 1500.0, loop_tid)  # the loop's logging all-reduce, nothing beside it
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2},
        "traceEvents": events,
    }


def _diagnose(tmp_path: Path, **kw: Any):  # noqa: ANN202
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.pt.trace.json").write_text(json.dumps(_trace(rank, **kw)))
    metrics = analyze(load(tmp_path, workers=1))
    result = evaluate(load_rules(), metrics)
    return metrics, {f.name: f for f in result.findings}, {n.name: n.reason for n in result.not_evaluated}


def test_the_logging_all_reduce_is_the_loops_and_ddps_is_hidden(tmp_path: Path) -> None:
    metrics, findings, _ = _diagnose(tmp_path)
    for r in metrics.ranks:
        assert r["loop_exposed_transfer_ms"] == pytest.approx(1.5, abs=1e-6), r
        assert r["exposed_transfer_ms"] == pytest.approx(1.5, abs=1e-6), r  # DDP's all-reduce is hidden
        assert r["optimizer_exposed_transfer_ms"] == 0.0
    loop = findings["loop-collectives-exposed"]
    assert loop.estimated_gain_ms == pytest.approx(1.5, abs=1e-3)
    assert "1.5 ms per step" in loop.message
    # DDP's own exposed time is 0: its overlap is not the problem, whatever the overlap ratio says
    assert "poor-comm-compute-overlap" not in findings


def test_ddps_all_reduce_inside_an_optimizer_closure_is_still_the_backward_passs(tmp_path: Path) -> None:
    """Forward and backward inside ``optimizer.step(closure)``: DDP's all-reduce is issued in the backward pass,
    not the optimizer's own (ZeRO's) collective, and the loop's logging all-reduce is still the loop's."""
    metrics, findings, _ = _diagnose(tmp_path, closure=True)
    for r in metrics.ranks:
        assert r["optimizer_exposed_transfer_ms"] == 0.0, r
        assert r["loop_exposed_transfer_ms"] == pytest.approx(1.5, abs=1e-6), r
        assert r["ddp_exposed_transfer_ms"] == pytest.approx(0.0, abs=1e-6), r
    assert "loop-collectives-exposed" in findings


def test_without_the_loops_collective_nothing_is_left_out(tmp_path: Path) -> None:
    metrics, findings, _ = _diagnose(tmp_path, loop=False)
    assert [r["loop_exposed_transfer_ms"] for r in metrics.ranks] == [0.0, 0.0]
    assert "loop-collectives-exposed" not in findings


def test_a_collective_issued_by_another_thread_is_not_the_loops(tmp_path: Path) -> None:
    """Issued outside every range by a thread that does not run DDP's forward (a comm hook's callback on a backend
    thread, say): not placed, so not the loop's."""
    metrics, findings, _ = _diagnose(tmp_path, loop_tid=300)
    assert [r["loop_exposed_transfer_ms"] for r in metrics.ranks] == [0.0, 0.0]
    assert "loop-collectives-exposed" not in findings


@pytest.mark.parametrize("missing", ["autograd", "ddp"])
def test_without_backward_or_ddp_ranges_nothing_is_the_loops(tmp_path: Path, missing: str) -> None:
    """Without the autograd ranges DDP's all-reduce cannot be told from the loop's (gradients all-reduced by hand
    look the same); without DDP's forward range nothing is placed at all: the whole exposed time stays the rule's."""
    metrics, findings, reasons = _diagnose(tmp_path, **{missing: False})
    assert [r["loop_exposed_transfer_ms"] for r in metrics.ranks] == [None, None]
    assert "cannot be told" in reasons["loop-collectives-exposed"]
    overlap = findings["poor-comm-compute-overlap"]
    assert overlap.estimated_gain_ms == pytest.approx(1.5, abs=1e-3)
    assert "the training loop issues itself" not in overlap.message
