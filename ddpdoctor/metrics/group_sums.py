"""Group sums added in the order pandas and numpy add them, so that ported code gives the same numbers to the last
bit: pandas' group sum (``np.add.reduceat`` over rows that come group after group, else Kahan-compensated in row
order), numpy's ``np.sum`` of each run of rows (pairwise, as a 2-D block's rows), and the small exact helpers they
need."""

from __future__ import annotations

from typing import Any

import numpy as np


class Segments:
    """Consecutive runs of rows (``first`` index and ``counts`` of each); ``reduce`` applies a numpy reduction to
    each run as ``fn(run)`` would (runs of one length are reduced as the rows of a 2-D block)."""

    def __init__(self, first: np.ndarray, counts: np.ndarray) -> None:
        self.first = np.asarray(first, dtype=np.int64)
        self.counts = np.asarray(counts, dtype=np.int64)

    @classmethod
    def of_mask(cls, first: np.ndarray, counts: np.ndarray, mask: np.ndarray) -> Segments:
        """The runs of ``values[mask]``: each run keeps its rows where ``mask`` holds."""
        kept = np.add.reduceat(mask.astype(np.int64), first) if len(first) else np.zeros(0, dtype=np.int64)
        return cls(np.concatenate(([0], np.cumsum(kept)[:-1])) if len(kept) else kept, kept)

    def reduce(self, fn: Any, values: np.ndarray) -> np.ndarray:
        out = np.zeros(len(self.counts))
        for length in np.unique(self.counts, return_counts=True)[0]:
            idx = np.flatnonzero(self.counts == length)
            if length == 0:
                out[idx] = 0.0 if fn is np.sum else np.nan  # an empty run: numpy's sum, else nothing to reduce
                continue
            rows = self.first[idx][:, None] + np.arange(length)
            out[idx] = fn(values[rows], axis=1)
        return out


def positions_within(counts: np.ndarray) -> np.ndarray:
    """For rows that come in consecutive runs of ``counts`` rows: each row's position within its run (0, 1, ...)."""
    counts = np.asarray(counts, dtype=np.int64)
    return np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)


def pandas_group_sum(values: np.ndarray, ids: np.ndarray, n: int, *, sort: bool = True) -> np.ndarray:
    """Per group: the sum of the values (NaN skipped), added as pandas' ``groupby(..., sort=sort).sum()`` adds
    them, to the last bit: ``np.add.reduceat`` over the groups when the rows come group after group (in the
    order pandas numbers the groups: by key with ``sort``, by first appearance without) and no value is NaN;
    else Kahan-compensated, rows added in their order."""
    v = np.asarray(values, dtype=np.float64)
    total = np.zeros(n)
    if not len(v):
        return total
    numbered = ids if sort else _by_first_appearance(ids, n)
    if not np.isnan(v).any() and bool(np.all(numbered[1:] >= numbered[:-1])):
        starts = np.flatnonzero(np.r_[True, numbered[1:] != numbered[:-1]])
        total[ids[starts]] = np.add.reduceat(v, starts)
        return total
    return kahan_group_sum(v, ids, n)


def _by_first_appearance(ids: np.ndarray, n: int) -> np.ndarray:
    first = np.full(n, len(ids), dtype=np.int64)
    np.minimum.at(first, ids, np.arange(len(ids)))
    rank = np.empty(n, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(n)
    return rank[ids]


def kahan_group_sum(values: np.ndarray, ids: np.ndarray, n: int) -> np.ndarray:
    """Per group: the sum of the values (NaN skipped), Kahan-compensated, rows added in their order (pandas'
    Cython group sum)."""
    v = np.asarray(values, dtype=np.float64)
    ok = ~np.isnan(v)
    v, g = v[ok], ids[ok]
    total = np.zeros(n)
    comp = np.zeros(n)
    if not len(v):
        return total
    order = np.argsort(g, kind="stable")
    g, v = g[order], v[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    pos = positions_within(np.diff(np.r_[starts, len(g)]))
    by_pos = np.argsort(pos, kind="stable")
    cuts = np.searchsorted(pos[by_pos], np.arange(int(pos.max()) + 2))
    for j in range(len(cuts) - 1):
        rows = by_pos[cuts[j] : cuts[j + 1]]
        k = g[rows]
        y = v[rows] - comp[k]
        t = total[k] + y
        comp[k] = (t - total[k]) - y
        total[k] = t
    return total


def pairwise_group_sum(values: np.ndarray, ids: np.ndarray, n: int) -> np.ndarray:
    """Per group: ``np.sum`` of its values in row order (as a pandas Series' ``sum`` of the group)."""
    order = np.argsort(ids, kind="stable")
    g = ids[order]
    first = np.searchsorted(g, np.arange(n))
    counts = np.bincount(g, minlength=n)
    return Segments(first, counts).reduce(np.sum, np.asarray(values, dtype=np.float64)[order])


def running_max(values: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """The running maximum of ``values`` within each run of equal ``segment`` (sorted), exactly."""
    uniq, inverse = np.unique(values, return_inverse=True)
    key = segment.astype(np.int64) * (len(uniq) + 1) + inverse.reshape(-1)
    return uniq[np.maximum.accumulate(key) - segment.astype(np.int64) * (len(uniq) + 1)]


def n_distinct(values: np.ndarray) -> int:
    """How many distinct values (``np.unique`` without a second output imports ``numpy.ma``, ~10 ms)."""
    return len(np.unique(values, return_counts=True)[0])


def segmented_searchsorted(
    values: np.ndarray,
    first: np.ndarray,
    counts: np.ndarray,
    segment: np.ndarray,
    queries: np.ndarray,
    side: str = "right",
) -> np.ndarray:
    """For each query, ``np.searchsorted(values[first[s]:first[s] + counts[s]], query, side)`` with ``s`` its
    ``segment``: how many of its segment's (sorted) values are <= it ("right") or < it ("left"). All queries at
    once by bisection, in O(queries x log of the longest segment) time and O(queries) memory; NaN queries sort
    after every value, as numpy sorts them."""
    below = np.less_equal if side == "right" else np.less
    first = np.asarray(first, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    base = first[segment]
    lo, hi = base, base + counts[segment]  # lo and hi are replaced below, never written in place
    nan = np.isnan(queries)
    if len(values):
        while True:
            open_ = lo < hi
            if not open_.any():
                break
            mid = (lo + hi) // 2
            # values[mid] <= query: the answer is past mid (a NaN query is past every value)
            right = open_ & (below(values[np.minimum(mid, len(values) - 1)], queries) | nan)
            left = open_ & ~right
            lo = np.where(right, mid + 1, lo)
            hi = np.where(left, mid, hi)
    return lo - base
