"""Interval algebra on numpy arrays (times in µs): union, intersection, difference, per-window coverage.

An ``Intervals`` is a pair of float arrays (starts, ends); ``union`` returns them sorted and disjoint, which
every other function here expects.
"""

from __future__ import annotations

import numpy as np

from ddpdoctor.metrics.group_sums import positions_within, running_max, segmented_searchsorted

Intervals = tuple[np.ndarray, np.ndarray]
EMPTY: Intervals = (np.zeros(0), np.zeros(0))


def union(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """The union of possibly overlapping intervals, as sorted disjoint intervals (empty ones dropped)."""
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if len(starts) == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], reach[last]


def union_all(*parts: Intervals) -> Intervals:
    if not parts:
        return EMPTY
    return union(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def total(iv: Intervals) -> float:
    """Total length of disjoint intervals (µs)."""
    return float(np.sum(iv[1] - iv[0]))


def _sweep(a: Intervals, b: Intervals, want: int) -> Intervals:
    # a weighs 1, b weighs 2: coverage 1 = only a, 2 = only b, 3 = both
    pts = np.concatenate([a[0], a[1], b[0], b[1]])
    if len(pts) == 0:
        return EMPTY
    w = np.concatenate([np.ones(len(a[0])), -np.ones(len(a[1])), np.full(len(b[0]), 2.0), np.full(len(b[1]), -2.0)])
    order = np.argsort(pts, kind="stable")
    pts, w = pts[order], w[order]
    # several boundaries at one instant: only the level after the last of them counts
    level = np.cumsum(w)
    last_at_t = np.append(pts[1:] != pts[:-1], True)
    pts, level = pts[last_at_t], level[last_at_t]
    inside = level[:-1] == want
    return union(pts[:-1][inside], pts[1:][inside])


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """a ∩ b for two disjoint sorted interval sets."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return EMPTY
    return _sweep(a, b, 3)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """a minus b for two disjoint sorted interval sets."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return a
    return _sweep(a, b, 1)


def by_priority(sets: list[Intervals]) -> list[Intervals]:
    """Each µs to the first of ``sets`` (disjoint sorted interval sets, at most 62) that covers it: for each set,
    the part of it no earlier set covers, as ``subtract(sets[k], union_all(*sets[:k]))`` gives it, in one sweep
    over every boundary instead of one per set."""
    if len(sets) > 62:
        raise ValueError("by_priority: at most 62 interval sets")
    pts = np.concatenate([x for st, en in sets for x in (st, en)]) if sets else np.zeros(0)
    if len(pts) == 0:
        return [EMPTY for _ in sets]
    # set k adds 2**k while it covers a time (its intervals are disjoint): the running sum is the mask of the sets
    # covering each segment between two boundaries
    bits = [np.int64(1) << np.int64(k) for k in range(len(sets))]
    w = np.concatenate(
        [x for (st, en), b in zip(sets, bits, strict=True) for x in (np.full(len(st), b), np.full(len(en), -b))]
    )
    order = np.argsort(pts, kind="stable")
    pts, w = pts[order], w[order]
    mask = np.cumsum(w)
    last_at_t = np.append(pts[1:] != pts[:-1], True)  # several boundaries at one instant: the level after them
    pts, mask = pts[last_at_t], mask[last_at_t][:-1]
    lowest = mask & -mask  # the first covering set's bit (0: none)
    out = []
    for b in bits:
        inside = lowest == b
        out.append(union(pts[:-1][inside], pts[1:][inside]) if inside.any() else EMPTY)
    return out


def clip(iv: Intervals, lo: float, hi: float) -> Intervals:
    s = np.maximum(iv[0], lo)
    e = np.minimum(iv[1], hi)
    keep = e > s
    return s[keep], e[keep]


def coverage(iv: Intervals, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For each window [lo[i], hi[i]], how much of it the disjoint intervals ``iv`` cover (µs)."""
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    if len(iv[0]) == 0:
        return np.zeros(len(lo))
    return np.maximum(_covered_until(iv, hi) - _covered_until(iv, lo), 0.0)


def _covered_until(iv: Intervals, t: np.ndarray) -> np.ndarray:
    starts, ends = iv
    lengths = ends - starts
    before = np.concatenate([[0.0], np.cumsum(lengths)])
    i = np.searchsorted(starts, t, side="right") - 1
    inside = np.where(i >= 0, np.clip(t - starts[np.maximum(i, 0)], 0.0, lengths[np.maximum(i, 0)]), 0.0)
    return before[np.maximum(i, 0)] * (i >= 0) + inside


def locate(iv_starts: np.ndarray, iv_ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index of the (sorted, disjoint) interval containing each time in ``t``, or -1."""
    if len(iv_starts) == 0:
        return np.full(len(t), -1, dtype=np.int64)
    i = np.searchsorted(iv_starts, t, side="right") - 1
    ok = (i >= 0) & (t <= iv_ends[np.maximum(i, 0)])
    return np.where(ok, i, -1)


# ---- many interval sets at once: each interval has a group (a rank, a (rank, kind) pair), numbered 0..n-1 --------
GroupedIntervals = tuple[np.ndarray, np.ndarray, np.ndarray]  # starts, ends, group: sorted by (group, start)


def union_by(starts: np.ndarray, ends: np.ndarray, group: np.ndarray) -> GroupedIntervals:
    """The union of each group's intervals (concurrent ones counted once), as disjoint intervals sorted by
    (group, start); empty intervals dropped."""
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    group = np.asarray(group, dtype=np.int64)
    keep = ends > starts
    if keep.all() and _disjoint_in_order(starts, ends, group):  # a union already (a summary's exposed_comm)
        return starts.copy(), ends.copy(), group.copy()
    s, e, g = starts[keep], ends[keep], group[keep]
    if len(s) == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64)
    order = np.lexsort((s, g))
    s, e, g = s[order], e[order], g[order]
    seg_new = np.r_[True, g[1:] != g[:-1]]
    seg = np.cumsum(seg_new) - 1
    reach = running_max(e, seg)  # the running maximum of the ends within each group, exactly
    new = seg_new.copy()
    new[1:] |= s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], reach[last], g[first]


def _disjoint_in_order(s: np.ndarray, e: np.ndarray, g: np.ndarray) -> bool:
    """Whether the (non-empty) intervals are sorted by (group, start) and each starts after the one before it in
    its group ends (apart, not touching): what ``union_by`` would return, in its order, unchanged."""
    if len(s) < 2:
        return len(s) == 1
    same = g[1:] == g[:-1]
    return bool(((g[1:] > g[:-1]) | (same & (s[1:] > e[:-1]))).all())


def intersect_by(a: GroupedIntervals, b: GroupedIntervals) -> GroupedIntervals:
    """a ∩ b within each group, for two outputs of ``union_by`` (each group's intervals sorted and apart), sorted
    by (group, start). Each interval of ``a`` meets the run of its group's intervals of ``b`` that end after it
    starts and start before it ends (found by bisection, ``segmented_searchsorted``): no sort of the points."""
    a_start, a_end, a_group = a
    b_start, b_end, b_group = b
    if len(a_start) == 0 or len(b_start) == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64)
    n = int(max(a_group.max(), b_group.max())) + 1
    count = np.bincount(b_group, minlength=n)
    first = np.cumsum(count) - count
    lo = first[a_group] + segmented_searchsorted(b_end, first, count, a_group, a_start, "right")  # end > start
    hi = first[a_group] + segmented_searchsorted(b_start, first, count, a_group, a_end, "left")  # start < end
    m = np.maximum(hi - lo, 0)
    ia = np.repeat(np.arange(len(a_start)), m)
    ib = positions_within(m) + np.repeat(lo, m)
    return np.maximum(a_start[ia], b_start[ib]), np.minimum(a_end[ia], b_end[ib]), a_group[ia]


def total_by(ivs: GroupedIntervals, n: int) -> np.ndarray:
    """Total length (µs) of each group's disjoint intervals, groups 0..n-1."""
    return np.bincount(ivs[2], weights=ivs[1] - ivs[0], minlength=n)[:n] if n else np.zeros(0)
