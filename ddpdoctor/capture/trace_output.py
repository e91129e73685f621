"""A session's trace files, one per profiled window (the output half of :class:`ddpdoctor.capture.session.Session`).

Each window the profiler completes is exported under a temporary name and renamed into place when whole
(``_export``: a reader never sees half a file), named in the rank file, and gzipped in a background thread
(:mod:`ddpdoctor.capture.compress`): when the gzip is done the rank file names it and the plain file goes
(``_apply_compressed``). ``--keep N`` removes the oldest windows' traces beyond the newest N, each summarised first
from a hidden link (:mod:`ddpdoctor.capture.window_summary`); the start-up's recording of a run that has not
stepped yet (``--no-step-limit``) is kept until a step comes, then removed. A trace that cannot be written is said
(``capture_errors``, one line on stderr) and the training goes on.

The methods run with the session's lock held unless they say otherwise; they read and write the session's state
(its attributes, declared on :class:`TraceOutput` for the reader).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpdoctor import rundir
from ddpdoctor.capture import progress, window_summary
from ddpdoctor.capture.compress import GZ

if TYPE_CHECKING:
    import threading

    from ddpdoctor.capture import rank_file
    from ddpdoctor.capture.compress import Compressor
    from ddpdoctor.capture.config import CaptureConfig
    from ddpdoctor.capture.step_clock import StepClock


class TraceOutput:
    """The trace-file half of a session (mixed into ``Session``)."""

    # the session's state these methods use (set by Session.__init__)
    config: CaptureConfig
    out: Path
    identity: rank_file.Identity
    claimed: bool
    clock: StepClock
    trace_files: list[str]
    capture_errors: list[str]
    dropped_windows: list[dict[str, Any]]
    _lock: threading.RLock
    _finished: bool
    _last_span: int
    _compressor: Compressor
    _compressed_files: list[tuple[str, BaseException | None]]
    _summarizing: list[window_summary.Pending]
    _window_steps: dict[str, tuple[int, int] | None]
    _startup_trace: str | None
    _dropped_startup: set[str]

    if TYPE_CHECKING:  # Session's own, which these methods call

        @property
        def rank(self) -> int: ...

        def write_rank_file(self) -> bool: ...

        def _claim(self) -> None: ...

        def _launched_ranks(self) -> bool: ...

    def _on_trace_ready(self, prof: Any) -> None:
        from ddpdoctor.capture.export import TraceNotWritten

        if self.clock.take_startup_trace():
            return  # the start-up recording: not a training step
        if not self.claimed and self._launched_ranks():
            return  # this process only launched the ranks: its start-up is not a rank's trace
        lost = sum(e.startswith("profiled window ") and " not written: " in e for e in self.capture_errors)
        window = f"profiled window {len(self.trace_files) + len(self.dropped_windows) + lost + 1}"
        try:
            if not self.claimed:
                self._claim()
            name = self._export(prof)
        except Exception as exc:  # never break the user's training because a trace could not be written
            why = str(exc) if isinstance(exc, TraceNotWritten) else f"{type(exc).__name__}: {exc}"
            steps = self._last_window_steps()  # the window that just ended: the last `active` steps recorded
            if steps:
                first, last = steps
                window += f" (steps {first}-{last})" if first != last else f" (step {last})"
            self.capture_errors.append(f"{window} not written: {why}")
            self.write_rank_file()
            if not self.config.quiet:
                progress.say(
                    f"ddpdoctor: warning: rank {self.rank}: {window} not written to {self.out}: {why}; "
                    "its trace is lost (nothing incomplete was kept), the training goes on"
                )
            return
        if self.clock.count == 0 and self.clock.startup_ended_by == "time limit":
            self._startup_trace = name  # the run's trace only if it never steps: said at its end, not now
            self.trace_files.append(name)
            self.write_rank_file()
            with contextlib.suppress(Exception):  # no thread to be had: it stays uncompressed
                self._compressor.submit(name)
            return
        try:
            self.trace_files.append(name)
            self._window_steps[name] = self._last_window_steps()
            removed = self._keep_newest()
            self.write_rank_file()
            self._summarize_removed(removed)
            if self.identity.local_rank == 0 and not self.config.quiet:
                size_mb = (self.out / name).stat().st_size / 1e6
                progress.say(
                    f"ddpdoctor: rank {self.rank}: {window} written "
                    f"({name}, {size_mb:.1f} MB; gzipped in the background)"
                )
            progress.window_written(self)
        except Exception as exc:  # the trace is in place and named in the rank file (or found beside it)
            self.capture_errors.append(f"reporting trace {name} failed: {type(exc).__name__}: {exc}")
        try:
            self._compressor.submit(name)
        except Exception as exc:  # no thread to be had: the trace stays uncompressed
            self.capture_errors.append(f"compressing trace {name} failed (kept uncompressed): {exc}")

    def _drop_startup_trace(self) -> None:
        """The first step came after the start-up had run past --no-step-limit (a job loading its data for minutes):
        the start-up's recording, kept in case the run never stepped, goes (lock held). Analysed as a step it was a
        window of its own ("6 steps analysed" of 5 profiled) and the profiler's steps ran one ahead of the run's
        ("profiling steps 7-11" of 8-12; with ranks, the windows of "1 step analysed")."""
        name, self._startup_trace = self._startup_trace, None
        if name is None:
            return
        plain = name.removesuffix(GZ)
        self._dropped_startup.add(plain)
        self.trace_files = [t for t in self.trace_files if t.removesuffix(GZ) != plain]
        for path in (plain, plain + GZ):  # a gzip still being made goes when it is done (_apply_compressed)
            with contextlib.suppress(OSError):
                os.unlink(self.out / path)
        self.write_rank_file()

    def _last_window_steps(self) -> tuple[int, int] | None:
        from ddpdoctor.capture.step_clock import ranges

        recorded = ranges(self.clock.recorded)
        if not recorded:
            return None
        return max(recorded[-1][0], recorded[-1][1] - self.config.active + 1), recorded[-1][1]

    def _keep_newest(self) -> list[window_summary.Pending]:
        """``--keep N``: remove the oldest traces beyond the newest N windows (lock held); a gzip of one still
        being made is removed when it is done (``_apply_compressed``). Each removed window's trace is first linked
        to a hidden name for its summariser (``_summarize_removed``, once the rank file names the removal)."""
        keep = self.config.keep
        removed: list[window_summary.Pending] = []
        if keep and len(self.trace_files) > keep:  # those that ended: their entries are in the rank file written next
            self._summarizing = window_summary.reap(self._summarizing)
        while keep and len(self.trace_files) > keep:
            old = self.trace_files.pop(0)
            plain = old.removesuffix(GZ)
            steps = self._window_steps.pop(plain, None)
            entry: dict[str, Any] = {
                "first_step": steps[0] if steps else None,
                "last_step": steps[1] if steps else None,
                "file": plain,
                "bytes": None,
            }
            if len(self._summarizing) + len(removed) >= window_summary.MAX_RUNNING:  # the disk stays bounded
                entry["summary_error"] = (
                    f"the summaries of {window_summary.MAX_RUNNING} earlier windows were still being made"
                )
            else:
                for name in (plain, old):  # the plain file while its gzip is made: complete, unlike the gzip
                    if (self.out / name).is_file():
                        pending = window_summary.link_for(self.out, self.rank, steps, self.out / name, entry)
                        if pending is not None:
                            removed.append(pending)
                        break
            size = None
            for name in (old, plain):
                with contextlib.suppress(OSError):
                    size = size or (self.out / name).stat().st_size
                    os.unlink(self.out / name)
            entry["bytes"] = size
            self.dropped_windows.append(entry)
            if self.identity.local_rank == 0 and not self.config.quiet:
                where = f" (steps {steps[0]}-{steps[1]})" if steps else ""
                mb = f", {size / 1e6:.2f} MB on disk" if size else ""
                progress.say(
                    f"ddpdoctor: rank {self.rank}: removed the oldest window's trace{where}{mb}: --keep {keep}"
                )
        return removed

    def _summarize_removed(self, removed: list[window_summary.Pending]) -> None:
        """Start the summarisers of the windows just removed (lock held); those that ended are settled at the next
        removal (``_keep_newest``) or at the end of the run."""
        for pending in removed:
            window_summary.start(self.out, self.rank, pending)
        self._summarizing += removed
        if any("summary_error" in p.entry for p in removed):
            self.write_rank_file()  # a summariser that could not start: the rank file says why

    def _export(self, prof: Any) -> str:
        """Write the profiler's window as ``rank<R>.<span>.pt.trace.json`` (the profiler's own exporter, checked,
        then a rename: a reader never sees half a file, and an incomplete one is never put in place: raises
        ``TraceNotWritten`` with the reason); return the file name. It is gzipped later, off this thread."""
        from ddpdoctor.capture.export import export_trace

        span = max(int(time.time() * 1000), self._last_span + 1)
        self._last_span = span
        name = rundir.trace_file_name(self.rank, span).removesuffix(GZ)
        export_trace(prof, self.out, name, self.rank)
        return name

    def _compressed(self, name: str, error: BaseException | None) -> None:
        """In the compressing thread: ``name`` is gzipped (or failed); put it in the rank file unless ``finish()``
        has started (it waits for the compression and does that itself)."""
        self._compressed_files.append((name, error))
        while not self._finished:
            if self._lock.acquire(timeout=0.1):  # a step holds it for a moment; finish() for the rest of the run
                try:
                    if not self._finished:
                        self._apply_compressed()
                finally:
                    self._lock.release()
                return

    def _apply_compressed(self) -> None:
        """Name the compressed traces in the rank file, then remove the uncompressed ones (lock held)."""
        done, self._compressed_files = self._compressed_files, []
        for name, error in done:
            if name in self._dropped_startup or any(d["file"] == name for d in self.dropped_windows):
                # the start-up's recording after a step came, or --keep removed it, while it was gzipped
                with contextlib.suppress(OSError):
                    os.unlink(self.out / (name + GZ))
            elif error is not None:
                self.capture_errors.append(
                    f"compressing trace {name} failed (kept uncompressed): {type(error).__name__}: {error}"
                )
            elif name in self.trace_files:
                self.trace_files[self.trace_files.index(name)] = name + GZ
        if not done or not self.write_rank_file():
            return  # a rank file not written still names the uncompressed traces: keep them
        for name, error in done:
            if error is None and name + GZ in self.trace_files:
                with contextlib.suppress(OSError):
                    os.unlink(self.out / name)
