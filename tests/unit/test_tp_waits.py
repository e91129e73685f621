"""A tensor-parallel rank waits for its collectives inside the ops that use their results: DTensor's
``aten::linear`` holds ``_c10d_functional::wait_tensor``. That wait is neither the op's work (``same_work.op_work``,
which tells a slower rank from a rank that does more) nor computation that hides the transfer (the breakdown's
exposed communication). Before, a balanced tensor-parallel job on a busy host showed the rank that arrived first
with its ``aten::linear`` 19.7 ms a step against the late rank's 10.5 (the late rank's ops looked faster, and
rank-straggler named it), and 99% of its communication overlapped. Synthetic 1-rank CPU traces, three steps of
1 ms: the main thread's ``aten::linear`` [100, 700) us holds a wait [300, 600) while gloo's thread transfers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.load import load
from ddpdoctor.metrics import analyze
from ddpdoctor.metrics.same_work import op_work


def _x(name: str, cat: str, ts: float, dur: float, tid: int = 100) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def _trace(wait: str | None) -> dict:
    events: list[dict] = []
    for s in range(3):
        t0 = 10_000.0 + s * 1000.0
        events.append(_x(f"ProfilerStep#{s + 1}", "user_annotation", t0, 1000.0))
        events.append(_x("aten::linear", "cpu_op", t0 + 100.0, 600.0))
        events.append(_x("aten::addmm", "cpu_op", t0 + 110.0, 150.0))
        if wait:
            events.append(_x(wait, "cpu_op", t0 + 300.0, 300.0))
            events.append(_x("aten::empty", "cpu_op", t0 + 310.0, 5.0))  # inside the wait: not counted twice
        events.append(_x("aten::add_", "cpu_op", t0 + 800.0, 50.0))
        events.append(_x("gloo:all_reduce", "user_annotation", t0 + 280.0, 330.0, tid=200))
    return {"schemaVersion": 1, "traceEvents": events}


def _load(tmp_path: Path, wait: str | None):
    (tmp_path / "rank0.pt.trace.json").write_text(json.dumps(_trace(wait)))
    return load(tmp_path, workers=1)


@pytest.mark.parametrize("wait", ["_c10d_functional::wait_tensor", "c10d_functional::wait_tensor"])
def test_a_wait_inside_an_op_is_not_its_work(tmp_path: Path, wait: str) -> None:
    rt = _load(tmp_path, wait).ranks[0]
    work = op_work(rt, rt.tables.steps)
    assert work["aten::linear"] == pytest.approx([1.0, 1.0, 0.3])  # 600 us less the 300 us wait it holds
    assert work["aten::add_"] == pytest.approx([1.0, 1.0, 0.05])
    assert wait not in work  # the wait itself is the others' time


def test_without_a_wait_the_op_keeps_its_time(tmp_path: Path) -> None:
    rt = _load(tmp_path, None).ranks[0]
    assert op_work(rt, rt.tables.steps)["aten::linear"] == pytest.approx([1.0, 1.0, 0.6])


def test_a_wait_inside_an_op_does_not_hide_the_transfer(tmp_path: Path) -> None:
    steps = analyze(_load(tmp_path, "_c10d_functional::wait_tensor")).per_step
    # gloo's [280, 610) against the linear's work [100, 300) + [600, 700): exposed [300, 600)
    assert float(steps["exposed_comm_ms"].mean()) == pytest.approx(0.3)
    (tmp_path / "plain").mkdir()
    plain = analyze(_load(tmp_path / "plain", None)).per_step
    assert float(plain["exposed_comm_ms"].mean()) == pytest.approx(0.0)  # the linear's work hides it all


def test_fsdp2s_wait_ranges_inside_an_autograd_node_are_not_its_work(tmp_path: Path) -> None:
    # FSDP2's post-backward hook runs in an autograd node and waits for its reduce-scatter in its own range: a
    # balanced FSDP2 job on a busy host had the early rank's node 8 ms a step longer (its wait), and the late rank's
    # slower matmuls showed as 4.7 ms "slower ops" instead of 15.7
    events: list[dict] = []
    for s in range(3):
        t0 = 10_000.0 + s * 1000.0
        events.append(_x(f"ProfilerStep#{s + 1}", "user_annotation", t0, 1000.0))
        node = "autograd::engine::evaluate_function: RegisterPostBackwardFunctionBackward"
        events.append(_x(node, "cpu_op", t0 + 100.0, 500.0))
        events.append(_x("FSDP::post_backward_reduce", "user_annotation", t0 + 150.0, 400.0))
        events.append(_x("c10d::_reduce_scatter_base_", "cpu_op", t0 + 160.0, 20.0))
        events.append(_x("aten::mm", "cpu_op", t0 + 700.0, 100.0))
    (tmp_path / "rank0.pt.trace.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    rt = load(tmp_path, workers=1).ranks[0]
    work = op_work(rt, rt.tables.steps)
    node_ms = work["autograd::engine::evaluate_function: RegisterPostBackwardFunctionBackward"]
    assert node_ms == pytest.approx([1.0, 1.0, 0.1])  # 500 us less the 400 us range it holds
    assert work["aten::mm"] == pytest.approx([1.0, 1.0, 0.1])
