"""Per-step time accounting of one rank: every µs of a step is counted once, by priority.

Phase breakdown (sums to the step): device compute, by the host phase that launched it (forward, backward,
optimizer, dataloader, else other) > exposed communication (communication not overlapped by compute) > the
host phase at that time (dataloader > backward > forward > optimizer) > other. On CPU-only traces there is no
device, so exposed communication comes first and every other µs goes to the host phase.

tb-style breakdown (torch-tb-profiler's overview, for comparison): kernel > memcpy > memset > communication >
runtime > dataloader > cpu_exec > other.
"""

from __future__ import annotations

import re

import numpy as np

from ddpdoctor.load.categories import DEVICE_WORK_CATS, RUNTIME_CATS
from ddpdoctor.load.model import RankTrace
from ddpdoctor.metrics import catalog
from ddpdoctor.metrics import intervals as iv
from ddpdoctor.metrics.comm import busy_sets
from ddpdoctor.metrics.phases import PHASES, host_phases, names_matching, phase_at
from ddpdoctor.metrics.steps import launch_times
from ddpdoctor.table import Table

_HOST_SYNC = re.compile(
    r"^(cuda|hip)(Stream|Device|Event)Synchronize$|^(cuda|hip)Memcpy$|^(cuda|hip)Memcpy(2D|3D)?$|^cuStreamSynchronize"
)
_PROFILER_STEP = re.compile(r"^ProfilerStep#")
_COMM_KERNEL = re.compile(r"^(nccl|rccl).*kernel", re.IGNORECASE)
BREAKDOWN = catalog.group("breakdown")
TB_BREAKDOWN = (
    "kernel_ms",
    "memcpy_ms",
    "memset_ms",
    "tb_comm_ms",
    "runtime_ms",
    "tb_dataloader_ms",
    "cpu_exec_ms",
    "tb_other_ms",
)


def _ivs(table: Table, rows: np.ndarray | None = None) -> iv.Intervals:
    """The union of the events of ``table`` (only ``rows``, a mask, when given)."""
    if rows is None:
        return iv.union(table["ts_us"], table["end_us"])
    return iv.union(table["ts_us"][rows], table["end_us"][rows])


def _ms(ivs: iv.Intervals, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return iv.coverage(ivs, lo, hi) / 1e3


def per_step(rt: RankTrace, windows: Table, lanes: dict[str, iv.Intervals] | None = None) -> Table:
    """One row per step window: ``step_ms`` and its breakdowns (ms), comm/overlap and device utilisation
    columns. ``lanes``: filled, when given, with the interval sets the timeline draws (``metrics.timeline``):
    ``exposed_comm`` and the host phases."""
    lo = windows["start_us"]
    hi = windows["end_us"]
    out = windows.select(["step", "span", "start_us", "end_us", "analyzed"]).copy()
    step_ms = (hi - lo) / 1e3
    out["step_ms"] = step_ms
    ops = rt.tables.ops
    phases = host_phases(ops, windows)
    comm, compute, on_device = busy_sets(rt)
    k = rt.tables.kernels
    kcat = k["cat"]
    work = k[kcat.isin(DEVICE_WORK_CATS)]
    ordered: list[tuple[str, iv.Intervals]] = []
    if on_device and len(work):
        dev = work[~names_matching(work, _COMM_KERNEL)]
        owner = phase_at(phases, launch_times(rt, dev))
        busy_compute = iv.EMPTY
        for name in ("forward", "backward", "optimizer", "dataloader", "other"):
            part = _ivs(dev, owner == name)
            ordered.append((f"dev_{name}", part))
            busy_compute = iv.union_all(busy_compute, part)
        ordered.append(("exposed_comm", iv.subtract(comm, busy_compute)))
    else:
        ordered.append(("exposed_comm", iv.subtract(comm, compute)))
    for name in ("dataloader", "optimizer", "backward", "forward"):
        ordered.append((name, phases[name]))
    if lanes is not None:
        lanes.update(ordered[-5:])
    shares = _priority(ordered, lo, hi)
    known = None
    for name in PHASES:
        value = shares.get(name, 0.0) + shares.get(f"dev_{name}", 0.0)
        out[f"{name}_ms"] = value
        known = out[f"{name}_ms"] if known is None else known + out[f"{name}_ms"]
    out["exposed_comm_ms"] = shares["exposed_comm"]
    known = known + out["exposed_comm_ms"]
    out["other_ms"] = np.maximum(step_ms - known, 0.0)
    out["comm_ms"] = _ms(comm, lo, hi)
    out["overlapped_comm_ms"] = _ms(iv.intersect(comm, compute), lo, hi)
    is_kernel = kcat.isin(["kernel"])
    kernels_only = _ivs(k, is_kernel) if len(k) else iv.EMPTY
    out["gpu_busy_ms"] = _ms(kernels_only, lo, hi)
    if on_device:
        with np.errstate(divide="ignore", invalid="ignore"):
            out["gpu_util_ratio"] = np.where(
                step_ms > 0, out["gpu_busy_ms"] / np.where(step_ms > 0, step_ms, 1.0), np.nan
            )
    else:
        out["gpu_util_ratio"] = np.full(len(out), np.nan)
    runtime = ops["cat"].isin(RUNTIME_CATS)
    out["host_sync_ms"] = (
        _ms(_ivs(ops, runtime & names_matching(ops, _HOST_SYNC)), lo, hi) if on_device else np.full(len(out), np.nan)
    )
    for key, value in tb_breakdown(rt, phases, comm, lo, hi).items():
        out[key] = value
    return out


def _priority(ordered: list[tuple[str, iv.Intervals]], lo: np.ndarray, hi: np.ndarray) -> dict[str, np.ndarray]:
    """Each set's ms per step window of the time no set before it in ``ordered`` covers."""
    owned = iv.by_priority([ivs for _, ivs in ordered])
    return {name: _ms(own, lo, hi) for (name, _), own in zip(ordered, owned, strict=True)}


def tb_breakdown(
    rt: RankTrace, phases: dict[str, iv.Intervals], comm: iv.Intervals, lo: np.ndarray, hi: np.ndarray
) -> dict[str, np.ndarray]:
    """torch-tb-profiler's overview accounting (ms per step), for cross-checks with TensorBoard."""
    k = rt.tables.kernels
    ops = rt.tables.ops
    kcat = k["cat"]
    kern = kcat.isin(["kernel"])
    cpu = ops["cat"].isin(["cpu_op"]) & ~names_matching(ops, _PROFILER_STEP)
    ordered = [
        ("kernel_ms", _ivs(k, kern & ~names_matching(k, _COMM_KERNEL)) if kern.any() else iv.EMPTY),
        ("memcpy_ms", _ivs(k, kcat.isin(["gpu_memcpy"])) if len(k) else iv.EMPTY),
        ("memset_ms", _ivs(k, kcat.isin(["gpu_memset"])) if len(k) else iv.EMPTY),
        ("tb_comm_ms", comm),
        ("runtime_ms", _ivs(ops, ops["cat"].isin(RUNTIME_CATS))),
        ("tb_dataloader_ms", phases["dataloader"]),
        ("cpu_exec_ms", _ivs(ops, cpu)),
    ]
    shares = _priority(ordered, lo, hi)
    shares["tb_other_ms"] = np.maximum((hi - lo) / 1e3 - sum(shares.values()), 0.0)
    return shares
