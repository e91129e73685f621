"""Slow ranks: which ranks arrive last at the matched collectives more often, or at more cost, than chance allows,
and the wait each one causes. Run by ``cross_rank.cross_rank`` on the collectives it matched and aligned.

The trials are **blocks**, not collectives: the collectives of one step that are in flight together (DDP's bucket
all-reduces, launched while the previous ones still run) share that step's lateness (a rank that lost a CPU slice
before the backward is late at all of them), so counting each as an independent trial overstates the evidence by
the number of collectives per step. A new block starts with each step and with each collective that every rank
enters after it left its previous one (synchronous collectives, as tensor parallelism's, re-align the ranks, so
each one's lateness is its own). Without ``end_us`` a block is a step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np

from ddpdoctor.metrics.group_sums import Segments, n_distinct, pandas_group_sum, running_max
from ddpdoctor.table import Table, group_ids

# Family-wise significance of "this rank arrives last more often than chance", over all ranks tested
# (Bonferroni over ranks and the two tests): at most one healthy run in fifty may name a slow rank by chance, and
# the rule's wait thresholds must hold as well.
SLOW_RANK_ALPHA = 0.02
TESTS = 2  # how often, at what cost
# The serial correlation of a rank's blocks is estimated from this many of them on (fewer: taken as independent),
# and capped (a design effect of at most 19).
MIN_BLOCKS_FOR_CORRELATION = 10
MAX_AUTOCORRELATION = 0.9
# A rank's lateness at one position of the step (its n-th block) seen in this many steps is a pattern of the rank's
# own; fewer steps cannot tell it from a run of bad luck (``_unpatterned``).
MIN_STEPS_FOR_PATTERN = 3


def slow_ranks(analysed: Table, ranks: list[int]) -> dict[str, Any]:
    """Which ranks arrive last at the matched collectives more often, or at more cost, than chance allows.

    ``analysed``: one row per rank and matched collective (``KEY`` columns, ``rank``, ``start_us``, ``end_us``
    (optional), ``aligned_start``, ``wait_us``; a ``Table``, or anything with those columns). In a collective of
    k ranks, noise alone makes each rank the last with chance 1/k. The observations are the blocks (module
    docstring). Two tests per rank over its n blocks, each against chance:

    - how often: the sum of its per-block shares of last arrivals against the mean chance p: exactly
      P(X >= x) for X ~ Binomial(n, p) when every block is all-or-nothing, otherwise Hoeffding's relative-entropy
      bound exp(-n KL(share || p)) (p^n for a rank last at everything: 5 of 5 steps of 2 ranks is 1/32);
    - at what cost: the others' wait in the collectives it was last at, summed per block (each block weighs the
      wait W in it), against the share chance gives it; Hoeffding's bound exp(-2 t^2 / sum W^2) on exceeding it
      by t (one long stall cannot reach significance, a wait repeated over many blocks can).

    Not the size of its lateness: on a loaded host a rank that lost the CPU stays behind for many steps in a row,
    so a steady lateness over a few steps is not evidence of a slow rank (a t test of it named one in 4 of 20
    traces of a balanced 2-rank job on a busy machine).

    A rank is slow when the smaller p value, doubled for the two tests, is below ``SLOW_RANK_ALPHA`` / ranks tested
    (Bonferroni). Returns per rank ``last_arrival_share`` (0-1, over its collectives), ``last_arrival_p_value``
    (that smaller p doubled, at most 1), ``slow_rank`` (None when no rank could reach significance even if it
    were last at every collective) and ``wait_caused_ms`` (the others' mean wait per analysed step in the
    collectives it entered last); ``count`` of slow ranks (None when undecidable), ``collectives`` matched,
    ``blocks`` (the independent observations), ``undecidable`` (why, or None).
    """
    out: dict[str, Any] = {"ranks": {}, "count": None, "collectives": 0, "blocks": 0, "undecidable": None}
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
    last_of_row = last_rank[gid]
    block = _blocks(a, gid, n_groups)
    steps = n_distinct(a["step"])
    n_steps = max(steps, 1)
    out["collectives"] = int(len(last_idx))
    out["blocks"] = n_distinct(block)
    tested = max(len(ranks), 1)
    best_possible = 1.0
    chance = 1.0 / size
    caused_wait = _wait_caused(a, last_of_row, n_steps)
    # one row per (rank, block): its collectives, last arrivals, chance, weights
    rb, n_rb = group_ids(a["rank"], block)
    count = np.bincount(rb, minlength=n_rb).astype(np.float64)
    lasts = np.bincount(rb, weights=is_last.astype(np.float64), minlength=n_rb)
    share = lasts / count
    p_block = np.bincount(rb, weights=chance, minlength=n_rb) / count
    w_block = np.bincount(rb, weights=weight, minlength=n_rb)
    caused_block = np.bincount(rb, weights=np.where(is_last, weight, 0.0), minlength=n_rb)
    expected_block = np.bincount(rb, weights=weight * chance, minlength=n_rb)
    rank_of_rb = np.empty(n_rb, dtype=np.int64)
    rank_of_rb[rb] = a["rank"]
    # each rank's (rank, block) rows, grouped once, and every per-rank reduction over them as numpy's own over the
    # rank's rows (``Segments``: the same numbers as one call per rank, without 10 numpy calls a rank)
    by_rank = np.argsort(rank_of_rb, kind="stable")
    rb_ranks, rb_counts = np.unique(rank_of_rb, return_counts=True)
    seg = Segments(np.cumsum(rb_counts) - rb_counts, rb_counts)
    chance_mean = seg.reduce(np.mean, p_block[by_rank]).tolist()
    share_sum = seg.reduce(np.sum, share[by_rank]).tolist()
    caused_sum = seg.reduce(np.sum, caused_block[by_rank]).tolist()
    spread_sum = seg.reduce(np.sum, (w_block**2)[by_rank]).tolist()
    expected_sum = seg.reduce(np.sum, expected_block[by_rank]).tolist()
    w_sum = seg.reduce(np.sum, w_block[by_rank]).tolist()
    first = seg.first
    inflation = _design_effect(seg, _unpatterned(share - p_block, rb, n_rb, rank_of_rb, block, a["step"])[by_rank])
    inflation = inflation.tolist()
    binary = ((share == 0) | (share == 1))[by_rank]
    not_binary = np.add.reduceat((~binary).astype(np.int64), first) if len(first) else first
    flat_chance = (
        np.maximum.reduceat(p_block[by_rank], first) == np.minimum.reduceat(p_block[by_rank], first)
        if len(first)
        else first
    )
    all_or_nothing = ((not_binary == 0) & flat_chance).tolist()
    rank_at = {r: i for i, r in enumerate(rb_ranks.tolist())}
    counts_of_rank = rb_counts.tolist()
    row_ranks, row_code = np.unique(a["rank"], return_inverse=True)
    code_of = {int(r): i for i, r in enumerate(row_ranks.tolist())}
    rows_of_rank = np.bincount(row_code, minlength=len(row_ranks)).tolist()
    lasts_of_rank = np.bincount(row_code[is_last], minlength=len(row_ranks)).tolist()
    for r in ranks:
        i = rank_at.get(int(r))
        if i is None:
            continue
        n = counts_of_rank[i]
        p_chance = chance_mean[i]
        d = inflation[i]
        p_count = _count_p_of(n, share_sum[i], p_chance, all_or_nothing[i] and d == 1.0, d)
        p_cost, _ = _hoeffding(caused_sum[i], spread_sum[i] * d, expected_sum[i], w_sum[i])
        _, best_cost = _hoeffding(caused_sum[i], spread_sum[i], expected_sum[i], w_sum[i])
        p_value = min(1.0, TESTS * min(p_count, p_cost))
        best_possible = min(best_possible, TESTS * min(p_chance**n, best_cost))
        code = code_of[int(r)]
        out["ranks"][r] = {
            "last_arrival_share": float(lasts_of_rank[code]) / max(int(rows_of_rank[code]), 1),
            "last_arrival_p_value": p_value,
            "slow_rank": p_value * tested < SLOW_RANK_ALPHA,
            "wait_caused_ms": caused_wait.get(int(r), 0.0),
        }
    if best_possible * tested >= SLOW_RANK_ALPHA:
        out["undecidable"] = (
            f"{out['collectives']} collective(s) matched across ranks in {steps} analysed step(s) "
            f"({out['blocks']} independent block(s): the collectives of a step in flight together share its "
            f"lateness) cannot tell a slow rank from chance: even a rank last at every one of them would be last "
            f"by chance with probability {best_possible:.2g}; profile more steps (--active)"
        )
        for values in out["ranks"].values():
            values["slow_rank"] = None
        return out
    out["count"] = sum(1 for v in out["ranks"].values() if v["slow_rank"])
    return out


def _blocks(a: Table, gid: np.ndarray, n_groups: int) -> np.ndarray:
    """Per row, its block: a new one with each step and with each collective that every rank of it entered after
    it had left all its earlier collectives of the step (numbered by the collectives' first aligned start)."""
    step = a["step"].astype(np.int64)
    if "end_us" not in a.columns:
        return group_ids(step)[0]
    start = a["start_us"].astype(np.float64)
    end = a["end_us"].astype(np.float64)
    rank = a["rank"].astype(np.int64)
    # per rank and step, rows by start: did this row start after every earlier row of its rank ended?
    order = np.lexsort((np.arange(len(a)), start, step, rank))
    seg = group_ids(rank[order], step[order])[0]
    reach = running_max(np.where(np.isfinite(end[order]), end[order], -np.inf), seg)
    prev = np.r_[-np.inf, reach[:-1]]
    new_seg = np.r_[True, seg[1:] != seg[:-1]]
    prev[new_seg] = -np.inf
    fresh = np.empty(len(a), dtype=bool)
    fresh[order] = start[order] >= prev
    fresh_coll = np.ones(n_groups, dtype=bool)
    np.logical_and.at(fresh_coll, gid, fresh)
    # collectives by (step, first aligned start): a block number that grows at each fresh one
    first = np.full(n_groups, np.inf)
    np.minimum.at(first, gid, a["aligned_start"].astype(np.float64))
    coll_step = np.empty(n_groups, dtype=np.int64)
    coll_step[gid] = step
    corder = np.lexsort((np.arange(n_groups), first, coll_step))
    new_step = np.r_[True, coll_step[corder][1:] != coll_step[corder][:-1]]
    starts = new_step | fresh_coll[corder]
    block_of = np.empty(n_groups, dtype=np.int64)
    block_of[corder] = np.cumsum(starts) - 1
    return block_of[gid]


def _unpatterned(
    excess: np.ndarray, rb: np.ndarray, n_rb: int, rank_of_rb: np.ndarray, block: np.ndarray, step: np.ndarray
) -> np.ndarray:
    """Per (rank, block) row: its ``excess`` (share of last arrivals less chance) less the rank's mean excess at
    that block's position in its step, where the rank has the position in at least ``MIN_STEPS_FOR_PATTERN``
    steps (else the excess as it is).

    A slow rank's lateness repeats step after step at the same places (its slower backward, its extra work before
    the optimizer): late at the same run of collectives in every step, it is a pattern, not a run of bad luck, and
    taking the pattern out leaves its blocks uncorrelated. A run of lateness that the host caused falls at
    different places in different steps and stays in what is left."""
    block_of_rb = np.empty(n_rb, dtype=np.int64)
    block_of_rb[rb] = block
    step_of_rb = np.empty(n_rb, dtype=np.int64)
    step_of_rb[rb] = step
    # a block's position: its number less the first block number of its step (blocks are numbered in time order)
    sid, n_steps = group_ids(step_of_rb)
    first_block = np.full(n_steps, np.iinfo(np.int64).max)
    np.minimum.at(first_block, sid, block_of_rb)
    position = block_of_rb - first_block[sid]
    pid, n_pid = group_ids(rank_of_rb, position)
    seen = np.bincount(pid, minlength=n_pid)
    mean = np.bincount(pid, weights=excess, minlength=n_pid) / np.maximum(seen, 1)
    return np.where(seen[pid] >= MIN_STEPS_FOR_PATTERN, excess - mean[pid], excess)


def _design_effect(seg: Segments, excess: np.ndarray) -> np.ndarray:
    """Per rank (the runs of ``seg``): how much the serial correlation of its blocks inflates the variance of their
    mean, ``(1 + r) / (1 - r)`` for the lag-1 autocorrelation r of ``excess`` (its share of last arrivals less
    chance, block after block in time order), r clipped to [0, ``MAX_AUTOCORRELATION``]; 1 where r <= 0, where
    the rank has fewer than ``MIN_BLOCKS_FOR_CORRELATION`` blocks, or where its blocks do not vary (a rank last at
    every one of them).

    Lateness comes in runs on a shared host: a rank that shares its CPU with another process for a while is late at
    every collective of that while, then the other rank is. Blocks of synchronous collectives (FSDP2's gathers and
    reduce-scatters, tensor parallelism's, a few ms apart) are then not independent trials: in a balanced FSDP2 job
    beside other processes, one rank was last at 16-19 collectives in a row, then the other, and the blocks'
    count named a "slow" rank in 4 runs of 14 (p 0.0002-0.009). Dividing the blocks by this factor (an AR(1)
    effective sample size) keeps a steady straggler, last at most blocks without runs of the other, at full
    strength."""
    out = np.ones(len(seg.counts))
    if not len(excess):
        return out
    mean = seg.reduce(np.mean, excess)
    owner = np.repeat(np.arange(len(seg.counts)), seg.counts)
    d = excess - mean[owner]
    same = owner[1:] == owner[:-1]  # consecutive blocks of one rank
    num = np.bincount(owner[1:][same], weights=(d[1:] * d[:-1])[same], minlength=len(seg.counts))
    den = np.bincount(owner, weights=d * d, minlength=len(seg.counts))
    ok = (seg.counts >= MIN_BLOCKS_FOR_CORRELATION) & (den > 1e-12)
    r = np.zeros(len(seg.counts))
    r[ok] = np.clip(num[ok] / den[ok], 0.0, MAX_AUTOCORRELATION)
    out[ok] = (1.0 + r[ok]) / (1.0 - r[ok])
    return out


def _count_p_of(n: int, total: float, p: float, all_or_nothing: bool, inflation: float = 1.0) -> float:
    """P(a rank is last this often or more) over ``n`` blocks, ``n / inflation`` of them independent (the design
    effect of their serial correlation, ``_design_effect``): ``total``, the sum of its per-block shares of last
    arrivals (0-1), ``p`` the blocks' mean chance; ``all_or_nothing``: every share 0 or 1, every chance the same
    and the blocks independent (the exact binomial tail)."""
    if n == 0:
        return 1.0
    if all_or_nothing:
        return binomial_sf(int(round(total)), n, p)  # exact
    a = total / n
    if a <= p:
        return 1.0
    n_eff = n / inflation
    if a >= 1.0:
        return p**n_eff
    kl = a * math.log(a / p) + (1 - a) * math.log((1 - a) / (1 - p))
    return math.exp(-n_eff * kl)


def _hoeffding(caused: float, spread: float, expected: float, w_total: float) -> tuple[float, float]:
    """(p, best p possible) that chance alone makes a rank cause ``caused`` of the waits or more, when it is last
    in each block with its chance (``spread``: the sum of the blocks' squared waits W, ``expected``: the sum of the
    waits times the chance, ``w_total``: the sum of W; Hoeffding's bound for a sum of independent terms in
    [0, W])."""
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


# A rank of a plain DDP job that no test of chance names (too few steps profiled, or its lateness in some steps
# only: rank 0 evaluating every other step) is still slow where its lateness is work that only it does: ops the
# other ranks do not run (``extra_ops_ms``: counts of ops, which a busy host does not change), over OWN_WORK_MIN_MS
# and OWN_WORK_SHARE of the wait it causes (rank-straggler's own-work test), with the others waiting for it far more
# than for anyone else (DOMINANT_SHARE of the wait all ranks cause) and last more often than chance alone.
OWN_WORK_MIN_MS = 2.0
OWN_WORK_SHARE = 0.2
DOMINANT_SHARE = 0.8
# and no other rank runs as much as this share of its extra work of its own: the work sets it apart
OTHERS_WORK_SHARE = 0.2
# The work is the rank's own code, outside the model: its time outside forward, backward and the optimizer
# (``other_ms``) exceeds the others' by OUTSIDE_SHARE of its extra ops at least, and in no analysed step does
# another rank spend more time there than it by over REVERSED_MS (or REVERSED_SHARE of its mean excess). Ops
# that come and go with the data (a block applied a data-dependent number of times, a loop over a batch's objects)
# make one rank run more of them in a few steps by chance, inside the model or alternating between the ranks: a
# balanced job of that kind named a rank in 2 traces of 8 without these two tests.
OUTSIDE_SHARE = 0.5
REVERSED_MS = 1.0
REVERSED_SHARE = 0.25
# and its mean excess there is SPREAD_TIMES the most any other rank's own time there varies from step to step: work
# outside the model that every rank does in amounts that vary with the data (post-processing, metrics per object)
# can fall on one rank in every step of a short window by chance, but then the others' amounts vary as much
SPREAD_TIMES = 2.0


def slow_by_own_work(
    ranks: list[dict[str, Any]], run: dict[str, Any], outside: Callable[[int], dict[int, float]] | None = None
) -> list[int]:
    """Ranks slow by work of their own (the constants above), in a DDP job whose ranks all run one program (DDP's
    ranges on every rank, no point-to-point or tensor-parallel collectives: a pipeline's stages differ by design),
    where no rank is ``slow_rank`` already. ``outside(rank)``: the rank's time outside the model's phases in each
    analysed step (``other_ms`` by step; without it no rank is slow by its work). Sets ``slow_rank`` (True for them,
    False for the others) and ``slow_rank_by_own_work`` on ``ranks``' rows, ``slow_rank_count`` in ``run`` and
    removes the frequency test's reasons for not deciding from ``run["not_measured"]``. Returns the ranks."""
    if outside is None:
        return []
    if len(ranks) < 2 or any(r.get("slow_rank") for r in ranks):
        return []
    if run.get("straggler_rank") is None or run.get("slow_ranks_same_work"):
        return []
    if not all(
        r.get("ddp_ranges") and not r.get("p2p_per_step") and not r.get("tp_collectives_per_step") for r in ranks
    ):
        return []
    caused = [r.get("wait_caused_ms") for r in ranks]
    if any(c is None or c != c for c in caused):
        return []
    total = sum(caused)
    chance = 1.0 / len(ranks)
    found = []
    for row in ranks:
        extra, wait, share = row.get("extra_ops_ms"), row["wait_caused_ms"], row.get("last_arrival_share")
        if extra is None or share is None or row.get("same_work_slower"):
            continue
        others = max((o.get("extra_ops_ms") or 0.0 for o in ranks if o is not row), default=0.0)
        if (
            int(row["rank"]) == run["straggler_rank"]
            and wait > OWN_WORK_MIN_MS
            and wait >= DOMINANT_SHARE * total
            and share > chance
            and extra > OWN_WORK_MIN_MS
            and extra >= OWN_WORK_SHARE * wait
            and others <= OTHERS_WORK_SHARE * extra
            and _outside_the_model(row, ranks, extra, outside)
        ):
            found.append(int(row["rank"]))
    if not found:
        return []
    for row in ranks:
        mine = int(row["rank"]) in found
        row["slow_rank"] = mine
        row["slow_rank_by_own_work"] = mine
    run["slow_rank_count"] = len(found)
    said = run.get("not_measured")
    if isinstance(said, dict):  # the reasons the frequency test gave for not deciding (metrics/evidence.py)
        from ddpdoctor.metrics import catalog

        decided = {*catalog.group("slow_ranks"), "slow_rank_count", "straggler_p_value"}
        run["not_measured"] = {k: v for k, v in said.items() if k not in decided}
    return found


def _outside_the_model(
    row: dict[str, Any], ranks: list[dict[str, Any]], extra: float, outside: Callable[[int], dict[int, float]]
) -> bool:
    """Whether ``row``'s rank spends more time outside the model's phases than the others, by OUTSIDE_SHARE of its
    ``extra`` ops on average and SPREAD_TIMES their own step-to-step spread there, and no other rank outdoes it
    there in any analysed step (the constants above)."""
    mine = outside(int(row["rank"]))
    theirs = [outside(int(o["rank"])) for o in ranks if o is not row]
    steps = sorted(set(mine).intersection(*theirs)) if theirs else []
    if not steps:
        return False
    excess = [mine[t] - float(np.median([o[t] for o in theirs])) for t in steps]
    worst_reversal = min(mine[t] - max(o[t] for o in theirs) for t in steps)
    spread = max(max(o[t] for t in steps) - min(o[t] for t in steps) for o in theirs)
    mean = sum(excess) / len(excess)
    return (
        mean >= OUTSIDE_SHARE * extra
        and worst_reversal >= -max(REVERSED_MS, REVERSED_SHARE * mean)
        and mean >= SPREAD_TIMES * spread
    )
