"""ddpdoctor.capture.dp: DataParallel's stages as named ranges in a real profiler trace (CPU harness)."""

from __future__ import annotations

import gc
import json
import threading
from pathlib import Path
from typing import Any

import dp_harness  # tests/ is on sys.path: tests/conftest.py is a rootdir conftest
import pytest
import torch
from torch.nn.parallel import _functions

from ddpdoctor.capture import dp

STAGES = [dp.SCATTER_RANGE, dp.REPLICATE_RANGE, dp.PARALLEL_APPLY_RANGE, dp.GATHER_RANGE]
PATCHED = [
    (torch.nn.DataParallel, "__init__"),
    (torch.nn.DataParallel, "scatter"),
    (torch.nn.DataParallel, "replicate"),
    (torch.nn.DataParallel, "parallel_apply"),
    (torch.nn.DataParallel, "gather"),
    (_functions.Broadcast, "backward"),
    (_functions.Gather, "backward"),
]


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        # Replicas wait for each other: they overlap in time, so their threads (and trace tids) are distinct.
        self.rendezvous: threading.Barrier | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rendezvous is not None:
            self.rendezvous.wait(timeout=10)
        return self.net(x)


@pytest.fixture
def installed():  # type: ignore[no-untyped-def]
    assert dp.install() == []
    dp.take_step_stats()
    yield
    dp.uninstall()


def _train_step(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    out.pow(2).mean().backward()
    return out


def _profile_steps(devices: int, active: int, tmp_path: Path) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    net = Net()
    net.rendezvous = threading.Barrier(devices)
    x = torch.randn(4 * devices, 8)
    config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    with dp_harness.simulated_devices():
        model = dp_harness.data_parallel(net, devices)
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=1, warmup=1, active=active, repeat=1),
            experimental_config=config,
        ) as prof:
            for _ in range(2 + active):
                _train_step(model, x)
                prof.step()
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    return [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]


def _within(inner: dict[str, Any], outer: dict[str, Any]) -> bool:
    slack = 0.01  # µs: the trace rounds timestamps to ns
    starts_after = outer["ts"] - slack <= inner["ts"]
    return starts_after and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + slack


@pytest.mark.parametrize("devices", [2, 4])
def test_every_stage_is_a_range_each_replica_in_its_own_thread(
    installed: None, devices: int, tmp_path: Path
) -> None:
    events = _profile_steps(devices, active=2, tmp_path=tmp_path)
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    assert len(steps) == 2

    for step in steps:
        in_step = [e for e in events if _within(e, step)]
        by_name = {name: [e for e in in_step if e["name"] == name] for name in STAGES}
        for name, found in by_name.items():
            assert len(found) == 1, (name, step["name"])
            assert found[0]["tid"] == step["tid"]  # the stages run in the thread that called DataParallel
        (apply,) = by_name[dp.PARALLEL_APPLY_RANGE]

        replicas = [e for e in events if e["name"].startswith(dp.REPLICA_RANGE_PREFIX) and _within(e, apply)]
        assert sorted(e["name"] for e in replicas) == sorted(dp.replica_range(i) for i in range(devices))
        assert len({e["tid"] for e in replicas}) == devices
        assert step["tid"] not in {e["tid"] for e in replicas}

        # backward of Broadcast (parameter gradients summed) and of Gather (output gradient scattered)
        assert len([e for e in in_step if e["name"] == dp.BACKWARD_REDUCE_RANGE]) == 1
        assert len([e for e in in_step if e["name"] == dp.GATHER_BACKWARD_RANGE]) == 1
        order = [by_name[name][0]["ts"] for name in STAGES]
        assert order == sorted(order)


def _outputs_and_grads(devices: int, *, profile: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(10, 8)
    with dp_harness.simulated_devices():
        model = dp_harness.data_parallel(net, devices)
        if profile:
            config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
            activities = [torch.profiler.ProfilerActivity.CPU]
            with torch.profiler.profile(activities=activities, experimental_config=config):
                out = _train_step(model, x)
        else:
            out = _train_step(model, x)
    return out.detach(), [p.grad for p in net.parameters()]


@pytest.mark.parametrize("profile", [False, True])
def test_install_does_not_change_results(profile: bool) -> None:
    expected_out, expected_grads = _outputs_and_grads(3, profile=False)
    dp.install()
    try:
        out, grads = _outputs_and_grads(3, profile=profile)
    finally:
        dp.uninstall()
    assert torch.equal(out, expected_out)
    assert all(torch.equal(g, e) for g, e in zip(grads, expected_grads, strict=True))


def test_install_is_idempotent_and_uninstall_restores_the_originals() -> None:
    originals = [owner.__dict__[name] for owner, name in PATCHED]
    assert dp.install() == []
    patched = [owner.__dict__[name] for owner, name in PATCHED]
    assert all(p is not o for p, o in zip(patched, originals, strict=True))
    assert dp.install() == []  # a second install wraps nothing twice
    assert all(owner.__dict__[name] is p for (owner, name), p in zip(PATCHED, patched, strict=True))
    assert torch.nn.DataParallel.scatter.__wrapped__ is originals[1]
    dp.uninstall()
    dp.uninstall()
    assert all(owner.__dict__[name] is o for (owner, name), o in zip(PATCHED, originals, strict=True))
    assert not dp.is_installed()


def test_step_stats_count_since_the_last_call(installed: None) -> None:
    model = dp_harness.data_parallel(Net(), 2)
    with dp_harness.simulated_devices():
        for _ in range(3):
            _train_step(model, torch.randn(6, 8))
    stats = dp.take_step_stats()
    assert stats["gathered_bytes"] == 3 * 6 * 4 * 4  # 3 forwards of a [6, 4] float32 output
    assert stats["replicas"] == 2 and stats["forwards"] == 3
    for key in ("scatter_ms", "replicate_ms", "parallel_apply_ms", "gather_ms"):
        assert stats[key] > 0
    assert stats["parallel_apply_ms"] > stats["gather_ms"]
    again = dp.take_step_stats()
    assert again["gathered_bytes"] == 0 and again["forwards"] == 0 and again["parallel_apply_ms"] == 0


def test_describe_lists_instances_even_after_they_are_freed(installed: None) -> None:
    class Tower(Net):
        pass

    multi = dp_harness.data_parallel(Tower(), 4, dim=0)
    passthrough = torch.nn.DataParallel(torch.nn.Linear(2, 2))  # no GPU here: DataParallel just calls it
    tower = {
        "module": "Tower",
        "wrapper": "DataParallel",
        "device_ids": [0, 1, 2, 3],
        "output_device": 0,
        "dim": 0,
    }
    linear = {
        "module": "Linear",
        "wrapper": "DataParallel",
        "device_ids": [],
        "output_device": None,
        "dim": None,
    }
    described = dp.describe()
    assert described.index(tower) < described.index(linear)
    json.dumps(described)

    # The session writes its last capture after the script returned: its model is gone by then.
    del multi, passthrough
    gc.collect()
    assert tower in dp.describe() and linear in dp.describe()
    for _ in range(40):  # rebuilt every step: remembered once, not forty times
        dp_harness.data_parallel(Tower(), 4, dim=0)
    gc.collect()
    assert dp.describe().count(tower) == 1


def test_an_instance_built_before_install_is_described_once_used() -> None:
    class Early(Net):
        pass

    model = dp_harness.data_parallel(Early(), 2)
    dp.install()
    try:
        assert "Early" not in [d["module"] for d in dp.describe()]
        with dp_harness.simulated_devices():
            model(torch.randn(4, 8))
        assert {
            "module": "Early",
            "wrapper": "DataParallel",
            "device_ids": [0, 1],
            "output_device": 0,
            "dim": 0,
        } in dp.describe()
    finally:
        dp.uninstall()


def test_no_range_is_opened_while_the_profiler_is_off(
    installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(name: str) -> None:
        raise AssertionError(f"record_function({name!r}) without a profiler")

    monkeypatch.setattr(dp, "_record", refuse)
    with dp_harness.simulated_devices():
        _train_step(dp_harness.data_parallel(Net(), 2), torch.randn(4, 8))
    assert dp.take_step_stats()["forwards"] == 1


def test_a_missing_internal_is_skipped_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broadcast:  # a torch whose Broadcast has no backward of its own
        pass

    monkeypatch.setattr(_functions, "Broadcast", Broadcast)
    try:
        assert dp.install() == ["Broadcast.backward"]
        assert "__wrapped__" in torch.nn.DataParallel.__dict__["gather"].__dict__
    finally:
        dp.uninstall()
