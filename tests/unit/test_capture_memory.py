"""CUDA memory bookkeeping. There is no GPU here, so torch.cuda's allocator counters are replaced by a scripted
allocator (the only stand-in: our code under test is unchanged). What we check is ddpdoctor's own logic: which
devices are recorded, that peaks come from the allocator's peak counters (never reset), and capacity."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ddpdoctor.capture.memory import DeviceMemory


class ScriptedAllocator:
    def __init__(self, n: int) -> None:
        self.stats = {i: {} for i in range(n)}
        self.resets = 0

    def install(self, monkeypatch, n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "memory_stats", lambda i: dict(self.stats[i]))
        monkeypatch.setattr(
            torch.cuda,
            "get_device_properties",
            lambda i: SimpleNamespace(name=f"GPU{i}", total_memory=80 << 30),
        )

        def no_reset(*a, **k):
            self.resets += 1

        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", no_reset)
        monkeypatch.setattr(
            torch.cuda, "mem_get_info", lambda *a: pytest.fail("mem_get_info creates contexts")
        )

    def set(self, i: int, alloc_peak: int, reserved_peak: int, alloc: int = 0, reserved: int = 0) -> None:
        self.stats[i] = {
            "allocated_bytes.all.peak": alloc_peak,
            "reserved_bytes.all.peak": reserved_peak,
            "allocated_bytes.all.current": alloc,
            "reserved_bytes.all.current": reserved,
        }


def test_rank_records_only_devices_it_touched(monkeypatch):
    alloc = ScriptedAllocator(4)
    alloc.install(monkeypatch, 4)
    mem = DeviceMemory()
    alloc.set(3, 100, 200, 50, 200)
    mem.sample(1)
    alloc.set(0, 10, 20, 10, 20)  # the classic bug: a rank on cuda:3 allocating on cuda:0
    alloc.set(3, 300, 400, 60, 400)
    mem.sample(2)
    out = mem.to_json()
    assert [d["device"] for d in out["devices"]] == ["cuda:0", "cuda:3"]
    d0, d3 = out["devices"]
    assert (
        d3["per_step"]["step"] == [1, 2]
        and d3["peak_reserved_bytes"] == 400
        and d3["peak_allocated_bytes"] == 300
    )
    assert d0["per_step"]["step"] == [2] and d0["capacity_bytes"] == 80 << 30
    assert alloc.resets == 0  # the script's own max_memory_allocated() stays what it would be


def test_single_process_records_every_visible_device(monkeypatch):
    alloc = ScriptedAllocator(2)
    alloc.install(monkeypatch, 2)
    mem = DeviceMemory(all_devices=True)
    alloc.set(0, 5, 10)
    mem.sample(1)
    assert [d["device"] for d in mem.to_json()["devices"]] == ["cuda:0", "cuda:1"]


def test_no_cuda_records_nothing():
    mem = DeviceMemory()
    mem.sample(1)
    assert mem.to_json()["devices"] == []
