"""GPU memory from a trace's [memory] events: totals where the trace has them, the running sum of the size changes
where it does not (torch <= 1.9), capacity from deviceProperties; unknown stays unknown."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ddpdoctor.metrics.memory import device_rows, memory_metrics
from ddpdoctor.table import Table

GIB = 2**30


def _trace(changes: list[float], spans: list[int], totals: list[float] | None = None, device: int = 0):
    n = len(changes)
    memory = Table(
        {
            "ts_us": np.arange(n, dtype=float),
            "span": spans,
            "bytes": np.array(changes, dtype=np.float64),
            "total_allocated": totals if totals is not None else [np.nan] * n,
            "total_reserved": [np.nan] * n,
            "device_type": [1] * n,
            "device_id": [device] * n,
        }
    )
    props = [{"id": 0, "totalGlobalMem": 32 * GIB}, {"id": 1, "totalGlobalMem": 32 * GIB}]
    return SimpleNamespace(tables=SimpleNamespace(memory=memory, kernels=Table()), device_properties=props)


def test_running_sum_of_size_changes_per_window() -> None:
    # window 0: +2 GiB, +1 GiB, -3 GiB; window 1 starts after frees of memory allocated before it (-1 GiB), then +4
    changes = [2 * GIB, 1 * GIB, -3 * GIB, -1 * GIB, 4 * GIB]
    (row,) = device_rows(_trace(changes, [0, 0, 0, 1, 1]), None)
    # window 0 peaks at 3 GiB; window 1 had at least 1 GiB allocated at its start (it frees it): 1 -> 0 -> 4 GiB
    assert row["device"] == "cuda:0" and row["peak_allocated_bytes"] == 4 * GIB
    assert row["peak_reserved_bytes"] is None and row["capacity_bytes"] == 32 * GIB


def test_totals_win_over_the_running_sum() -> None:
    (row,) = device_rows(_trace([GIB, GIB], [0, 0], totals=[7 * GIB, 8 * GIB]), None)
    assert row["peak_allocated_bytes"] == 8 * GIB


def test_no_memory_events_means_unknown_not_zero() -> None:
    rt = SimpleNamespace(tables=SimpleNamespace(memory=Table(), kernels=Table()), device_properties=[])
    devices = device_rows(rt, None)
    assert devices == []
    m = memory_metrics(devices, "cuda:1")
    # without any memory data a rank on cuda:1 is not "holding 0 bytes on cuda:0": it is unknown
    assert m["foreign_cuda0_bytes"] is None and m["peak_allocated_bytes"] is None


def test_memory_on_own_device_only_means_nothing_on_cuda0() -> None:
    devices = device_rows(_trace([GIB], [0], device=1), None)
    assert memory_metrics(devices, "cuda:1")["foreign_cuda0_bytes"] == 0
