"""Slow ranks: which ranks arrive last at the matched collectives more often, or at more cost, than chance allows
(an exact binomial test and Hoeffding's bound, Bonferroni over the ranks), and the wait each one causes. Run by
``cross_rank.cross_rank`` on the collectives it matched and aligned."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

from ddpdoctor.metrics.group_sums import Segments, n_distinct, pandas_group_sum, running_max
from ddpdoctor.table import Table, group_ids

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
    gid, n_groups = group_ids(a["step"], a["kind"], a["index"])  # the collective key
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
    steps = n_distinct(a["step"])
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
    seg = Segments(first, counts)
    mean_chance = seg.reduce(np.mean, chance)
    spread = seg.reduce(np.sum, w**2)
    expected = seg.reduce(np.sum, w * chance)
    w_total = seg.reduce(np.sum, w)
    lasts = np.add.reduceat(last_sorted.astype(np.int64), first) if len(first) else np.zeros(0, dtype=np.int64)
    caused = Segments.of_mask(first, counts, last_sorted).reduce(np.sum, w[last_sorted])
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
    others = max(n_distinct(rank) - 1, 1)
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
    reach = running_max(end, pair)
    new = pair_new.copy()
    new[1:] |= start[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(start) - 1)
    lengths = reach[last] - start[first]
    pair_of = pair[first]
    pair_first = np.flatnonzero(np.r_[True, pair_of[1:] != pair_of[:-1]])
    totals = Segments(pair_first, np.diff(np.r_[pair_first, len(pair_of)])).reduce(np.sum, lengths)
    pair_leader = leader[pair_new]
    # per leader: the waiting ranks' totals added in rank order
    for r in np.unique(pair_leader, return_counts=True)[0]:
        mine = totals[pair_leader == r].tolist()
        out[int(r)] = sum(mine) / others / n_steps / 1e3
    return out


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
