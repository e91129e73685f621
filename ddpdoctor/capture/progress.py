"""What a traced job tells its user while it runs, between ``trace``'s first line and its summary: when a profiled
window starts, and once it is written what happens next (the job runs on to its end; ``diagnose`` already works on
what was written). Printed on stderr by the first rank of each node (``local_rank`` 0), never with ``-q``.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def _speaks(session: Any) -> bool:
    return session.identity.local_rank == 0 and not session.config.quiet and session.claimed


def say(text: str) -> None:
    """One line on stderr from inside the script's process, never an exception into the script: it may have put a
    writer of its own in ``sys.stderr`` (logging's, without ``flush()``: the training ended at the first window's
    line) or closed it. Then the line goes to file descriptor 2."""
    stream = sys.stderr
    try:
        stream.write(text + "\n")
    except Exception:
        try:
            os.write(2, (text + "\n").encode("utf-8", "replace"))
        except OSError:
            pass
        return
    try:
        stream.flush()
    except Exception:
        pass


def after_step(session: Any) -> None:
    """Called after each step, once the profiler moved on: the first recorded step of a window is announced (a
    window follows a recorded step only when that step ended the previous window: ``RECORD_AND_SAVE``)."""
    from torch.profiler import ProfilerAction

    action = session._prof.current_action if session._prof is not None else None
    previous = getattr(session, "_progress_action", None)
    session._progress_action = action
    recording = action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
    if not recording or previous == ProfilerAction.RECORD or not _speaks(session):
        return
    first = session.clock.iteration
    last = first + session.config.active - 1
    steps = f"steps {first}-{last}" if last > first else f"step {first}"
    number = getattr(session, "_progress_windows", 0) + 1
    session._progress_windows = number
    say(f"ddpdoctor: rank {session.rank}: profiling {steps} (window {number})")


def next_text(config: Any, *, windows_written: int, iteration: int, out: str) -> str | None:
    """After a window was written while the job goes on: what happens next, once (None: nothing more to say)."""
    diagnose = f"`ddpdoctor diagnose {out}` works on what is written now"
    if config.repeat and windows_written >= config.repeat:
        if config.max_steps and config.max_steps <= iteration:
            return None  # --max-steps ends the job at this step: the summary follows
        if config.max_steps:
            return f"ddpdoctor: the job runs on to step {config.max_steps} (--max-steps), not profiled; {diagnose}"
        return (
            "ddpdoctor: the job runs on to its own end, not profiled (Ctrl-C stops it; --max-steps N ends it at step N "
            f"next time); {diagnose}"
        )
    if windows_written == 1:  # more windows follow (--repeat 0 or above 1, --every): said once
        return f"ddpdoctor: the job runs on, with more windows to come; {diagnose}"
    return None


def window_written(session: Any) -> None:
    """Called after a window's trace was written: a job that goes on is said to, once (not at the end of the run,
    where the window still open is written as the session finishes)."""
    if session.finished or not _speaks(session):
        return
    written = len(session.trace_files) + len(getattr(session, "dropped_windows", ()))
    text = next_text(session.config, windows_written=written, iteration=session.clock.iteration, out=str(session.root))
    if text is not None:
        say(text)
