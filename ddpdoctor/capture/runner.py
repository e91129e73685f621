"""Run the user's script or module as ``__main__``, exactly as a bare ``python`` would, under a capture session.

Parity with a bare run (tested): ``sys.argv``, ``sys.path[0]``, ``__name__``, ``__file__``, cwd, and the exit status —
``sys.exit(n)`` gives n, ``sys.exit("msg")`` prints msg and gives 1, an uncaught exception prints the script's own
traceback (ddpdoctor's frames removed) and gives 1, SIGINT/SIGTERM end the process by that signal after what was
captured is written.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NoReturn

from ddpdoctor.capture import flight, invisible
from ddpdoctor.capture.config import CaptureConfig
from ddpdoctor.capture.session import Session


@dataclass(frozen=True)
class Target:
    kind: str  # "script" | "module"
    name: str  # path to the script, or module name
    args: tuple[str, ...]


class _Terminated(BaseException):
    """Raised in the main thread by our SIGTERM handler so that ``finally`` blocks and the capture flush run."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _prepare_sys(target: Target) -> None:
    if target.kind == "script":
        sys.argv = [target.name, *target.args]
        sys.path[0] = os.path.dirname(os.path.realpath(target.name))
    else:
        # `python -m pkg.mod`: argv[0] becomes the module's file (runpy sets it), sys.path[0] the cwd.
        sys.argv = [target.name, *target.args]
        sys.path[0] = os.getcwd()


def _strip_own_frames(value: BaseException, tb: TracebackType | None) -> TracebackType | None:
    """Drop the frames of ddpdoctor (its wrappers included, wherever they are) and of runpy, as a bare traceback
    would show."""

    def runpy_frame(filename: str) -> bool:
        return filename.endswith(f"{os.sep}runpy.py") or filename.startswith("<frozen runpy")

    return invisible.strip_exception(value, tb, also=runpy_frame)


def _watch_signals(session: Session) -> tuple[int, int] | None:
    """Flush the rank file from a helper thread when a signal arrives while the main thread is blocked in C++

    (a rank waiting forever in an all-reduce for a dead peer never returns to Python to run a signal handler).
    """
    try:
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        return None

    def watch() -> None:
        while True:
            try:
                data = os.read(r, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in (signal.SIGTERM, signal.SIGINT):
                    session.flush_interrupted(signum)
                else:  # SIGUSR1: an on-demand dump (capture/flight.py)
                    session.signal_arrived(signum)

    threading.Thread(target=watch, name="ddpdoctor-signal-watch", daemon=True).start()
    return r, w


def _run_script(path: str) -> None:
    """Execute ``path`` as ``__main__`` the way the interpreter does: ``sys.argv[0]`` as typed, ``__file__``
    absolute (Python >= 3.9), and a real ``sys.modules["__main__"]`` so pickling and multiprocessing work.

    (``runpy.run_path`` would rewrite ``sys.argv[0]`` to the path it was given.)
    """
    import importlib.machinery
    import types

    abspath = os.path.abspath(path)
    with open(abspath, "rb") as f:
        code = compile(f.read(), abspath, "exec", dont_inherit=True)
    module = types.ModuleType("__main__")
    module.__dict__.update(
        __file__=abspath,
        __builtins__=__builtins__,
        __loader__=importlib.machinery.SourceFileLoader("__main__", abspath),
        __spec__=None,
        __cached__=None,
    )
    previous = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        exec(code, module.__dict__)
    finally:
        if previous is not None:
            sys.modules["__main__"] = previous


SETTLE_S = 0.2


class _Settling:
    """Let gloo's worker threads finish tearing down their last work items before this thread can garbage-collect
    (and so maybe free the script's DDP model).

    Seen here: the main thread, holding the GIL, frees a DDP Reducer whose process group joins a gloo thread, while
    that thread is destroying a finished barrier and waits for the GIL to drop a Python object: a deadlock. A
    bare run usually escapes it because interpreter shutdown takes long enough. Garbage collection is off from the
    end of the script until ``SETTLE_S`` after the last collective could have been issued (the end of the script,
    or the script's own ``destroy_process_group()`` when it destroyed every group); the rank's files are written
    meanwhile (this thread lets go of the GIL every few milliseconds), and :meth:`wait` sleeps what is left.
    """

    def __init__(self) -> None:
        import gc
        import time

        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        self.deadline = time.monotonic() + SETTLE_S
        from ddpdoctor.capture import ddp as ddp_capture

        if ddp_capture.destroy_started is not None and not _process_group_alive():
            self.deadline = min(self.deadline, ddp_capture.destroy_started + SETTLE_S)

    def wait(self) -> None:
        import gc
        import time

        left = self.deadline - time.monotonic()
        if left > 0:
            time.sleep(left)  # the GIL released
        if self._gc_was_enabled:
            gc.enable()


def _process_group_alive() -> bool:
    dist = sys.modules.get("torch.distributed")
    try:
        return dist is None or not dist.is_available() or dist.is_initialized()
    except Exception:
        return True


_late_signals: list[int] = []  # SIGTERMs after the first stop signal: recorded, never raised again


def _record_late(signum: int, frame: object) -> None:
    _late_signals.append(signum)


def _stopping() -> None:
    """The first stop signal was seen: later SIGTERMs (torchrun sends them while the rank ends) and Ctrl-Cs are
    only recorded, so that the rank writes its files instead of dying halfway with a traceback."""
    signal.signal(signal.SIGTERM, _record_late)
    if signal.getsignal(signal.SIGINT) is _on_sigint:
        signal.signal(signal.SIGINT, _record_late)


# While ``run`` has its handlers in: the handlers the process had before them (signal number -> handler), which a
# forked child gets back (``_untraced_child``).
_in_children: dict[int, Any] = {}


def _untraced_child() -> None:
    """In a process forked from a traced rank (a ``multiprocessing.Pool`` or DataLoader worker, any ``os.fork``),
    which is not the rank: the signal handling a bare run gives it. With the rank's handlers it would raise
    ``_Terminated`` at the SIGTERM that ``Pool.terminate()`` sends its workers, and print a traceback or hang on a
    lock the worker held (a pool's ``with Pool(2)`` never returned, seen under torchrun); and through the rank's
    wakeup fd its signals reached the rank's watcher thread, which took them for the rank's own (the rank's file said
    "interrupted", a signal dump was written). A handler the script set since is left as it is."""
    if not _in_children:
        return
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)
    for signum, previous in _in_children.items():
        with contextlib.suppress(ValueError, OSError, TypeError):
            if signal.getsignal(signum) in (_on_sigterm, _on_sigint, _record_late):
                signal.signal(signum, previous)
    _in_children.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_untraced_child)


def _on_sigterm(signum: int, frame: object) -> None:
    _stopping()
    raise _Terminated(signum)


def _on_sigint(signum: int, frame: object) -> None:
    _stopping()
    raise KeyboardInterrupt


def _record_os_exit(session: Session, on_os_exit: Callable[[int], None] | None) -> Callable[[int], NoReturn]:
    """Make ``os._exit(n)`` in the script record how the rank ended (status, exit code ``n``) before it ends the
    process: it skips every exit handler, so nothing else would. Only in this process: a forked child (a
    DataLoader worker, multiprocessing) ends with ``os._exit`` too, and is not the rank. Returns the real one."""
    real = os._exit
    pid = os.getpid()

    def recorded(code: int) -> NoReturn:
        if os.getpid() == pid:
            os._exit = real
            flight.remove_fatal()
            try:
                n = int(code)
                session.finish("ok" if n == 0 else "failed", n, None if n == 0 else f"os._exit({n})")
                if on_os_exit is not None:
                    on_os_exit(n)
            except BaseException:  # noqa: BLE001 - the process ends now, whatever went wrong
                pass
        real(code)

    os._exit = recorded
    return real


def run(
    target: Target,
    config: CaptureConfig,
    *,
    claimed: bool = True,
    on_os_exit: Callable[[int], None] | None = None,
    quiet_interrupt: bool = False,
    stopped: Callable[[], bool] | None = None,
) -> int:
    """Run the target under a capture session; return the exit code a bare run would have.

    ``claimed=False``: the process may turn out to be only the launcher of the ranks (see :class:`Session`).
    ``on_os_exit``: called with ``n`` when the script ends the process with ``os._exit(n)``, after the session
    recorded it (the launcher writes its manifest there). ``quiet_interrupt``: no KeyboardInterrupt traceback (a
    rank under torchrun: the launcher says how each rank ended). ``stopped()``: True when ddpdoctor stopped the
    ranks the script started (a hang): the script's exception about it (``mp.spawn``'s) is then not printed. For a
    signal, the caller must re-raise it with
    :func:`die_by_signal` after cleaning up.
    """
    from ddpdoctor.capture import autostart

    autostart.activate()  # the script's own init_process_group (the other processes of the job run it at start-up)
    session = Session(config, claimed=claimed)
    real_os_exit = _record_os_exit(session, on_os_exit)
    _late_signals.clear()
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
    _in_children.update({signal.SIGTERM: previous, signal.SIGINT: previous_int})
    watch = _watch_signals(session)
    _prepare_sys(target)
    status, code, error, signum = "ok", 0, None, None
    exc_info = None
    try:
        session.start()
        flight.arm_fatal(session)  # dumps/rank<R>.fatal-<pid>.txt: the stacks at a fatal signal (a gloo abort)
        if target.kind == "script":
            _run_script(target.name)
        else:
            runpy.run_module(target.name, run_name="__main__", alter_sys=True)
        _dump_if_peers_run(session)
    except SystemExit as exc:
        code, error = _exit_code(exc.code)
        status = "ok" if code == 0 else "failed"
        if code == 0:
            _dump_if_peers_run(session)
    except KeyboardInterrupt as exc:
        status, signum, error = "interrupted", signal.SIGINT, "KeyboardInterrupt"
        exc_info = None if quiet_interrupt else (type(exc), exc, exc.__traceback__)
    except _Terminated as exc:
        if session.status == "hung":  # our own watchdog ended it: keep its diagnosis
            status, signum, error = "hung", exc.signum, session.error
        else:
            status, signum, error = "interrupted", exc.signum, f"terminated by signal {exc.signum}"
    except BaseException as exc:
        # How the rank ended is settled before the dump: the dump takes a moment (seconds for torch's first pickle
        # dump), and torchrun's SIGTERM, once the peers see this rank fail, raises inside it.
        status, code, error = "failed", 1, f"{type(exc).__name__}: {exc}"
        exc_info = (type(exc), exc, exc.__traceback__)
        try:
            # A stop signal from now on is recorded, not raised: torchrun's SIGTERM (sent to every rank as soon as
            # one fails) must not cut the dump short; the rank still ends by it once its files are written.
            _stopping()
            session.saw_exception(exc)  # dumps/rank<R>.exception-<ms>.json, with the traceback
        except _Terminated:
            pass  # stopped while dumping: the exception is still what ended the rank
    finally:
        os._exit = real_os_exit
        _stopping()  # a signal now: finish the files first, then end by it
        settling = _Settling()
        try:
            session.finish(status, 128 + signum if signum else code, error)
        finally:
            flight.remove_fatal()
            settling.wait()
            if watch is not None:
                signal.set_wakeup_fd(-1)
                for fd in watch:
                    os.close(fd)
            signal.signal(signal.SIGTERM, previous)
            if signal.getsignal(signal.SIGINT) in (_on_sigint, _record_late):
                signal.signal(signal.SIGINT, previous_int)
            _in_children.clear()
    if _late_signals and signum is None:
        signum = _late_signals[0]
    if exc_info is not None and stopped is not None and stopped():
        exc_info = None  # ddpdoctor stopped the ranks this script started (a hang) and said why: not the script's error
    if exc_info is not None:
        etype, value, tb = exc_info
        sys.stderr.flush()
        traceback.print_exception(etype, value, _strip_own_frames(value, tb))
        sys.stderr.flush()
    if signum:
        return -int(signum)
    return code


def _dump_if_peers_run(session: Session) -> None:
    """The script returned (or exited with 0) while its process group is alive and other ranks of the job are still
    running: dump (reason "exit", torch's fast dump: milliseconds), so that a peer left waiting in a collective this
    rank never issued is diagnosed with this rank's last collective, not as a rank that vanished. A script that
    destroyed its process group, or whose peers all finished, leaves no dump."""
    try:
        if not _process_group_alive() or "torch.distributed" not in sys.modules:
            return
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_world_size() < 2:
            return
        from ddpdoctor.capture import hang

        others = set(hang.running_ranks(session.out)) - {session.rank}
        if others:
            session.flight.dump("exit", dump_id=flight._now_id("exit"), frames=False)
    except Exception:  # noqa: BLE001 - the rank ended well: a dump that cannot be made changes nothing
        pass


def _exit_code(code: object) -> tuple[int, str | None]:
    """Map ``SystemExit.code`` as the interpreter does (None → 0, int → itself, anything else printed → 1)."""
    if code is None:
        return 0, None
    if isinstance(code, int):
        return code, None if code == 0 else f"exit code {code}"
    print(code, file=sys.stderr)
    return 1, str(code)


def die_by_signal(signum: int) -> None:
    """End this process by ``signum`` so its parent sees the same status as for a bare run."""
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    os._exit(128 + signum)  # pragma: no cover - only if the signal did not end us
