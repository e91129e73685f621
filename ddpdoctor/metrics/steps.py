"""Training-step windows of one rank, from ``ProfilerStep#N`` ranges (or the whole profiled window when
absent).

On traces with device work a step is stretched to the end of the last kernel it launched and starts no earlier
than the previous step ended (torch-tb-profiler's rule), so that the device time of a step is counted in that
step. The last step of each profiled window is not analysed when the rank has device work: kernels it launched
may still have been running when the profiler stopped (Holistic Trace Analysis drops it for the same reason).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ddpdoctor.load.categories import DEVICE_WORK_CATS, RUNTIME_CATS
from ddpdoctor.load.model import RankTrace

STEP_COLUMNS = ["step", "span", "host_start_us", "host_end_us", "start_us", "end_us", "analyzed"]


def device_work(rt: RankTrace) -> pd.DataFrame:
    """Kernels, memcpys and memsets (what keeps the device busy)."""
    k = rt.kernels
    if k is None or len(k) == 0:
        return k.iloc[0:0] if k is not None else pd.DataFrame()
    return k[k["cat"].isin(DEVICE_WORK_CATS)]


def launch_times(rt: RankTrace, device_events: pd.DataFrame) -> np.ndarray:
    """Host time (µs) of the runtime call that launched each device event (NaN when not found)."""
    if len(device_events) == 0:
        return np.zeros(0)
    ops = rt.ops
    runtime = ops[ops["cat"].isin(RUNTIME_CATS) & (ops["correlation"] >= 0)]
    by_corr = pd.Series(runtime["ts_us"].to_numpy(), index=runtime["correlation"].to_numpy())
    by_corr = by_corr[~by_corr.index.duplicated()]
    corr = device_events["correlation"].to_numpy()
    return by_corr.reindex(corr).to_numpy(dtype=np.float64)


def step_windows(rt: RankTrace) -> pd.DataFrame:
    """One row per step: ``step, span, host_start_us, host_end_us, start_us, end_us, analyzed``."""
    steps = rt.steps
    if steps is not None and len(steps):
        out = pd.DataFrame(
            {
                "step": steps["step"].to_numpy(),
                "span": steps["span"].to_numpy(),
                "host_start_us": steps["ts_us"].to_numpy(),
                "host_end_us": steps["end_us"].to_numpy(),
            }
        )
    else:
        out = _whole_windows(rt)
    out = out.sort_values("host_start_us", kind="stable").reset_index(drop=True)
    work = device_work(rt)
    has_device = len(work) > 0
    starts, ends = out["host_start_us"].to_numpy().copy(), out["host_end_us"].to_numpy().copy()
    if has_device and len(out):
        starts, ends = _stretch_to_device(out, work, launch_times(rt, work))
    out["start_us"], out["end_us"] = starts, ends
    analyzed = np.ones(len(out), dtype=bool)
    if has_device and steps is not None and len(steps):
        for _, idx in out.groupby("span").groups.items():
            if len(idx) >= 2:
                analyzed[out.index.get_loc(idx[-1])] = False
    out["analyzed"] = analyzed
    return out[STEP_COLUMNS]


def _whole_windows(rt: RankTrace) -> pd.DataFrame:
    rows = []
    frames = [f for f in (rt.ops, rt.kernels) if f is not None and len(f)]
    for span in sorted({int(s) for f in frames for s in f["span"].unique()}):
        lo = min(float(f.loc[f["span"] == span, "ts_us"].min()) for f in frames if (f["span"] == span).any())
        hi = max(float(f.loc[f["span"] == span, "end_us"].max()) for f in frames if (f["span"] == span).any())
        rows.append({"step": 0, "span": span, "host_start_us": lo, "host_end_us": hi})
    return pd.DataFrame(rows, columns=["step", "span", "host_start_us", "host_end_us"])


def _stretch_to_device(
    steps: pd.DataFrame, work: pd.DataFrame, launched_at: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    host_lo = steps["host_start_us"].to_numpy()
    host_hi = steps["host_end_us"].to_numpy()
    # the step whose host window contains the launch of each device event
    i = np.searchsorted(host_lo, launched_at, side="right") - 1
    ok = ~np.isnan(launched_at) & (i >= 0)
    ok &= launched_at <= host_hi[np.maximum(i, 0)]
    dev_end = np.full(len(steps), -np.inf)
    dev_start = np.full(len(steps), np.inf)
    np.maximum.at(dev_end, i[ok], work["end_us"].to_numpy()[ok])
    np.minimum.at(dev_start, i[ok], work["ts_us"].to_numpy()[ok])
    # device work launched before the first step that is still running when it starts delays it
    prev_end = host_lo[0]
    before = work["end_us"].to_numpy()[~ok]
    if np.isfinite(dev_start[0]):
        earlier = before[before < dev_start[0]]
        if len(earlier):
            prev_end = max(prev_end, float(earlier.max()))
    starts, ends = np.empty(len(steps)), np.empty(len(steps))
    for k in range(len(steps)):
        start = (
            max(prev_end, host_lo[k])
            if k == 0 or steps["span"].iat[k] == steps["span"].iat[k - 1]
            else host_lo[k]
        )
        end = max(host_hi[k], dev_end[k]) if np.isfinite(dev_end[k]) else max(host_hi[k], start)
        starts[k], ends[k] = start, max(end, start)
        prev_end = ends[k]
    return starts, ends
