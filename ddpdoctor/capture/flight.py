"""A rank's dumps (``dumps/rank<R>.<id>.json``, ``FlightDump``): its step and phase, every thread's Python stack, the
exception it raised, and torch's Flight Recorder buffers (the collectives each process group issued).

The Flight Recorder is turned on in every process of a traced job by the start-up hook
(``autostart.enable_flight_recorder``: ``TORCH_FR_BUFFER_SIZE``, and ``TORCH_NCCL_TRACE_BUFFER_SIZE`` for torch
versions that read that one; a value the user set is never changed).

Dumps are made by a ddpdoctor thread (``ddpdoctor-flight``), never by the main thread, so they are made while the main
thread is blocked inside a collective: torch's dump call works from any thread, and ``sys._current_frames()`` gives
every thread's stack. A rank dumps

- when asked: ``dumps/request.json`` (``{"id", "reason": "hang" | "on_demand", "by", "time"}``, replaced atomically by
  a rank's hang watchdog or ``ddpdoctor dump``), checked about once a second with one ``os.stat``; answered once per
  id with ``dumps/rank<R>.<id>.json``;
- on SIGUSR1 (reason "on_demand"), without stopping the job, when the script left SIGUSR1 at its default (a
  handler of the script's own, a scheduler's pre-emption signal, stays in charge);
- on SIGTERM / SIGINT (reason "signal"), from the thread that watches for signals while the main thread may be
  blocked, before the rank is ended;
- when an exception escapes the script (reason "exception", with its traceback).

A dump never raises into the training: what fails is one line on stderr.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpdoctor import rundir, runfiles
from ddpdoctor.capture import progress
from ddpdoctor.capture.autostart import FR_VARIABLES
from ddpdoctor.capture.phase import PHASE_WIDTH, STEP_WIDTH
from ddpdoctor.runfile_types import FlightDump

if TYPE_CHECKING:
    from ddpdoctor.capture.session import Session

DUMPS_DIR = rundir.DUMPS_DIR
REQUEST = "request.json"
ID_RE = re.compile(rundir.DUMP_ID)
POLL_S = 1.0
_STACK_LIMIT = 100  # innermost frames kept per thread
_REQUEST_MAX_BYTES = 64 * 1024


def dump_path(folder: Path, rank: int, dump_id: str) -> Path:
    return Path(folder) / DUMPS_DIR / f"rank{rank}.{dump_id}.json"


def request_path(folder: Path) -> Path:
    return Path(folder) / DUMPS_DIR / REQUEST


def _now_id(prefix: str) -> str:
    return f"{prefix}-{int(time.time() * 1000)}"


# ---- what a dump holds ---------------------------------------------------------------------------------------------
def _frame(file: Any, line: Any, name: Any) -> dict[str, Any]:
    try:
        number = int(line or 0)
    except (TypeError, ValueError):
        number = 0
    return {"file": str(file or ""), "line": number if 0 <= number < 1 << 31 else 0, "name": str(name or "")}


def thread_stacks(skip: set[int] | None = None, main_ident: int | None = None) -> list[dict[str, Any]]:
    """Every thread's Python stack, outermost frame first (the main thread first)."""
    main_ident = threading.main_thread().ident if main_ident is None else main_ident
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        if skip and ident in skip:
            continue
        stack = traceback.extract_stack(frame, limit=_STACK_LIMIT)
        if ident == threading.get_ident():  # the thread making the dump: not ddpdoctor's own frames
            from ddpdoctor.capture import invisible

            while stack and invisible.is_own_file(stack[-1].filename):
                stack.pop()
        frames = [_frame(f.filename, f.lineno, f.name) for f in stack]
        out.append(
            {"name": names.get(ident, f"thread {ident}"), "ident": ident, "main": ident == main_ident, "frames": frames}
        )
    out.sort(key=lambda t: not t["main"])
    return out


def exception_record(exc: BaseException) -> dict[str, Any]:
    """The exception's type, message and traceback (outermost first, ddpdoctor's own frames left out)."""
    from ddpdoctor.capture import invisible

    frames = [
        _frame(f.filename, f.lineno, f.name)
        for f in traceback.extract_tb(exc.__traceback__)
        if not invisible.is_own_file(f.filename) and not f.filename.endswith(f"{os.sep}runpy.py")
    ]
    return {"type": type(exc).__name__, "message": str(exc)[:4000], "frames": frames}


_ENTRY_FIELDS = (
    "collective_seq_id", "p2p_seq_id", "op_id", "record_id", "pg_id", "process_group", "profiling_name", "state",
    "is_p2p", "retired", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "time_created_ns",
    "time_discovered_started_ns", "time_discovered_completed_ns", "timeout_ms", "thread_name",
)  # fmt: skip


_MAY_BE_NONE = ("time_discovered_started_ns", "time_discovered_completed_ns", "timeout_ms")


def _entry(raw: dict[str, Any]) -> dict[str, Any]:
    entry = {k: raw[k] for k in _ENTRY_FIELDS if k in raw and (raw[k] is not None or k in _MAY_BE_NONE)}
    for key in ("time_discovered_started_ns", "time_discovered_completed_ns"):
        if entry.get(key) == 0:  # gloo's JSON dump writes 0 for "not recorded"
            entry[key] = None
    frames = raw.get("frames") or []
    # torch lists the frames innermost first: a dump lists them outermost first, as the threads' stacks
    entry["frames"] = [_frame(f.get("filename"), f.get("line"), f.get("name")) for f in reversed(frames)]
    return entry


def _record(raw: dict[str, Any], source: str) -> dict[str, Any]:
    entries = [_entry(e) for e in raw.get("entries") or [] if isinstance(e, dict)]
    if entries:
        prefix = str(entries[-1].get("profiling_name", "")).partition(":")[0]
        source = prefix if prefix in ("gloo", "nccl") else source
    return {
        "source": source,
        "version": str(raw.get("version", "")),
        "pg_config": raw.get("pg_config") or {},
        "pg_status": raw.get("pg_status") or {},
        "entries": entries,
    }


def flight_records(backend: str | None, *, frames: bool = True) -> tuple[list[dict[str, Any]], str | None]:
    """This process's Flight Recorder buffers (one record per buffer) and why there are none (None when there are).
    ``frames``: with the Python frames of each collective (torch's pickle dump; its first call in a process imports
    much of torch, seconds); else torch's JSON dump (no frames, milliseconds)."""
    if "torch" not in sys.modules:
        return [], "torch not loaded"
    try:
        import json

        import torch

        c10d = torch._C._distributed_c10d
    except Exception as exc:  # a torch built without distributed
        return [], f"no Flight Recorder in this torch ({type(exc).__name__}: {exc})"
    from ddpdoctor.flight.plain_pickle import loads_plain  # at dump time only: the rank's start-up stays small

    records: list[dict[str, Any]] = []
    errors: list[str] = []
    raw: Any = None
    if frames and hasattr(c10d, "_dump_fr_trace"):
        try:  # our own process's bytes, read as every FR pickle is: plain data only
            raw = loads_plain(c10d._dump_fr_trace(True, True, False))
        except Exception as exc:
            errors.append(f"_dump_fr_trace: {type(exc).__name__}: {exc}")
    if raw is None and hasattr(c10d, "_dump_fr_trace_json"):
        try:
            raw = json.loads(c10d._dump_fr_trace_json(True, True))
        except Exception as exc:
            errors.append(f"_dump_fr_trace_json: {type(exc).__name__}: {exc}")
    if isinstance(raw, dict):
        records.append(_record(raw, backend if backend in ("gloo", "nccl") else "gloo"))
    if hasattr(c10d, "_dump_nccl_trace") and backend == "nccl":
        try:
            nccl = loads_plain(c10d._dump_nccl_trace(True, True, False))
            if isinstance(nccl, dict) and nccl.get("entries"):
                records.append(_record(nccl, "nccl"))
        except Exception as exc:
            errors.append(f"_dump_nccl_trace: {type(exc).__name__}: {exc}")
    records = [r for r in records if r["entries"] or r["pg_status"]]
    if not records and not errors:
        enabled = [f"{n}={os.environ[n]}" for n in FR_VARIABLES if n in os.environ]
        errors.append(
            "the Flight Recorder recorded nothing" + (f" ({', '.join(enabled)})" if enabled else " (it is off)")
        )
    return records, "; ".join(errors) or None


def run_collectives(
    backend: str | None, since_ns: int | None = None, started_ns: int | None = None
) -> tuple[int | None, int | None, int | None]:
    """The collectives this process issued that the Flight Recorder still holds (its last TORCH_FR_BUFFER_SIZE
    entries, kept after destroy_process_group), barriers left out: a barrier moves no data, and a job whose ranks
    train apart still meets at one before it ends. None where the recorder is off or cannot be read (a count of 0
    there would say the ranks never met). Read when the run ends: a whole run's collectives, where the profiled
    steps show a window's (periodic model averaging, local SGD, syncs every few hundred steps).

    Second: those of them created after ``since_ns`` (``time.time_ns()`` at the end of the run's first step: what the
    ranks exchanged while they trained, not DDP's start-up broadcasts). None without ``since_ns``, where the buffer
    holds none at all, or where an entry has no creation time on the same clock (``time.time_ns()`` from
    ``started_ns``, when the process began, to now); it keeps the newest entries, so a count of 0 there is every one
    since then. Third: the bytes of their inputs (``_entry_bytes``), None where one has no stated size or the buffer
    may have dropped older entries (as many entries as it holds at most: the whole run since then is not there)."""
    if not any(_positive(os.environ.get(n)) for n in FR_VARIABLES):
        return None, None, None
    records, why = flight_records(backend, frames=False)
    if not records and why and "recorded nothing" not in why:
        return None, None, None  # it could not be read
    held = sum(len(record["entries"]) for record in records)
    entries = [
        entry
        for record in records
        for entry in record["entries"]
        if "barrier" not in str(entry.get("profiling_name", "")) and entry.get("profiling_name")
    ]
    created = [entry.get("time_created_ns") for entry in entries]
    # an empty buffer proves nothing (a backend the recorder does not see); DDP's start-up broadcasts are in it
    if since_ns is None or not created:
        return len(entries), None, None
    slack = 60 * 10**9
    earliest, latest = (started_ns or since_ns) - slack, time.time_ns() + slack
    if not all(type(t) is int and earliest <= t <= latest for t in created):  # another clock, or no time
        return len(entries), None, None
    training = [entry for entry, t in zip(entries, created, strict=True) if t > since_ns]
    sizes = [_entry_bytes(entry) for entry in training]
    capacity = max((_int_env(n) for n in FR_VARIABLES), default=0)
    whole = capacity > held and all(b is not None for b in sizes)
    return len(entries), len(training), sum(b for b in sizes if b is not None) if whole else None


def _entry_bytes(entry: dict[str, Any]) -> int | None:
    """The bytes of a Flight Recorder entry's input tensors (``input_sizes`` x ``input_dtypes``; a 0-dim tensor's
    size is ``[]``, one element), None where they are not stated."""
    from ddpdoctor.metrics.comm import dtype_bytes  # c10's names (``Float``, ``BFloat16``) among the others

    sizes, dtypes = entry.get("input_sizes"), entry.get("input_dtypes")
    if not isinstance(sizes, list) or not isinstance(dtypes, list) or len(sizes) != len(dtypes):
        return None
    total = 0
    for dims, dtype in zip(sizes, dtypes, strict=True):
        width = dtype_bytes(dtype)
        if width is None or not isinstance(dims, list) or not all(type(d) is int and d >= 0 for d in dims):
            return None
        total += math.prod(dims) * width
    return total


def _int_env(name: str) -> int:
    try:
        return int(os.environ.get(name) or 0)
    except ValueError:
        return 0


def _positive(value: str | None) -> bool:
    try:
        return value is not None and int(value) > 0
    except ValueError:
        return False


# ---- a fatal signal: Python's faulthandler ---------------------------------------------------------------------------
# A rank that a fatal signal ends (gloo aborts a process with SIGABRT when a collective receives more data than its
# tensor holds; a segfault in an extension) runs no Python again, so it cannot dump. Python's faulthandler writes
# every thread's stack at that moment from its C signal handler: into dumps/rank<R>.fatal-<pid>.txt, opened at
# start-up with one header line (rank, pid, the main thread's id); a file holding only the header is removed when
# the rank ends normally. A user's own faulthandler (PYTHONFAULTHANDLER, -X faulthandler) is left in charge.
# Its second line, ``ddpdoctor where {"step": N, "phase": "..."}`` (fixed width), is the step and phase the rank is
# in: the file's first bytes are mapped into memory and the phase tracker stores them there as they change (no
# system call; the kernel keeps the page for the file when the process dies), "unknown" where no tracker runs.
FATAL_HEADER = "ddpdoctor fatal-signal record "
FATAL_WHERE = "ddpdoctor where "
_fatal: dict[str, Any] = {}


def fatal_path(folder: Path, rank: int, pid: int) -> Path:
    return Path(folder) / DUMPS_DIR / f"rank{rank}.fatal-{pid}.txt"


def arm_fatal(session: Session) -> Path | None:
    """Have faulthandler write this rank's stacks to its fatal record on a fatal signal; the path, or None."""
    import faulthandler
    import json

    if _fatal or faulthandler.is_enabled() or not session.claimed:
        return None
    path = fatal_path(session.out, session.rank, os.getpid())
    tracker = session.phase
    tracked = bool(tracker._handles)  # the phase tracker is installed: it keeps the "where" line
    try:
        made = not path.parent.is_dir()
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "w+", encoding="utf-8")  # noqa: SIM115 - faulthandler writes to it until the process ends
        header = {
            "rank": session.rank,
            "world_size": max(1, int(session.identity.world_size or 1)),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "main": threading.main_thread().ident,
            "started": time.time(),
        }
        head = FATAL_HEADER + json.dumps(header) + "\n"
        step = f"{tracker.step:{STEP_WIDTH}d}" if tracked else '"unknown"'.ljust(STEP_WIDTH)
        phase = tracker.phase if tracked else "unknown"
        where = f'{FATAL_WHERE}{{"step": {step}, "phase": "{phase:<{PHASE_WIDTH}}"}}\n'
        f.write(head + where)
        f.flush()
        faulthandler.enable(file=f, all_threads=True)
    except (OSError, ValueError, RuntimeError):
        return None
    size = f.tell()
    _fatal.update(path=path, file=f, size=size, pid=os.getpid(), made_dir=made)
    if not _fatal_fork_handler:
        _fatal_fork_handler.append(True)
        os.register_at_fork(after_in_child=_fatal_in_child)
    if tracked:
        _map_where(f, size, len(head.encode()) + len(FATAL_WHERE), tracker)
    return path


_fatal_fork_handler: list[bool] = []  # registered (once a process)


def _fatal_in_child() -> None:
    """A process forked from the rank (a DataLoader or multiprocessing worker) is not the rank: a fatal signal of
    its own is not written into the rank's record (faulthandler off, as a bare run has it in the child)."""
    import faulthandler

    if _fatal and _fatal.get("pid") != os.getpid():
        faulthandler.disable()


def _map_where(f: Any, size: int, at: int, tracker: Any) -> None:
    """Map the record's first ``size`` bytes and have ``tracker`` keep its step and phase in the "where" line (``at``:
    where the line's JSON starts); a forked child (a DataLoader worker) lets go of it. Without it the line says the
    step and phase of when the rank armed the record, which the reader cannot tell from the truth: so on any
    failure the line is made to say "unknown"."""
    import mmap

    step_at = at + len('{"step": ')
    phase_at = step_at + STEP_WIDTH + len(', "phase": "')
    try:
        mapped = mmap.mmap(f.fileno(), size)
        view = memoryview(mapped)
        if bytes(view[step_at - len('{"step": ') : step_at]) != b'{"step": ':
            raise ValueError("the where line is not where it was written")
        tracker.attach_where(view, step_at, phase_at)
        _fatal["where"] = (mapped, view)
        os.register_at_fork(after_in_child=lambda: tracker.attach_where(None, 0, 0))
    except (OSError, ValueError, BufferError):
        with contextlib.suppress(OSError, ValueError):
            os.pwrite(f.fileno(), b'"unknown"'.ljust(STEP_WIDTH), step_at)
            os.pwrite(f.fileno(), b"unknown".ljust(PHASE_WIDTH), phase_at)


def remove_fatal() -> None:
    """The rank ends without a fatal signal: its fatal record holds only the header, and is removed (the rank's
    files stay as they were). faulthandler stays on until the process ends."""
    path = _fatal.get("path")
    if path is None or _fatal.get("pid") != os.getpid():
        return
    try:
        if os.path.getsize(path) <= _fatal["size"]:
            os.unlink(path)
            if _fatal.get("made_dir"):
                with contextlib.suppress(OSError):
                    os.rmdir(path.parent)  # only when empty: the folder was made for this record
    except OSError:
        pass


# ---- the dumper ----------------------------------------------------------------------------------------------------
class Dumper:
    """One process's dumps: its thread (requests, SIGUSR1), and the dumps the session asks for."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pending: list[tuple[str, str, str]] = []  # (reason, id, request id) asked of the thread
        self._answered: set[str] = set()  # request ids answered
        self._seen: dict[Path, tuple[int, int]] = {}  # request file -> (mtime_ns, size) last read
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._signal_dumped = False
        self._usr1_at = 0.0
        self._previous_usr1: Any = None
        self._busy = False  # the thread is writing a dump
        self.signals_watched = False  # a thread forwards the signals it sees (runner's wakeup-fd watcher)
        self.written: list[Path] = []

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ddpdoctor-flight", daemon=True)
        self._thread.start()
        self._install_usr1()

    def stop(self, wait_s: float = 15.0) -> None:
        """No more dumps; a dump being written is waited for (``wait_s`` at most) so that the process does not end
        halfway through it."""
        self._stopped = True
        self._wake.set()
        thread = self._thread
        if self._busy and thread is not None and thread is not threading.current_thread():
            thread.join(wait_s)
        if self._lock.acquire(timeout=wait_s):  # a dump another thread is writing (a signal's)
            self._lock.release()
        if self._previous_usr1 is not None and threading.current_thread() is threading.main_thread():
            with contextlib.suppress(Exception):
                if signal.getsignal(signal.SIGUSR1) is self._on_usr1:
                    signal.signal(signal.SIGUSR1, self._previous_usr1)
            self._previous_usr1 = None

    # ---- what asks for a dump ----
    def _install_usr1(self) -> None:
        if not hasattr(signal, "SIGUSR1") or threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL:  # the script's own handler stays in charge
                self._previous_usr1 = signal.signal(signal.SIGUSR1, self._on_usr1)
        except (ValueError, OSError):
            pass

    def _on_usr1(self, signum: int, frame: Any) -> None:
        if not self.signals_watched:  # else the thread that watches signals has asked already
            self.on_demand_signal()

    def on_demand_signal(self) -> None:
        """SIGUSR1 arrived (from the Python handler, or from a thread that watches signals while the main thread is
        blocked in C++): one dump from the ddpdoctor thread. The two ways a signal is seen give one dump."""
        now = time.monotonic()
        if now - self._usr1_at < 1.0:
            return
        self._usr1_at = now
        self._ask("on_demand", _now_id("sigusr1"), "")

    def _ask(self, reason: str, dump_id: str, request: str) -> None:
        self._pending.append((reason, dump_id, request))
        self._wake.set()

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(POLL_S)
            self._wake.clear()
            if self._stopped:
                return
            self._busy = True
            try:
                self._check_requests()
                while self._pending:
                    self._answer(*self._pending.pop(0))
            except Exception as exc:  # never let the thread die on a bad request
                self._warn(f"dump request not answered: {type(exc).__name__}: {exc}")
            finally:
                self._busy = False

    def _folders(self) -> list[Path]:
        out, root = Path(self.session.out), Path(self.session.root)
        return [out] if out == root else [out, root]

    def _check_requests(self) -> None:
        for folder in self._folders():
            path = request_path(folder)
            try:
                st = os.stat(path)
            except OSError:
                continue
            key = (st.st_mtime_ns, st.st_size)
            if self._seen.get(path) == key:
                continue
            self._seen[path] = key
            request = self._read_request(path)
            if request is None or request["id"] in self._answered:
                continue
            self._answered.add(request["id"])
            self._answer(request["reason"], request["id"], request["id"])

    def _answer(self, reason: str, dump_id: str, request: str) -> None:
        """Answer at once (torch's JSON dump: milliseconds), then replace the file with one that also holds each
        collective's Python frames (torch's pickle dump, seconds the first time in a process)."""
        if self.dump(reason, dump_id=dump_id, request=request, frames=False) is not None and not self._stopped:
            self.dump(reason, dump_id=dump_id, request=request, frames=True)

    def _read_request(self, path: Path) -> dict[str, str] | None:
        import json

        try:
            data = json.loads(rundir.read_regular(path, limit=_REQUEST_MAX_BYTES))
        except (OSError, ValueError) as exc:
            self._warn(f"{path}: dump request not read: {exc}")
            return None
        dump_id = data.get("id") if isinstance(data, dict) else None
        if not isinstance(dump_id, str) or not ID_RE.fullmatch(dump_id):
            self._warn(f"{path}: dump request ignored: field 'id' is not 1-64 of [a-z0-9-]")
            return None
        reason = data.get("reason")
        return {"id": dump_id, "reason": reason if reason in ("hang", "on_demand") else "on_demand"}

    # ---- the dump itself ----
    def dump_signal(self, signum: int) -> Path | None:
        """SIGTERM / SIGINT: one dump (the first such signal), from whichever thread saw it first."""
        with self._lock:
            if self._signal_dumped:
                return None
            self._signal_dumped = True
        return self.dump("signal", dump_id=_now_id("signal"), frames=False)

    def dump_exception(self, exc: BaseException) -> Path | None:
        """An exception escaped the script (main thread, the process ends next: the fast dump, no frames)."""
        return self.dump("exception", dump_id=_now_id("exception"), exception=exc, frames=False)

    def dump(
        self,
        reason: str,
        *,
        dump_id: str,
        request: str = "",
        exception: BaseException | None = None,
        frames: bool = True,
    ) -> Path | None:
        """Write ``dumps/rank<R>.<id>.json`` now (any thread); the path, or None when it could not be written."""
        session = self.session
        if not session.claimed:
            return None  # not (yet) a rank: a launcher of ranks writes no dump
        with self._lock:
            try:
                data = self._collect(reason, request, exception, frames)
                path = dump_path(session.out, session.rank, dump_id)
                plain = runfiles.to_plain(data)
                why = runfiles.check(plain, FlightDump)
                rundir.atomic_write_json(path, plain)
                if why:
                    self._warn(f"{path}: written, but it does not fit its type: {why}")
                self.written.append(path)
                return path
            except Exception as exc:
                self._warn(f"dump ({reason}) not written: {type(exc).__name__}: {exc}")
                return None

    def _collect(self, reason: str, request: str, exception: BaseException | None, frames: bool) -> dict[str, Any]:
        session = self.session
        backend = (session.dist or {}).get("backend")
        records, fr_error = flight_records(backend, frames=frames)
        skip = {threading.get_ident()} if threading.current_thread().name == "ddpdoctor-flight" else set()
        return {
            "rank": session.rank,
            "world_size": max(1, int(session.identity.world_size or 1)),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "request": request,
            "reason": reason,
            "time": time.time(),
            **session.phase.snapshot(),
            "exception": exception_record(exception) if exception is not None else None,
            "threads": thread_stacks(skip, main_ident=session._thread_id),
            "flight_recorder": records,
            "fr_error": fr_error,
        }

    def watch_signals(self) -> bool:
        """Watch for signals from a thread of our own (a rank ddpdoctor did not start: ``mp.spawn``'s, a
        scheduler's), so that SIGTERM / SIGUSR1 dump while the main thread is blocked in a collective: through
        ``signal.set_wakeup_fd``, only where nothing else uses it (the runner's own watcher forwards them already).
        SIGTERM / SIGINT only dump here: what the rank then does is its handlers' business. Main thread only."""
        if threading.current_thread() is not threading.main_thread():
            return False
        try:
            r, w = os.pipe()
            os.set_blocking(w, False)
            previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            return False
        if previous != -1:  # someone's (asyncio's, the runner's): leave it in place
            signal.set_wakeup_fd(previous)
            os.close(r)
            os.close(w)
            return False
        self.signals_watched = True
        stops = (signal.SIGTERM, signal.SIGINT)

        def watch() -> None:
            while True:
                try:
                    data = os.read(r, 64)
                except OSError:
                    return
                if not data:
                    return
                for signum in data:
                    if self.session.finished:
                        continue
                    if signum in stops:
                        self.dump_signal(signum)
                    elif signum == getattr(signal, "SIGUSR1", None):
                        self.on_demand_signal()

        threading.Thread(target=watch, name="ddpdoctor-flight-signals", daemon=True).start()
        return True

    def _warn(self, message: str) -> None:
        progress.say(f"ddpdoctor: warning: rank {self.session.rank}: {message}")  # never raises
