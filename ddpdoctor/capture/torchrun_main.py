"""torchrun as ``ddpdoctor trace`` runs it: ``python -m ddpdoctor.capture.torchrun_main TORCHRUN_ARGS``.

``torch.distributed.run``'s own ``main``, except for how it ends:

- on SIGTERM or Ctrl-C its agent stops the ranks (they write what they captured) and then raises
  ``SignalException``, which torchrun lets through as a traceback and exit status 1. Here the process ends quietly by
  that signal, so that ``ddpdoctor trace`` can end by it too (143 / 130), as a one-process run does;
- torchrun's ``ChildFailedError`` block (the failure of every rank, with torchrun's own traceback) is summarised
  in one line per rank; the full text, and torchrun's messages about stopping the ranks, go to the run directory's
  ``nodes/node<K>.log``;
- when it returns (every rank ended and was reaped, the agent shut down), the process runs its exit handlers,
  flushes its output and ends at once: the interpreter's teardown of torch that would follow (~0.4 s on 2 cores)
  does nothing the run needs, and ``ddpdoctor trace`` waits for this process to end.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any


def main() -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    log = _NodeLog.open()
    try:
        torchrun()
    except ChildFailedError as exc:  # the block of every rank's failure: one line each here, in full in the log
        log.write(traceback.format_exc())
        log.write_exits(exc)
        for line in failure_lines(exc, log.path):
            print(f"ddpdoctor: {line}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)  # torchrun's own status for it
    except SignalException as exc:  # the ranks are already stopped (the agent's shutdown ran before it raised)
        signum = int(exc.sigval)
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        raise SystemExit(128 + signum) from None
    _end_now()


_LOGGERS = (
    "torch.distributed.elastic.multiprocessing.api",
    "torch.distributed.elastic.agent.server.api",
    "torch.distributed.elastic.agent.server.local_elastic_agent",
)
_QUIET = ("closing signal", "failed (exitcode", "death signal", "Got termination signal")


class _NodeLog:
    """``nodes/node<K>.log`` of the run directory: torchrun's failure report and its messages about stopping ranks
    (opened on first write; nowhere when the run directory is not known)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    @classmethod
    def open(cls) -> _NodeLog:
        from ddpdoctor import rundir
        from ddpdoctor.capture.config import CaptureConfig
        from ddpdoctor.capture.launcher import _node_rank

        try:
            config = CaptureConfig.from_env()
            node = _node_rank(sys.argv[1:])
        except (TypeError, ValueError, IndexError):
            config = None
        log = cls(rundir.node_file(Path(config.out), node).with_suffix(".log") if config else None)
        for name in _LOGGERS:  # a logger's filter sees only its own records, not its children's
            logging.getLogger(name).addFilter(log.divert)
        if config is not None and config.quiet:  # -q: torchrun's warnings (its OMP_NUM_THREADS banner) to the log
            # a handler's filter sees the propagated records; torch.distributed has a handler of its own
            handlers = {*logging.getLogger("torch.distributed").handlers, *logging.getLogger("torch").handlers}
            for handler in handlers:
                handler.addFilter(log.divert_below_error)
        return log

    def write(self, text: str) -> None:
        if self.path is None:
            return
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(text if text.endswith("\n") else text + "\n")
        except OSError:
            pass

    def write_exits(self, exc: Any) -> None:
        """``nodes/exits<K>.json``: each failed rank's exit status as torchrun saw it (a rank ended by a signal
        before it could write its own files has no other record of it)."""
        if self.path is None:
            return
        try:
            from ddpdoctor import rundir

            failures = {
                str(rank): {"exitcode": f.exitcode, "pid": f.pid, "local_rank": f.local_rank}
                for rank, f in exc.failures.items()
            }
            exits = self.path.with_name("exits" + self.path.stem.removeprefix("node") + ".json")
            rundir.atomic_write_json(exits, {"failures": failures})
        except Exception:  # noqa: BLE001 - the summary lines still say it
            pass

    def divert(self, record: logging.LogRecord) -> bool:
        """A logging filter: torchrun's lines about stopping ranks go to the log, not the terminal."""
        try:
            message = record.getMessage()
        except Exception:
            return True
        if not any(q in message for q in _QUIET) or self.path is None:
            return True
        self.write(f"{record.levelname} {record.name}: {message}")
        return False

    def divert_below_error(self, record: logging.LogRecord) -> bool:
        """A handler's filter under ``trace -q``: torchrun's records below ERROR go to the log, not the terminal."""
        if record.levelno >= logging.ERROR or not record.name.startswith("torch.distributed") or self.path is None:
            return True
        try:
            self.write(f"{record.levelname} {record.name}: {record.getMessage()}")
        except Exception:  # noqa: BLE001 - a record that cannot be formatted is shown as torch would
            return True
        return False


def failure_lines(exc: Any, log: Path | None) -> list[str]:
    """torchrun's ``ChildFailedError``, one line per rank (the first to fail first), and where the full text is."""
    first, _ = exc.get_first_failure()
    lines = []
    for rank in sorted(exc.failures, key=lambda r: (r != first, r)):
        failure = exc.failures[rank]
        code = failure.exitcode
        if code is not None and code < 0:
            try:
                how = f"ended by {signal.Signals(-code).name}"
            except ValueError:
                how = f"ended by signal {-code}"
        else:
            how = f"exited with code {code}"
        role = (
            "the first to fail"
            if rank == first
            else f"stopped by torchrun after rank {first}"
            if (code is not None and code < 0)
            else "also failed"
        )
        lines.append(f"torchrun: rank {rank} (local rank {failure.local_rank}, pid {failure.pid}) {how} ({role})")
    if log is not None:
        lines.append(f"torchrun's full report: {log}")
    return lines


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
