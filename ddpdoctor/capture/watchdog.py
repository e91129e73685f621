"""The hang timeout in a rank: no step for that long asks every rank to dump, so that the hang is decided by
evidence across ranks (who is inside a collective, who never entered it), not by whichever watchdog fires first.

The watchdog only writes ``dumps/request.json`` (:func:`ddpdoctor.capture.hang.request_hang`); the launcher, which
sees every local rank, waits for the dumps, says who is the cause and stops the job
(:class:`ddpdoctor.capture.launcher.HangJudge`). Where no ddpdoctor launcher is there to do it (a scheduler started
this rank, or this process is the launcher itself, or the launcher is gone), the watchdog does it for its own rank:
reads the dumps, ends itself (SIGTERM to unwind the main thread if it runs Python, ``os._exit(124)`` after a grace
period if it is blocked in a collective).

With the default timeout (no ``--hang-timeout``: :func:`ddpdoctor.capture.hang.timeout_s`) a job is stopped only
when the dumps show a hang or a desync: a long evaluation or checkpoint without collectives waiting is not one. The
watchdog then asks again after twice as long.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddpdoctor import liveness
from ddpdoctor.capture import hang
from ddpdoctor.capture.step_clock import StepClock

_STACK_FRAMES = 8  # innermost frames of the stuck thread kept in the rank file
_GRACE_S = 10  # time the SIGTERM gets to unwind the main thread before the hard exit
# Verdicts that stop a job under the default timeout: ranks in mismatched collectives, or waiting for a dead peer,
# never go on. A rank outside any collective while the others wait ("hang") may be a long checkpoint or evaluation
# on one rank: under the default it is reported, and the job goes on (the backend's own timeout still applies).
STOP_KINDS = ("desync", "crash")


def main_thread_stack(thread_id: int) -> str:
    """The innermost frames of thread ``thread_id``, formatted as a traceback."""
    frame = sys._current_frames().get(thread_id)
    return "".join(traceback.format_stack(frame)[-_STACK_FRAMES:]) if frame is not None else "(no stack)"


def should_stop(verdict: Any, *, explicit: bool) -> bool:
    """Whether a job is stopped on ``verdict``: always for an explicit ``--hang-timeout`` (the user's limit on a
    step); for the default one only on a desync or a dead peer, never on a rank that is only slow to return."""
    return explicit or verdict.kind in STOP_KINDS


class HangWatchdog:
    """A daemon thread that asks for a hang dump after ``timeout_s`` without a step (only after the first step).

    ``timeout_s``: the hang timeout, or with ``default=True`` the floor of the default rule
    (:func:`ddpdoctor.capture.hang.timeout_s`). ``on_hang(idle_s, stack)`` marks this rank hung (it runs in the
    watchdog thread); ``finished()`` tells the watchdog the run is over. ``out``: the run directory; ``in_rank``:
    no ddpdoctor launcher watches this rank (it acts for itself); ``launcher_pid``: the launcher that does.
    """

    def __init__(
        self,
        *,
        clock: StepClock,
        timeout_s: float,
        thread_id: int,
        rank: Callable[[], int],
        finished: Callable[[], bool],
        on_hang: Callable[[float, str], None],
        out: Path | None = None,
        default: bool | None = None,
        in_rank: bool | None = None,
        launcher_pid: int | None = None,
    ) -> None:
        self.clock = clock
        self.timeout_s = float(timeout_s)
        self.thread_id = thread_id
        self._rank = rank
        self._finished = finished
        self._on_hang = on_hang
        config = _config()
        self.out = Path(out if out is not None else (config.out if config else "."))
        self.default = bool(default if default is not None else getattr(config, "hang_timeout_default", False))
        pid = launcher_pid if launcher_pid is not None else (config.launcher_pid if config else 0)
        self.launcher_pid = int(pid or 0)
        if in_rank is None:
            in_rank = config is None or config.launch == "scheduler" or self.launcher_pid in (0, os.getpid())
        self.in_rank = in_rank

    def limit_s(self) -> float:
        """The hang timeout now (the default one grows with the slowest step seen)."""
        return hang.timeout_s(None, self.clock.wall_ms) if self.default else self.timeout_s

    def start(self) -> None:
        threading.Thread(target=self._watch, name="ddpdoctor-hang-watchdog", daemon=True).start()

    def _watch(self) -> None:
        fired_at: float | None = None  # unix time this rank last asked (or joined a request) in this stall
        times = 0
        while not self._finished():
            time.sleep(min(1.0, self.limit_s() / 4))
            idle = self.clock.idle_s()
            if self.clock.source is None or self._finished():
                continue
            if idle < self.limit_s() * (2**times):
                if fired_at is not None and idle < self.limit_s():
                    fired_at, times = None, 0  # it stepped again: a new stall starts from scratch
                continue
            since = time.time() - idle if fired_at is None else fired_at
            step = self.clock.iteration
            by = f"rank {self._rank()} (no step for {idle:.0f} s after step {step})"
            ident, written = hang.request_hang(self.out, by=by, since=since)
            fired_at, times = time.time(), times + 1
            if not self.in_rank and _alive(self.launcher_pid):
                continue  # the launcher decides, prints and stops the job
            self._act(ident, idle, speak=written)

    def _act(self, ident: str, idle: float, *, speak: bool) -> None:
        """No launcher watches this rank: read the dumps and end this rank if they show a hang. ``speak``: this
        rank asked for the dumps, so it prints the verdict (the others only say that they stop)."""
        rank = self._rank()
        ranks = hang.world_ranks(self.out)
        dumps = hang.wait_for_answers(self.out, ident, ranks)
        try:
            verdict = hang.judge(dumps, world_size=len(ranks) or None)
        except Exception as exc:  # never leave a hung rank running because the analysis failed
            print(f"ddpdoctor: rank {rank}: the dumps could not be analysed: {exc}", file=sys.stderr, flush=True)
            verdict = None
        if verdict is None and self.default:
            return  # the default timeout never stops a job on no evidence
        if verdict is not None and not should_stop(verdict, explicit=not self.default):
            if verdict.kind == "hang":
                why = (
                    f"{verdict.summary}; not stopped: the default hang timeout only reports (a long checkpoint or "
                    "evaluation on one rank looks the same); --hang-timeout SECONDS stops such a job"
                )
            else:
                why = f"no hang in the dumps ({verdict.kind}: {verdict.summary}); not stopped"
            if speak or verdict.kind != "hang":
                print(f"ddpdoctor: rank {rank}: no step for {idle:.0f}s: {why}", file=sys.stderr, flush=True)
            return
        if verdict is not None and speak:
            for line in hang.verdict_lines(verdict, waited_for=ranks):
                print(f"ddpdoctor: rank {rank}: {line}", file=sys.stderr, flush=True)
        if verdict is None or rank in verdict.culprits or not verdict.culprits:
            self._on_hang(idle, main_thread_stack(self.thread_id))
        print(
            f"ddpdoctor: rank {rank}: no step for {idle:.0f}s (hang timeout); stopping it",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGTERM)  # unwinds the main thread if it is running Python
        time.sleep(_GRACE_S)
        os._exit(hang.HANG_EXIT)  # blocked in a collective: leave; its peers' collectives then fail


def _config() -> Any:
    from ddpdoctor.capture.config import CaptureConfig

    try:
        return CaptureConfig.from_env()
    except (TypeError, ValueError):
        return None


def _alive(pid: int) -> bool:
    """Whether the launcher ``pid`` is still there to decide (a zombie is not: ``liveness.exists``)."""
    return pid > 0 and liveness.exists(pid)
