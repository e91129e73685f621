"""Per-step samples from the capture files (``ranks/rank<R>.json``), with the steps the profiler disturbs
left out.

``steps.wall_ms`` holds the wall time of every step. Some steps are not the training loop's own time: the
first step (lazy initialisation, allocator warm-up), the profiler's warm-up and active steps (recording costs
time) and the step after each profiled window (the trace is exported inside it, hundreds of ms). Those are
left out when enough steps remain; both runs of a comparison get the same treatment.

The job's step time for step k is the slowest rank's wall time for that step: in DDP every rank waits for the
others in the all-reduce, so the ranks' wall times are nearly equal and the maximum is the job's pace.

Bounds: a run gives at most ``MAX_SAMPLES`` samples per metric, a baseline of several runs ``MAX_POOLED`` (the
gate's bootstrap, and the baseline file a reviewer reads, stay small whatever the world size). The per-rank
metrics of the traces (exposed communication, data loading, ...) have one value per rank per step; up to
``MAX_SAMPLES`` of them are kept as they are, beyond that they are reduced per step over groups of ranks
(``reduce_rank_steps``), which keeps their mean.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ddpdoctor.metrics.capture import step_contention
from ddpdoctor.metrics.profiled_steps import _int, disturbed_steps

MIN_STEADY = 5  # fewer undisturbed steps than this: fall back to every step but the first
MAX_SAMPLES = 1000  # a baseline stays reviewable: at most this many per-step samples per run (the last ones)
MAX_POOLED = 5000  # a baseline of several runs: at most this many per metric, all runs together


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        out = float(value)
    except OverflowError:
        return None
    return out if math.isfinite(out) else None


def rank_step_times(capture: Mapping[str, Any]) -> dict[int, float]:
    """step -> wall ms of one rank, for every recorded step."""
    steps = capture.get("steps") or {}
    first = _int(steps.get("first"), 1)
    values = [_float(ms) for ms in steps.get("wall_ms") or []]
    return {first + i: ms for i, ms in enumerate(values) if ms is not None}


def job_step_times(captures: Sequence[Mapping[str, Any]]) -> tuple[list[float], str]:
    """The job's per-step wall times (ms; slowest rank per step) and a note saying which steps they cover."""
    per_rank = [rank_step_times(c) for c in captures]
    per_rank = [r for r in per_rank if r]
    if not per_rank:
        return [], "no step wall times recorded"
    common = sorted(set.intersection(*(set(r) for r in per_rank)))
    disturbed = set().union(*(disturbed_steps(c) for c in captures))
    steady = [s for s in common if s not in disturbed]
    if len(steady) >= MIN_STEADY:
        chosen, how = steady, "steps outside the profiled windows"
    else:
        chosen = [s for s in common if s != common[0]] if len(common) > MIN_STEADY else common
        how = "all steps (too few outside the profiled windows)"
    chosen = chosen[-MAX_SAMPLES:]
    values = [max(r[s] for r in per_rank) for s in chosen]
    span = f"{chosen[0]}-{chosen[-1]}" if chosen else "none"
    return values, f"{len(values)} {how}, steps {span}, slowest rank per step"


def reduce_rank_steps(rank: Any, step: Any, values: Any, statistic: str = "mean") -> tuple[list[float], str | None]:
    """At most ``MAX_SAMPLES`` samples of a per-rank, per-step metric (``rank``, ``step``, ``values``: one entry
    per rank and step) and a note saying how they were made (None: every finite value, unchanged).

    Up to ``MAX_SAMPLES`` values are kept as they are. Beyond that, each step's values are reduced over G groups
    of ranks (rank i in group i mod G), G the largest divisor of the rank count with G x steps <= MAX_SAMPLES
    (G = 1: one value per step over all ranks), by ``statistic`` ("mean": every group has as many ranks, so
    the samples' mean is the mean over every rank and step; "median", "p90": the groups' median). Only the
    last ``MAX_SAMPLES`` steps are kept.

    Why per step: the bootstrap treats its samples as independent draws, and the ranks of one step are not (a
    slow step is slow on every rank): kept rank by rank, such a step would count once per rank, here once per
    group, which widens the interval towards what the steps' variation gives. The groups' means also leave out
    the fixed differences between ranks (rank 0 waiting less than rank 1 in every step), which are in both runs
    and are not noise; differences between runs (placement, load) are the run-to-run test's, not this one's."""
    v = np.asarray(values, dtype=float)
    r = np.asarray(rank, dtype=float)
    s = np.asarray(step, dtype=float)
    keep = np.isfinite(v) & np.isfinite(r) & np.isfinite(s)
    if int(keep.sum()) <= MAX_SAMPLES:
        return v[keep].tolist(), None
    v, r, s = v[keep], r[keep], s[keep]
    steps = np.unique(s)
    if len(steps) > MAX_SAMPLES:
        steps = steps[-MAX_SAMPLES:]
        inside = s >= steps[0]
        v, r, s = v[inside], r[inside], s[inside]
    ranks = np.unique(r)
    most = max(1, MAX_SAMPLES // len(steps))
    groups = max(g for g in range(1, min(most, len(ranks)) + 1) if len(ranks) % g == 0)
    group = np.searchsorted(ranks, r) % groups
    key = np.searchsorted(steps, s) * groups + group
    if statistic == "mean":
        sums = np.bincount(key, weights=v, minlength=len(steps) * groups)
        counts = np.bincount(key, minlength=len(steps) * groups)
        out = (sums[counts > 0] / counts[counts > 0]).tolist()
    else:
        import pandas as pd  # compare and gate import it anyway

        grouped = pd.Series(v).groupby(key)
        out = (grouped.median() if statistic == "median" else grouped.quantile(0.9)).astype(float).tolist()
    size = len(ranks) // groups
    over = f"all {len(ranks)} ranks" if groups == 1 else f"each of {groups} groups of {size} ranks"
    return out, (
        f"{len(out)} samples: per step, the {statistic} over {over} "
        f"({len(ranks)} ranks x {len(steps)} steps; more than {MAX_SAMPLES} rank-steps)"
    )


def pool(runs: Sequence[Sequence[float]]) -> tuple[list[float], int | None]:
    """Several runs' samples of one metric as one list of at most ``MAX_POOLED``: every run's, or, when they are
    more, the last ``MAX_POOLED // len(runs)`` of each (every run weighs the same). The second value: how many
    were kept of each run (None: all)."""
    if sum(len(r) for r in runs) <= MAX_POOLED:
        return [float(x) for r in runs for x in r], None
    each = max(1, MAX_POOLED // max(len(runs), 1))
    return [float(x) for r in runs for x in list(r)[-each:]][:MAX_POOLED], each


def gil_samples(captures: Sequence[Mapping[str, Any]]) -> list[float]:
    """GIL contention (0-1) per profiled step, averaged over the ranks that measured it (the last
    ``MAX_SAMPLES`` steps)."""
    by_step: dict[int, list[float]] = {}
    for c in captures:
        gil = c.get("gil")
        per_step = gil.get("per_step") if isinstance(gil, dict) else None
        if not isinstance(per_step, dict):
            continue
        steps, values = per_step.get("step"), step_contention(per_step)
        if not isinstance(steps, list) or not isinstance(values, list):
            continue
        for step, value in zip(steps, values, strict=False):
            value = _float(value)
            if value is not None and isinstance(step, int) and not isinstance(step, bool):
                by_step.setdefault(step, []).append(value)
    with np.errstate(all="ignore"):
        means = [float(np.mean(v)) for _, v in sorted(by_step.items())][-MAX_SAMPLES:]
    return [m for m in means if math.isfinite(m)]


def statistic(values: Sequence[float], name: str) -> float | None:
    """``median``, ``p90`` or ``mean`` of ``values`` (None when empty)."""
    if not len(values):
        return None
    arr = np.asarray(values, dtype=float)
    with np.errstate(all="ignore"):  # values near the float limit: an inf mean, not a warning on stderr
        if name == "median":
            out = float(np.median(arr))
        elif name == "p90":
            out = float(np.percentile(arr, 90))
        else:
            out = float(np.mean(arr))
    return out if math.isfinite(out) else None
