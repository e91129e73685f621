"""Cross-rank collective metrics: match each collective across ranks, then split its time into transfer and
wait.

A collective is identified by (step, kind, index of that kind within the step). Clocks of different hosts are
aligned on matched collectives, not raw timestamps: a collective ends at about the same moment on every rank,
so a rank's clock offset is the median of (its end − the reference rank's end). Then, per collective:
transfer = the shortest duration over the ranks; wait = own duration − transfer; lateness = own aligned
start − earliest aligned start. Per step: ``collective_wait_ms`` = wall time (union) spent waiting,
``late_arrival_ms`` = mean lateness over the step's collectives. ``straggler_late_share`` = the fraction of
matched collectives in which the straggler arrived last (about 1/world_size when only noise makes ranks late).

Everything runs on numpy columns over all ranks at once (``ddpdoctor.table``): a per-rank Python or pandas step
costs milliseconds, minutes at 16,384 ranks. Sums over a rank's rows are numpy's own (``np.sum`` row by row of
a 2-D block), and the sums per matched collective compensated as pandas' group sums are, so the numbers are the
same to the last bit as when each rank was summed on its own.
"""

from __future__ import annotations

import math
from functools import lru_cache
from itertools import chain
from typing import Any

import numpy as np

from ddpdoctor.table import Codes, Table, column, group_ids, group_median, group_min, group_nunique

KEY = ["step", "kind", "index"]


COLUMNS = ["step", "kind", "index", "start_us", "end_us", "dur_us", "bytes", "group_size"]
_NUMERIC = ("start_us", "end_us", "dur_us", "bytes", "group_size")


def cross_rank(
    summaries: list[dict[str, Any]], colls: Table | None = None
) -> tuple[dict[int, dict[str, float | None]], dict[str, Any]]:
    """Per rank {collective_wait_ms, late_arrival_ms} and run-level {straggler_rank, straggler_wait_ms}.
    ``colls``: ``all_collectives(summaries)`` when the caller has it."""
    per_rank: dict[int, dict[str, float | None]] = {}
    run: dict[str, Any] = {
        "straggler_rank": None,
        "straggler_wait_ms": None,
        "straggler_late_share": None,
        "straggler_p_value": None,
        "straggler_collectives": None,
        "slow_rank_count": None,
        "slow_rank_undecidable": None,
    }
    colls = all_collectives(summaries) if colls is None else colls
    if _n_distinct(colls["rank"]) < 2:
        return per_rank, run
    colls = colls[_keyed(colls) & (colls["step"] >= 0)]
    gid, n = _key_ids(colls)
    colls = colls[group_nunique(colls["rank"], gid, n)[gid] >= 2]
    if len(colls) == 0:
        return per_rank, run
    gid, n = _key_ids(colls)
    rank = colls["rank"]
    # clock offset of each rank: median of (its end - the reference rank's end) over the collectives both ran
    ref = rank == rank.min()
    ref_end = np.full(n, np.nan)
    ref_end[gid[ref]] = colls["end_us"][ref]
    rids, ranks_present = _rank_ids(rank)
    offsets = group_median(colls["end_us"] - ref_end[gid], rids, len(ranks_present))
    offsets = np.where(np.isnan(offsets), 0.0, offsets)
    aligned = colls["start_us"] - offsets[rids]
    colls["aligned_start"] = aligned
    colls["wait_us"] = colls["dur_us"] - group_min(colls["dur_us"], gid, n)[gid]
    colls["late_us"] = aligned - group_min(aligned, gid, n)[gid]
    colls = colls.sort("rank")
    typical_wait = _per_rank_waits(colls, summaries, per_rank)
    if len(per_rank) >= 2:
        analysed = colls[np.isin(colls["step"], np.fromiter(_analysed_steps(summaries), dtype=np.int64))]
        slow = slow_ranks(analysed, sorted(per_rank))
        for r, values in slow["ranks"].items():
            per_rank[r].update(values)
        run["straggler_collectives"] = slow["collectives"]
        run["slow_rank_count"] = slow["count"]
        run["slow_rank_undecidable"] = slow["undecidable"]
        straggler = max(per_rank, key=lambda r: per_rank[r]["late_arrival_ms"] or 0.0)
        flagged = [r for r in per_rank if per_rank[r].get("slow_rank")]
        if flagged:  # the slowest of the significantly slow ranks; the others are those not slow
            straggler = min(
                flagged, key=lambda r: (per_rank[r]["last_arrival_p_value"], -per_rank[r]["late_arrival_ms"])
            )
        if (per_rank[straggler]["late_arrival_ms"] or 0.0) > 0:
            # The median step's wait, not the mean: one step in which the host descheduled a rank must not
            # make it a straggler; a straggler makes the others wait in most steps.
            flagged_set = set(flagged or [straggler])
            waiting = [r for r in per_rank if r not in flagged_set]
            others = [typical_wait[r] for r in waiting] or [typical_wait[r] for r in per_rank if r != straggler]
            run.update(
                {
                    "straggler_rank": int(straggler),
                    "straggler_wait_ms": float(np.mean(others)),
                    "straggler_late_share": per_rank[straggler].get("last_arrival_share"),
                    "straggler_p_value": per_rank[straggler].get("last_arrival_p_value"),
                }
            )
    return per_rank, run


def _per_rank_waits(
    colls: Table, summaries: list[dict[str, Any]], per_rank: dict[int, dict[str, float | None]]
) -> dict[int, float]:
    """Fill ``per_rank`` with each rank's collective_wait_ms and late_arrival_ms (``colls`` sorted by rank);
    returns each rank's median wait per analysed step (ms).

    Per rank: the union of its wait intervals (``intervals.union``) covering each analysed step's window
    (``intervals.coverage``), and its mean lateness in each step; then the mean and median over the steps. All
    ranks at once, with the float operations of those functions in the same order (a rank's running sums are
    added one position at a time over all ranks), so the numbers are theirs to the last bit."""
    windows = _Windows(summaries)
    win_rank, win_step, win_lo, win_hi, counts = (
        windows.rank,
        windows.step,
        windows.start_us,
        windows.end_us,
        windows.counts,
    )
    rows = colls[_in_analysed_steps(colls, summaries, windows)]
    present, n_rows = np.unique(rows["rank"], return_counts=True)
    rank_of = rows["rank"]
    rid = np.searchsorted(present, rank_of)
    n_ranks = len(present)

    # the union of each rank's wait intervals: sorted by start (ties in row order), merged where they touch
    start = rows["start_us"].astype(np.float64)
    end = start + rows["wait_us"].astype(np.float64)
    keep = end > start
    order = np.lexsort((start[keep], rid[keep]))
    s, e, g = start[keep][order], end[keep][order], rid[keep][order]
    seg_new = np.r_[True, g[1:] != g[:-1]] if len(g) else np.zeros(0, dtype=bool)
    reach = _running_max(e, np.cumsum(seg_new) - 1) if len(g) else e
    new = seg_new.copy()
    if len(g):
        new[1:] |= s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1) if len(first) else first
    m_start, m_end, m_rank = s[first], reach[last], g[first]
    m_len = m_end - m_start
    # per rank: its merged intervals in a row of a 2-D block, and the covered length before each
    m_count = np.bincount(m_rank, minlength=n_ranks)
    width = int(m_count.max()) if len(m_count) else 0
    pos = np.arange(len(m_rank)) - np.repeat(np.cumsum(m_count) - m_count, m_count)
    starts2 = np.full((n_ranks, max(width, 1)), np.inf)
    lens2 = np.zeros((n_ranks, max(width, 1)))
    before2 = np.zeros((n_ranks, max(width, 1)))
    starts2[m_rank, pos] = m_start
    lens2[m_rank, pos] = m_len
    for j in range(1, width):  # before[j] = before[j-1] + len[j-1], one position at a time (a cumsum's order)
        before2[:, j] = before2[:, j - 1] + lens2[:, j - 1]

    # each window of a rank that has rows: how much of it the rank's merged intervals cover
    wr = np.minimum(np.searchsorted(present, win_rank), max(n_ranks - 1, 0))

    def until(t: np.ndarray) -> np.ndarray:
        below = (starts2[wr] <= t[:, None]).sum(axis=1)
        below = np.where(np.isnan(t), m_count[wr], below)  # a NaN bound lies after every start, as it sorts
        i = below - 1
        j = np.maximum(i, 0)
        covered = before2[wr, j] + np.minimum(np.maximum(t - starts2[wr, j], 0.0), lens2[wr, j])
        return np.where(i >= 0, covered, 0.0)

    d = until(win_hi) - until(win_lo)
    wait_ms = np.where((d > 0.0) | np.isnan(d), d, 0.0) / 1e3
    # each window's mean lateness over the rank's rows in that step (0 without any)
    row_key, win_key = _pair_keys(rank_of, rows["step"], win_rank, win_step)
    keys, pair_id = np.unique(row_key, return_inverse=True)
    late_sum = np.bincount(pair_id, weights=rows["late_us"].astype(np.float64), minlength=len(keys))
    late_n = np.bincount(pair_id, minlength=len(keys))
    at = np.minimum(np.searchsorted(keys, win_key), max(len(keys) - 1, 0))
    found = (keys[at] == win_key) if len(keys) else np.zeros(len(win_key), dtype=bool)
    with np.errstate(invalid="ignore", divide="ignore"):
        win_late = np.where(found, late_sum[at] / np.maximum(late_n[at], 1), 0.0) if len(keys) else win_key * 0.0

    # per rank (the summaries' order): mean and median over its windows, numpy's own reductions
    in_rows = set(present.tolist())
    ranks_all = [s["rank"] for s in summaries]
    done = np.array([c > 0 and r in in_rows for r, c in zip(ranks_all, counts.tolist(), strict=True)], dtype=bool)
    first_win = (np.cumsum(counts) - counts)[done]
    seg = _Segments(first_win, counts[done])
    wait_mean = seg.reduce(np.mean, wait_ms)
    wait_median = seg.reduce(_median, wait_ms)
    late_mean = seg.reduce(np.mean, win_late)
    typical: dict[int, float] = {}
    ranks_done = [r for r, ok in zip(ranks_all, done.tolist(), strict=True) if ok]
    for i, r in enumerate(ranks_done):
        per_rank[r] = {"collective_wait_ms": float(wait_mean[i]), "late_arrival_ms": float(late_mean[i] / 1e3)}
        typical[r] = float(wait_median[i])
    return typical


def _pair_keys(
    rank: np.ndarray, step: np.ndarray, other_rank: np.ndarray, other_step: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One integer key per (rank, step) for two sets of pairs (equal pairs, equal keys; a pair of the second set
    that is not in the first gets -1 where the steps are not integers)."""
    if step.dtype.kind == "i" and other_step.dtype.kind == "i" and (len(step) or len(other_step)):
        both = np.concatenate([step, other_step])
        lo = int(both.min())
        span = int(both.max()) - lo + 1
        return rank * span + (step - lo), other_rank * span + (other_step - lo)
    index: dict[tuple[Any, Any], int] = {}
    keys = [index.setdefault(p, len(index)) for p in zip(rank.tolist(), step.tolist(), strict=True)]
    other = [index.get(p, -1) for p in zip(other_rank.tolist(), other_step.tolist(), strict=True)]
    return np.array(keys, dtype=np.int64), np.array(other, dtype=np.int64)


def _median(block: np.ndarray, axis: int = 1) -> np.ndarray:
    """``np.median(block, axis=1)``, the same numbers (the middle value, or the mean of the two middle ones; NaN
    where a row has one) without ``np.median``'s import of ``numpy.ma`` (~10 ms of a small run's start-up)."""
    ordered = np.sort(block, axis=axis)
    n = ordered.shape[1]
    if n == 0:
        return np.full(len(ordered), np.nan)
    mid = ordered[:, n // 2] if n % 2 else (ordered[:, n // 2 - 1] + ordered[:, n // 2]) / 2.0
    return np.where(np.isnan(block).any(axis=1), np.nan, mid)


# Family-wise significance of "this rank arrives last more often than chance", over all ranks tested
# (Bonferroni over ranks and the two tests): at most one healthy run in fifty may name a slow rank by chance, and
# the rule's wait thresholds must hold as well.
SLOW_RANK_ALPHA = 0.02


def slow_ranks(analysed: Table, ranks: list[int]) -> dict[str, Any]:
    """Which ranks arrive last at the matched collectives more often, or at more cost, than chance allows.

    ``analysed``: one row per rank and matched collective (``KEY`` columns, ``rank``, ``start_us``,
    ``aligned_start``, ``wait_us``; a ``Table``, or anything with those columns). In a collective of k ranks,
    noise alone makes each rank the last with chance 1/k. Two tests per rank, each against that chance:

    - how often: last at ``x`` of its ``n`` collectives, P(X >= x) for X ~ Binomial(n, 1/k) (exact);
    - at what cost: the others' wait in the collectives it was last at (each collective weighs its wait w), against
      the share 1/k of all the wait that chance gives it; Hoeffding's bound exp(-2 t^2 / sum w^2) on exceeding it
      by t (conservative; one long stall cannot reach significance, a wait repeated over many collectives can).

    A rank is slow when the smaller p value, doubled for the two tests, is below ``SLOW_RANK_ALPHA`` / ranks tested
    (Bonferroni). Returns per rank ``last_arrival_share`` (0-1), ``last_arrival_p_value`` (that doubled smaller p,
    at most 1), ``slow_rank`` (None when no rank could reach significance even if it were last at every
    collective) and ``wait_caused_ms`` (the others' mean wait per analysed step in the collectives it entered
    last); ``count`` of slow ranks (None when undecidable), ``collectives`` matched, ``undecidable`` (why, or None).
    """
    out: dict[str, Any] = {"ranks": {}, "count": None, "collectives": 0, "undecidable": None}
    if len(analysed) == 0:
        out["undecidable"] = "no collective was matched across ranks in the analysed steps"
        return out
    a = analysed if isinstance(analysed, Table) else Table({c: np.asarray(analysed[c]) for c in analysed.columns})
    gid, n_groups = _key_ids(a)
    size = np.bincount(gid, minlength=n_groups)[gid]
    aligned = a["aligned_start"].astype(np.float64)
    # the last to arrive at each collective: its latest aligned start (the first such row on a tie)
    order = np.lexsort((np.arange(len(a)), -aligned, gid))
    head = np.r_[True, gid[order][1:] != gid[order][:-1]]
    last_idx = order[head]
    is_last = np.zeros(len(a), dtype=bool)
    is_last[last_idx] = True
    # who was last at each collective, and the others' mean wait in it (its weight), on every row of it
    wait = a["wait_us"].astype(np.float64)
    total_wait = pandas_group_sum(wait, gid, n_groups, sort=False)
    weight = (total_wait[gid] - np.where(is_last, wait, 0.0)) / np.maximum(size - 1, 1)
    last_rank = np.empty(n_groups, dtype=np.int64)
    last_rank[gid[last_idx]] = a["rank"][last_idx]
    group_weight = np.empty(n_groups)
    group_weight[gid[last_idx]] = weight[last_idx]
    last_of_row = last_rank[gid]
    weight_of_row = group_weight[gid]
    steps = _n_distinct(a["step"])
    n_steps = max(steps, 1)
    out["collectives"] = int(len(last_idx))
    tested = max(len(ranks), 1)
    best_possible = 1.0
    # per rank (rows in rank order, each rank's rows in their order): the sums numpy gives for each rank's rows
    rank_col = a["rank"]
    by_rank = np.argsort(rank_col, kind="stable")
    present, first, counts = np.unique(rank_col[by_rank], return_index=True, return_counts=True)
    chance = 1.0 / size[by_rank]
    w = weight_of_row[by_rank]
    last_sorted = is_last[by_rank]
    seg = _Segments(first, counts)
    mean_chance = seg.reduce(np.mean, chance)
    spread = seg.reduce(np.sum, w**2)
    expected = seg.reduce(np.sum, w * chance)
    w_total = seg.reduce(np.sum, w)
    lasts = np.add.reduceat(last_sorted.astype(np.int64), first) if len(first) else np.zeros(0, dtype=np.int64)
    caused = _Segments.of_mask(first, counts, last_sorted).reduce(np.sum, w[last_sorted])
    caused_wait = _wait_caused(a, last_of_row, n_steps)
    index = {int(r): i for i, r in enumerate(present)}
    for r in ranks:
        i = index.get(int(r))
        if i is None:
            continue
        n = int(counts[i])
        x = int(lasts[i])
        p_chance = float(mean_chance[i])
        p_count = binomial_sf(x, n, p_chance)
        p_cost, best_cost = _hoeffding(float(caused[i]), float(spread[i]), float(expected[i]), float(w_total[i]))
        p_value = min(1.0, 2.0 * min(p_count, p_cost))
        best_possible = min(best_possible, 2.0 * min(p_chance**n, best_cost))
        out["ranks"][r] = {
            "last_arrival_share": x / n,
            "last_arrival_p_value": p_value,
            "slow_rank": p_value * tested < SLOW_RANK_ALPHA,
            "wait_caused_ms": caused_wait.get(int(r), 0.0),
        }
    if best_possible * tested >= SLOW_RANK_ALPHA:
        out["undecidable"] = (
            f"{out['collectives']} collective(s) matched across ranks in {steps} analysed step(s) cannot tell a "
            f"slow rank from chance: even a rank last at every one of them would be last by chance with "
            f"probability {best_possible:.2g}; profile more steps (--active)"
        )
        for values in out["ranks"].values():
            values["slow_rank"] = None
        return out
    out["count"] = sum(1 for v in out["ranks"].values() if v["slow_rank"])
    return out


class _Segments:
    """Consecutive runs of rows (``first`` index and ``counts`` of each); ``reduce`` applies a numpy reduction to
    each run as ``fn(run)`` would (runs of one length are reduced as the rows of a 2-D block)."""

    def __init__(self, first: np.ndarray, counts: np.ndarray) -> None:
        self.first = np.asarray(first, dtype=np.int64)
        self.counts = np.asarray(counts, dtype=np.int64)

    @classmethod
    def of_mask(cls, first: np.ndarray, counts: np.ndarray, mask: np.ndarray) -> _Segments:
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
    pos = np.arange(len(g)) - np.repeat(starts, np.diff(np.r_[starts, len(g)]))
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


def _hoeffding(caused: float, spread: float, expected: float, w_total: float) -> tuple[float, float]:
    """(p, best p possible) that chance alone makes a rank cause ``caused`` of the waits or more, when it is last at
    each collective with its chance (``spread``: the sum of the squared waits w, ``expected``: the sum of w times
    the chance, ``w_total``: the sum of w; Hoeffding's bound for a sum of independent terms in [0, w])."""
    if spread <= 0:
        return 1.0, 1.0
    excess = caused - expected
    best = w_total - expected
    p = math.exp(-2.0 * excess**2 / spread) if excess > 0 else 1.0
    return p, math.exp(-2.0 * best**2 / spread) if best > 0 else 1.0


def _wait_caused(a: Table, last_of_row: np.ndarray, n_steps: int) -> dict[int, float]:
    """Per rank r that entered some collective last: the other ranks' mean wall time per step (ms) spent waiting
    in the collectives r entered last (union of each waiting rank's wait intervals: concurrent collectives are not
    counted twice)."""
    rank = a["rank"]
    others = max(_n_distinct(rank) - 1, 1)
    waiting = last_of_row != rank
    start = a["start_us"].astype(np.float64)[waiting]
    end = start + a["wait_us"].astype(np.float64)[waiting]
    leader, waiter = last_of_row[waiting], rank[waiting]
    keep = end > start  # empty intervals are dropped (as intervals.union does)
    start, end, leader, waiter = start[keep], end[keep], leader[keep], waiter[keep]
    out: dict[int, float] = {}
    if not len(start):
        return out
    # each (leader, waiter) pair's intervals by start (ties in row order), merged as intervals.union merges them
    order = np.lexsort((start, waiter, leader))
    start, end, leader, waiter = start[order], end[order], leader[order], waiter[order]
    pair_new = np.r_[True, (leader[1:] != leader[:-1]) | (waiter[1:] != waiter[:-1])]
    pair = np.cumsum(pair_new) - 1
    reach = _running_max(end, pair)
    new = pair_new.copy()
    new[1:] |= start[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(start) - 1)
    lengths = reach[last] - start[first]
    pair_of = pair[first]
    pair_first = np.flatnonzero(np.r_[True, pair_of[1:] != pair_of[:-1]])
    totals = _Segments(pair_first, np.diff(np.r_[pair_first, len(pair_of)])).reduce(np.sum, lengths)
    pair_leader = leader[pair_new]
    # per leader: the waiting ranks' totals added in rank order
    for r in np.unique(pair_leader, return_counts=True)[0]:
        mine = totals[pair_leader == r].tolist()
        out[int(r)] = sum(mine) / others / n_steps / 1e3
    return out


def _running_max(values: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """The running maximum of ``values`` within each run of equal ``segment`` (sorted), exactly."""
    uniq, inverse = np.unique(values, return_inverse=True)
    key = segment.astype(np.int64) * (len(uniq) + 1) + inverse.reshape(-1)
    return uniq[np.maximum.accumulate(key) - segment.astype(np.int64) * (len(uniq) + 1)]


@lru_cache(maxsize=4096)
def binomial_sf(x: int, n: int, p: float) -> float:
    """P(X >= x) for X ~ Binomial(n, p), exact (log-space sum of the tail)."""
    if x <= 0:
        return 1.0
    if x > n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    i = np.arange(x, n + 1)
    log_fact = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, n + 1)))))
    log_pmf = log_fact[n] - log_fact[i] - log_fact[n - i] + i * np.log(p) + (n - i) * np.log1p(-p)
    return float(min(1.0, np.exp(log_pmf).sum()))


def all_collectives(summaries: list[dict[str, Any]]) -> Table:
    """The ``collectives`` lists of every rank as one table with a ``rank`` column (built once, not per
    rank). ``kind`` is categorical; the numeric columns are float64 (NaN where missing or not a number)."""
    columns: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    ranks: list[int] = []
    for s in summaries:
        c = s.get("collectives") or {}
        n = len(c.get("step") or [])
        if n == 0:
            continue
        for col in COLUMNS:
            columns[col].extend(c.get(col) or [None] * n)
        ranks.extend([s["rank"]] * n)
    out: dict[str, Any] = {
        "step": column(columns["step"]),
        "kind": _codes(columns["kind"]),
        "index": column(columns["index"]),
    }
    for col in _NUMERIC:
        out[col] = _numeric(columns[col])
    out["rank"] = np.asarray(ranks, dtype=np.int64)
    return Table(out)


def _codes(values: list[Any]) -> Codes:
    """A categorical column of strings (-1 where missing)."""
    distinct = [v for v in dict.fromkeys(values) if v is not None]
    index: dict[Any, int] = {v: i for i, v in enumerate(distinct)}
    index[None] = -1
    codes = np.array(list(map(index.__getitem__, values)), dtype=np.int32).reshape(len(values))
    return Codes(codes, [str(v) for v in distinct])


def _numeric(values: list[Any]) -> np.ndarray:
    """float64, NaN where a value is missing or not a number (as ``pd.to_numeric(errors="coerce")``)."""
    try:
        return np.array(values, dtype=np.float64).reshape(len(values))
    except (TypeError, ValueError):
        return np.array(
            [v if isinstance(v, (int, float)) and not isinstance(v, bool) else np.nan for v in values],
            dtype=np.float64,
        ).reshape(len(values))


def _keyed(colls: Table) -> np.ndarray:
    """Rows whose collective key is complete (a group key with a missing part matches nothing)."""
    ok = colls["kind"].codes >= 0
    for col in ("step", "index"):
        v = colls[col]
        if v.dtype.kind == "f":
            ok &= ~np.isnan(v)
        elif v.dtype == object:
            ok &= np.array([x is not None for x in v], dtype=bool)
    return ok


def _key_ids(colls: Table) -> tuple[np.ndarray, int]:
    return group_ids(colls["step"], colls["kind"], colls["index"])


def _rank_ids(rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    present, inverse = np.unique(rank, return_inverse=True)
    return inverse.reshape(-1), present


def _analysed(summary: dict[str, Any]) -> dict[str, np.ndarray]:
    """``step``, ``start_us``, ``end_us`` of the analysed steps of one rank's summary."""
    ps = summary["per_step"]
    keep = np.asarray(ps.get("analyzed") or [], dtype=bool)
    return {
        key: np.asarray(ps.get(key) or [], dtype=np.float64 if key != "step" else np.int64)[keep]
        for key in ("step", "start_us", "end_us")
    }


class _Windows:
    """The analysed steps of every rank, one after the other (summaries' order): ``rank``, ``step``,
    ``start_us``, ``end_us`` per step and ``counts`` per summary; what ``_analysed`` gives each rank."""

    def __init__(self, summaries: list[dict[str, Any]]) -> None:
        tables = [s["per_step"] for s in summaries]
        lengths = [len(t.get("analyzed") or []) for t in tables]
        flags = _flat(tables, "analyzed", lengths, bool)
        keep = flags.astype(bool)
        owner = np.repeat(np.arange(len(summaries)), lengths)
        self.counts = np.bincount(owner[keep], minlength=len(summaries))
        self.rank = np.repeat(np.array([s["rank"] for s in summaries], dtype=np.int64), lengths)[keep]
        self.step = _flat(tables, "step", lengths, np.int64)[keep]
        self.start_us = _flat(tables, "start_us", lengths, np.float64)[keep]
        self.end_us = _flat(tables, "end_us", lengths, np.float64)[keep]


def _flat(tables: list[dict[str, Any]], key: str, lengths: list[int], dtype: Any) -> np.ndarray:
    """Column ``key`` of every table joined (each cut or padded to its length, as ``_analysed`` would index it)."""
    parts = [t.get(key) or [] for t in tables]
    if all(len(p) == n for p, n in zip(parts, lengths, strict=True)):
        return np.asarray(list(chain.from_iterable(parts)), dtype=dtype).reshape(sum(lengths))
    return np.concatenate(
        [np.asarray(p, dtype=dtype)[:n] for p, n in zip(parts, lengths, strict=True)] or [np.zeros(0)]
    )


def _analysed_steps(summaries: list[dict[str, Any]]) -> set[int]:
    steps: set[int] = set()
    for s in summaries:
        ps = s["per_step"]
        flags = ps.get("analyzed") or []
        steps.update(int(x) for x, a in zip(ps.get("step") or [], flags, strict=False) if a)
    return steps


def transfer_bandwidth(summaries: list[dict[str, Any]], colls: Table | None = None) -> Table:
    """Per rank and kind: ``count, bytes, ms, algbw_gbps, busbw_gbps`` over the analysed steps (ms = own
    time). ``colls``: ``all_collectives(summaries)`` when the caller has it."""
    from ddpdoctor.metrics.comm import bus_factor

    out_columns = ["rank", "kind", "count", "bytes", "ms", "algbw_gbps", "busbw_gbps"]
    colls = all_collectives(summaries) if colls is None else colls
    if len(colls) == 0:
        return Table.from_records([], out_columns)
    order = {s["rank"]: i for i, s in enumerate(summaries)}
    keep = _in_analysed_steps(colls, summaries)
    c = colls[keep & (colls["kind"].codes >= 0)]
    if len(c) == 0:
        return Table.from_records([], out_columns)
    nbytes = c["bytes"]
    sized = ~np.isnan(nbytes) & (nbytes > 0)
    rank_order = np.array([order[r] for r in c["rank"].tolist()], dtype=np.int64)
    gid, n = group_ids(rank_order, c["rank"], c["kind"])
    # one row per group, in group order (sorted by the rank's position, rank, kind)
    first = np.full(n, len(c), dtype=np.int64)
    np.minimum.at(first, gid, np.arange(len(c)))
    count = np.bincount(gid, minlength=n)
    bytes_sum = _pairwise_group_sum(np.where(np.isnan(nbytes), 0.0, nbytes), gid, n)
    bytes_seen = np.bincount(gid, weights=(~np.isnan(nbytes)).astype(np.float64), minlength=n)
    dur = pandas_group_sum(c["dur_us"], gid, n)
    sized_bytes = pandas_group_sum(np.where(sized, nbytes, 0.0), gid, n)
    sized_dur = pandas_group_sum(np.where(sized, c["dur_us"], 0.0), gid, n)
    sized_group = np.where(sized, c["group_size"], np.nan)
    group_max = np.full(n, -np.inf)
    ok = ~np.isnan(sized_group)
    np.maximum.at(group_max, gid[ok], sized_group[ok])
    group_max[np.isinf(group_max)] = np.nan
    world = {s["rank"]: int(s.get("world_size") or 1) for s in summaries}
    kinds = c["kind"]
    rows = []
    for g in range(n):
        i = int(first[g])
        r = int(c["rank"][i])
        kind = kinds.at(i)
        seconds = sized_dur[g] / 1e6
        sg = group_max[g]
        size = int(sg) if sg == sg and sg > 0 else world[r]
        algbw = float(sized_bytes[g] / seconds / 1e9) if seconds > 0 else None
        rows.append(
            {
                "rank": r,
                "kind": kind,
                "count": int(count[g]),
                "bytes": float(bytes_sum[g]) if bytes_seen[g] >= 1 else None,
                "ms": float(dur[g] / 1e3),
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * bus_factor(str(kind), size) if algbw is not None else None,
            }
        )
    return Table.from_records(rows, out_columns)


def _in_analysed_steps(colls: Table, summaries: list[dict[str, Any]], windows: _Windows | None = None) -> np.ndarray:
    """Rows of ``colls`` whose step is one of its rank's analysed steps."""
    windows = _Windows(summaries) if windows is None else windows
    ranks, steps = windows.rank, windows.step
    step_col = colls["step"]
    if step_col.dtype.kind != "i" or not len(steps):  # steps that are not whole numbers: one row at a time
        analysed: dict[int, set[Any]] = {}
        for r, st in zip(ranks.tolist(), steps.tolist(), strict=True):
            analysed.setdefault(r, set()).add(st)
        return np.fromiter(
            (st in analysed.get(r, ()) for r, st in zip(colls["rank"].tolist(), step_col.tolist(), strict=True)),
            dtype=bool,
            count=len(colls),
        )
    lo = min(int(steps.min()), int(step_col.min()) if len(step_col) else 0)
    span = max(int(steps.max()), int(step_col.max()) if len(step_col) else 0) - lo + 1
    return np.isin(colls["rank"] * span + (step_col - lo), ranks * span + (steps - lo))


def _pairwise_group_sum(values: np.ndarray, ids: np.ndarray, n: int) -> np.ndarray:
    """Per group: ``np.sum`` of its values in row order (as a pandas Series' ``sum`` of the group)."""
    order = np.argsort(ids, kind="stable")
    g = ids[order]
    first = np.searchsorted(g, np.arange(n))
    counts = np.bincount(g, minlength=n)
    return _Segments(first, counts).reduce(np.sum, np.asarray(values, dtype=np.float64)[order])


def _n_distinct(values: np.ndarray) -> int:
    """How many distinct values (``np.unique`` without a second output imports ``numpy.ma``, ~10 ms)."""
    return len(np.unique(values, return_counts=True)[0])
