"""How a rank that ddpdoctor did not start ends: its exit status, recorded without running its code ourselves.

A process that became a rank on its own (``mp.spawn``'s children, the ranks of ``accelerate launch``, Lightning's
re-executed script) runs its own ``__main__``; ddpdoctor only watches how it ends: ``sys.exit(n)`` (also
``mp.spawn``'s worker wrapper, which catches the worker's exception and exits 1), an uncaught exception, SIGTERM
(from torchrun or ``mp.spawn`` stopping the others after a failure), or a normal end. The session is finished at
interpreter exit (or in multiprocessing's own exit path for forked children, which skip ``atexit``).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from typing import Any

from ddpdoctor.capture import invisible
from ddpdoctor.capture.session import Session


class ExitRecord:
    """What the process is ending with: exit code (None = a normal end) and the error, if any."""

    def __init__(self) -> None:
        self.code: int | None = None
        self.error: str | None = None
        self.interrupted = False

    def saw_exit(self, status: Any) -> None:
        active = sys.exc_info()[1]  # mp.spawn's wrapper calls sys.exit(1) while handling the worker's exception
        if active is not None and not isinstance(active, SystemExit) and self.error is None:
            self.error = f"{type(active).__name__}: {active}"
        if status is None:
            code = 0
        elif isinstance(status, int):
            code = status
        else:
            code, self.error = 1, self.error or str(status)
        if self.code in (None, 0):
            self.code = code

    def saw_exception(self, value: BaseException) -> None:
        if isinstance(value, KeyboardInterrupt):
            self.interrupted, self.code = True, 128 + signal.SIGINT
            self.error = self.error or "KeyboardInterrupt"
            return
        self.code = self.code or 1
        self.error = self.error or f"{type(value).__name__}: {value}"

    def outcome(self) -> tuple[str, int, str | None]:
        """(status, exit code, error) for the rank file."""
        code = self.code or (1 if self.error else 0)
        if self.interrupted:
            return "interrupted", code, self.error
        if code == 0:
            return "ok", 0, None
        return "failed", code, self.error or f"exit code {code}"


def finish_at_exit(session: Session) -> ExitRecord:
    """Record how this process ends and finish ``session`` then (idempotent with the session's own ``finish``)."""
    record = ExitRecord()
    pid = os.getpid()

    original_exit = sys.exit

    def exit(status: Any = None) -> None:
        record.saw_exit(status)
        original_exit(status)

    sys.exit = exit  # type: ignore[assignment]

    original_hook = sys.excepthook

    def excepthook(etype: Any, value: Any, tb: Any) -> None:
        record.saw_exception(value)
        original_hook(etype, value, invisible.strip_exception(value, tb))

    sys.excepthook = excepthook

    def finish() -> None:
        if os.getpid() != pid:  # a forked child of the rank (a DataLoader worker) exiting
            return
        try:
            session.finish(*record.outcome())
        except Exception as exc:
            print(f"ddpdoctor: warning: rank {session.rank}: capture not written: {exc}", file=sys.stderr)

    atexit.register(finish)
    if "multiprocessing.util" in sys.modules:  # a forked multiprocessing child leaves by os._exit, after these
        import multiprocessing.util

        multiprocessing.util.Finalize(None, finish, exitpriority=100)
    _flush_on_sigterm(session, record, finish)
    return record


def _flush_on_sigterm(session: Session, record: ExitRecord, finish: Any) -> None:
    """Write what was captured when SIGTERM ends the rank, then end by SIGTERM as before (only where the process
    left SIGTERM at its default: a handler of the script's own stays in charge)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        if session.status == "hung":  # ended by our own --hang-timeout watchdog: keep its diagnosis
            session.finish("hung", 128 + signum, session.error)
        else:
            record.interrupted, record.code = True, 128 + signum
            record.error = record.error or f"terminated by signal {signum}"
            finish()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_sigterm)
