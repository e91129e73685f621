"""The step timeline: what each rank did during one step, on one clock (the reports draw it: ``report.timeline``).

Recorded per rank (``record``, into the summary's ``timeline``, bounded): for at most ``MAX_STEPS`` analysed steps
(all of them when there are few, else the slowest and those nearest the rank's median step), the intervals of the
compute lanes, exclusive in the breakdown's order (exposed comm > data wait > optimizer > backward > forward; the
rest of the step is idle or other work), and DataParallel's gather, at most ``MAX_SEGMENTS`` per lane and step
(the shortest gaps closed first beyond that). Communication needs no more: the summary's ``collectives`` hold each
call's start and end.

Built for a run (``build``): the clocks aligned as the cross-rank analysis aligns them
(``cross_rank.clock_offsets``); each collective split into waiting for late peers (its start up to where the
shortest duration of any rank's call of it begins) and transfer (that shortest duration, at its end), a rank's
lateness at it counted as the analysis counts it (from the calls, where every shown rank's is known: gloo's); the median
step (by its wall time over the ranks) and the worst; at most ``MAX_RANKS`` ranks (those the findings name first).
A summary without ``timeline`` (an older capture) gives a timeline that says so.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ddpdoctor.metrics import intervals as iv

MAX_STEPS = 8
MAX_SEGMENTS = 24
MAX_RANKS = 32
# compute lanes, in the order they claim time (what is left of the step is "idle")
COMPUTE_ORDER = ("exposed_comm", "dataloader", "optimizer", "backward", "forward")
LANES = (*COMPUTE_ORDER, "dp_gather")
NOT_RECORDED = (
    "not recorded by this capture (its summaries predate the timeline; `diagnose --steps 0..` reads the traces)"
)


def choose_steps(steps: np.ndarray, step_ms: np.ndarray, limit: int = MAX_STEPS) -> list[int]:
    """All of ``steps`` when at most ``limit``; else the slowest third and the rest nearest the median step."""
    if len(steps) <= limit:
        return sorted(int(s) for s in steps)
    order = np.argsort(-step_ms, kind="stable")
    slow = [int(steps[i]) for i in order[: max(1, limit // 3)]]
    median = float(np.median(step_ms))
    near = np.argsort(np.abs(step_ms - median), kind="stable")
    kept = list(dict.fromkeys(slow + [int(steps[i]) for i in near]))
    return sorted(kept[:limit])


def _bounded(starts: np.ndarray, ends: np.ndarray, limit: int = MAX_SEGMENTS) -> tuple[np.ndarray, np.ndarray]:
    """At most ``limit`` disjoint sorted segments: the shortest gaps between them closed first."""
    if len(starts) <= limit:
        return starts, ends
    gaps = starts[1:] - ends[:-1]
    close = np.zeros(len(gaps), dtype=bool)
    close[np.argsort(gaps, kind="stable")[: len(starts) - limit]] = True
    keep_start = np.concatenate([[True], ~close])
    keep_end = np.concatenate([~close, [True]])
    return starts[keep_start], ends[keep_end]


def record(lanes: dict[str, iv.Intervals], steps: Any, dp_gather: iv.Intervals | None = None) -> dict[str, list[Any]]:
    """The summary's ``timeline``: columns ``step, lane, start_us, end_us`` (the rank's own clock) of the chosen
    analysed steps (``steps``: the per-step table with ``step, start_us, end_us, analyzed, step_ms``)."""
    out: dict[str, list[Any]] = {"step": [], "lane": [], "start_us": [], "end_us": []}
    analysed = np.asarray(steps["analyzed"], dtype=bool)
    ids = np.asarray(steps["step"])[analysed]
    if len(ids) == 0:
        return out
    lo_all = np.asarray(steps["start_us"], dtype=np.float64)[analysed]
    hi_all = np.asarray(steps["end_us"], dtype=np.float64)[analysed]
    chosen = set(choose_steps(ids, np.asarray(steps["step_ms"], dtype=np.float64)[analysed]))
    keep = np.array([int(x) in chosen for x in ids.tolist()], dtype=bool)
    ids, lo_all, hi_all = ids[keep], lo_all[keep], hi_all[keep]
    windows = iv.union(lo_all, hi_all)  # the lanes cut to the kept steps first: the rest is never looked at
    own: list[tuple[str, iv.Intervals]] = []
    taken = iv.EMPTY
    for name in COMPUTE_ORDER:
        part = iv.intersect(lanes.get(name, iv.EMPTY), windows)
        own.append((name, iv.subtract(part, taken)))
        taken = iv.union_all(taken, part)
    if dp_gather is not None and len(dp_gather[0]):
        own.append(("dp_gather", iv.intersect(dp_gather, windows)))
    for step, lo, hi in zip(ids.tolist(), lo_all.tolist(), hi_all.tolist(), strict=True):
        for name, (starts, ends) in own:
            first, last = np.searchsorted(ends, lo, side="right"), np.searchsorted(starts, hi, side="left")
            s, e = _bounded(np.maximum(starts[first:last], lo), np.minimum(ends[first:last], hi))
            n = len(s)
            out["step"] += [int(step)] * n
            out["lane"] += [name] * n
            out["start_us"] += np.round(s, 1).tolist()
            out["end_us"] += np.round(e, 1).tolist()
    return out


class LazyTimeline:
    """``build(summaries, colls, focus_ranks)`` made on first ``get()`` (a report that draws no timeline never pays
    for it); one per ``focus_ranks`` asked (the ranks the findings name, drawn first in a large run)."""

    def __init__(self, summaries: list[dict[str, Any]], colls: Any) -> None:
        self._args: tuple[Any, ...] = (summaries, colls)
        self._made: dict[tuple[int, ...], dict[str, Any]] = {}

    def get(self, focus_ranks: list[int] | None = None) -> dict[str, Any]:
        key = tuple(sorted(set(focus_ranks or [])))
        if key not in self._made:
            self._made[key] = build(*self._args, focus_ranks=list(key))
        return self._made[key]

    def __reduce__(self) -> tuple[Any, ...]:  # pickled as what it made (the summaries stay behind)
        return (_made, (self.get(),))


def _made(value: dict[str, Any]) -> LazyTimeline:
    out = LazyTimeline([], None)
    out._made[()] = value
    return out


def _steps(summary: dict[str, Any]) -> dict[int, tuple[float, float]]:
    ps = summary.get("per_step") or {}
    cols = (ps.get(k) or [] for k in ("step", "start_us", "end_us", "analyzed"))
    return {
        int(s): (float(lo), float(hi))
        for s, lo, hi, a in zip(*cols, strict=False)
        if a and s is not None and lo is not None and hi is not None
    }


def build(summaries: list[dict[str, Any]], colls: Any = None, focus_ranks: list[int] | None = None) -> dict[str, Any]:
    """The run's timeline (module docstring): ``{"recorded", "reason", "offsets_us", "unaligned", "ranks_of",
    "steps": [{"label", "step", "t0_us", "t1_us", "ranks": [{"rank", "start_us", "end_us", "compute": [[lane, a,
    b], ...], "comm": [[kind, index, part, a, b, late_us], ...], "gather": [[a, b], ...]}]}]}``, times aligned and
    in µs. ``focus_ranks``: drawn first when the run has more than ``MAX_RANKS``."""
    from ddpdoctor.metrics.cross_rank import clock_offsets

    empty: dict[str, Any] = {"recorded": False, "reason": None, "steps": [], "offsets_us": {}, "unaligned": []}
    if not summaries:
        return {**empty, "reason": "no rank's trace or summary"}
    if any(s.get("timeline") is None for s in summaries):
        return {**empty, "reason": NOT_RECORDED}
    ranks = sorted(int(s["rank"]) for s in summaries)
    shown = _shown_ranks(ranks, focus_ranks or [])
    by_rank = {int(s["rank"]): s for s in summaries}
    offsets, unaligned = clock_offsets(summaries, colls)
    recorded = {r: {s for s in by_rank[r]["timeline"].get("step") or [] if _numbers(s)} for r in shown}
    windows = {r: _steps(by_rank[r]) for r in shown}
    common = set.intersection(*(recorded[r] & set(windows[r]) for r in shown)) if shown else set()
    if not common:
        return {**empty, "recorded": True, "reason": "no analysed step that every rank recorded", "offsets_us": offsets}

    def wall(step: int) -> float:
        lo = min(windows[r][step][0] - offsets.get(r, 0.0) for r in shown)
        hi = max(windows[r][step][1] - offsets.get(r, 0.0) for r in shown)
        return hi - lo

    walls = {s: wall(s) for s in sorted(common)}
    median_wall = float(np.median(list(walls.values())))
    median_step = min(walls, key=lambda s: (abs(walls[s] - median_wall), s))
    worst_step = max(walls, key=lambda s: (walls[s], -s))
    picks = [("median step", median_step)] + ([("worst step", worst_step)] if worst_step != median_step else [])
    steps = [_one_step(label, step, shown, by_rank, windows, offsets) for label, step in picks]
    return {
        "recorded": True,
        "reason": None,
        "offsets_us": offsets,
        "unaligned": unaligned,
        "ranks_of": len(ranks),
        "steps": steps,
        "step_walls_ms": {"median": walls[median_step] / 1e3, "worst": walls[worst_step] / 1e3, "steps": len(walls)},
    }


def _numbers(*values: Any) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in values)


def _shown_ranks(ranks: list[int], focus: list[int]) -> list[int]:
    if len(ranks) <= MAX_RANKS:
        return ranks
    first = [r for r in dict.fromkeys(focus) if r in set(ranks)][: MAX_RANKS // 2]
    rest = [r for r in ranks if r not in set(first)][: MAX_RANKS - len(first)]
    return sorted(first + rest)


def _one_step(
    label: str,
    step: int,
    shown: list[int],
    by_rank: dict[int, dict[str, Any]],
    windows: dict[int, dict[int, tuple[float, float]]],
    offsets: dict[int, float],
) -> dict[str, Any]:
    calls: dict[int, list[tuple[str, int, float, float, float | None]]] = {}
    for r in shown:
        c = by_rank[r].get("collectives") or {}
        mine = []
        for s, kind, index, a, b, called in zip(
            c.get("step") or [],
            c.get("kind") or [],
            c.get("index") or [],
            c.get("start_us") or [],
            c.get("end_us") or [],
            c.get("arrival_us") or [None] * len(c.get("step") or []),
            strict=False,
        ):
            if s == step and None not in (kind, index, a, b):
                off = offsets.get(r, 0.0)
                arrived = float(called) - off if isinstance(called, (int, float)) and called == called else None
                mine.append((str(kind), int(index), float(a) - off, float(b) - off, arrived))
        calls[r] = mine
    shortest: dict[tuple[str, int], float] = {}
    earliest: dict[tuple[str, int], float] = {}
    first_call: dict[tuple[str, int], float | None] = {}  # None: a rank's call is not known (cross_rank._arrivals)
    for mine in calls.values():
        for kind, index, a, b, arrived in mine:
            key = (kind, index)
            shortest[key] = min(shortest.get(key, np.inf), b - a)
            earliest[key] = min(earliest.get(key, np.inf), a)
            known = first_call.get(key, np.inf)
            first_call[key] = None if arrived is None or known is None else min(known, arrived)
    rows = []
    for r in shown:
        off = offsets.get(r, 0.0)
        tl = by_rank[r]["timeline"]
        compute, gather = [], []
        cols = (tl.get(k) or [] for k in ("step", "lane", "start_us", "end_us"))
        for s, lane, a, b in zip(*cols, strict=False):
            if s != step or lane not in LANES or not _numbers(a, b):  # a file's odd row is left out, not drawn
                continue
            if lane == "dp_gather":
                gather.append([a - off, b - off])
            else:
                compute.append([lane, a - off, b - off])
        comm = []
        for kind, index, a, b, arrived in calls[r]:
            key = (kind, index)
            transfer = shortest[key] if len(calls) > 1 else b - a
            split = max(a, b - transfer)
            # late as the analysis counts it: from the calls where every rank's is known, else from the starts
            first = first_call[key]
            late = arrived - first if first is not None and arrived is not None else a - earliest[key]
            if split > a:
                comm.append([kind, index, "wait", a, split, late])
            comm.append([kind, index, "transfer", split, b, late])
        lo, hi = windows[r][step]
        rows.append(
            {"rank": r, "start_us": lo - off, "end_us": hi - off, "compute": compute, "comm": comm, "gather": gather}
        )
    t0 = min(row["start_us"] for row in rows)
    t1 = max(row["end_us"] for row in rows)
    return {"label": label, "step": step, "t0_us": t0, "t1_us": t1, "ranks": rows}


def step_rows(summaries: list[dict[str, Any]], step: int, offsets: dict[int, float]) -> list[dict[str, Any]] | None:
    """Every rank's row of ``step`` in ``build``'s form (``{"rank", "start_us", "end_us", "compute", "comm",
    "gather"}``, µs on the clocks ``offsets`` aligns), for any analysed step, not only the median and the worst;
    None when a rank did not analyse it. A rank whose summary recorded no timeline has no compute lanes (its
    collectives are there)."""
    by_rank = {int(s["rank"]): s if s.get("timeline") is not None else {**s, "timeline": {}} for s in summaries}
    ranks = sorted(by_rank)
    windows = {r: _steps(by_rank[r]) for r in ranks}
    if not ranks or any(step not in windows[r] for r in ranks):
        return None
    return _one_step("", step, ranks, by_rank, windows, offsets)["ranks"]


def latest_arrival(row: dict[str, Any]) -> tuple[str, int, float, float] | None:
    """(kind, index, arrival, lateness) of the collective this rank entered latest after the first rank to enter
    it; None when it was never late."""
    arrivals: dict[tuple[str, int], tuple[float, float]] = {}
    for kind, index, _part, a, _b, late in row["comm"]:
        if (kind, index) not in arrivals or a < arrivals[(kind, index)][0]:
            arrivals[(kind, index)] = (a, late)
    late = [(k[0], k[1], a, lateness) for k, (a, lateness) in arrivals.items() if lateness > 0]
    return max(late, key=lambda c: (c[3], -c[2]), default=None)


def exposed_after_backward(row: dict[str, Any]) -> list[tuple[float, float]]:
    """The exposed-communication segments from the start of the rank's backward to its step's end, in time order;
    empty when no backward was seen."""
    starts = [a for lane, a, _ in row["compute"] if lane == "backward"]
    if not starts:
        return []
    first = min(starts)
    return sorted((a, b) for lane, a, b in row["compute"] if lane == "exposed_comm" and a >= first)
