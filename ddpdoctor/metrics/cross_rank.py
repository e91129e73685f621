"""Cross-rank collective metrics: match each collective across ranks, then split its time into transfer and
wait.

A collective is identified by (step, kind, index of that kind within the step). Clocks of different hosts are
aligned on matched collectives, not raw timestamps: a collective ends at about the same moment on every rank,
so a rank's clock offset is the median of (its end − the reference rank's end). Then, per collective:
transfer = the shortest duration over the ranks; wait = own duration − transfer; lateness = own aligned
start − earliest aligned start. Per step: ``collective_wait_ms`` = wall time (union) spent waiting,
``late_arrival_ms`` = mean lateness over the step's collectives. ``straggler_late_share`` = the fraction of
matched collectives in which the straggler arrived last (about 1/world_size when only noise makes ranks late).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from ddpdoctor.metrics import intervals as iv

KEY = ["step", "kind", "index"]


COLUMNS = ["step", "kind", "index", "start_us", "end_us", "dur_us", "bytes", "group_size"]


def cross_rank(summaries: list[dict[str, Any]]) -> tuple[dict[int, dict[str, float | None]], dict[str, Any]]:
    """Per rank {collective_wait_ms, late_arrival_ms} and run-level {straggler_rank, straggler_wait_ms}."""
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
    colls = _all_collectives(summaries)
    if colls["rank"].nunique() < 2:
        return per_rank, run
    colls = colls[colls["step"] >= 0]
    counts = colls.groupby(KEY)["rank"].transform("nunique")
    colls = colls[counts >= 2].copy()
    if len(colls) == 0:
        return per_rank, run
    # clock offset of each rank: median of (its end - the reference rank's end) over the collectives both ran
    ref = colls["rank"].min()
    ref_end = colls.loc[colls["rank"] == ref, KEY + ["end_us"]].rename(columns={"end_us": "ref_end_us"})
    diff = colls[KEY + ["rank", "end_us"]].merge(ref_end, on=KEY, how="left")
    offsets = (diff["end_us"] - diff["ref_end_us"]).groupby(diff["rank"]).median().fillna(0.0)
    colls["aligned_start"] = colls["start_us"] - colls["rank"].map(offsets)
    grouped = colls.groupby(KEY)
    colls["wait_us"] = colls["dur_us"] - grouped["dur_us"].transform("min")
    colls["late_us"] = colls["aligned_start"] - grouped["aligned_start"].transform("min")
    # one pass over the ranks on plain arrays (a DataFrame per rank costs ~1 ms each: seconds at 1,000 ranks)
    colls = colls.sort_values("rank", kind="stable")
    rank_col = colls["rank"].to_numpy()
    ranks_present, first = np.unique(rank_col, return_index=True)
    last = np.append(first[1:], len(rank_col))
    bounds = {int(r): (int(a), int(b)) for r, a, b in zip(ranks_present, first, last, strict=True)}
    step_col = colls["step"].to_numpy()
    start_col = colls["start_us"].to_numpy(dtype=np.float64)
    wait_col = colls["wait_us"].to_numpy(dtype=np.float64)
    late_col = colls["late_us"].to_numpy(dtype=np.float64)
    typical_wait: dict[int, float] = {}
    for s in summaries:
        lo_hi = bounds.get(s["rank"])
        steps = _analysed(s)
        if lo_hi is None or len(steps["step"]) == 0:
            continue
        sl = slice(*lo_hi)
        mine = np.isin(step_col[sl], steps["step"])
        if not mine.any():
            continue
        start, step = start_col[sl][mine], step_col[sl][mine]
        waits = iv.union(start, start + wait_col[sl][mine])
        wait_ms = iv.coverage(waits, steps["start_us"], steps["end_us"]) / 1e3
        per_rank[s["rank"]] = {
            "collective_wait_ms": float(np.mean(wait_ms)),
            "late_arrival_ms": float(np.mean(_mean_by_step(step, late_col[sl][mine], steps["step"])) / 1e3),
        }
        typical_wait[s["rank"]] = float(np.median(wait_ms))
    if len(per_rank) >= 2:
        analysed = colls[colls["step"].isin(_analysed_steps(summaries))]
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
            waiting = [r for r in per_rank if r not in (flagged or [straggler])]
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


# Family-wise significance of "this rank arrives last more often than chance", over all ranks tested
# (Bonferroni over ranks and the two tests): at most one healthy run in fifty may name a slow rank by chance, and
# the rule's wait thresholds must hold as well.
SLOW_RANK_ALPHA = 0.02


def slow_ranks(analysed: pd.DataFrame, ranks: list[int]) -> dict[str, Any]:
    """Which ranks arrive last at the matched collectives more often, or at more cost, than chance allows.

    ``analysed``: one row per rank and matched collective (``KEY`` columns, ``rank``, ``start_us``,
    ``aligned_start``, ``wait_us``). In a collective of k ranks, noise alone makes each rank the last with chance
    1/k. Two tests per rank, each against that chance:

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
    a = analysed.reset_index(drop=True)
    grouped = a.groupby(KEY, sort=False)
    size = grouped["rank"].transform("size").to_numpy()
    last_idx = grouped["aligned_start"].idxmax().to_numpy()
    is_last = np.zeros(len(a), dtype=bool)
    is_last[last_idx] = True
    # who was last at each collective, and the others' mean wait in it (its weight), on every row of it
    wait = a["wait_us"].to_numpy(dtype=np.float64)
    weight = (grouped["wait_us"].transform("sum").to_numpy() - np.where(is_last, wait, 0.0)) / np.maximum(size - 1, 1)
    lasts = a.loc[last_idx, KEY + ["rank"]].rename(columns={"rank": "last_rank"})
    lasts["weight"] = weight[last_idx]
    per_row = a[KEY].merge(lasts, on=KEY, how="left")
    last_of_row = per_row["last_rank"].to_numpy()
    weight_of_row = per_row["weight"].to_numpy(dtype=np.float64)
    n_steps = max(a["step"].nunique(), 1)
    out["collectives"] = int(len(last_idx))
    tested = max(len(ranks), 1)
    best_possible = 1.0
    for r in ranks:
        mine = (a["rank"] == r).to_numpy()
        n = int(mine.sum())
        if n == 0:
            continue
        x = int(is_last[mine].sum())
        chance = 1.0 / size[mine]
        p_count = binomial_sf(x, n, float(np.mean(chance)))
        w = weight_of_row[mine]
        caused = float(w[is_last[mine]].sum())
        p_cost, best_cost = _hoeffding(caused, w, chance)
        p_value = min(1.0, 2.0 * min(p_count, p_cost))
        best_possible = min(best_possible, 2.0 * min(float(np.mean(chance)) ** n, best_cost))
        out["ranks"][r] = {
            "last_arrival_share": x / n,
            "last_arrival_p_value": p_value,
            "slow_rank": p_value * tested < SLOW_RANK_ALPHA,
            "wait_caused_ms": _wait_caused(a, last_of_row, r, n_steps),
        }
    if best_possible * tested >= SLOW_RANK_ALPHA:
        steps = a["step"].nunique()
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


def _hoeffding(caused: float, weights: np.ndarray, chance: np.ndarray) -> tuple[float, float]:
    """(p, best p possible) that chance alone makes a rank cause ``caused`` of the waits ``weights`` or more, when
    it is last at each collective with probability ``chance`` (Hoeffding's bound for a sum of independent terms
    in [0, w])."""
    spread = float((weights**2).sum())
    if spread <= 0:
        return 1.0, 1.0
    expected = float((weights * chance).sum())
    excess = caused - expected
    best = float(weights.sum()) - expected
    p = math.exp(-2.0 * excess**2 / spread) if excess > 0 else 1.0
    return p, math.exp(-2.0 * best**2 / spread) if best > 0 else 1.0


def _wait_caused(a: pd.DataFrame, last_of_row: np.ndarray, r: int, n_steps: int) -> float:
    """The other ranks' mean wall time per step (ms) spent waiting in the collectives ``r`` entered last (union of
    each rank's wait intervals: concurrent collectives are not counted twice)."""
    waiting = a[(last_of_row == r) & (a["rank"].to_numpy() != r)]
    if len(waiting) == 0:
        return 0.0
    per_rank = []
    for _, rows in waiting.groupby("rank"):
        start = rows["start_us"].to_numpy(dtype=np.float64)
        waits = iv.union(start, start + rows["wait_us"].to_numpy(dtype=np.float64))
        per_rank.append(float((waits[1] - waits[0]).sum()))
    others = max(a["rank"].nunique() - 1, 1)
    return sum(per_rank) / others / n_steps / 1e3


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


def _all_collectives(summaries: list[dict[str, Any]]) -> pd.DataFrame:
    """The ``collectives`` lists of every rank as one frame with a ``rank`` column (built once, not per
    rank)."""
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
    frame = pd.DataFrame(columns)
    for col in ("start_us", "end_us", "dur_us", "bytes", "group_size"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    frame["rank"] = np.asarray(ranks, dtype=np.int64)
    return frame


def _analysed(summary: dict[str, Any]) -> dict[str, np.ndarray]:
    """``step``, ``start_us``, ``end_us`` of the analysed steps of one rank's summary."""
    ps = summary["per_step"]
    keep = np.asarray(ps.get("analyzed") or [], dtype=bool)
    return {
        key: np.asarray(ps.get(key) or [], dtype=np.float64 if key != "step" else np.int64)[keep]
        for key in ("step", "start_us", "end_us")
    }


def _mean_by_step(step: np.ndarray, values: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """For each entry of ``steps``, the mean of ``values`` whose ``step`` equals it (0 when there are
    none)."""
    uniq, inverse = np.unique(step, return_inverse=True)
    means = np.bincount(inverse, weights=values) / np.bincount(inverse)
    pos = np.minimum(np.searchsorted(uniq, steps), len(uniq) - 1)
    return np.where(uniq[pos] == steps, means[pos], 0.0)


def _analysed_steps(summaries: list[dict[str, Any]]) -> set[int]:
    steps: set[int] = set()
    for s in summaries:
        ps = s["per_step"]
        flags = ps.get("analyzed") or []
        steps.update(int(x) for x, a in zip(ps.get("step") or [], flags, strict=False) if a)
    return steps


def transfer_bandwidth(summaries: list[dict[str, Any]]) -> pd.DataFrame:
    """Per rank and kind: ``count, bytes, ms, algbw_gbps, busbw_gbps`` over the analysed steps (ms = own
    time)."""
    from ddpdoctor.metrics.comm import bus_factor

    out_columns = ["rank", "kind", "count", "bytes", "ms", "algbw_gbps", "busbw_gbps"]
    colls = _all_collectives(summaries)
    if len(colls) == 0:
        return pd.DataFrame(columns=out_columns)
    order = {s["rank"]: i for i, s in enumerate(summaries)}
    pairs = [(s["rank"], step) for s in summaries for step in _analysed(s)["step"].tolist()]
    analysed = pd.DataFrame(pairs, columns=["rank", "step"]).drop_duplicates()
    c = colls.merge(analysed, on=["rank", "step"], how="inner")
    if len(c) == 0:
        return pd.DataFrame(columns=out_columns)
    sized = c["bytes"].notna() & (c["bytes"] > 0)
    c = c.assign(
        order=c["rank"].map(order),
        sized_bytes=c["bytes"].where(sized, 0.0),
        sized_dur_us=c["dur_us"].where(sized, 0.0),
        sized_group=c["group_size"].where(sized),
    )
    agg = (
        c.groupby(["order", "rank", "kind"], sort=True)
        .agg(
            count=("kind", "size"),
            bytes=("bytes", lambda b: b.sum(min_count=1)),
            dur_us=("dur_us", "sum"),
            sized_bytes=("sized_bytes", "sum"),
            sized_dur_us=("sized_dur_us", "sum"),
            sized_group=("sized_group", "max"),
        )
        .reset_index()
    )
    world = {s["rank"]: int(s.get("world_size") or 1) for s in summaries}
    rows = []
    for r in agg.itertuples(index=False):
        seconds = r.sized_dur_us / 1e6
        n = int(r.sized_group) if r.sized_group == r.sized_group and r.sized_group > 0 else world[r.rank]
        algbw = float(r.sized_bytes / seconds / 1e9) if seconds > 0 else None
        rows.append(
            {
                "rank": r.rank,
                "kind": r.kind,
                "count": int(r.count),
                "bytes": float(r.bytes) if r.bytes == r.bytes else None,
                "ms": float(r.dur_us / 1e3),
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * bus_factor(str(r.kind), n) if algbw is not None else None,
            }
        )
    return pd.DataFrame(rows, columns=out_columns)
