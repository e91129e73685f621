"""Training-step windows of one rank, from ``ProfilerStep#N`` ranges (or the whole profiled window when
absent).

On traces with device work a step is stretched to the end of the last kernel it launched and starts no earlier
than the previous step ended (torch-tb-profiler's rule), so that the device time of a step is counted in that
step. The last step of each profiled window is not analysed when the rank has device work: kernels it launched
may still have been running when the profiler stopped (Holistic Trace Analysis drops it for the same reason).
"""

from __future__ import annotations

import numpy as np

from ddpdoctor.load.categories import DEVICE_WORK_CATS, RUNTIME_CATS
from ddpdoctor.load.model import RankTrace
from ddpdoctor.table import Table, distinct

STEP_COLUMNS = ["step", "span", "host_start_us", "host_end_us", "start_us", "end_us", "analyzed"]


def device_work(rt: RankTrace) -> Table:
    """Kernels, memcpys and memsets (what keeps the device busy)."""
    k = rt.tables.kernels
    if len(k) == 0:
        return k
    return k[k["cat"].isin(DEVICE_WORK_CATS)]


def first_index(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """For each of ``wanted``, the position of the first row whose key equals it (-1 when none): the lookup of a
    Series indexed by ``keys`` with duplicates dropped, reindexed by ``wanted``."""
    out = np.full(len(wanted), -1, dtype=np.int64)
    if len(keys) == 0 or len(wanted) == 0:
        return out
    uniq, first = np.unique(keys, return_index=True)
    j = np.minimum(np.searchsorted(uniq, wanted), len(uniq) - 1)
    hit = uniq[j] == wanted
    out[hit] = first[j[hit]]
    return out


def launch_times(rt: RankTrace, device_events: Table) -> np.ndarray:
    """Host time (µs) of the runtime call that launched each device event (NaN when not found)."""
    if len(device_events) == 0:
        return np.zeros(0)
    ops = rt.tables.ops
    runtime = ops["cat"].isin(RUNTIME_CATS) & (ops["correlation"] >= 0)
    at = first_index(ops["correlation"][runtime], device_events["correlation"])
    ts = ops["ts_us"][runtime]
    return np.where(at >= 0, ts[np.maximum(at, 0)], np.nan) if len(ts) else np.full(len(at), np.nan)


def step_windows(rt: RankTrace) -> Table:
    """One row per step: ``step, span, host_start_us, host_end_us, start_us, end_us, analyzed``."""
    steps = rt.tables.steps
    if len(steps):
        out = Table(
            {
                "step": steps["step"],
                "span": steps["span"],
                "host_start_us": steps["ts_us"],
                "host_end_us": steps["end_us"],
            }
        )
    else:
        out = _whole_windows(rt)
    out = out.sort("host_start_us")
    work = device_work(rt)
    has_device = len(work) > 0
    starts, ends = out["host_start_us"].copy(), out["host_end_us"].copy()
    if has_device and len(out):
        starts, ends = _stretch_to_device(out, work, launch_times(rt, work))
    out["start_us"], out["end_us"] = starts, ends
    analyzed = np.ones(len(out), dtype=bool)
    if has_device and len(steps):
        span = out["span"]
        uniq, last_rev, counts = np.unique(span[::-1], return_index=True, return_counts=True)
        last = len(span) - 1 - last_rev  # the last row of each span
        analyzed[last[counts >= 2]] = False
    out["analyzed"] = analyzed
    return out.select(STEP_COLUMNS)


def _whole_windows(rt: RankTrace) -> Table:
    rows = []
    tables = [t for t in (rt.tables.ops, rt.tables.kernels) if len(t)]
    for span in sorted({int(s) for t in tables for s in distinct(t["span"])}):
        lo = min(float(t["ts_us"][t["span"] == span].min()) for t in tables if (t["span"] == span).any())
        hi = max(float(t["end_us"][t["span"] == span].max()) for t in tables if (t["span"] == span).any())
        rows.append({"step": 0, "span": span, "host_start_us": lo, "host_end_us": hi})
    if not rows:
        return Table(
            {
                "step": np.zeros(0, dtype=np.int64),
                "span": np.zeros(0, dtype=np.int64),
                "host_start_us": np.zeros(0),
                "host_end_us": np.zeros(0),
            }
        )
    return Table.from_records(rows, ["step", "span", "host_start_us", "host_end_us"])


def _stretch_to_device(steps: Table, work: Table, launched_at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    host_lo = steps["host_start_us"]
    host_hi = steps["host_end_us"]
    span = steps["span"]
    # the step whose host window contains the launch of each device event
    i = np.searchsorted(host_lo, launched_at, side="right") - 1
    ok = ~np.isnan(launched_at) & (i >= 0)
    ok &= launched_at <= host_hi[np.maximum(i, 0)]
    dev_end = np.full(len(steps), -np.inf)
    dev_start = np.full(len(steps), np.inf)
    np.maximum.at(dev_end, i[ok], work["end_us"][ok])
    np.minimum.at(dev_start, i[ok], work["ts_us"][ok])
    # device work launched before the first step that is still running when it starts delays it
    prev_end = host_lo[0]
    before = work["end_us"][~ok]
    if np.isfinite(dev_start[0]):
        earlier = before[before < dev_start[0]]
        if len(earlier):
            prev_end = max(prev_end, float(earlier.max()))
    starts, ends = np.empty(len(steps)), np.empty(len(steps))
    lo_list, hi_list, span_list = host_lo.tolist(), host_hi.tolist(), span.tolist()
    dev_end_list = dev_end.tolist()
    for k in range(len(steps)):
        start = max(prev_end, lo_list[k]) if k == 0 or span_list[k] == span_list[k - 1] else lo_list[k]
        end = max(hi_list[k], dev_end_list[k]) if np.isfinite(dev_end_list[k]) else max(hi_list[k], start)
        starts[k], ends[k] = start, max(end, start)
        prev_end = ends[k]
    return starts, ends
