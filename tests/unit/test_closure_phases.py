"""Forward and backward that run inside the optimizer's step count as forward and backward (a closure:
Lightning's automatic optimisation, ``optimizer.step(closure)``, LBFGS). Lightning's ``Optimizer.step#SGD.step``
held the closure's ``DistributedDataParallel.forward`` and its backward, and the breakdown gave 7-9 ms of a 33 ms
step to SGD's update, which takes ~1 ms. Synthetic 1-rank CPU traces, three steps of 1 ms each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.load import load
from ddpdoctor.metrics import analyze


def _x(name: str, cat: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 100, "ts": ts, "dur": dur}


def _trace(closure: bool) -> dict:
    events: list[dict] = []
    for s in range(3):
        t0 = 10_000.0 + s * 1000.0
        events.append(_x(f"ProfilerStep#{s + 1}", "user_annotation", t0, 1000.0))
        if closure:  # the step: [100, 900); inside it the forward [150, 350) and the backward [400, 700)
            events.append(_x("Optimizer.step#SGD.step", "user_annotation", t0 + 100.0, 800.0))
        else:  # the forward, the backward, then the update: [100, 150) + [350, 400) + [700, 900) of it
            events.append(_x("Optimizer.step#SGD.step", "user_annotation", t0 + 700.0, 200.0))
        events.append(_x("DistributedDataParallel.forward", "user_annotation", t0 + 150.0, 200.0))
        events.append(_x("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", t0 + 400.0, 300.0))
    return {"schemaVersion": 1, "traceEvents": events}


def _phases(tmp_path: Path, closure: bool) -> dict[str, float]:
    (tmp_path / "rank0.pt.trace.json").write_text(json.dumps(_trace(closure)))
    steps = analyze(load(tmp_path, workers=1)).per_step
    return {k: float(steps[f"{k}_ms"].mean()) for k in ("forward", "backward", "optimizer")}


def test_a_closures_forward_and_backward_are_not_optimizer_time(tmp_path: Path) -> None:
    phases = _phases(tmp_path, closure=True)
    # the forward runs from DistributedDataParallel.forward to the backward (the loss is the forward's)
    assert phases["forward"] == pytest.approx(0.25)
    assert phases["backward"] == pytest.approx(0.3)
    assert phases["optimizer"] == pytest.approx(0.25)  # the step's own time around them: 800 - 250 - 300 us


def test_a_plain_loop_is_split_as_before(tmp_path: Path) -> None:
    phases = _phases(tmp_path, closure=False)
    assert phases["backward"] == pytest.approx(0.3)
    assert phases["optimizer"] == pytest.approx(0.2)


def test_zero_grad_at_the_start_of_a_step_without_forward_ranges_stays_the_optimizers(tmp_path: Path) -> None:
    # no DistributedDataParallel.forward range (one process, FSDP2): the forward is inferred, from the step's
    # start to its backward; the zero_grad in it is the optimizer's, as before
    events: list[dict] = []
    for s in range(3):
        t0 = 10_000.0 + s * 1000.0
        events.append(_x(f"ProfilerStep#{s + 1}", "user_annotation", t0, 1000.0))
        events.append(_x("Optimizer.zero_grad#SGD.zero_grad", "user_annotation", t0, 100.0))
        events.append(_x("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", t0 + 400.0, 300.0))
        events.append(_x("Optimizer.step#SGD.step", "user_annotation", t0 + 700.0, 200.0))
    (tmp_path / "rank0.pt.trace.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    steps = analyze(load(tmp_path, workers=1)).per_step
    assert float(steps["optimizer_ms"].mean()) == pytest.approx(0.3)  # zero_grad 100 us + step 200 us
    assert float(steps["forward_ms"].mean()) == pytest.approx(0.3)  # [100, 400)
    assert float(steps["backward_ms"].mean()) == pytest.approx(0.3)
