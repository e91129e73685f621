"""Cross-rank collective metrics: match each collective across ranks, then split its time into transfer and
wait.

A collective is identified by (step, kind, index of that kind within the step). Clocks of different hosts are
aligned on matched collectives, not raw timestamps: a collective ends at about the same moment on every rank,
so a rank's clock offset is the median of (its end − the reference rank's end). Then, per collective:
transfer = the shortest duration over the ranks; wait = own duration − transfer; lateness = own aligned
arrival − earliest aligned arrival (arrival: the collective's start; with gloo, the rank's call, ``_arrivals``).
Per step: ``collective_wait_ms`` = wall time (union) spent waiting,
``late_arrival_ms`` = mean lateness over the step's collectives. What follows from each collective's transfer time
(exposed transfer, bandwidth) is ``ddpdoctor.metrics.transfer``'s, on the matching here (``keyed``, ``key_ids``,
``Windows``, ``in_analysed_steps``). ``straggler_late_share`` = the fraction of matched collectives in which the
straggler arrived last (about 1/world_size when only noise makes ranks late).

Everything runs on numpy columns over all ranks at once (``ddpdoctor.table``): a per-rank Python or pandas step
costs milliseconds, minutes at 16,384 ranks. Sums over a rank's rows are numpy's own (``np.sum`` row by row of
a 2-D block), and the sums per matched collective compensated as pandas' group sums are
(``ddpdoctor.metrics.group_sums``), so the numbers are the same to the last bit as when each rank was summed on its
own. Which ranks are slow: ``ddpdoctor.metrics.slow_ranks``.
"""

from __future__ import annotations

from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

from ddpdoctor.metrics.group_sums import (
    Segments,
    n_distinct,
    positions_within,
    running_max,
    segmented_searchsorted,
)
from ddpdoctor.metrics.slow_ranks import slow_ranks
from ddpdoctor.table import Codes, Table, column, distinct, group_ids, group_median, group_min, group_nunique

KEY = ["step", "kind", "index"]


COLUMNS = ["step", "kind", "index", "start_us", "end_us", "dur_us", "bytes", "group_size", "issued_in", "arrival_us"]
_NUMERIC = ("start_us", "end_us", "dur_us", "bytes", "group_size", "arrival_us")
_OPTIONAL = "arrival_us"  # summaries written before it: every value NaN
_EVERY_COLUMN = frozenset(COLUMNS) - {_OPTIONAL}


def cross_rank(
    summaries: list[dict[str, Any]], colls: Table | None = None, windows: Windows | None = None
) -> tuple[dict[int, dict[str, float | None]], dict[str, Any]]:
    """Per rank {collective_wait_ms, late_arrival_ms} and run-level {straggler_rank, straggler_wait_ms}.
    ``colls``: ``all_collectives(summaries)``, ``windows``: ``Windows(summaries)``, when the caller has them."""
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
    if n_distinct(colls["rank"]) < 2:
        return per_rank, run
    # only the columns read below: each copy of 131,072 ranks' collectives is ~20 MB a column
    colls = _matched(colls.select([c for c in _MATCHED_COLUMNS if c in colls.columns]))
    if len(colls) == 0:
        return per_rank, run
    gid, n = key_ids(colls)
    rids, _present, offsets = _offsets(colls, gid, n)
    offsets = np.where(np.isnan(offsets), 0.0, offsets)
    aligned = _arrivals(colls, gid, n) - offsets[rids]
    colls["aligned_start"] = aligned
    colls["wait_us"] = colls["dur_us"] - group_min(colls["dur_us"], gid, n)[gid]
    colls["late_us"] = aligned - group_min(aligned, gid, n)[gid]
    colls = colls.select([c for c in colls.columns if c != "dur_us"]).sort("rank")
    windows = Windows(summaries) if windows is None else windows
    typical_wait = _per_rank_waits(colls, summaries, per_rank, windows)
    if len(per_rank) >= 2:
        analysed = colls[np.isin(colls["step"], distinct(windows.step))]  # a step any rank analysed
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


def _arrivals(colls: Table, gid: np.ndarray, n: int) -> np.ndarray:
    """When each rank arrived at each matched collective (its own clock): when it called the collective where
    every rank of it says (``arrival_us``: gloo's ranges, whose threads can start the work milliseconds after
    the call on a busy host, ``comm.gloo_arrivals``), else the collective's start (a kernel's: the GPU's
    arrival; a range's: its call not paired)."""
    start = colls["start_us"]
    if "arrival_us" not in colls.columns:
        return start
    called = colls["arrival_us"]
    known = np.isfinite(called)
    if not known.any():
        return start
    every = np.ones(n, dtype=bool)
    np.logical_and.at(every, gid, known)
    return np.where(every[gid], called, start)


_MATCHED_COLUMNS = ("step", "kind", "index", "rank", "start_us", "end_us", "dur_us", "arrival_us")


def _matched(colls: Table) -> Table:
    """The collectives with a complete key in a step that at least two ranks ran (what the analysis matches)."""
    colls = colls[keyed(colls) & (colls["step"] >= 0)]
    gid, n = key_ids(colls)
    return colls[group_nunique(colls["rank"], gid, n)[gid] >= 2]


def _offsets(colls: Table, gid: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Clock offset of each rank of the matched ``colls`` (``gid``: their key ids, ``n`` keys): the median of (its
    end - the lowest rank's end) over the collectives both ran, NaN where it shares none with the lowest rank.
    Returns (rank id per row, the ranks, offset per rank in µs)."""
    rank = colls["rank"]
    ref = rank == rank.min()
    ref_end = np.full(n, np.nan)
    ref_end[gid[ref]] = colls["end_us"][ref]
    rids, ranks_present = _rank_ids(rank)
    offsets = group_median(colls["end_us"] - ref_end[gid], rids, len(ranks_present))
    return rids, ranks_present, offsets


def clock_offsets(summaries: list[dict[str, Any]], colls: Table | None = None) -> tuple[dict[int, float], list[int]]:
    """Per rank, its clock minus the lowest matched rank's (µs), as ``cross_rank`` aligns them; and the ranks with
    collectives that matched none of that rank's (offset 0: their own clock). The one alignment of the cross-rank
    metrics, the timeline of the reports and the Perfetto export. ``colls``: ``all_collectives(summaries)``."""
    colls = all_collectives(summaries) if colls is None else colls
    ranks = sorted({int(s["rank"]) for s in summaries if (s.get("collectives") or {}).get("step")})
    matched = _matched(colls) if len(colls) else colls
    if len(matched) == 0:
        return {r: 0.0 for r in ranks}, ranks[1:]
    gid, n = key_ids(matched)
    _rids, present, raw = _offsets(matched, gid, n)
    found = {int(r): float(v) for r, v in zip(present.tolist(), raw.tolist(), strict=True) if not np.isnan(v)}
    unmatched = sorted(r for r in ranks if r not in found)
    return {**{r: 0.0 for r in unmatched}, **found}, unmatched


def unmatched_ranks(colls: Table, summaries: list[dict[str, Any]], windows: Windows) -> list[int]:
    """The ranks with collectives in their analysed steps none of which another rank recorded in the same step
    (``_matched``): ranks profiled at other steps than the rest (their windows do not overlap). [] where fewer
    than two ranks have collectives in their analysed steps: there is no peer to match."""
    if not len(colls):
        return []
    rows = colls.select([c for c in _MATCHED_COLUMNS if c in colls.columns])
    rows = rows[in_analysed_steps(rows, summaries, windows)]
    having = distinct(rows["rank"])
    if len(having) < 2:
        return []
    matched = set(distinct(_matched(rows)["rank"]).tolist())
    return [int(r) for r in having.tolist() if int(r) not in matched]


def analysed_step_ranges(windows: Windows, ranks: list[int]) -> str:
    """``rank 0 ProfilerStep#2-9, rank 1 #13-20`` for up to four of ``ranks`` (their analysed steps' numbers)."""
    parts = []
    for r in ranks[:4]:
        steps = windows.step[windows.rank == r]
        if len(steps):
            lo, hi = int(steps.min()), int(steps.max())
            parts.append(f"rank {r} {'ProfilerStep' if not parts else ''}#{lo}" + (f"-{hi}" if hi > lo else ""))
    more = f" and {len(ranks) - 4} more" if len(ranks) > 4 else ""
    return ", ".join(parts) + more


def _per_rank_waits(
    colls: Table,
    summaries: list[dict[str, Any]],
    per_rank: dict[int, dict[str, float | None]],
    windows: Windows | None = None,
) -> dict[int, float]:
    """Fill ``per_rank`` with each rank's collective_wait_ms and late_arrival_ms (``colls`` sorted by rank);
    returns each rank's median wait per analysed step (ms).

    Per rank: the union of its wait intervals (``intervals.union``) covering each analysed step's window
    (``intervals.coverage``), and its mean lateness in each step; then the mean and median over the steps. All
    ranks at once, with the float operations of those functions in the same order (a rank's running sums are
    added one position at a time over all ranks), so the numbers are theirs to the last bit."""
    windows = Windows(summaries) if windows is None else windows
    win_rank, win_step, win_lo, win_hi, counts = (
        windows.rank,
        windows.step,
        windows.start_us,
        windows.end_us,
        windows.counts,
    )
    rows = colls[in_analysed_steps(colls, summaries, windows)]
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
    reach = running_max(e, np.cumsum(seg_new) - 1) if len(g) else e
    new = seg_new.copy()
    if len(g):
        new[1:] |= s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1) if len(first) else first
    m_start, m_end, m_rank = s[first], reach[last], g[first]
    m_len = m_end - m_start
    # per rank (its merged intervals one after the other, sorted by start): the covered length before each,
    # before[j] = before[j-1] + len[j-1] one position at a time (a cumsum's order), every rank at once per position
    m_count = np.bincount(m_rank, minlength=n_ranks)
    m_first = np.cumsum(m_count) - m_count
    pos = positions_within(m_count)
    before = np.zeros(len(m_rank))
    by_pos = np.argsort(pos, kind="stable")
    at_pos = np.cumsum(np.bincount(pos)) if len(pos) else np.zeros(1, dtype=np.int64)
    for j in range(1, len(at_pos)):
        k = by_pos[at_pos[j - 1] : at_pos[j]]
        before[k] = before[k - 1] + m_len[k - 1]

    # each window of a rank that has rows: how much of it the rank's merged intervals cover
    wr = np.minimum(np.searchsorted(present, win_rank), max(n_ranks - 1, 0))

    def until(t: np.ndarray) -> np.ndarray:
        if not len(m_start):
            return np.zeros(len(t))
        # the rank's intervals that start at or before t (a NaN bound lies after every start, as it sorts)
        i = segmented_searchsorted(m_start, m_first, m_count, wr, t) - 1
        k = np.minimum(m_first[wr] + np.maximum(i, 0), len(m_start) - 1)
        covered = before[k] + np.minimum(np.maximum(t - m_start[k], 0.0), m_len[k])
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
    seg = Segments(first_win, counts[done])
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


def all_collectives(summaries: list[dict[str, Any]]) -> Table:
    """The ``collectives`` lists of every rank as one table with a ``rank`` column (built once, not per
    rank). ``kind`` is categorical; the numeric columns are float64 (NaN where missing or not a number)."""
    tables: list[dict[str, Any]] = []
    counts: list[int] = []
    owners: list[int] = []
    for s in summaries:
        c = s.get("collectives") or {}
        n = len(c.get("step") or [])
        if n:
            tables.append(c)
            counts.append(n)
            owners.append(s["rank"])
    having = sum(_OPTIONAL in t for t in tables)
    wanted = COLUMNS if having else [c for c in COLUMNS if c != _OPTIONAL]  # in none: no column (40 MB at 131,072)
    if having in (0, len(tables)) and all(map(_EVERY_COLUMN.issubset, tables)):  # the usual summaries
        columns = {col: list(chain.from_iterable(map(itemgetter(col), tables))) for col in wanted}
    else:  # each column of every rank joined in one pass (a rank's missing column: None in each row)
        columns = {
            col: list(chain.from_iterable(t.get(col) or [None] * n for t, n in zip(tables, counts, strict=True)))
            for col in wanted
        }
    ranks = np.repeat(np.asarray(owners, dtype=np.int64), np.asarray(counts, dtype=np.int64))
    out: dict[str, Any] = {
        "step": column(columns["step"]),
        "kind": _codes(columns["kind"]),
        "index": column(columns["index"]),
        "issued_in": _codes(columns["issued_in"]),  # metrics.issuers.issuers (-1: unknown, or an older summary)
    }
    for col in _NUMERIC:
        if col in columns:
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


def keyed(colls: Table) -> np.ndarray:
    """Rows whose collective key is complete (a group key with a missing part matches nothing)."""
    ok = colls["kind"].codes >= 0
    for col in ("step", "index"):
        v = colls[col]
        if v.dtype.kind == "f":
            ok &= ~np.isnan(v)
        elif v.dtype == object:
            ok &= np.array([x is not None for x in v], dtype=bool)
    return ok


def key_ids(colls: Table) -> tuple[np.ndarray, int]:
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


class Windows:
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


def in_analysed_steps(colls: Table, summaries: list[dict[str, Any]], windows: Windows | None = None) -> np.ndarray:
    """Rows of ``colls`` whose step is one of its rank's analysed steps."""
    windows = Windows(summaries) if windows is None else windows
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
