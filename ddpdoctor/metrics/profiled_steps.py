"""Which recorded steps the profiler itself disturbed (its start-up, recording and trace export, and the first
step): the steps a step-time series leaves out. Light (no numpy, no pandas): both ``compare`` (the gate's samples)
and ``diagnose``'s over-time trends read it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["disturbed_steps"]


def _int(value: Any, default: int = 0) -> int:
    """An integer field of a capture file; ``default`` for anything else (the files are checked for type
    where they are read, ``rundir.RankCapture``; nested records such as the schedule are not)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 1 << 62 else default


def disturbed_steps(capture: Mapping[str, Any]) -> set[int]:
    """Steps whose wall time includes profiler start-up, recording or trace export, and the first step (of the
    recorded steps: a hand-edited warm-up of 2**30 steps sizes no loop; each step is added once)."""
    steps = capture.get("steps") or {}
    schedule = capture.get("schedule")
    warmup = _int(schedule.get("warmup")) if isinstance(schedule, dict) else 0
    first = _int(steps.get("first"), 1)
    stop = first + len(steps.get("wall_ms") or []) + 1  # the step after the last recorded (its export)
    out = {first}
    windows = [w for w in steps.get("profiled") or [] if isinstance(w, (list, tuple)) and w]
    done = first
    for lo, hi in sorted((_int(w[0]), _int(w[-1])) for w in windows):
        start, end = max(lo - warmup, done), min(hi + 2, stop)
        out.update(range(start, end))
        done = max(done, end)
    return out
