"""Which recorded steps the profiler itself disturbed (its start-up, recording and trace export, and the first
step): the steps a step-time series leaves out; and the step a run ended in, whose recording it cut short. Light
(no numpy, no pandas): ``compare`` (the gate's samples), ``diagnose``'s over-time trends and the summaries read
it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["cut_short_note", "disturbed_steps", "running_step"]


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


def running_step(capture: Mapping[str, Any] | None) -> int | None:
    """The step a ``ddpdoctor trace`` rank was still in when it wrote its capture file (the run ended, crashed or
    was stopped inside it), where the profiler recorded it: its ``ProfilerStep#N`` range ends where the recording
    stopped, not at a step boundary, so it holds part of a step (a job of 8 steps under a schedule that starts
    recording at step 8 left only the 2 ms from its last optimizer step to its exit, which read as a 2 ms step).
    None without a capture, before the first step, or where the profiler's step numbers may not be the step
    counter's (the start-up recording ended by its time limit, not by the first step: one more ``ProfilerStep``)."""
    steps = (capture or {}).get("steps")
    startup = (capture or {}).get("fallback_window")
    if not isinstance(steps, dict) or steps.get("source") in (None, "none"):
        return None
    if not isinstance(startup, dict) or startup.get("ended_by") != "first step":
        return None
    count = steps.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return None
    windows = [w for w in steps.get("profiled") or [] if isinstance(w, list) and len(w) == 2]
    return None if any(_int(lo) <= count <= _int(hi) for lo, hi in windows) else count


def cut_short_note(captures: Mapping[int, Mapping[str, Any]], summaries: list[Mapping[str, Any]]) -> str | None:
    """The run's note when no rank has a complete step to analyse because the run ended in the first step its
    profiler recorded (``running_step``); None otherwise."""
    cut: dict[int, int] = {}
    for s in summaries:
        per_step = s.get("per_step")
        if per_step is None:
            continue
        try:
            analyzed, numbers = list(per_step["analyzed"]), {int(x) for x in per_step["step"]}
        except (KeyError, TypeError, ValueError):  # a summary without the columns: nothing to say
            return None
        if any(bool(a) for a in analyzed):
            return None
        running = running_step(captures.get(s["rank"]))
        if running is not None and running in numbers:
            cut[int(s["rank"])] = running
    if not cut:
        return None
    step = max(cut.values())
    schedule = next((c.get("schedule") for c in captures.values() if isinstance(c.get("schedule"), dict)), None)
    first = f" (it starts at step {_int(schedule.get('wait')) + _int(schedule.get('warmup')) + 1})" if schedule else ""
    return (
        f"No complete step was recorded: the run ended in step {step}, the first step of its profiled window{first}, "
        f"and a step cut short by the end of the run is not analysed (its trace holds only the part before the "
        f"end); trace more steps, or start recording sooner (--wait, --warmup)"
    )
