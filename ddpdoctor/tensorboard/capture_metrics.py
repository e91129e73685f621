"""Metrics from a run directory's capture files alone (``manifest.json``, ``ranks/rank<R>.json``), no trace.

Used when the trace metrics (``ddpdoctor.metrics.analyze``) are not available or fail: it gives the step
times, GIL contention, CUDA memory per device, DDP's configuration and DDP's own overlap figures, under the
metric names of ``docs/CONTRACTS.md`` so the diagnosis rules can run on what was measured (the others report
"not evaluated"). The result has the ``run`` / ``ranks`` / ``per_step`` / ``collectives`` / ``devices`` shape
of ``RunMetrics``.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ddpdoctor import rundir

_RANK_FILE_RE = re.compile(r"^rank(\d+)\.json$")
_NS_PER_MS = 1e6


@dataclass
class CaptureMetrics:
    """``RunMetrics``-shaped metrics from the capture files (``collectives`` stays empty: no trace)."""

    run: dict[str, Any]
    ranks: list[dict[str, Any]]
    per_step: pd.DataFrame
    devices: pd.DataFrame
    collectives: pd.DataFrame = field(default_factory=pd.DataFrame)


def read_rank_files(run_dir: Path) -> dict[int, dict[str, Any]]:
    """rank -> the parsed ``ranks/rank<R>.json`` (unreadable files are left out)."""
    out: dict[int, dict[str, Any]] = {}
    ranks_dir = run_dir / rundir.RANKS_DIR
    if not ranks_dir.is_dir():
        return out
    for path in sorted(ranks_dir.iterdir()):
        match = _RANK_FILE_RE.match(path.name)
        if not match or not path.is_file():
            continue
        try:
            data = rundir.read_json(path)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            out[int(match.group(1))] = data
    return dict(sorted(out.items()))


def read_manifest(run_dir: Path) -> dict[str, Any]:
    try:
        data = rundir.read_json(run_dir / rundir.MANIFEST)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def profiled_steps(capture: dict[str, Any]) -> set[int]:
    steps: set[int] = set()
    for window in (capture.get("steps") or {}).get("profiled") or []:
        if isinstance(window, (list, tuple)) and len(window) == 2:
            steps.update(range(int(window[0]), int(window[1]) + 1))
    return steps


def step_rows(rank: int, capture: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per step: rank, step, step_ms (wall time), profiled, gil_contention, threads."""
    steps = capture.get("steps") or {}
    first = int(steps.get("first") or 1)
    profiled = profiled_steps(capture)
    rows = {
        first + i: {"rank": rank, "step": first + i, "step_ms": float(ms), "profiled": first + i in profiled}
        for i, ms in enumerate(steps.get("wall_ms") or [])
    }
    gil = (capture.get("gil") or {}).get("per_step") or {}
    for i, step in enumerate(gil.get("step") or []):
        row = rows.setdefault(
            int(step), {"rank": rank, "step": int(step), "step_ms": None, "profiled": int(step) in profiled}
        )
        for key, column in (("contention", "gil_contention"), ("threads", "threads")):
            values = gil.get(key) or []
            row[column] = values[i] if i < len(values) else None
    return [rows[s] for s in sorted(rows)]


def device_rows(rank: int, capture: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for dev in (capture.get("memory") or {}).get("devices") or []:
        rows.append(
            {
                "rank": rank,
                "device": dev.get("device"),
                "peak_allocated_bytes": dev.get("peak_allocated_bytes"),
                "peak_reserved_bytes": dev.get("peak_reserved_bytes"),
                "capacity_bytes": dev.get("capacity_bytes"),
            }
        )
    return rows


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _p90(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]


def _flag(value: Any) -> bool | None:
    return None if value is None else bool(value)


def ddp_metrics(capture: dict[str, Any]) -> dict[str, Any]:
    """DDP's configuration and its own timing averages (ns -> ms), from the first DDP module's logs."""
    modules = [m for m in capture.get("ddp") or [] if isinstance(m.get("logging_data"), dict)]
    if not modules:
        return {}
    data = modules[0]["logging_data"]
    out: dict[str, Any] = {}
    sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes")
    if isinstance(sizes, str) and sizes.strip():
        out["ddp_bucket_count"] = len([s for s in sizes.split(",") if s.strip()])
    if data.get("bucket_cap_bytes"):
        out["ddp_bucket_cap_mb"] = data["bucket_cap_bytes"] / 2**20
    for key in ("find_unused_parameters", "gradient_as_bucket_view", "static_graph", "broadcast_buffers"):
        if key in data:
            out[f"ddp_{key}"] = _flag(data[key])
    if data.get("comm_hook"):
        out["ddp_comm_hook"] = str(data["comm_hook"])
    total = data.get("total_parameter_size_bytes")
    if total and "unused_parameter_size" in data:
        out["ddp_unused_parameter_size_ratio"] = data["unused_parameter_size"] / total
    comm, overlap = data.get("avg_backward_comm_time"), data.get("avg_backward_compute_comm_overlap_time")
    if comm and overlap is not None:
        out["ddp_reported_overlap_ratio"] = min(1.0, max(0.0, overlap / comm))
    # DDP's own averages (ns): a per-rank breakdown when the trace metrics are missing.
    for key, name in (
        ("avg_forward_compute_time", "ddp_forward_ms"),
        ("avg_backward_compute_time", "ddp_backward_ms"),
        ("avg_backward_comm_time", "ddp_backward_comm_ms"),
        ("avg_backward_compute_comm_overlap_time", "ddp_overlap_ms"),
    ):
        if isinstance(data.get(key), (int, float)) and data[key] > 0:
            out[name] = data[key] / _NS_PER_MS
    return out


def rank_metrics(rank: int, capture: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-rank metrics (CONTRACTS names) measurable from one capture file."""
    analysed = [r for r in rows if r["profiled"] and r["step_ms"] is not None]
    if not analysed:  # no profiled window: every step but the first (start-up)
        analysed = [r for r in rows[1:] if r["step_ms"] is not None]
    times = [r["step_ms"] for r in analysed]
    gil = [r["gil_contention"] for r in analysed if r.get("gil_contention") is not None]
    threads = [r["threads"] for r in analysed if r.get("threads") is not None]
    out: dict[str, Any] = {
        "rank": rank,
        "steps_analyzed": len(times),
        "step_ms_median": statistics.median(times) if times else None,
        "step_ms_p90": _p90(times),
        "step_ms_mean": _mean(times),
        "gil_contention": _mean(gil),
        "threads": max(threads) if threads else None,
    }
    out.update(_memory_metrics(capture))
    out.update(ddp_metrics(capture))
    thread_info = capture.get("threads") or {}
    out["cpu_count"] = thread_info.get("affinity_cpus") or thread_info.get("cpu_count")
    out["intra_op_threads"] = thread_info.get("torch_intra_op_threads")
    out["local_world_size"] = capture.get("local_world_size")
    return out


def _memory_metrics(capture: dict[str, Any]) -> dict[str, Any]:
    devices = {d.get("device"): d for d in (capture.get("memory") or {}).get("devices") or []}
    own = devices.get(capture.get("device"))
    if own is None:
        return {}
    out = {k: own.get(k) for k in ("peak_allocated_bytes", "peak_reserved_bytes", "capacity_bytes")}
    if own.get("capacity_bytes") and own.get("peak_reserved_bytes") is not None:
        out["headroom_ratio"] = 1.0 - own["peak_reserved_bytes"] / own["capacity_bytes"]
    if capture.get("device") != "cuda:0":
        out["foreign_cuda0_bytes"] = (devices.get("cuda:0") or {}).get("peak_reserved_bytes", 0)
    return out


def capture_metrics(run_dir: Path) -> CaptureMetrics:
    """Everything measurable from the capture files of ``run_dir``."""
    manifest = read_manifest(run_dir)
    captures = read_rank_files(run_dir)
    step_table: list[dict[str, Any]] = []
    device_table: list[dict[str, Any]] = []
    ranks = []
    for rank, capture in captures.items():
        rows = step_rows(rank, capture)
        step_table += rows
        device_table += device_rows(rank, capture)
        ranks.append(rank_metrics(rank, capture, rows))
    first = next(iter(captures.values()), {})
    backend = first.get("backend")
    world_size = manifest.get("world_size") or first.get("world_size") or len(captures)
    mode = (
        "ddp"
        if any(c.get("ddp") for c in captures.values())
        else ("dp" if any(c.get("dp") for c in captures.values()) else ("ddp" if backend else "single"))
    )
    analysed = [r["steps_analyzed"] for r in ranks if r["steps_analyzed"]]
    run = {
        "path": str(run_dir),
        "mode": mode,
        "world_size": world_size,
        "backend": backend,
        "steps_analyzed": min(analysed) if analysed else 0,
    }
    return CaptureMetrics(run, ranks, pd.DataFrame(step_table), pd.DataFrame(device_table))
