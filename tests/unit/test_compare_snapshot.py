"""Snapshots from capture files alone (no trace metrics): environment, step samples, GPU 0 vs the rest."""

from __future__ import annotations

import pytest

from ddpdoctor.compare.snapshot import build

GIB = 2**30


def _device(index: int, reserved_gib: float, allocated_gib: float) -> dict:
    return {
        "device": f"cuda:{index}",
        "index": index,
        "name": "NVIDIA H100 80GB HBM3",
        "capacity_bytes": 80 * GIB,
        "peak_allocated_bytes": allocated_gib * GIB,
        "peak_reserved_bytes": reserved_gib * GIB,
    }


def _capture(
    rank: int, devices: list[dict], *, ddp: bool, world: int, wall_ms=(50.0,) + (10.0,) * 19
) -> dict:
    return {
        "rank": rank,
        "world_size": world,
        "hostname": "node0",
        "backend": "nccl" if ddp else None,
        "device": f"cuda:{rank}",
        "torch_version": "2.13.0+cu126",
        "python": "3.11.7",
        "steps": {"first": 1, "wall_ms": list(wall_ms), "profiled": [[8, 12]]},
        "schedule": {"warmup": 2},
        "memory": {"devices": devices},
        "ddp": [{"module": "Net"}] if ddp else [],
        "dp": [] if ddp else [{"module": "Net"}],
        "setup": {"data_loaders": [{"batch_size": 32, "batches_yielded": 20}]},
    }


def test_dataparallel_gpu0_holds_more_than_the_others():
    devices = [_device(0, 30, 20), _device(1, 12, 10), _device(2, 11, 10)]
    snap = build("runs/dp", [_capture(0, devices, ddp=False, world=1)])
    assert snap.value("gpu0_peak_reserved_bytes") == 30 * GIB
    assert snap.value("others_max_peak_reserved_bytes") == 12 * GIB
    assert snap.value("gpu0_vs_others_ratio") == pytest.approx(2.5)
    assert snap.value("max_peak_allocated_bytes") == 20 * GIB
    assert snap.environment["mode"] == "dp" and snap.environment["world_size"] == 1
    assert snap.environment["devices"] == ["NVIDIA H100 80GB HBM3"]


def test_ddp_counts_every_process_on_gpu0():
    # rank 1 also created a context on cuda:0 (a missing torch.cuda.set_device): it adds to GPU 0's memory
    r0 = _capture(0, [_device(0, 10, 8)], ddp=True, world=2)
    r1 = _capture(1, [_device(0, 0.5, 0), _device(1, 10, 8)], ddp=True, world=2)
    snap = build("runs/ddp", [r0, r1])
    assert snap.value("gpu0_peak_reserved_bytes") == 10.5 * GIB
    assert snap.value("gpu0_vs_others_ratio") == pytest.approx(1.05)
    assert snap.environment["mode"] == "ddp" and snap.environment["backend"] == "nccl"
    assert snap.environment["batch_size_per_rank"] == 32


def test_capture_only_snapshot_has_step_times_but_no_findings():
    snap = build(
        "runs/x",
        [_capture(0, [], ddp=True, world=2), _capture(1, [], ddp=True, world=2)],
        notes=["trace metrics and findings are missing"],
    )
    assert snap.value("step_ms.median") == 10.0 and len(snap.samples["step_ms"]) == 20 - 9
    assert snap.value("exposed_comm_ms") is None and snap.findings is None and snap.rules_evaluated is None
    assert snap.notes == ["trace metrics and findings are missing"]
