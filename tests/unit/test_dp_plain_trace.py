"""A plain ``torch.profiler`` trace of a DataParallel job (no ``ddpdoctor trace``): its stages are read from the
autograd functions DataParallel runs (``metrics/dp.py``), never reported as 0 ms, and its replicas from the GPUs
its kernels ran on.

The traces are real: DataParallel's forward and backward run on CPU through ``dp_harness`` under a plain
profiler. The GPU case adds to such a trace one kernel per device inside each ``DataParallel.forward``, as the
replicas' kernels are in a GPU trace (device events, ``args.device``), and nothing else.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import dp_harness  # tests/ is on sys.path: tests/conftest.py is a rootdir conftest
import pytest
import torch

from ddpdoctor.diagnosis import evaluate, load_rules
from ddpdoctor.load import load
from ddpdoctor.metrics import analyze

STEPS = 5


def _record(folder: Path, devices: int) -> Path:
    """A plain profiler trace (``tensorboard_trace_handler``) of a DataParallel model over ``devices`` devices."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    model = dp_harness.data_parallel(net, devices)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=STEPS)
    handler = torch.profiler.tensorboard_trace_handler(str(folder))
    with dp_harness.simulated_devices(), torch.profiler.profile(schedule=schedule, on_trace_ready=handler) as prof:
        for _ in range(2 + STEPS):
            opt.zero_grad()
            x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            prof.step()
    (trace,) = folder.glob("*.pt.trace.json*")
    return trace


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _record(tmp_path_factory.mktemp("dp2"), 2)


@pytest.fixture(scope="module")
def one_device(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _record(tmp_path_factory.mktemp("dp1"), 1)


def _read(trace: Path) -> dict[str, Any]:
    opener: Any = gzip.open if trace.suffix == ".gz" else open
    with opener(trace, "rt") as f:
        return json.load(f)


def _with_kernels(trace: Path, devices: list[int], out: Path) -> Path:
    """``trace`` with one kernel on each of ``devices`` inside every ``DataParallel.forward`` range."""
    data = _read(trace)
    events = data["traceEvents"]
    forwards = [e for e in events if e.get("name") == "DataParallel.forward" and e.get("ph") == "X"]
    assert forwards
    correlation = 10_000_000
    for fwd in forwards:
        for device in devices:
            correlation += 1
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": "void at::native::vectorized_elementwise_kernel<4>",
                    "pid": device,
                    "tid": 7,
                    "ts": fwd["ts"] + fwd["dur"] * 0.25,
                    "dur": fwd["dur"] * 0.5,
                    "args": {"device": device, "stream": 7, "correlation": correlation, "External id": 0},
                }
            )
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gpu.pt.trace.json"
    path.write_text(json.dumps(data))
    return path


def _rank(path: Path) -> dict[str, Any]:
    metrics = analyze(load(path))
    assert metrics.run["mode"] == "dp"
    return metrics.ranks[0]


def _finding(path: Path, name: str) -> Any:
    result = evaluate(load_rules(), analyze(load(path)))
    return next((f for f in result.findings if f.name == name), None), result


def test_a_plain_trace_times_the_stages_it_shows_and_not_the_others(two_devices: Path) -> None:
    row = _rank(two_devices)
    # the stages' own ops: measured, never the 0.0 ms a trace without ddpdoctor's ranges used to get
    for stage in ("scatter", "replicate", "gather", "backward_reduce"):
        assert row[f"dp_{stage}_ms"] is not None and row[f"dp_{stage}_ms"] > 0, stage
    # the replicas' forwards run in threads a plain profiler does not follow: not measured
    assert row["dp_parallel_apply_ms"] is None
    assert row["thread_parallelism"] is None
    assert row["dp_replicas"] is None  # a CPU trace: no GPU shows the replicas
    finding, result = _finding(two_devices, "use-ddp-instead-of-dp")
    assert finding is None
    why = next(n.reason for n in result.not_evaluated if n.name == "use-ddp-instead-of-dp")
    assert "dp_replicas" in why and "kernels ran on" in why


def test_the_stages_are_the_ops_inside_each_forward(two_devices: Path) -> None:
    """dp_scatter_ms is the Scatter ops inside DataParallel.forward only (Gather's backward runs a Scatter too)."""
    events = _read(two_devices)["traceEvents"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    forwards = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "DataParallel.forward"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    assert len(steps) == STEPS

    def per_step(name: str, in_forward: bool) -> float:
        total = 0.0
        for op in ops:
            if op["name"] != name:
                continue
            a, b = op["ts"], op["ts"] + op["dur"]
            if in_forward and not any(lo <= a and b <= hi for lo, hi in forwards):
                continue
            total += op["dur"]
        return total / len(steps) / 1e3

    scatters = [op for op in ops if op["name"] == "Scatter"]
    assert len(scatters) == 2 * len(forwards)  # one in each forward, one in each backward (GatherBackward)
    row = _rank(two_devices)
    assert row["dp_scatter_ms"] == pytest.approx(per_step("Scatter", True), rel=0.02)
    assert row["dp_replicate_ms"] == pytest.approx(per_step("Broadcast", True), rel=0.02)
    assert row["dp_gather_ms"] == pytest.approx(per_step("Gather", True), rel=0.02)
    assert row["dp_backward_reduce_ms"] == pytest.approx(per_step("ReduceAddCoalesced", False), rel=0.02)


def test_the_gpus_kernels_show_the_replicas(two_devices: Path, tmp_path: Path) -> None:
    gpu = _with_kernels(two_devices, [0, 1], tmp_path / "gpu")
    row = _rank(gpu)
    assert row["dp_replicas"] == 2
    finding, _ = _finding(gpu, "use-ddp-instead-of-dp")
    assert finding is not None
    assert "drives 2 GPUs" in finding.message
    assert f"scatters the batch ({row['dp_scatter_ms']:.1f} ms)" in finding.message
    assert "from a plain torch.profiler trace: the copy is DataParallel's Broadcast alone" in finding.message


def test_dataparallel_over_one_device_has_no_replicas_whatever_the_gpus(one_device: Path, tmp_path: Path) -> None:
    """DataParallel over one device scatters and calls the module: no Broadcast, no Gather. Kernels on two GPUs
    (the model split over them by hand) are no replicas of it."""
    names = {e.get("name") for e in _read(one_device)["traceEvents"]}
    assert "DataParallel.forward" in names and "Broadcast" not in names and "Gather" not in names
    gpu = _with_kernels(one_device, [0, 1], tmp_path / "gpu")
    row = _rank(gpu)
    assert row["dp_replicas"] is None
    assert row["dp_replicate_ms"] == 0.0 and row["dp_gather_ms"] == 0.0  # shown: the forwards hold none
    finding, _ = _finding(gpu, "use-ddp-instead-of-dp")
    assert finding is None


def test_one_gpu_under_a_replicating_forward_is_no_count(two_devices: Path, tmp_path: Path) -> None:
    """Kernels on one device only: the trace does not show the replicas' GPUs (no count of 1 or 2 is made up)."""
    gpu = _with_kernels(two_devices, [0], tmp_path / "gpu")
    assert _rank(gpu)["dp_replicas"] is None
