"""Per-step samples from the capture files (``ranks/rank<R>.json``), with the steps the profiler disturbs
left out.

``steps.wall_ms`` holds the wall time of every step. Some steps are not the training loop's own time: the
first step (lazy initialisation, allocator warm-up), the profiler's warm-up and active steps (recording costs
time) and the step after each profiled window (the trace is exported inside it, hundreds of ms). Those are
left out when enough steps remain; both runs of a comparison get the same treatment.

The job's step time for step k is the slowest rank's wall time for that step: in DDP every rank waits for the
others in the all-reduce, so the ranks' wall times are nearly equal and the maximum is the job's pace.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

MIN_STEADY = 5  # fewer undisturbed steps than this: fall back to every step but the first
MAX_SAMPLES = 1000  # a baseline stays reviewable: at most this many per-step samples (the last ones)


def _int(value: Any, default: int = 0) -> int:
    """An integer field of a capture file; ``default`` for anything else (the files are checked for type
    where they are read, ``rundir.RankCapture``; nested records such as the schedule are not)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 1 << 62 else default


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        out = float(value)
    except OverflowError:
        return None
    return out if math.isfinite(out) else None


def disturbed_steps(capture: Mapping[str, Any]) -> set[int]:
    """Steps whose wall time includes profiler start-up, recording or trace export, and the first step."""
    steps = capture.get("steps") or {}
    schedule = capture.get("schedule")
    warmup = _int(schedule.get("warmup")) if isinstance(schedule, dict) else 0
    out = {_int(steps.get("first"), 1)}
    for window in steps.get("profiled") or []:
        if isinstance(window, (list, tuple)) and window:
            lo, hi = _int(window[0]), _int(window[-1])
            out.update(range(lo - warmup, hi + 2))
    return out


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


def gil_samples(captures: Sequence[Mapping[str, Any]]) -> list[float]:
    """GIL contention (0-1) per profiled step, averaged over the ranks that measured it."""
    by_step: dict[int, list[float]] = {}
    for c in captures:
        gil = c.get("gil")
        per_step = gil.get("per_step") if isinstance(gil, dict) else None
        if not isinstance(per_step, dict):
            continue
        steps, values = per_step.get("step"), per_step.get("contention")
        if not isinstance(steps, list) or not isinstance(values, list):
            continue
        for step, value in zip(steps, values, strict=False):
            value = _float(value)
            if value is not None and isinstance(step, int) and not isinstance(step, bool):
                by_step.setdefault(step, []).append(value)
    return [float(np.mean(v)) for _, v in sorted(by_step.items())]


def statistic(values: Sequence[float], name: str) -> float | None:
    """``median``, ``p90`` or ``mean`` of ``values`` (None when empty)."""
    if not len(values):
        return None
    arr = np.asarray(values, dtype=float)
    if name == "median":
        return float(np.median(arr))
    if name == "p90":
        return float(np.percentile(arr, 90))
    return float(np.mean(arr))
