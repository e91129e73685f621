"""Periodic deep windows (``trace --every STEPS|DURATION``, ``--keep N``): the profiler's schedule and the bound on
the traces kept.

The schedule counts like torch.profiler's own (``--wait`` steps skipped, ``--warmup``, ``--active`` recorded), but
a window starts every ``every_steps`` steps (window k begins at ``wait + k * every_steps``), or, with a duration,
at the first step that ends in a new ``every_s``-second slot of the wall clock (slots counted from the Unix epoch,
so every rank of a node, and of nodes with synchronised clocks, has the same ones; the first window after
``--wait`` whatever the slot). The ranks of a DDP job leave every step together (its all-reduce), so they open a
window at the same step, except when a slot begins inside the few milliseconds by which their step ends differ:
then one rank's window starts a step later, and only that window (the slots do not drift apart). Diagnosis pairs
windows by their order, not their steps.

``--keep N``: once a rank has written a window beyond the newest N, its oldest trace is removed (and any gzip of it
made later): the traces on disk stay within N windows per rank. The rank file lists the windows removed
(``schedule.dropped``: their steps and bytes).
"""

from __future__ import annotations

import argparse
import math
import re
import time
from collections.abc import Callable
from typing import Any

from ddpdoctor.cli.argtypes import MAX_COUNT, MAX_SECONDS

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,6})?)\s*(s|m|h|min)")


def parse_every(text: str) -> tuple[str, float]:
    """``--every``: ``200`` (steps) -> ("steps", 200); ``10m``, ``30s``, ``1.5h`` -> ("seconds", 600.0)."""
    value = text.strip().lower()
    if re.fullmatch(r"[0-9]{1,10}", value):
        steps = int(value)
        if not 1 <= steps <= MAX_COUNT:
            raise argparse.ArgumentTypeError(f"must be a number of steps from 1 to {MAX_COUNT}, not {text!r}")
        return "steps", float(steps)
    match = _DURATION.fullmatch(value)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"must be a number of steps (200) or a duration with a unit (30s, 10m, 1h), not {text!r}"
        )
    unit = match.group(2)[0]
    seconds = float(match.group(1)) * _UNITS[unit]
    if not 0 < seconds <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"must be a duration above 0 and at most {MAX_SECONDS:.0f}s, not {text!r}")
    return "seconds", seconds


def describe(every_steps: int | None, every_s: float | None) -> str:
    if every_steps:
        return f"every {every_steps} steps"
    if every_s:
        if every_s >= 3600 and every_s % 3600 == 0:
            return f"every {every_s / 3600:g} h"
        if every_s >= 60 and every_s % 60 == 0:
            return f"every {every_s / 60:g} min"
        return f"every {every_s:g} s"
    return ""


class EverySchedule:
    """A torch.profiler schedule (``step -> ProfilerAction``) with a window every N steps or every D seconds.

    ``step`` is the profiler's own count (the session's iteration minus one). Called more than once per step (the
    host-load recorder asks ahead): each step's action is decided once and kept."""

    def __init__(
        self,
        *,
        wait: int,
        warmup: int,
        active: int,
        repeat: int,
        every_steps: int | None = None,
        every_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not (every_steps or every_s):
            raise ValueError("EverySchedule needs every_steps or every_s")
        if every_steps and every_steps < warmup + active:
            raise ValueError(f"every_steps {every_steps} is shorter than a window ({warmup + active} steps)")
        self.wait, self.warmup, self.active, self.repeat = wait, warmup, active, repeat
        self.every_steps, self.every_s = every_steps, every_s
        self._clock = clock
        self._decided: dict[int, Any] = {}
        self._window_start: int | None = None  # time-based: the step the current (or last) window began at
        self._slot = 0  # time-based: the clock's every_s slot the last window began in
        self._windows = 0

    def __call__(self, step: int) -> Any:
        action = self._decided.get(step)
        if action is None:
            action = self._decide(step)
            self._decided[step] = action
            self._decided.pop(step - 4, None)  # bounded: only the last few steps are ever asked again
        return action

    def _position(self, pos: int) -> Any:
        from torch.profiler import ProfilerAction

        if pos < self.warmup:
            return ProfilerAction.WARMUP
        if pos < self.warmup + self.active - 1:
            return ProfilerAction.RECORD
        if pos == self.warmup + self.active - 1:
            return ProfilerAction.RECORD_AND_SAVE
        return ProfilerAction.NONE

    def _decide(self, step: int) -> Any:
        from torch.profiler import ProfilerAction

        if step < self.wait:
            return ProfilerAction.NONE
        if self.every_steps:
            k, pos = divmod(step - self.wait, self.every_steps)
            if self.repeat and k >= self.repeat:
                return ProfilerAction.NONE
            return self._position(pos)
        length = self.warmup + self.active
        if self._window_start is not None and step - self._window_start < length:
            return self._position(step - self._window_start)
        if self.repeat and self._windows >= self.repeat:
            return ProfilerAction.NONE
        now = self._clock()
        slot = math.floor(now / (self.every_s or 1.0))  # the same grid on every rank: no drift between them
        if self._window_start is None or slot > self._slot:
            self._window_start, self._slot = step, slot
            self._windows += 1
            return self._position(0)
        return ProfilerAction.NONE


def dropped_record(first: int | None, last: int | None, name: str, size: int | None) -> dict[str, Any]:
    return {"first_step": first, "last_step": last, "file": name, "bytes": size}


def header(args: Any, first: int) -> str:
    """trace's line on the windows it will take (printed after its first line)."""
    last = first + args.active - 1
    if args.every_steps:
        k = args.every_steps
        when = f"a window every {k} steps: steps {first}-{last}, {first + k}-{last + k}, ..."
    elif args.every_s:
        when = (
            f"a window {describe(None, args.every_s)}: steps {first}-{last}, then at the first step of each new "
            f"{describe(None, args.every_s).removeprefix('every ')} of the clock"
        )
    else:
        when = f"windows back to back from step {first} ({args.repeat or 'until the end'} of them)"
    if args.repeat and (args.every_steps or args.every_s):
        when += f" ({args.repeat} windows at most)"
    if args.keep:
        kept = (
            f"; the newest {args.keep} window(s) per rank kept on disk, older traces removed (each window's size is "
            f"printed as it is written: at most {args.keep} times that per rank)"
        )
    else:
        kept = "; every window kept (--keep N bounds the disk)"
    return f"ddpdoctor: {when}{kept}"
