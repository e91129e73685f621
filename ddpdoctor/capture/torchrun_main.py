"""torchrun as ``ddpdoctor trace`` runs it: ``python -m ddpdoctor.capture.torchrun_main TORCHRUN_ARGS``.

``torch.distributed.run``'s own ``main``, except for how it ends:

- on SIGTERM or Ctrl-C its agent stops the ranks (they write what they captured) and then raises
  ``SignalException``, which torchrun lets through as a traceback and exit status 1. Here the process ends quietly by
  that signal, so that ``ddpdoctor trace`` can end by it too (143 / 130), as a one-process run does;
- when it returns (every rank ended and was reaped, the agent shut down), the process runs its exit handlers,
  flushes its output and ends at once: the interpreter's teardown of torch that would follow (~0.4 s on 2 cores)
  does nothing the run needs, and ``ddpdoctor trace`` waits for this process to end.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading


def main() -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    try:
        torchrun()
    except SignalException as exc:  # the ranks are already stopped (the agent's shutdown ran before it raised)
        signum = int(exc.sigval)
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        raise SystemExit(128 + signum) from None
    _end_now()


def _end_now() -> None:
    """End with status 0 as the interpreter would, in its order (threading's exit hooks and the other threads
    joined, then the exit handlers, output flushed), without its teardown."""
    join_threads = getattr(threading, "_shutdown", None)
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if join_threads is None or run_exit_handlers is None:  # not CPython: end the ordinary way
        return
    join_threads()
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(0)


if __name__ == "__main__":
    main()
