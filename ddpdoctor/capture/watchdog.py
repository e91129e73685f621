"""``--hang-timeout``: end a rank that makes no step for too long, after recording where its main thread was stuck.

A rank stuck in Python (a deadlocked data pipeline) is unwound by SIGTERM, so its capture is flushed; a rank blocked
in a collective never returns to Python, so the watchdog leaves with ``os._exit(124)`` and the launcher stops the
other ranks (which flush theirs).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable

from ddpdoctor.capture.step_clock import StepClock

_STACK_FRAMES = 8  # innermost frames of the stuck thread kept in the rank file
_GRACE_S = 10  # time the SIGTERM gets to unwind the main thread before the hard exit


def main_thread_stack(thread_id: int) -> str:
    """The innermost frames of thread ``thread_id``, formatted as a traceback."""
    frame = sys._current_frames().get(thread_id)
    return "".join(traceback.format_stack(frame)[-_STACK_FRAMES:]) if frame is not None else "(no stack)"


class HangWatchdog:
    """A daemon thread that declares the rank hung after ``timeout_s`` without a step (only after its first step).

    ``on_hang(idle_s, stack)`` records the state (it runs in the watchdog thread); ``finished()`` tells the watchdog
    the run is over.
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
    ) -> None:
        self.clock = clock
        self.timeout_s = float(timeout_s)
        self.thread_id = thread_id
        self._rank = rank
        self._finished = finished
        self._on_hang = on_hang

    def start(self) -> None:
        threading.Thread(target=self._watch, name="ddpdoctor-hang-watchdog", daemon=True).start()

    def _watch(self) -> None:
        while not self._finished():
            time.sleep(min(1.0, self.timeout_s / 4))
            idle = self.clock.idle_s()
            if self.clock.source is None or idle < self.timeout_s or self._finished():
                continue
            self._on_hang(idle, main_thread_stack(self.thread_id))
            print(
                f"ddpdoctor: rank {self._rank()} hung: no step for {idle:.0f}s (--hang-timeout); stopping it",
                file=sys.stderr,
                flush=True,
            )
            os.kill(os.getpid(), signal.SIGTERM)  # unwinds the main thread if it is running Python
            time.sleep(_GRACE_S)
            os._exit(124)  # blocked in a collective: leave, the launcher stops the other ranks
