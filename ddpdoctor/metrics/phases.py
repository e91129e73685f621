"""Host-side phases of each step: dataloader, forward, backward, optimizer (interval sets in µs).

- dataloader: ``enumerate(DataLoader)#...__next__`` / ``enumerate(DataPipe)#...`` ranges
              (torch-tb-profiler's rule)
- optimizer:  ``Optimizer.step#...`` and ``Optimizer.zero_grad#...`` ranges
- backward:   per step, from the first to the last autograd op (``autograd::engine::evaluate_function: ...``,
              ``*Backward``, ``AccumulateGrad``, on any thread) or DDP reducer op
              (``torch.distributed.ddp.reducer::...``)
- forward:    per step, from the start of ``DistributedDataParallel.forward``/``DataParallel.forward`` (else
              the end of the batch fetch, else the step start) to the start of backward: input copies, forward
              pass and loss
The sets are made exclusive in the order dataloader > optimizer > backward > forward.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ddpdoctor.metrics import intervals as iv

PHASES = ("dataloader", "forward", "backward", "optimizer")
_DATALOADER = re.compile(r"^enumerate\(DataLoader\)#.*__next__$|^enumerate\(DataPipe\)#")
_OPTIMIZER = re.compile(r"^Optimizer\.(step|zero_grad)#")
_BACKWARD = re.compile(
    r"^autograd::engine::evaluate_function|^torch\.distributed\.ddp\.reducer::|Backward\d*$|^torch::autograd::AccumulateGrad$"
)
_FORWARD = re.compile(r"^(DistributedDataParallel|DataParallel)\.forward$")


def names_matching(frame: pd.DataFrame, pattern: re.Pattern[str]) -> pd.Series:
    """Boolean mask of the rows whose (categorical) name matches ``pattern``; evaluated once per distinct
    name."""
    cats = frame["name"].cat.categories
    hit = np.fromiter((bool(pattern.search(c)) for c in cats), dtype=bool, count=len(cats))
    codes = frame["name"].cat.codes.to_numpy()
    return pd.Series(hit[codes] & (codes >= 0), index=frame.index)


def _ranges(ops: pd.DataFrame, pattern: re.Pattern[str]) -> pd.DataFrame:
    return ops[names_matching(ops, pattern)]


def host_phases(ops: pd.DataFrame, steps: pd.DataFrame) -> dict[str, iv.Intervals]:
    """Exclusive interval sets for each phase of ``PHASES`` over the host step windows of ``steps``."""
    dl_ops = _ranges(ops, _DATALOADER)
    dataloader = iv.union(dl_ops["ts_us"].to_numpy(), dl_ops["end_us"].to_numpy())
    opt_ops = _ranges(ops, _OPTIMIZER)
    optimizer = iv.union(opt_ops["ts_us"].to_numpy(), opt_ops["end_us"].to_numpy())
    bwd = _ranges(ops, _BACKWARD)
    fwd = _ranges(ops, _FORWARD)
    lo = steps["host_start_us"].to_numpy()
    hi = steps["host_end_us"].to_numpy()
    b_start, b_end = _per_step_extent(bwd, lo, hi)
    f_start, f_end = _per_step_extent(fwd, lo, hi)
    dl_end = _last_end_before(dataloader, lo, np.where(np.isnan(b_start), hi, b_start))
    fwd_lo = np.where(~np.isnan(f_start), f_start, np.where(~np.isnan(dl_end), dl_end, lo))
    fwd_hi = np.where(~np.isnan(b_start), b_start, np.where(~np.isnan(f_end), f_end, fwd_lo))
    backward = iv.union(b_start[~np.isnan(b_start)], b_end[~np.isnan(b_start)])
    forward = iv.union(fwd_lo, fwd_hi)
    taken = dataloader
    optimizer = iv.subtract(optimizer, taken)
    taken = iv.union_all(taken, optimizer)
    backward = iv.subtract(backward, taken)
    taken = iv.union_all(taken, backward)
    forward = iv.subtract(forward, taken)
    return {"dataloader": dataloader, "forward": forward, "backward": backward, "optimizer": optimizer}


def _per_step_extent(rows: pd.DataFrame, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step window, the first start and last end of ``rows`` starting inside it (NaN when none)."""
    start = np.full(len(lo), np.nan)
    end = np.full(len(lo), np.nan)
    if len(rows) == 0 or len(lo) == 0:
        return start, end
    ts = rows["ts_us"].to_numpy()
    te = rows["end_us"].to_numpy()
    i = np.searchsorted(lo, ts, side="right") - 1
    ok = (i >= 0) & (ts < hi[np.maximum(i, 0)])
    s = (
        pd.DataFrame({"i": i[ok], "ts": ts[ok], "te": te[ok]})
        .groupby("i")
        .agg(ts=("ts", "min"), te=("te", "max"))
    )
    start[s.index.to_numpy()] = s["ts"].to_numpy()
    end[s.index.to_numpy()] = np.minimum(s["te"].to_numpy(), hi[s.index.to_numpy()])
    return start, end


def _last_end_before(ranges: iv.Intervals, lo: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """Per step, the end of the last range that ends inside [lo, limit] (NaN when none)."""
    ends = ranges[1]
    out = np.full(len(lo), np.nan)
    if len(ends) == 0:
        return out
    j = np.searchsorted(ends, limit, side="right") - 1
    ok = (j >= 0) & (ends[np.maximum(j, 0)] >= lo)
    out[ok] = ends[j[ok]]
    return out


def phase_at(phases: dict[str, iv.Intervals], t: np.ndarray) -> np.ndarray:
    """The phase name (or "other") at each host time ``t``."""
    out = np.full(len(t), "other", dtype=object)
    for name, (s, e) in phases.items():
        hit = iv.locate(s, e, t) >= 0
        out[hit & (out == "other")] = name
    return out
