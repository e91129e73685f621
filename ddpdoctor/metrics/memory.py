"""Device memory of one rank: peaks per device from ``[memory]`` events and the capture's ``memory.devices``.

``[memory]`` events carry ``Total Allocated``/``Total Reserved`` in recent traces; older ones (torch 1.9) only the
size change, from which the peak allocated is the running sum's (a lower bound; reserved unknown). Capacity comes
from the trace's ``deviceProperties`` (``totalGlobalMem``) or the capture.

Bytes throughout. The rank's own device comes from the capture (``"device": "cuda:3"``), else the device its
kernels ran on. ``foreign_cuda0_bytes``: what a rank whose own device is not cuda:0 reserved (else allocated)
on cuda:0 — the classic "every rank creates a context on GPU 0" mistake.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ddpdoctor.load.model import RankTrace
from ddpdoctor.metrics import catalog
from ddpdoctor.table import Table, distinct

CUDA = 1  # c10::DeviceType::CUDA in "Device Type"


def own_device(rt: RankTrace | None, capture: dict[str, Any] | None) -> str | None:
    """``"cuda:N"`` / ``"cpu"`` of the rank, or None when unknown."""
    dev = (capture or {}).get("device")
    if isinstance(dev, str) and dev:
        return dev if ":" in dev or dev == "cpu" else f"{dev}:0"
    kernels = rt.tables.kernels if rt is not None and rt.tables is not None else None
    if kernels is not None and len(kernels):
        devices = kernels["device"]
        devices = devices[devices >= 0]
        if len(devices):
            return f"cuda:{_mode(devices)}"
        return f"cuda:{_mode(kernels['pid'])}"
    return None


def _mode(values: np.ndarray) -> int:
    """The most frequent value (the smallest of those tied), as pandas' ``mode().iloc[0]``."""
    uniq, counts = np.unique(values, return_counts=True)
    return int(uniq[np.argmax(counts)])


def device_rows(rt: RankTrace | None, capture: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per device: ``device, peak_allocated_bytes, peak_reserved_bytes, capacity_bytes`` (None when
    unknown)."""
    rows: dict[str, dict[str, Any]] = {}
    capacities: dict[str, int] = {}
    if rt is not None:
        for props in rt.device_properties:
            if isinstance(props.get("id"), int) and isinstance(props.get("totalGlobalMem"), int):
                capacities[f"cuda:{props['id']}"] = props["totalGlobalMem"]
        mem = rt.tables.memory if rt.tables is not None else None
        if mem is not None and len(mem):
            cuda = mem[(mem["device_type"] == CUDA) & (mem["device_id"] >= 0)]
            for dev_id in distinct(cuda["device_id"]):
                g = cuda[cuda["device_id"] == dev_id]
                rows[f"cuda:{int(dev_id)}"] = {
                    "peak_allocated_bytes": _max(g["total_allocated"]) or _running_peak(g),
                    "peak_reserved_bytes": _max(g["total_reserved"]),
                }
    for d in ((capture or {}).get("memory") or {}).get("devices") or []:
        if not isinstance(d, dict):
            continue
        name = d.get("device") if isinstance(d.get("device"), str) else f"cuda:{d.get('index')}"
        if name.startswith("cuda") and ":" not in name:
            name = f"cuda:{d.get('index', 0)}"
        row = rows.setdefault(name, {"peak_allocated_bytes": None, "peak_reserved_bytes": None})
        for key in ("peak_allocated_bytes", "peak_reserved_bytes"):
            if isinstance(d.get(key), int):
                row[key] = max(row[key] or 0, d[key])
        if isinstance(d.get("capacity_bytes"), int):
            capacities[name] = d["capacity_bytes"]
    return [{"device": name, **row, "capacity_bytes": capacities.get(name)} for name, row in sorted(rows.items())]


def _max(values: np.ndarray) -> int | None:
    values = values[~np.isnan(values)]
    return int(values.max()) if len(values) else None


def _running_peak(events: Table) -> int | None:
    """Peak allocated bytes from the size changes alone (traces that record no totals, e.g. torch 1.9): per
    profiled window, the running sum of ``bytes`` less its lowest point (memory allocated before the window
    that is freed in it). A lower bound: what was allocated before the window and never freed is not seen."""
    if "bytes" not in events or len(events) == 0:
        return None
    peaks = []
    span = events["span"] if "span" in events else np.zeros(len(events), dtype=np.int64)
    for s in distinct(span):
        changes = events[span == s].sort("ts_us")["bytes"].astype(np.float64)
        changes = changes[~np.isnan(changes)]
        if len(changes) == 0:
            continue
        level = np.cumsum(changes)
        peaks.append(level.max() - min(level.min(), 0.0))
    return int(max(peaks)) if peaks and max(peaks) > 0 else None


def memory_metrics(devices: list[dict[str, Any]], own: str | None) -> dict[str, Any]:
    """Per-rank memory metrics for the rank's own device (bytes, ratio 0-1)."""
    mine = next((d for d in devices if d["device"] == own), None)
    out: dict[str, Any] = {
        "peak_allocated_bytes": None,
        "peak_reserved_bytes": None,
        "capacity_bytes": None,
        "headroom_ratio": None,
        "foreign_cuda0_bytes": None,
    }
    if mine is not None:
        out.update({k: mine[k] for k in catalog.group("device_memory")})
        used = mine["peak_reserved_bytes"] or mine["peak_allocated_bytes"]
        if used is not None and mine["capacity_bytes"]:
            out["headroom_ratio"] = 1.0 - used / mine["capacity_bytes"]
    if own is not None and own.startswith("cuda") and devices:  # no memory recorded at all: unknown, not 0
        if own == "cuda:0":
            out["foreign_cuda0_bytes"] = 0
        else:
            cuda0 = next((d for d in devices if d["device"] == "cuda:0"), None)
            out["foreign_cuda0_bytes"] = (
                (cuda0["peak_reserved_bytes"] or cuda0["peak_allocated_bytes"] or 0) if cuda0 else 0
            )
    return out
