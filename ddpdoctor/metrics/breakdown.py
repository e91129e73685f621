"""Per-step time accounting of one rank: every µs of a step is counted once, by priority.

Phase breakdown (sums to the step): device compute, by the host phase that launched it (forward, backward,
optimizer, dataloader, else other) > exposed communication (communication not overlapped by compute) > the
host phase at that time (dataloader > optimizer > backward > forward) > other. On CPU-only traces there is no
device, so exposed communication comes first and every other µs goes to the host phase.

tb-style breakdown (torch-tb-profiler's overview, for comparison): kernel > memcpy > memset > communication >
runtime > dataloader > cpu_exec > other.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ddpdoctor.load.categories import DEVICE_WORK_CATS, RUNTIME_CATS
from ddpdoctor.load.model import RankTrace
from ddpdoctor.metrics import catalog
from ddpdoctor.metrics import intervals as iv
from ddpdoctor.metrics.comm import busy_sets
from ddpdoctor.metrics.phases import PHASES, host_phases, names_matching, phase_at
from ddpdoctor.metrics.steps import launch_times

_HOST_SYNC = re.compile(
    r"^(cuda|hip)(Stream|Device|Event)Synchronize$|^(cuda|hip)Memcpy$|^(cuda|hip)Memcpy(2D|3D)?$|^cuStreamSynchronize"
)
_PROFILER_STEP = re.compile(r"^ProfilerStep#")
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


def _ivs(frame: pd.DataFrame) -> iv.Intervals:
    return iv.union(frame["ts_us"].to_numpy(), frame["end_us"].to_numpy())


def _ms(ivs: iv.Intervals, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return iv.coverage(ivs, lo, hi) / 1e3


def per_step(rt: RankTrace, windows: pd.DataFrame) -> pd.DataFrame:
    """One row per step window: ``step_ms`` and its breakdowns (ms), comm/overlap and device utilisation
    columns."""
    lo = windows["start_us"].to_numpy()
    hi = windows["end_us"].to_numpy()
    out = windows[["step", "span", "start_us", "end_us", "analyzed"]].copy()
    out["step_ms"] = (hi - lo) / 1e3
    ops = rt.ops
    phases = host_phases(ops, windows)
    comm, compute, on_device = busy_sets(rt)
    k = rt.kernels
    work = k[k["cat"].isin(DEVICE_WORK_CATS)] if k is not None else None
    ordered: list[tuple[str, iv.Intervals]] = []
    if on_device and work is not None and len(work):
        comm_names = names_matching(work, re.compile(r"^(nccl|rccl).*kernel", re.IGNORECASE))
        dev = work[~comm_names]
        owner = phase_at(phases, launch_times(rt, dev))
        busy_compute = iv.EMPTY
        for name in ("forward", "backward", "optimizer", "dataloader", "other"):
            part = _ivs(dev[owner == name])
            ordered.append((f"dev_{name}", part))
            busy_compute = iv.union_all(busy_compute, part)
        ordered.append(("exposed_comm", iv.subtract(comm, busy_compute)))
    else:
        ordered.append(("exposed_comm", iv.subtract(comm, compute)))
    for name in ("dataloader", "optimizer", "backward", "forward"):
        ordered.append((name, phases[name]))
    shares = _priority(ordered, lo, hi)
    for name in PHASES:
        out[f"{name}_ms"] = shares.get(name, 0.0) + shares.get(f"dev_{name}", 0.0)
    out["exposed_comm_ms"] = shares["exposed_comm"]
    known = out[[f"{p}_ms" for p in PHASES] + ["exposed_comm_ms"]].sum(axis=1)
    out["other_ms"] = np.maximum(out["step_ms"] - known, 0.0)
    out["comm_ms"] = _ms(comm, lo, hi)
    out["overlapped_comm_ms"] = _ms(iv.intersect(comm, compute), lo, hi)
    kernels_only = _ivs(k[k["cat"] == "kernel"]) if k is not None and len(k) else iv.EMPTY
    out["gpu_busy_ms"] = _ms(kernels_only, lo, hi)
    out["gpu_util_ratio"] = (
        np.where(
            out["step_ms"] > 0, out["gpu_busy_ms"] / out["step_ms"].where(out["step_ms"] > 0, 1.0), np.nan
        )
        if on_device
        else np.nan
    )
    runtime = ops[ops["cat"].isin(RUNTIME_CATS)]
    out["host_sync_ms"] = (
        _ms(_ivs(runtime[names_matching(runtime, _HOST_SYNC)]), lo, hi) if on_device else np.nan
    )
    for key, value in tb_breakdown(rt, phases, comm, lo, hi).items():
        out[key] = value
    return out.reset_index(drop=True)


def _priority(
    ordered: list[tuple[str, iv.Intervals]], lo: np.ndarray, hi: np.ndarray
) -> dict[str, np.ndarray]:
    taken = iv.EMPTY
    shares: dict[str, np.ndarray] = {}
    for name, ivs in ordered:
        own = iv.subtract(ivs, taken)
        shares[name] = _ms(own, lo, hi)
        taken = iv.union_all(taken, ivs)
    return shares


def tb_breakdown(
    rt: RankTrace, phases: dict[str, iv.Intervals], comm: iv.Intervals, lo: np.ndarray, hi: np.ndarray
) -> dict[str, np.ndarray]:
    """torch-tb-profiler's overview accounting (ms per step), for cross-checks with TensorBoard."""
    k = rt.kernels
    ops = rt.ops
    comm_kernel = re.compile(r"^(nccl|rccl).*kernel", re.IGNORECASE)
    kern = k[k["cat"] == "kernel"] if k is not None else ops.iloc[0:0]
    cpu = ops[(ops["cat"] == "cpu_op") & ~names_matching(ops, _PROFILER_STEP)]
    ordered = [
        ("kernel_ms", _ivs(kern[~names_matching(kern, comm_kernel)]) if len(kern) else iv.EMPTY),
        ("memcpy_ms", _ivs(k[k["cat"] == "gpu_memcpy"]) if k is not None and len(k) else iv.EMPTY),
        ("memset_ms", _ivs(k[k["cat"] == "gpu_memset"]) if k is not None and len(k) else iv.EMPTY),
        ("tb_comm_ms", comm),
        ("runtime_ms", _ivs(ops[ops["cat"].isin(RUNTIME_CATS)])),
        ("tb_dataloader_ms", phases["dataloader"]),
        ("cpu_exec_ms", _ivs(cpu)),
    ]
    shares = _priority(ordered, lo, hi)
    shares["tb_other_ms"] = np.maximum((hi - lo) / 1e3 - sum(shares.values()), 0.0)
    return shares
