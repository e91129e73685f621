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

from ddpdoctor.metrics import intervals as iv
from ddpdoctor.table import Table, group_max, group_min

PHASES = ("dataloader", "forward", "backward", "optimizer")
_DATALOADER = re.compile(r"^enumerate\(DataLoader\)#.*__next__$|^enumerate\(DataPipe\)#")
_OPTIMIZER = re.compile(r"^Optimizer\.(step|zero_grad)#")
_BACKWARD = re.compile(
    r"^autograd::engine::evaluate_function|^torch\.distributed\.ddp\.reducer::|Backward\d*$|^torch::autograd::AccumulateGrad$"
)
_FORWARD = re.compile(r"^(DistributedDataParallel|DataParallel)\.forward$")


def names_matching(table: Table, pattern: re.Pattern[str]) -> np.ndarray:
    """Boolean mask of the rows whose (categorical) name matches ``pattern`` (``re.search``); evaluated once per
    distinct name (and once per rank: the tables of a rank share their list of names)."""
    names = table["name"]
    return _name_flags(names.categories, pattern)[names.codes]


# (the names of the rank analysed last, {pattern: one flag per name and a False for code -1})
_FLAGS: tuple[list[str], int, dict[re.Pattern[str], np.ndarray]] = ([], 0, {})


def _name_flags(categories: list[str], pattern: re.Pattern[str]) -> np.ndarray:
    global _FLAGS
    cached = _FLAGS  # one read: another thread may replace it, never change it under us
    if cached[0] is not categories or cached[1] != len(categories):
        cached = _FLAGS = (categories, len(categories), {})
    flags = cached[2].get(pattern)
    if flags is None:
        search = pattern.search
        flags = cached[2][pattern] = np.array([search(c) is not None for c in categories] + [False], dtype=bool)
    return flags


def _ranges(ops: Table, pattern: re.Pattern[str]) -> iv.Intervals:
    rows = names_matching(ops, pattern)
    return ops["ts_us"][rows], ops["end_us"][rows]


def host_phases(ops: Table, steps: Table) -> dict[str, iv.Intervals]:
    """Exclusive interval sets for each phase of ``PHASES`` over the host step windows of ``steps``."""
    dataloader = iv.union(*_ranges(ops, _DATALOADER))
    optimizer = iv.union(*_ranges(ops, _OPTIMIZER))
    lo = steps["host_start_us"]
    hi = steps["host_end_us"]
    b_start, b_end = _per_step_extent(_ranges(ops, _BACKWARD), lo, hi)
    f_start, f_end = _per_step_extent(_ranges(ops, _FORWARD), lo, hi)
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


def _per_step_extent(rows: iv.Intervals, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step window, the first start and last end of the ranges ``rows`` (starts, ends) starting inside it
    (NaN when none)."""
    ts, te = rows
    if len(ts) == 0 or len(lo) == 0:
        return np.full(len(lo), np.nan), np.full(len(lo), np.nan)
    i = np.searchsorted(lo, ts, side="right") - 1
    ok = (i >= 0) & (ts < hi[np.maximum(i, 0)])
    start = group_min(ts[ok], i[ok], len(lo))
    end = np.minimum(group_max(te[ok], i[ok], len(lo)), hi)
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
