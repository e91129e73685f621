"""Late arrivals over a whole run: which DDP rank kept reaching the backward's all-reduce last, step by step, from the
always-on series (``ranks/rank<R>.series.jsonl``), and since when. Part of the report's "Over time" section
(``ddpdoctor.metrics.overtime``); pure: it takes the series and the rank captures as read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any

import numpy as np

from ddpdoctor.metrics.overtime import _time_of
from ddpdoctor.metrics.slow_ranks import binomial_sf

ARRIVAL_MIN_STEPS = 20  # steps every rank has, with the phases of the step and of the step before
ARRIVAL_MIN_MS = 5.0  # a step counts as one with a late rank when the last arrived this much after the others
ARRIVAL_MIN_SHARE = 0.05  # ... and this share of the median step
ARRIVAL_ALPHA = 1e-3  # the chance that a late rank (or its persistence) is luck, at most (over every rank)
# the late ranks of steps this far apart are compared, in steps and in time: neighbouring steps share a hiccup (a
# rank off its CPU for a while delays every step it spans)
ARRIVAL_LAG_STEPS = 3
ARRIVAL_LAG_S = 0.2
ARRIVAL_MIN_RUN = 5  # a stretch of steps with the same late rank is said from this many steps on
ARRIVAL_MERGE_GAP = 2  # ... across gaps of this many steps without a late rank (or with another one)


def arrival_skipped(captures: Mapping[int, Mapping[str, Any]]) -> set[int]:
    """Steps whose time to the backward a profiled window may have made uneven between ranks: the first step, and
    at each window the steps the profiler starts in and the last one with the two after it (its trace is written
    there, longer on a rank with more events). The window's other steps stay: each rank records the same ops, so
    the profiler's cost adds alike to every rank's arrival."""
    out: set[int] = set()
    for cap in captures.values():
        steps = cap.get("steps") or {}
        schedule = cap.get("schedule")
        warmup = int(schedule.get("warmup") or 0) if isinstance(schedule, dict) else 0
        first = steps.get("first") if isinstance(steps.get("first"), int) else 1
        out.add(first)
        for w in steps.get("profiled") or []:
            if isinstance(w, (list, tuple)) and len(w) == 2 and all(isinstance(v, int) for v in w):
                lo, hi = w[0] - warmup, w[1]
                out.update((lo - 1, lo, hi, hi + 1, hi + 2))
    return out


def arrivals(series: Mapping[int, Any], captures: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Which rank reached its backward (where DDP's first all-reduce of the step starts) last, at every step of the
    series, and for how long the same rank kept being the late one.

    A DDP step's collectives end together on every rank (the last bucket's all-reduce), so each rank's time from
    that point to its next backward is its arrival: the optimizer's step after it, then the next step's data and
    forward (``optimizer_s`` of the step before + ``data_s`` + ``forward_s`` of the series). No clock is shared:
    each rank measures its own span. Whether a late rank is a pattern is decided from steps ``lag`` apart (at least
    ARRIVAL_LAG_STEPS, and ARRIVAL_LAG_S of median steps)
    (issue 25: steps, not collectives, are the trials; neighbouring steps share a hiccup): in a job with no
    straggler the late rank of one step says nothing of a later one's (the same rank with chance 1/world size), a
    straggler is late step after step. Two tests, either may decide: one rank late more often than 1 in the world
    size at steps ``lag`` apart (binomial, times the ranks), and the same rank at both ends of pairs of late steps
    ``lag`` apart more often than the ranks' own shares of the late steps make likely (a straggler that moves from
    rank to rank over the run). Only DDP jobs
    (every rank built a DistributedDataParallel module): FSDP's all-gathers in the forward make every rank wait
    there, a pipeline's stages reach their backward at different times by design."""
    if len(series) < 2:
        return {"evaluated": False, "reason": "one rank's series: nothing to compare"}
    if not captures or not all((cap or {}).get("ddp") for cap in captures.values()):
        return {
            "evaluated": False,
            "reason": "not every rank built a DistributedDataParallel module: the time to the backward is when a "
            "rank reaches DDP's all-reduce only in a DDP job",
        }
    ranks = sorted(series)
    skipped = arrival_skipped(captures)
    arrive: dict[int, dict[int, float]] = {}
    cpu: dict[int, dict[int, float]] = {}
    wall: list[float] = []
    for rank in ranks:
        rows = {int(r["step"]): r for r in series[rank].rows if isinstance(r.get("step"), int)}
        mine = arrive[rank] = {}
        cpu[rank] = {}
        for step, r in rows.items():
            prev = rows.get(step - 1)
            if step in skipped or prev is None or (step - 1) in skipped or step < 1:
                continue
            parts = (prev.get("optimizer_s"), r.get("data_s"), r.get("forward_s"))
            if all(isinstance(v, Real) and math.isfinite(v) for v in parts):
                mine[step] = float(sum(parts))  # type: ignore[arg-type]
                if isinstance(r.get("cpu_s"), Real):
                    cpu[rank][step] = float(r["cpu_s"])
            if isinstance(r.get("wall_s"), Real):
                wall.append(float(r["wall_s"]))
    steps = sorted(set.intersection(*(set(a) for a in arrive.values())))
    if len(steps) < ARRIVAL_MIN_STEPS:
        return {
            "evaluated": False,
            "reason": f"{len(steps)} steps with every rank's phases (the profiler's start and export left out); "
            f"{ARRIVAL_MIN_STEPS} are needed",
        }
    a = np.array([[arrive[r][s] for r in ranks] for s in steps]) * 1000.0  # ms, steps x ranks
    order = np.argsort(a, axis=1)
    last = order[:, -1]
    rest = np.sort(a, axis=1)[:, :-1]
    late_ms = a[np.arange(len(steps)), last] - np.median(rest, axis=1)  # the last one after the others' median
    step_ms = float(np.median(wall)) * 1000.0 if wall else 0.0
    floor = max(ARRIVAL_MIN_MS, ARRIVAL_MIN_SHARE * step_ms)
    late = late_ms >= floor
    who = np.where(late, last, -1)  # the late rank's index per step, -1: no rank late
    # pairs of late steps ``lag`` steps apart: a hiccup shorter than that (a rank off its CPU for a few steps)
    # makes no pair of its own, a straggler's steps pair up all along
    lag = max(ARRIVAL_LAG_STEPS, math.ceil(ARRIVAL_LAG_S * 1000.0 / step_ms) if step_ms > 0 else 0)
    pos = {step: i for i, step in enumerate(steps)}
    later = [(i, pos[st + lag]) for i, st in enumerate(steps) if st + lag in pos]
    pairs = sum(1 for i, j in later if late[i] and late[j])
    same = sum(1 for i, j in later if late[i] and late[j] and who[i] == who[j])
    w = len(ranks)
    # 1. one rank late more often than chance, counted at steps ``lag`` apart (independent trials), in each of the
    # ``lag`` phases, the best one's p times ``lag`` (Bonferroni): a rank late every 2nd or 4th step (evaluation or
    # logging every N steps, N even) is late at none of the steps of one phase and at all of another's; phase 0
    # alone missed it in 3 phases of 4 ("no rank shown" with 100 of 398 steps all rank 1's)
    first = steps[0]
    phase_of = (np.asarray(steps) - first) % lag
    p_rank, thinned, counts, top = 2.0, [], [0] * w, 0
    for phase in range(lag):
        sampled = [int(who[i]) for i in np.flatnonzero(phase_of == phase) if who[i] >= 0]
        tally = [sum(1 for k in sampled if k == r) for r in range(w)]
        best = max(range(w), key=lambda r: tally[r])
        p_phase = min(1.0, lag * w * binomial_sf(tally[best], len(sampled), 1.0 / w))
        if p_phase < p_rank or (p_phase == p_rank and len(sampled) > len(thinned)):
            p_rank, thinned, counts, top = p_phase, sampled, tally, best
    # 2. the late rank persists (a straggler that moves from rank to rank keeps each rank for a while): the same
    # rank at both ends of a pair more often than the ranks' own shares of the late steps make likely
    shares = [float(np.sum(who == r)) / max(int(late.sum()), 1) for r in range(w)]
    p_same = binomial_sf(same, pairs, min(1.0, sum(q * q for q in shares))) if pairs else 1.0
    p = min(p_rank, p_same)
    out: dict[str, Any] = {
        "evaluated": True,
        "steps": len(steps),
        "first_step": steps[0],
        "last_step": steps[-1],
        "late_steps": int(late.sum()),
        "threshold_ms": round(floor, 3),
        "lag_steps": lag,
        "sampled_late_steps": len(thinned),
        "most_late_rank": ranks[top],
        "most_late_count": counts[top],
        "late_pairs": pairs,
        "same_rank_pairs": same,
        "p_value": float(f"{p:.3g}"),
        "stretches": [],
    }
    if not late.any():
        out["text"] = (
            f"no rank shown to keep arriving last: in none of {len(steps)} steps did a rank reach its backward "
            f"{floor:.1f} ms or more after the others"
        )
        return out
    if p > ARRIVAL_ALPHA:
        out["text"] = (
            f"no rank shown to keep arriving last (p = {p:.2g}; under {ARRIVAL_ALPHA:g} is needed): "
            f"{int(late.sum())} of {len(steps)} steps had a rank reach its backward {floor:.1f} ms or more after the "
            f"others; at steps {lag} apart the most often late was rank {ranks[top]}, {counts[top]} of "
            f"{len(thinned)} (chance alone: 1 in {w}), and the same rank was late at both ends of {same} of {pairs} "
            "pairs"
        )
        return out
    stretches = _stretches(steps, who)
    for s in stretches:
        rank = ranks[s["index"]]
        idx = [i for i, st in enumerate(steps) if s["first"] <= st <= s["last"] and who[i] == s["index"]]
        s.update(rank=rank, late_ms=round(float(np.median(late_ms[idx])), 3))
        s["since_time"] = _time_of({int(r["step"]): float(r["t"]) for r in series[rank].rows if r.get("t")}, s["first"])
        mine = [cpu[rank].get(steps[i]) for i in idx]
        theirs = [cpu[o].get(steps[i]) for i in idx for o in ranks if o != rank]
        mine_v = [v for v in mine if v is not None]
        theirs_v = [v for v in theirs if v is not None]
        if len(mine_v) >= len(idx) // 2 and theirs_v:
            s["cpu_ms"] = round(1000.0 * float(np.median(mine_v)), 3)
            s["others_cpu_ms"] = round(1000.0 * float(np.median(theirs_v)), 3)
        del s["index"]
    out["stretches"] = stretches
    out["ranks"] = sorted({s["rank"] for s in stretches})
    if not stretches:  # late far more often than chance, but never ARRIVAL_MIN_RUN times in a row
        out["ranks"] = [ranks[top]]
        out["pattern"] = "intermittent"
        out["text"] = (
            f"rank {ranks[top]} arrived last at the backward's all-reduce more often than chance, on and off: at "
            f"steps {lag} apart late in {counts[top]} of {len(thinned)} (chance alone 1 in {w}, p = {p:.2g}), never "
            f"{ARRIVAL_MIN_RUN} late steps in a row"
        )
        return out
    if len(out["ranks"]) > 1:
        out["pattern"] = "moved"
    elif _covers(stretches, steps):
        out["pattern"] = "throughout"
    elif stretches and stretches[-1]["last"] >= steps[-1] - ARRIVAL_MERGE_GAP:
        out["pattern"] = "started"
    else:
        out["pattern"] = "stretch"
    out["text"] = _arrivals_text(out, w)
    return out


def _stretches(steps: Sequence[int], who: np.ndarray) -> list[dict[str, Any]]:
    """Runs of steps with the same late rank, at least ARRIVAL_MIN_RUN late steps each. Gaps of up to
    ARRIVAL_MERGE_GAP observed steps (no rank late, or another) are bridged; steps not observed (a profiled
    window's, left out of the series analysis) are no gap."""
    runs: list[dict[str, Any]] = []
    for pos, (step, k) in enumerate(zip(steps, who, strict=True)):
        if k < 0:
            continue
        # the same rank's run, unless the gap since it is too long (another rank's short run inside it is bridged)
        cur = next((r for r in reversed(runs[-2:]) if r["index"] == int(k)), None)
        if cur is not None and pos - cur["last_pos"] <= ARRIVAL_MERGE_GAP + 1:
            cur["last"], cur["last_pos"] = step, pos
            cur["late"] += 1
        else:
            runs.append({"index": int(k), "first": step, "last": step, "first_pos": pos, "last_pos": pos, "late": 1})
    kept = [r for r in runs if r["late"] >= ARRIVAL_MIN_RUN]
    for r in kept:
        r["steps"] = r.pop("last_pos") - r.pop("first_pos") + 1  # observed steps in the stretch
    return kept


def _covers(stretches: Sequence[Mapping[str, Any]], steps: Sequence[int]) -> bool:
    return (
        len(stretches) == 1
        and stretches[0]["first"] <= steps[0] + ARRIVAL_MERGE_GAP
        and (stretches[0]["last"] >= steps[-1] - ARRIVAL_MERGE_GAP)
    )


def _arrivals_text(out: Mapping[str, Any], world: int) -> str:
    parts = []
    for s in out["stretches"]:
        span = f"steps {s['first']}-{s['last']}"
        if out["pattern"] == "started" and s is out["stretches"][-1]:
            span = f"since step {s['first']}" + (f" ({s['since_time']})" if s.get("since_time") else "")
        text = f"rank {s['rank']} in {s['late']} of {s['steps']} steps {span}, {s['late_ms']:.1f} ms after the others"
        if "cpu_ms" in s:
            more = s["cpu_ms"] - s["others_cpu_ms"]
            if more >= 0.5 * s["late_ms"]:
                text += (
                    f" (its process used {s['cpu_ms']:.1f} ms of CPU a step, the others {s['others_cpu_ms']:.1f}: "
                    "more work on that rank)"
                )
            elif abs(more) < 0.25 * s["late_ms"]:
                text += (
                    f" (its process used as much CPU a step as the others, {s['cpu_ms']:.1f} vs "
                    f"{s['others_cpu_ms']:.1f} ms: it waited for something rather than working more - a CPU on a "
                    "busy host, I/O, a sleep, or its GPU)"
                )
        parts.append(text)
    head = (
        f"arrived last at the backward's all-reduce, step after step (at steps {out['lag_steps']} apart: rank "
        f"{out['most_late_rank']} late in {out['most_late_count']} of {out['sampled_late_steps']}, the same rank at "
        f"both ends of {out['same_rank_pairs']} of {out['late_pairs']} pairs; chance alone 1 in {world}, "
        f"p = {out['p_value']:.2g}): "
    )
    tail = ""
    if out["pattern"] == "moved":
        tail = ": the rank changes over the run: look at the data (what each rank's batches held), not at a node"
    elif out["pattern"] == "started":
        tail = "; before, no rank kept arriving last"
    return head + "; ".join(parts) + tail
