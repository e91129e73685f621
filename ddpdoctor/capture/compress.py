"""Compressing a rank's traces off the training thread.

The step that closes a profiled window exports it with the profiler's own exporter, as a hand-written
``torch.profiler`` run does, and renames it into place uncompressed (``rank<R>.<span>.pt.trace.json``, a complete
trace that every reader takes). Gzip runs here, in one background thread per process at the lowest CPU priority
(Linux gives each thread its own nice value), so that no training step waits for it: zlib releases the GIL while
it compresses. The session is told of each result and swaps the file names in the rank file; the uncompressed
file is removed only after the rank file names the compressed one. ``wait()`` (the end of the run) gives the
thread its priority back (where the process may raise it: root or ``RLIMIT_NICE``; otherwise it keeps the lowest
one, which a machine busy with other work can starve) and blocks until every file handed over is done.

A rank killed while a file is being compressed leaves the uncompressed trace, listed in its rank file; a failed
compression (a full disk) keeps it too and is reported through ``on_done`` with the error.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from ddpdoctor import rundir

GZ = ".gz"


class Compressor:
    """``submit(name)`` gzips ``out/name`` into ``out/name.gz`` in the background; ``on_done(name, error)`` is
    called in the compressing thread when it is done (``error`` None) or failed."""

    def __init__(self, out: Path, on_done: Callable[[str, BaseException | None], None]) -> None:
        self.out = out
        self._on_done = on_done
        self._queue: queue.Queue[str] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._niced: tuple[int, int] | None = None  # (native thread id, its priority before) while lowered
        self._ending = False  # wait() was called: the thread runs at its own priority from then on

    def submit(self, name: str) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ddpdoctor-compress", daemon=True)
                self._thread.start()
        self._queue.put(name)

    def wait(self) -> None:
        """Block until every submitted file is compressed (or failed): nothing trains any more, so the thread
        gets its priority back first."""
        if self._thread is None:
            return
        self._ending = True
        _restore_priority(self._niced)
        self._queue.join()

    def _run(self) -> None:
        self._niced = _lowest_priority()
        if self._ending:  # wait() came before the thread lowered itself
            _restore_priority(self._niced)
        while True:
            name = self._queue.get()
            error: BaseException | None = None
            try:
                rundir.atomic_gzip_file(self.out / name, self.out / (name + GZ))
            except Exception as exc:  # the uncompressed trace stays; the session notes why
                error = exc
            try:
                self._on_done(name, error)
            except Exception:  # pragma: no cover - the session's own handler notes its failures
                pass
            finally:
                self._queue.task_done()


def _restore_priority(niced: tuple[int, int] | None) -> None:
    if niced is not None:
        try:
            os.setpriority(os.PRIO_PROCESS, *niced)
        except OSError:  # not allowed to raise a priority here: the thread finishes at the lowest one
            pass


def _lowest_priority() -> tuple[int, int] | None:
    """Nice this thread (only this thread, on Linux) to 19: it takes CPU time the training leaves idle. Returns
    (its native id, its priority before), or None when it was not lowered."""
    if not sys.platform.startswith("linux"):
        return None  # elsewhere the call would lower the whole process
    try:
        tid = threading.get_native_id()
        before = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, 19)
    except (OSError, AttributeError):
        return None
    return tid, before
