"""FSDP2 per-unit all-gather and reduce-scatter times on synthetic NCCL traces whose intervals are known exactly
(ddpdoctor.metrics.fsdp), and the three FSDP rules on them: one unit for the whole model, exposed all-gathers,
exposed reduce-scatters, and a well-overlapped job that gets none of them.

Each trace is two ranks of three 20 ms steps; every unit's all-gather is a 400 µs NCCL kernel, each unit's forward
and backward a 1000 µs compute kernel, each reduce-scatter a 300 µs NCCL kernel, launched inside FSDP2's own
``FSDP::all_gather (<fqn>)`` / ``FSDP::post_backward_reduce (<fqn>)`` ranges as FSDP2 launches them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.diagnosis.engine import evaluate
from ddpdoctor.diagnosis.rules import load_rules
from ddpdoctor.load import load
from ddpdoctor.metrics import analyze

TID = 100
STEP_US = 20_000.0
AG_US, COMPUTE_US, RS_US = 400.0, 1000.0, 300.0
BLOCKS = [("layers.0", 1000), ("layers.1", 1000), ("layers.2", 1000), ("", 100)]  # "" is the root


def _x(name: str, cat: str, ts: float, dur: float, tid: int = TID, pid: int = 1, **args: object) -> dict:
    e: dict = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def _trace(
    rank: int,
    units: list[tuple[str, int]],
    hidden: bool,
    scale: float = 1.0,
    steps: int = 3,
    tensors: dict[str, list[list[int]]] | None = None,
) -> dict:
    """hidden: each all-gather but the first runs beside the previous unit's forward compute and each
    reduce-scatter but the last beside the next unit's backward compute (what prefetching gives); otherwise
    every collective runs alone. ``scale``: times the collectives' durations. ``tensors``: unit -> the shapes of
    its parameter shards, listed by an ``fsdp::all_gather_copy_in`` in its all-gather (as with record_shapes)."""
    ag_us, rs_us = AG_US * scale, RS_US * scale
    events: list[dict] = []
    corr = iter(range(1, 1_000_000))

    def launch(host_ts: float, kernel: str, ts: float, dur: float, stream: int) -> None:
        c = next(corr)
        events.append(_x("cudaLaunchKernel", "cuda_runtime", host_ts, 5.0, correlation=c))
        events.append(_x(kernel, "kernel", ts, dur, tid=stream, pid=0, correlation=c, device=0, stream=stream))

    for s in range(steps):
        start = 1000.0 + s * STEP_US
        events.append(_x(f"ProfilerStep#{s + 1}", "user_annotation", start, STEP_US))
        dev = start + 100.0
        for i, (fqn, numel) in enumerate(units):  # forward
            label = f" ({fqn})" if fqn else ""
            host = start + 50.0 + i * 200.0
            events.append(_x(f"FSDP::all_gather{label}", "user_annotation", host, 100.0))
            if tensors and fqn in tensors:
                shapes = tensors[fqn]
                copy_in = {"Input Dims": [shapes, [numel * 2], [], [], []], "Input type": ["TensorList", "float"]}
                events.append(_x("fsdp::all_gather_copy_in", "cpu_op", host + 2.0, 5.0, **copy_in))
            dims = {"Input Dims": [[numel * 2], [numel]], "Input type": ["float", "float"]}
            events.append(_x("c10d::_allgather_base_", "cpu_op", host + 10.0, 50.0, **dims))
            ag_ts = dev - ag_us if (hidden and i > 0) else dev
            launch(host + 20.0, "ncclDevKernel_AllGather_RING_LL", ag_ts, ag_us, 20)
            compute_ts = max(dev, ag_ts + ag_us)
            launch(host + 60.0, "sm90_xmma_gemm_fwd", compute_ts, COMPUTE_US, 7)
            dev = compute_ts + COMPUTE_US
        order = list(reversed(units))  # backward: the last unit first
        for j, (fqn, numel) in enumerate(order):
            label = f" ({fqn})" if fqn else ""
            host = start + 3000.0 + j * 200.0
            launch(host - 50.0, "sm90_xmma_gemm_bwd", dev, COMPUTE_US, 7)
            dev += COMPUTE_US
            events.append(_x(f"FSDP::post_backward_reduce{label}", "user_annotation", host, 100.0))
            dims = {"Input Dims": [[numel], [numel * 2]], "Input type": ["float", "float"]}
            events.append(_x("c10d::_reduce_scatter_base_", "cpu_op", host + 10.0, 50.0, **dims))
            launch(host + 20.0, "ncclDevKernel_ReduceScatter_RING_LL", dev, rs_us, 21)
            if not hidden:
                dev += rs_us  # the next unit's backward waits for it
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
        "deviceProperties": [{"id": 0, "name": "H100", "totalGlobalMem": 80 * 2**30}],
        "traceEvents": events,
    }


def _run(
    folder: Path,
    units: list[tuple[str, int]],
    hidden: bool,
    scale: float = 1.0,
    tensors: dict[str, list[list[int]]] | None = None,
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(2):
        trace = _trace(rank, units, hidden, scale, tensors=tensors)
        (folder / f"rank{rank}.pt.trace.json").write_text(json.dumps(trace))
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("fsdp")
    return {
        "overlapped": _run(base / "overlapped", BLOCKS, hidden=True),
        "exposed": _run(base / "exposed", BLOCKS, hidden=False),
        "one_unit": _run(base / "one_unit", [("", 3100)], hidden=False, scale=4.0),
    }


def _units(path: Path) -> dict[str, dict]:
    metrics = analyze(load(path, workers=1))
    assert metrics.run["parallelism"] == "fsdp2"
    return {u["unit"]: u for u in metrics.run["fsdp_units"]}


def test_exposed_times_per_unit_are_the_known_intervals(runs: dict[str, Path]) -> None:
    units = _units(runs["exposed"])
    assert list(units) == ["layers.0", "layers.1", "layers.2", "(root)"]
    for name, u in units.items():
        assert u["allgather_calls"] == 1 and u["reduce_calls"] == 1, name
        assert u["allgather_ms"] == pytest.approx(AG_US / 1e3) and u["allgather_exposed_ms"] == pytest.approx(
            AG_US / 1e3
        )
        assert u["reduce_ms"] == pytest.approx(RS_US / 1e3) and u["reduce_exposed_ms"] == pytest.approx(RS_US / 1e3)
    assert units["layers.0"]["param_bytes"] == 1000 * 2 * 4  # the gathered buffer, fp32
    assert units["(root)"]["param_share"] == pytest.approx(100 / 3100)


def test_hidden_collectives_are_not_exposed(runs: dict[str, Path]) -> None:
    units = _units(runs["overlapped"])
    # the first all-gather has no compute before it; the last reduce-scatter (layers.0's, last in backward) none after
    assert units["layers.0"]["allgather_exposed_ms"] == pytest.approx(AG_US / 1e3)
    assert units["layers.0"]["reduce_exposed_ms"] == pytest.approx(RS_US / 1e3)
    for name in ("layers.1", "layers.2", "(root)"):
        assert units[name]["allgather_ms"] == pytest.approx(AG_US / 1e3)
        assert units[name]["allgather_exposed_ms"] == pytest.approx(0.0), name
        assert units[name]["reduce_exposed_ms"] == pytest.approx(0.0), name


def _findings(path: Path) -> dict[str, object]:
    rules = [r for r in load_rules() if r.name.startswith("fsdp-")]
    diagnosis = evaluate(rules, analyze(load(path, workers=1)))
    assert not [n for n in diagnosis.not_evaluated], diagnosis.not_evaluated
    return {f.name: f for f in diagnosis.findings}


def test_one_unit_for_the_whole_model_is_found_with_its_gain(runs: dict[str, Path]) -> None:
    found = _findings(runs["one_unit"])
    assert list(found) == ["fsdp-one-large-unit"]
    f = found["fsdp-one-large-unit"]
    assert "(root) holds 100% of the parameters" in f.message and "the only unit" in f.message
    assert "gloo" not in f.message and "On CPU" not in f.message
    assert f.estimated_gain_ms == pytest.approx(4 * (AG_US + RS_US) / 1e3)


def test_exposed_collectives_of_per_block_units(runs: dict[str, Path]) -> None:
    found = _findings(runs["exposed"])
    assert set(found) == {"fsdp-exposed-all-gather", "fsdp-exposed-reduce-scatter"}
    ag = found["fsdp-exposed-all-gather"]
    assert ag.estimated_gain_ms == pytest.approx(4 * AG_US / 1e3)
    assert "No explicit prefetching" in ag.message and "gathered in 32-bit" in ag.message
    assert found["fsdp-exposed-reduce-scatter"].estimated_gain_ms == pytest.approx(4 * RS_US / 1e3)


def test_a_well_overlapped_fsdp_job_gets_no_fsdp_finding(runs: dict[str, Path]) -> None:
    assert _findings(runs["overlapped"]) == {}


def test_the_report_shows_the_unit_table(runs: dict[str, Path]) -> None:
    import io

    from ddpdoctor.report import OutputFormat, render

    rules = [r for r in load_rules() if r.name.startswith("fsdp-")]
    diagnosis = evaluate(rules, analyze(load(runs["exposed"], workers=1)))
    shown = {}
    for fmt in ("text", "markdown", "html", "json"):
        out = io.StringIO()
        render(diagnosis, OutputFormat(fmt), out)
        shown[fmt] = out.getvalue()
    assert "parallelism fsdp2" in shown["text"]
    for fmt in ("text", "markdown", "html"):
        assert "FSDP2 units" in shown[fmt] and "layers.2" in shown[fmt] and "(root)" in shown[fmt], fmt
    units = json.loads(shown["json"])["run"]["fsdp_units"]
    assert [u["unit"] for u in units] == ["layers.0", "layers.1", "layers.2", "(root)"]
    assert units[0]["allgather_exposed_ms"] == pytest.approx(AG_US / 1e3)


def test_a_unit_no_wrapping_can_shrink_gets_no_wrap_finding(tmp_path: Path) -> None:
    # the largest unit is one tensor (an embedding of 2,400 elements a shard, 2400 of 2700 all-gathered): splitting
    # modules cannot make it smaller, so "call fully_shard on each block" is no remedy; the passed line says why
    units = [("emb", 2400), ("layers.0", 100), ("layers.1", 100), ("", 100)]
    shapes = {"emb": [[2400]], "layers.0": [[90], [10]], "layers.1": [[90], [10]], "": [[100]]}
    path = _run(tmp_path / "embed", units, hidden=False, scale=4.0, tensors=shapes)
    metrics = analyze(load(path, workers=1))
    assert {r["fsdp_largest_unit"] for r in metrics.ranks} == {"emb"}
    assert {r["fsdp_largest_unit_tensors"] for r in metrics.ranks} == {1}
    assert {round(r["fsdp_largest_unit_tensor_share"], 3) for r in metrics.ranks} == {round(2400 / 2700, 3)}
    diagnosis = evaluate([r for r in load_rules() if r.name == "fsdp-one-large-unit"], metrics)
    assert not diagnosis.findings, [f.name for f in diagnosis.findings]
    (why,) = diagnosis.passed_reasons
    assert why.reason.startswith("FSDP unit emb holds 89% of the parameters, but one parameter tensor of it holds 89%")
    # the same unit made of many tensors (a block of layers wrapped as one): the rule fires, as without shapes
    shapes["emb"] = [[240]] * 10
    path = _run(tmp_path / "block", units, hidden=False, scale=4.0, tensors=shapes)
    metrics = analyze(load(path, workers=1))
    assert {r["fsdp_largest_unit_tensors"] for r in metrics.ranks} == {10}
    found = evaluate([r for r in load_rules() if r.name == "fsdp-one-large-unit"], metrics).findings
    assert [f.name for f in found] == ["fsdp-one-large-unit"]
    assert "FSDP unit emb holds 89% of the parameters" in found[0].message


def test_a_copy_in_whose_shapes_are_not_a_tensor_list_is_left_unknown(tmp_path: Path) -> None:
    units = [("", 3100)]
    path = _run(tmp_path / "odd", units, hidden=False, scale=4.0, tensors={"": [3100]})  # not a list of shapes
    metrics = analyze(load(path, workers=1))
    assert {r["fsdp_largest_unit_tensors"] for r in metrics.ranks} == {None}
    assert [f.name for f in _findings(path).values()] == ["fsdp-one-large-unit"]  # decided on the unit alone
