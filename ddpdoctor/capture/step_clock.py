"""The step clock of one training process: which iteration is running, how long each took, which were recorded.

Steps are found without touching the script: torch's global optimizer step hook marks the end of each iteration
(``ddpdoctor.step()`` does the same for loops without ``torch.optim``). Only the OUTERMOST step does: an optimizer
that steps another inside its own step (``ZeroRedundancyOptimizer`` around its local optimizer, which then broadcasts
the updated parameters) fires torch's global hooks for the inner one first, and ending the iteration there would put
the outer step's own work into the next step. The pre-hook (:meth:`StepClock.optimizer_started`) keeps the steps
running on each thread. Iteration 0 also holds the script's start-up,
so the profiler schedule counts from iteration 1.

Until the first step is seen the profiler records the start of the run (the *start-up trace*), so that a script with
no detectable step still yields a trace. :class:`StartupTrace` is the life of that recording.
"""

from __future__ import annotations

import enum
import threading
import time
import weakref
from typing import Any


class StartupTrace(enum.Enum):
    """What became of the start-up recording (iteration 0, before any step)."""

    RECORDING = "recording"  # no step seen yet: the profiler records from the start of the run
    DISCARDING = "discarding"  # the first step came: the recording is not a training step; drop it when handed over
    DROPPED = "dropped"  # dropped (the profiler handed it over and nothing was written)
    KEPT = "kept"  # no step within the time limit, or none at all: the recording is the run's trace

    @property
    def reported(self) -> str:
        """The state as the rank file reports it ("recording" | "dropped" | "kept")."""
        return "dropped" if self is StartupTrace.DISCARDING else self.value


def ranges(indices: list[int]) -> list[list[int]]:
    """Consecutive step indices as inclusive ``[first, last]`` ranges: [3, 4, 5, 9] -> [[3, 5], [9, 9]]."""
    out: list[list[int]] = []
    for i in indices:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def _frames_above(frame: Any) -> set[int]:
    """ids of ``frame`` and every frame that called it (empty for None)."""
    out: set[int] = set()
    while frame is not None:
        out.add(id(frame))
        frame = frame.f_back
    return out


def _ref(obj: Any) -> Any:
    """A weak reference to ``obj`` (a strong one, as a callable, for an object that cannot have weak ones)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


class StepClock:
    """Counts iterations and times them (wall ms); knows nothing of the profiler but what it is told."""

    def __init__(self) -> None:
        self.source: str | None = None  # "optimizer" | "manual" once a step was seen
        self.iteration = 0  # index of the iteration now running (ProfilerStep#<iteration>)
        self.wall_ms: list[float] = []  # wall time of every iteration from iteration 1 on
        self.recorded: list[int] = []  # iterations inside a profiled window
        self.startup = StartupTrace.RECORDING
        self.startup_ended_by: str | None = None  # "first step" | "time limit" | "end of run"
        self._marker: Any = None  # () -> the optimizer whose step ends an iteration (a weak reference)
        self._others: dict[int, Any] = {}  # optimizers stepped since the marker last did (id -> reference)
        # per thread: the optimizer steps running now, outermost first ((id of the optimizer, torch's step frame))
        self._running: dict[int, list[tuple[int, Any]]] = {}
        self._t0 = time.perf_counter()
        self.last_step_t = self._t0

    # ---- which calls are steps -------------------------------------------------------------------------------
    def optimizer_started(self, optimizer: Any, frame: Any = None) -> None:
        """torch's step pre-hook: ``optimizer.step()`` begins (``frame``: the frame of torch's step wrapper that
        calls the hook). A step that raised never reached its post-hook; its entry is dropped once its frame is no
        longer on the thread's stack."""
        running = self._running.setdefault(threading.get_ident(), [])
        if running:
            live = _frames_above(frame)
            running[:] = [(key, f) for key, f in running if key != id(optimizer) and (f is None or id(f) in live)]
        running.append((id(optimizer), frame))

    def _finished(self, optimizer: Any) -> bool:
        """The post-hook of ``optimizer``: remove its step; True if no other optimizer step is still running on
        this thread (it was the outermost)."""
        running = self._running.get(threading.get_ident())
        if not running:
            return True
        key = id(optimizer)
        for i in range(len(running) - 1, -1, -1):
            if running[i][0] == key:
                del running[i:]
                break
        return not running

    def counts_optimizer(self, optimizer: Any, may_count: bool = True) -> bool:
        """Whether this ``optimizer.step()`` ends an iteration.

        A step inside another optimizer's step (ZeRO's local optimizer) never does, and never becomes the marker.

        ``ddpdoctor.step()`` takes over from optimizers once called. One optimizer marks the iterations: the first
        to step. With several stepped in one iteration (a GAN's two, ZeRO's wrapper and the optimizer inside it)
        the others never end one. The job may move to another optimizer (a new Adam built at step 3): the marker
        passes to the next optimizer that steps once the marking one is gone (freed), or to one that steps twice
        while the marking one did not step at all. An optimizer built and never stepped changes nothing.
        ``may_count`` False: a step that can never end an iteration (another thread's, once the training loop's
        thread is known): it neither counts nor takes over.
        """
        if not self._finished(optimizer) or self.source == "manual" or not may_count:
            return False
        marker = self._marker() if self._marker is not None else None
        if marker is None:  # the first step of the run, or the optimizer that marked iterations was freed
            self._follow(optimizer)
            return True
        if marker is optimizer:
            self._others.clear()
            return True
        key = id(optimizer)
        if key in self._others and self._others[key]() is optimizer:
            # it stepped again and the marker not once since: the job uses this one now
            self._follow(optimizer)
            return True
        self._others[key] = _ref(optimizer)  # held weakly where it can be: a stale id is dropped with its object
        return False

    def _follow(self, optimizer: Any) -> None:
        self._marker = _ref(optimizer)
        self._others.clear()

    def tick(self, source: str, *, recording: bool) -> None:
        """End the current iteration. ``recording``: the profiler was recording it (a profiled step)."""
        if self.source is None or (source == "manual" and self.source != "manual"):
            self.source = source
        now = time.perf_counter()
        if self.iteration >= 1:
            self.wall_ms.append(round((now - self.last_step_t) * 1e3, 4))
        self.last_step_t = now
        if self.startup is StartupTrace.RECORDING:
            self.end_startup("first step")
        elif recording:
            self.recorded.append(self.iteration)
        self.iteration += 1

    @property
    def count(self) -> int:
        """Steps seen (0 when none was ever detected)."""
        return self.iteration if self.source else 0

    def idle_s(self) -> float:
        """Seconds since the last step (or since the clock started)."""
        return time.perf_counter() - self.last_step_t

    # ---- the start-up trace ----------------------------------------------------------------------------------
    def startup_over_limit(self, limit_s: float) -> bool:
        """Still recording the start-up with no step after ``limit_s`` seconds."""
        return self.startup is StartupTrace.RECORDING and time.perf_counter() - self._t0 > limit_s

    def end_startup(self, ended_by: str) -> None:
        """Stop treating the run as "no step yet": at the first step the start-up recording is discarded, else
        (time limit, end of run) it is kept as the run's trace."""
        self.startup = StartupTrace.DISCARDING if ended_by == "first step" else StartupTrace.KEPT
        self.startup_ended_by = ended_by

    def take_startup_trace(self) -> bool:
        """Called when the profiler hands over a trace: True if it is the start-up recording to discard."""
        if self.startup is StartupTrace.DISCARDING:
            self.startup = StartupTrace.DROPPED
            return True
        return False

    # ---- what the rank file reports --------------------------------------------------------------------------
    def steps_json(self) -> dict[str, Any]:
        return {
            "source": self.source or "none",
            "count": self.count,
            "first": 1,
            "wall_ms": self.wall_ms,
            "profiled": ranges(self.recorded),
        }

    def startup_json(self) -> dict[str, Any]:
        return {"state": self.startup.reported, "ended_by": self.startup_ended_by}
