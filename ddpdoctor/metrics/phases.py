"""Host-side phases of each step: dataloader, forward, backward, optimizer (interval sets in µs).

- dataloader: ``enumerate(DataLoader)#...__next__`` / ``enumerate(DataPipe)#...`` ranges
              (torch-tb-profiler's rule)
- optimizer:  ``Optimizer.step#...`` and ``Optimizer.zero_grad#...`` ranges
- micro-batches: a step holds one micro-batch per top-level ``DistributedDataParallel.forward`` /
              ``DataParallel.forward`` (gradient accumulation: several per optimizer step; a manual update loop
              without steps: every forward of the recording), from that forward's start to the next one's (or the
              step's end)
- backward:   per micro-batch, from the first to the last autograd op (``autograd::engine::evaluate_function: ...``,
              ``*Backward``, ``AccumulateGrad``, on any thread) or DDP reducer op
              (``torch.distributed.ddp.reducer::...``) that starts after its forward returned; in a step without
              forward ranges, from the step's first to its last such op
- forward:    per micro-batch, from the start of its forward to the start of its backward (or the forward's end):
              input copies, forward pass and loss; in a step without forward ranges, from the end of the batch
              fetch (else the step start) to the start of backward
The sets are made exclusive in the order dataloader > backward > forward (from a forward range) > optimizer >
forward (inferred, in a step without forward ranges): a forward and backward inside the optimizer's step (a
closure: Lightning's automatic optimisation, LBFGS) are forward and backward, and the optimizer keeps the rest of
its step; an ``optimizer.zero_grad()`` before the backward of a step without forward ranges stays the
optimizer's.
"""

from __future__ import annotations

import re

import numpy as np

from ddpdoctor.metrics import intervals as iv
from ddpdoctor.table import Table, group_max, group_min

PHASES = ("dataloader", "forward", "backward", "optimizer")
_DATALOADER = re.compile(r"^enumerate\(DataLoader\)#.*__next__$|^enumerate\(DataPipe\)#")
_OPTIMIZER = re.compile(r"^Optimizer\.(step|zero_grad)#")
BACKWARD_OPS = re.compile(
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
        seen = _SEEN.get(pattern)
        if seen is None or len(seen) > _SEEN_MAX:
            seen = _SEEN[pattern] = {}
        search, known = pattern.search, seen.get
        out = []
        for c in categories:
            flag = known(c)
            if flag is None:
                flag = seen[c] = search(c) is not None
            out.append(flag)
        flags = cached[2][pattern] = np.array(out + [False], dtype=bool)
    return flags


# Each pattern's answer for every name met so far, across ranks: the ranks of a job share most of their names (a
# long kernel name costs a regex search of microseconds, a lookup tens of nanoseconds). At most _SEEN_MAX names a
# pattern (then it starts again): a long-lived process (`ddpdoctor view`) reads many runs.
_SEEN: dict[re.Pattern[str], dict[str, bool]] = {}
_SEEN_MAX = 1 << 18


def _ranges(ops: Table, pattern: re.Pattern[str]) -> iv.Intervals:
    rows = names_matching(ops, pattern)
    return ops["ts_us"][rows], ops["end_us"][rows]


def loads_batches(ops: Table, lo: np.ndarray, hi: np.ndarray) -> bool:
    """Whether a torch DataLoader (or DataPipe) handed out a batch in any of the windows [lo, hi] (sorted, apart):
    its ``enumerate(DataLoader)#...__next__`` range starts in one (``intervals.locate``). Without that, the wait
    for data is not told apart from the rest of the step (data loaded by a loop of the script's own, a generator,
    tensors made in it)."""
    starts, _ = _ranges(ops, _DATALOADER)
    return bool(np.any(iv.locate(lo, hi, starts) >= 0))


def host_phases(ops: Table, steps: Table) -> dict[str, iv.Intervals]:
    """Exclusive interval sets for each phase of ``PHASES`` over the host step windows of ``steps``."""
    dataloader = iv.union(*_ranges(ops, _DATALOADER))
    optimizer = iv.union(*_ranges(ops, _OPTIMIZER))
    lo = steps["host_start_us"]
    hi = steps["host_end_us"]
    bwd_ops = _ranges(ops, BACKWARD_OPS)
    micro, rest = _micro_batches(_ranges(ops, _FORWARD), bwd_ops, lo, hi)
    # steps without forward ranges: one forward, from the batch fetch (else the step start) to backward
    b_start, b_end = _per_step_extent(rest, lo, hi)
    plain = micro["steps_without"]
    dl_end = _last_end_before(dataloader, lo, np.where(np.isnan(b_start), hi, b_start))
    fwd_lo = np.where(~np.isnan(dl_end), dl_end, lo)[plain]
    fwd_hi = np.where(~np.isnan(b_start), b_start, np.where(~np.isnan(dl_end), dl_end, lo))[plain]
    has_b = ~np.isnan(b_start)
    backward = iv.union(
        np.concatenate([micro["b_start"], b_start[has_b]]), np.concatenate([micro["b_end"], b_end[has_b]])
    )
    ranged = iv.union(micro["f_start"], micro["f_end"])  # from a forward range
    inferred = iv.union(fwd_lo, fwd_hi)  # a step without forward ranges: up to its backward
    taken = dataloader
    backward = iv.subtract(backward, taken)
    taken = iv.union_all(taken, backward)
    ranged = iv.subtract(ranged, taken)
    taken = iv.union_all(taken, ranged)
    optimizer = iv.subtract(optimizer, taken)
    taken = iv.union_all(taken, optimizer)
    forward = iv.union_all(ranged, iv.subtract(inferred, taken))
    return {"dataloader": dataloader, "forward": forward, "backward": backward, "optimizer": optimizer}


def _micro_batches(
    forwards: iv.Intervals, backward_ops: iv.Intervals, lo: np.ndarray, hi: np.ndarray
) -> tuple[dict[str, np.ndarray], iv.Intervals]:
    """The micro-batches of the steps [lo, hi): one per top-level forward range starting in a step (a forward
    inside another forward is part of it). Returns, per micro-batch, ``f_start``/``f_end`` (forward: its start to
    the first backward op after it returned, or its end) and ``b_start``/``b_end`` (its backward ops' extent; only
    micro-batches with backward ops), ``steps_without`` (a mask of the steps with no forward range), and the
    backward ops that belong to no micro-batch (those of steps without forward ranges, or before a step's first
    forward)."""
    fs, fe = forwards
    order = np.argsort(fs, kind="stable")
    fs, fe = fs[order], fe[order]
    if len(fs):
        before = np.concatenate([[-np.inf], np.maximum.accumulate(fe)[:-1]])
        top = fs >= before  # not inside an earlier forward
        fs, fe = fs[top], fe[top]
    i = np.searchsorted(lo, fs, side="right") - 1 if len(lo) else np.zeros(len(fs), dtype=np.int64)
    ok = (i >= 0) & (fs < hi[np.maximum(i, 0)]) if len(lo) else np.zeros(len(fs), dtype=bool)
    fs, fe, i = fs[ok], fe[ok], i[ok]
    steps_without = np.ones(len(lo), dtype=bool)
    steps_without[i] = False
    # a micro-batch runs to the next one of its step, else to the step's end
    seg_end = hi[i].copy() if len(i) else np.zeros(0)
    same = i[1:] == i[:-1]
    seg_end[:-1][same] = fs[1:][same]
    fe = np.minimum(fe, seg_end)
    bs, be = backward_ops
    b_order = np.argsort(bs, kind="stable")
    bs, be = bs[b_order], be[b_order]
    k = np.searchsorted(fs, bs, side="right") - 1
    mine = (k >= 0) & (bs < seg_end[np.maximum(k, 0)]) & (bs >= fe[np.maximum(k, 0)]) if len(fs) else k >= 0
    n = len(fs)
    first = group_min(bs[mine], k[mine], n) if n else np.zeros(0)
    last = np.minimum(group_max(be[mine], k[mine], n), seg_end) if n else np.zeros(0)
    has = ~np.isnan(first)
    f_end = np.where(has, first, fe)
    # backward ops inside a micro-batch's forward (DDP's bucket rebuild, say) are neither its backward nor left over
    inside = (k >= 0) & (bs < fe[np.maximum(k, 0)]) if len(fs) else np.zeros(len(bs), dtype=bool)
    rest = ~mine & ~inside
    return (
        {
            "f_start": fs,
            "f_end": f_end,
            "b_start": first[has],
            "b_end": last[has],
            "steps_without": steps_without,
        },
        (bs[rest], be[rest]),
    )


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
