"""The always-on step series: every step of every rank, from the first to the last, at near-zero cost.

Each traced rank appends one JSON line per step to ``ranks/rank<R>.series.jsonl`` (in the folder its other files go
to): the step's wall time, the time its main thread spent in each phase (``capture/phase.py``: data wait, forward,
backward, optimizer), the memory of its device (CUDA allocated bytes from the counters ``capture/memory.py`` already
reads at each step; the process RSS on CPU), and, for DDP modules, DDP's own timing of its backward's communication
(its logging data, read only as often as costs at most 0.1% of the step time). Read back by :func:`read_series` /
:func:`series_frames`; live numbers by :func:`summary` and the Prometheus endpoint (``ddpdoctor/export``).

Cost per step, on the training thread: one call that reads a few attributes and two clocks and appends a tuple to
a deque (no lock, no formatting); the process RSS (CPU) at most every 50 ms, one ``pread`` of ``/proc/self/statm``;
DDP's logging data at its budget. The lines are made and written by a daemon thread once a second (msgspec's encoder
over all the steps since, one ``os.write`` to an ``O_APPEND`` file), and at the end of the run: a crash loses at
most the last second of steps; a torn last line is ignored by the reader. ``benchmarks/bench_series.py`` measures it
against the same loop bare, in the same run (issue 28: <= 1% of the step time).

Header line ``{"kind": "header", "version": 1, "rank", "world_size", "local_rank", "node", "pid", "started_at",
"device", "mem_capacity_bytes"}``, then per step ``{"step", "t", "wall_s", "data_s", "forward_s", "backward_s",
"optimizer_s", "mem_bytes", "mem_reserved_bytes", "cpu_s", "ddp"?}`` (seconds, bytes, unix seconds; ``cpu_s``: the
process's CPU time in the step, all its threads); ``ddp`` is
``[step, forward_s, backward_compute_s, backward_comm_s, overlap_s, comm_start_t, forward_start_t]`` of an EARLIER
step (DDP records a step's timings during the next forward); the reader moves it onto that step's row. Seconds are
written to the microsecond (``wall_s`` to 0.1 us, ``t`` to 0.1 ms); a NaN or an infinity as null.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdoctor.capture import ddp as ddp_capture
from ddpdoctor.capture import progress

VERSION = 1
SUFFIX = ".series.jsonl"
FLUSH_INTERVAL_S = 1.0
# DDP's logging data costs ~0.1 ms a read: read it at most at a rate that keeps it under this share of step time
DDP_READ_SHARE = 0.001
RSS_INTERVAL_S = 0.05  # the process RSS (CPU) is read at most this often: ~5 us a read
PHASE_FIELDS = ("data", "forward", "backward", "optimizer")
DDP_FIELDS = ("ddp_forward_s", "ddp_backward_s", "ddp_comm_s", "ddp_overlap_s", "ddp_comm_start_t")
ROW_FIELDS = (
    "step",
    "t",
    "wall_s",
    "data_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "mem_bytes",
    "mem_reserved_bytes",
    "cpu_s",
    *DDP_FIELDS,
)
# row field -> summary() key (after "ddpdoctor/")
SUMMARY_NAMES = (
    ("wall_s", "step_seconds"),
    ("data_s", "data_wait_seconds"),
    ("forward_s", "forward_seconds"),
    ("backward_s", "backward_seconds"),
    ("optimizer_s", "optimizer_seconds"),
    ("cpu_s", "cpu_seconds"),
)
_MAX_PENDING = 100_000  # lines kept while the file cannot be written (never more memory than this)
# the live DDP modules (the WeakSet's own set: its truth value costs no len() call)
_LIVE_DDP = getattr(ddp_capture._instances, "data", ddp_capture._instances)


def series_file(out: Path, rank: int) -> Path:
    """``<out>/ranks/rank<R>.series.jsonl``."""
    from ddpdoctor import rundir

    return Path(out) / rundir.RANKS_DIR / f"rank{rank}{SUFFIX}"


# ---- writing (inside a traced rank) ----------------------------------------------------------------------------
class SeriesRecorder:
    """One process's series. ``step()`` runs on the training thread at each step end; a daemon thread writes."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self._queue: collections.deque[tuple] = collections.deque(maxlen=_MAX_PENDING)  # steps not yet written
        self._fd: int | None = None
        self._path: Path | None = None
        self._where: tuple[Any, int] | None = None  # (folder, rank) of the open file
        self._header_written = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False
        self._raw: tuple | None = None  # the last step's values (``latest``: summary(), the Prometheus endpoint)
        self.last_memory: tuple[int, int | None] | None = None  # the last (bytes, reserved bytes) measured
        self._rss_t = -1.0  # time.monotonic() of the last RSS read
        self.steps = 0  # rows recorded
        self.wall_total_s = 0.0  # sum of wall_s over the rows
        self.error: str | None = None  # why the series stopped being written, once it did
        self.writer_cpu_s = 0.0  # CPU time of the writer thread so far (benchmarks/bench_series.py)
        self.device = "cpu"
        self.capacity: int | None = None
        self._statm: int | None = None
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._wall_floor = float("inf")  # the fastest step so far (s): the DDP read's budget
        self._ddp_next = 0  # DDP's logging data is read again once this many steps are recorded
        self._ddp_last_start: int | None = None
        self._cpu_last: float | None = None  # time.process_time() at the last step's end
        self.last_ddp: list[Any] | None = None  # the last DDP timing read (see _ddp)
        self.exporter: Any = None  # ddpdoctor.export.prometheus.Exporter once asked for
        self._textfile: str | None = None

    # ---- per step (training thread) ------------------------------------------------------------------------
    def step(self, iteration: int) -> None:
        """Record the step ``iteration`` that just ended (after the clock ticked and memory was sampled).

        The training thread's whole cost: one call with a handful of attribute reads, two clock reads and an
        append to a deque (atomic: no lock). Everything else (rounding, JSON, the DDP read's budget, the fastest
        step) is done by the writer thread. It runs right after the step's own work, when the CPU's caches hold the
        step's data, not this code's: each object it touches is a cache miss (~20 us a call as first written, with
        a function per field; benchmarks/bench_series.py)."""
        if self._closed:
            return
        try:
            s = self._session
            wall_ms = s.clock.wall_ms
            wall = wall_ms[-1] / 1e3 if iteration >= 1 and wall_ms else None
            phase = s.phase
            spent = phase.last_spent if phase._handles else None
            mem = reserved = None
            if s.memory._devices:  # CUDA: the counters DeviceMemory read at this step
                mem, reserved = self._cuda_memory(iteration)
            if mem is None:  # the process RSS, at most every RSS_INTERVAL_S
                now = time.monotonic()
                mem = self._rss(now) if now - self._rss_t >= RSS_INTERVAL_S else None
            if mem is not None:
                self.last_memory = (mem, reserved)
            ddp = None
            if self.steps >= self._ddp_next and wall is not None and _LIVE_DDP:
                ddp = self._ddp(iteration, wall)
                if ddp is not None:
                    self.last_ddp = ddp
            cpu_now = time.process_time()  # the process's CPU time (every thread): ~1 us
            cpu_last, self._cpu_last = self._cpu_last, cpu_now
            cpu = cpu_now - cpu_last if cpu_last is not None else None
            raw = (iteration, time.time(), wall, spent, mem, reserved, ddp, cpu)
            self._raw = raw
            self._queue.append(raw)  # a full queue (the file cannot be written) drops its oldest line
            self.steps += 1
            if wall is not None:
                self.wall_total_s += wall
            if self._thread is None:
                self._first_step()
        except Exception as exc:  # never break the training for it: the series stops, the rank file says why
            self._closed = True
            self.error = f"series stopped at step {iteration}: {type(exc).__name__}: {exc}"
            self._session.capture_errors.append(self.error)

    def _first_step(self) -> None:
        self._start_exporters()
        self._start_thread()

    @property
    def latest(self) -> dict[str, Any] | None:
        """The last step's row (as written in the file), or None before the first step."""
        return _row(self._raw) if self._raw is not None else None

    def _cuda_memory(self, iteration: int) -> tuple[int | None, int | None]:
        best: tuple[int, int, dict] | None = None
        for dev in self._session.memory._devices.values():
            series = dev["per_step"]
            if series["step"] and series["step"][-1] == iteration:
                alloc = series["allocated_bytes"][-1]
                if best is None or alloc > best[0]:
                    best = (alloc, series["reserved_bytes"][-1], dev)
        if best is None:
            return None, None  # no device sampled at this step
        self.device, self.capacity = best[2]["device"], best[2]["capacity_bytes"]
        return best[0], best[1]

    def _rss(self, now: float) -> int | None:
        """The process RSS (read at most every RSS_INTERVAL_S: a step in between has none)."""
        self._rss_t = now
        try:
            if self._statm is None:
                self._statm = os.open("/proc/self/statm", os.O_RDONLY)
                self.capacity = _host_memory()
            return int(os.pread(self._statm, 128, 0).split()[1]) * self._page
        except (OSError, ValueError, IndexError):
            return None

    def _ddp(self, iteration: int, wall: float) -> list[Any] | None:
        """DDP's timing of the step before, read at most at a rate that keeps its cost under DDP_READ_SHARE of the
        fastest step: after each read, the next one waits as many steps as that read's CPU time needs."""
        t0 = time.thread_time()
        try:
            return self._read_ddp(iteration)
        finally:
            cost = time.thread_time() - t0  # the whole read: DDP's dict made, converted and freed
            # a share of the fastest step seen (close to its CPU time, which a busy host does not inflate; the
            # writer thread also keeps it from the rows it writes)
            self._wall_floor = floor = min(self._wall_floor, wall)
            self._ddp_next = self.steps + max(1, math.ceil(cost / (DDP_READ_SHARE * max(floor, 1e-6))))

    def _read_ddp(self, iteration: int) -> list[Any] | None:
        module = next(iter(list(ddp_capture._instances)), None)
        if module is None:
            return None
        try:
            data = module._get_ddp_logging_data()
        except Exception:
            return None
        comm = data.get("backward_comm_time")
        start = data.get("forward_compute_time_start")
        if not isinstance(comm, int) or start == self._ddp_last_start:
            return None  # nothing timed yet, or the same step as last read
        self._ddp_last_start = start

        def sec(key: str) -> float | None:
            v = data.get(key)
            return round(v / 1e9, 6) if isinstance(v, int) else None

        comm_start = data.get("backward_comm_time_start")
        return [
            iteration - 1,
            sec("forward_compute_time"),
            sec("backward_compute_time"),
            sec("backward_comm_time"),
            sec("backward_compute_comm_overlap_time"),
            round(comm_start / 1e9, 6) if isinstance(comm_start, int) and comm_start > 0 else None,
            round(start / 1e9, 6) if isinstance(start, int) and start > 0 else None,
        ]

    # ---- exporters (trace --metrics-port / --metrics-textfile) ---------------------------------------------
    def _start_exporters(self) -> None:
        extra = getattr(self._session.config, "extra", None) or {}
        address, self._textfile = extra.get("metrics_port"), extra.get("metrics_textfile")
        if not address and not self._textfile:
            return
        where = "the metrics exporter"
        try:
            from ddpdoctor.export import prometheus

            self.exporter = prometheus.Exporter(self._session)
            if address:
                host, port = address[0], int(address[1]) + self._session.identity.local_rank
                where = f"the metrics endpoint {host}:{port}"
                self.exporter.serve(host, port)
        except Exception as exc:  # a port in use, no prometheus_client: the training goes on without it
            why = f"{where} not started: {getattr(exc, 'strerror', None) or exc}"
            self._session.capture_errors.append(why)
            progress.say(f"ddpdoctor: warning: rank {self._session.rank}: {why}")

    def _write_textfile(self) -> None:
        if self._textfile and self.exporter is not None and self._session.claimed:
            try:
                self.exporter.write_textfile(Path(self._textfile), self._session.rank)
            except Exception as exc:
                if self.error is None:
                    self.error = f"metrics textfile not written in {self._textfile}: {exc}"

    # ---- writing (daemon thread, and close) ----------------------------------------------------------------
    def _start_thread(self) -> None:
        try:
            self._thread = threading.Thread(target=self._run, name="ddpdoctor-series", daemon=True)
            self._thread.start()
        except RuntimeError as exc:  # no thread to be had: written at the end of the run only
            self.error = f"no writer thread ({exc}): the series is written at the end of the run"

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_INTERVAL_S):
            c = time.thread_time()
            self.flush()
            self._write_textfile()
            self.writer_cpu_s += time.thread_time() - c

    def flush(self) -> None:
        """Write the buffered lines (the header first, once). Never raises."""
        s = self._session
        if not s.claimed:
            return  # not known to be a rank yet: keep the lines
        queue = self._queue
        raws = [queue.popleft() for _ in range(len(queue))]  # each popleft atomic: the training thread appends
        if not raws:
            return
        walls = [raw[2] for raw in raws if raw[2] is not None]
        if walls:
            self._wall_floor = min(self._wall_floor, min(walls))
        try:
            data = _lines(raws)
        except Exception as exc:  # a value of a type never seen: these steps are lost, the thread goes on
            if self.error is None:
                self.error = f"series lines not encoded: {type(exc).__name__}: {exc}"
            return
        try:
            where = (s.out, s.rank)
            if where != self._where or self._fd is None:  # the path once, not at each flush (it rarely changes)
                self._open(series_file(*where))
                self._where = where
            if not self._header_written:
                data = json.dumps(self._header(), separators=(",", ":")).encode() + b"\n" + data
                self._header_written = True
            while data:
                data = data[os.write(self._fd, data) :]  # type: ignore[arg-type]
        except OSError as exc:
            if self.error is None:
                self.error = f"series not written to {self._path}: {exc.strerror or exc}"

    def _open(self, path: Path) -> None:
        if self._path == path and self._fd is not None:
            return
        if self._fd is not None:  # the rank or its folder changed (it joined a process group): move the file
            os.close(self._fd)
            self._fd = None
            if self._path is not None and not path.exists():
                with contextlib.suppress(OSError):
                    os.replace(self._path, path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._path = path
        if os.fstat(self._fd).st_size:  # a file of an earlier session of this process: its header is there
            self._header_written = True

    def _header(self) -> dict[str, Any]:
        s = self._session
        ident = s.identity
        return {
            "kind": "header",
            "version": VERSION,
            "rank": ident.rank,
            "world_size": ident.world_size,
            "local_rank": ident.local_rank,
            "node": socket.gethostname(),
            "pid": s.pid,
            "started_at": round(s.started_at, 4),
            "device": self.device,
            "mem_capacity_bytes": self.capacity,
        }

    def close(self) -> None:
        """The end of the run: stop the thread, write what is left."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        self.flush()
        self._write_textfile()
        if self.exporter is not None:
            self.exporter.close()
        for fd in (self._fd, self._statm):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._statm = None

    @property
    def path(self) -> Path | None:
        return self._path


def _row(raw: tuple) -> dict[str, Any]:
    """A step's values as its line in the file (seconds to the microsecond, ``t`` to 0.1 ms, ``wall_s`` to 0.1 us):
    the lines are these dicts, made in bulk by :func:`_lines` with the same rounding."""
    iteration, t, wall, spent, mem, reserved, ddp, *more = raw
    cpu = more[0] if more else None
    d = f = b = o = None
    if spent:
        d = spent.get("data") if iteration else None  # step 0 has no data phase
        f, b, o = spent.get("forward"), spent.get("backward"), spent.get("optimizer")
    row: dict[str, Any] = {
        "step": iteration,
        "t": _r4(t),
        "wall_s": None if wall is None else _r7(wall),
        "data_s": None if d is None else _r6(d),
        "forward_s": None if f is None else _r6(f),
        "backward_s": None if b is None else _r6(b),
        "optimizer_s": None if o is None else _r6(o),
        "mem_bytes": mem,
        "mem_reserved_bytes": reserved,
        "cpu_s": None if cpu is None else _r6(cpu),
    }
    if ddp is not None:
        row["ddp"] = ddp
    return row


# Rounding to a number of decimals: the nearest double to k / 10^n (an exact power of ten, IEEE division) prints as
# that decimal. Half the cost of round(), whose results it matches but for ties at the last digit (a 1-ulp
# difference of x * 10^n); a float floor division, so that NaN and infinities give NaN (written as null), not an
# exception.
def _r4(x: float) -> float:
    return (x * 1e4 + 0.5) // 1 / 1e4


def _r6(x: float) -> float:
    return (x * 1e6 + 0.5) // 1 / 1e6


def _r7(x: float) -> float:
    return (x * 1e7 + 0.5) // 1 / 1e7


_ENCODER: Any = None


def _lines(raws: list[tuple]) -> bytes:
    """The lines of these steps (``_row`` of each), newline-terminated, in one call of msgspec's C encoder: ~1/4
    of the writer thread's CPU time per line of a %-format and ``json.dumps`` (benchmarks/bench_series.py)."""
    global _ENCODER
    if _ENCODER is None:
        import msgspec

        _ENCODER = msgspec.json.Encoder()  # NaN and infinities become null: every line stays JSON
    rows = []
    for iteration, t, wall, spent, mem, reserved, ddp, *more in raws:
        cpu = more[0] if more else None
        d = f = b = o = None
        if spent:
            d = spent.get("data") if iteration else None
            f, b, o = spent.get("forward"), spent.get("backward"), spent.get("optimizer")
        row = {
            "step": iteration,
            "t": (t * 1e4 + 0.5) // 1 / 1e4,
            "wall_s": None if wall is None else (wall * 1e7 + 0.5) // 1 / 1e7,
            "data_s": None if d is None else (d * 1e6 + 0.5) // 1 / 1e6,
            "forward_s": None if f is None else (f * 1e6 + 0.5) // 1 / 1e6,
            "backward_s": None if b is None else (b * 1e6 + 0.5) // 1 / 1e6,
            "optimizer_s": None if o is None else (o * 1e6 + 0.5) // 1 / 1e6,
            "mem_bytes": mem,
            "mem_reserved_bytes": reserved,
            "cpu_s": None if cpu is None else (cpu * 1e6 + 0.5) // 1 / 1e6,
        }
        if ddp is not None:
            row["ddp"] = ddp
        rows.append(row)
    return _ENCODER.encode_lines(rows)


def _host_memory() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# ---- reading -------------------------------------------------------------------------------------------------
@dataclass
class RankSeries:
    """One rank's series as read: the header (``{}`` when missing), one row per step in step order."""

    rank: int
    path: Path
    header: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: int = 0  # lines that did not parse (a torn last line included)


def read_rank_series(path: Path, rank: int | None = None) -> RankSeries:
    """Read one series file (complete or still being written). Missing file: an empty series."""
    import re

    if rank is None:
        m = re.match(r"rank(\d+)", Path(path).name)
        rank = int(m.group(1)) if m else -1
    out = RankSeries(rank=rank, path=Path(path))
    from ddpdoctor import rundir

    try:
        with rundir.open_regular(path) as f:  # never a FIFO or a device (nor waited on)
            raw = f.read()
    except OSError:
        return out
    by_step: dict[int, dict[str, Any]] = {}
    ddp: list[list[Any]] = []
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for i, line in enumerate(lines):
        torn = i == len(lines) - 1 and not raw.endswith(b"\n")
        try:
            obj = json.loads(line)
        except ValueError:
            out.bad_lines += 1
            continue
        if torn or not isinstance(obj, dict):  # a last line without its newline may be cut inside a number
            out.bad_lines += 1
            continue
        if "kind" in obj:
            if obj.get("kind") == "header" and not out.header:
                out.header = obj
            continue
        step = obj.get("step")
        if not isinstance(step, int):
            out.bad_lines += 1
            continue
        row = {name: obj.get(name) for name in ROW_FIELDS}
        if isinstance(obj.get("ddp"), list):
            ddp.append(obj["ddp"])
        by_step[step] = row
    out.rows = [by_step[k] for k in sorted(by_step)]
    _place_ddp(out.rows, by_step, ddp)
    return out


def _place_ddp(rows: list[dict[str, Any]], by_step: dict[int, dict[str, Any]], ddp: list[list[Any]]) -> None:
    """Put DDP's timings on the row of the step they describe: the step whose wall-clock span holds DDP's
    forward start (where DDP gave one), else the step the writer named (the one before the line's)."""
    import bisect

    ends = [r["t"] for r in rows]
    for rec in ddp:
        rec = list(rec) + [None] * (7 - len(rec))
        target = by_step.get(rec[0]) if isinstance(rec[0], int) else None
        fwd_start = rec[6]
        if isinstance(fwd_start, (int, float)) and ends:
            i = bisect.bisect_left(ends, fwd_start)
            if i < len(rows):
                target = rows[i]
        if target is None:
            continue
        for name, value in zip(DDP_FIELDS, rec[1:6], strict=True):
            target[name] = value


def read_series(run_dir: str | Path, *, group: str | None = None) -> dict[int, RankSeries]:
    """Every rank's series of a run directory (``group``: another process group's, ``groups/<group>/``), by rank.
    Works while the job runs; a rank without a series file is absent."""
    from ddpdoctor import rundir
    from ddpdoctor.errors import DDPDoctorError

    root = Path(run_dir)
    if not root.is_dir():
        raise DDPDoctorError(f"{root}: not a run directory")
    folder = (root / rundir.GROUPS_DIR / group if group else root) / rundir.RANKS_DIR
    out: dict[int, RankSeries] = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    import re

    for name in names:
        m = re.fullmatch(r"rank(\d+)" + re.escape(SUFFIX), name)
        if m:
            out[int(m.group(1))] = read_rank_series(folder / name, int(m.group(1)))
    return dict(sorted(out.items()))


def series_frames(run_dir: str | Path, *, group: str | None = None) -> dict[int, Any]:
    """:func:`read_series` as pandas DataFrames (columns ``ROW_FIELDS`` but ``step``, index ``step``)."""
    import pandas as pd

    frames = {}
    for rank, series in read_series(run_dir, group=group).items():
        df = pd.DataFrame(series.rows, columns=list(ROW_FIELDS))
        frames[rank] = df.set_index("step")
    return frames


# ---- live numbers --------------------------------------------------------------------------------------------
def summary() -> dict[str, Any]:
    """The current rank's latest series numbers as a flat dict (``ddpdoctor.summary()``); {} outside a traced job
    or before its first step."""
    session_mod = sys.modules.get("ddpdoctor.capture.session")  # not imported: no traced job in this process
    s = session_mod.current() if session_mod is not None else None
    rec = getattr(s, "series", None) if s is not None else None
    if rec is None or rec.latest is None:
        return {}
    row = rec.latest
    out: dict[str, Any] = {
        "ddpdoctor/rank": s.rank,  # type: ignore[union-attr]
        "ddpdoctor/step": row["step"],
        "ddpdoctor/steps_recorded": rec.steps,
    }
    for key, name in SUMMARY_NAMES:
        if row.get(key) is not None:
            out[f"ddpdoctor/{name}"] = row[key]
    if rec.steps > 1 and rec.wall_total_s:
        out["ddpdoctor/mean_step_seconds"] = round(rec.wall_total_s / (rec.steps - 1), 6)
    if rec.last_memory is not None:  # the last measured (on CPU the RSS is read at most every 50 ms)
        out["ddpdoctor/memory_bytes"] = rec.last_memory[0]
        if rec.last_memory[1] is not None:
            out["ddpdoctor/memory_reserved_bytes"] = rec.last_memory[1]
    ddp = rec.last_ddp
    if ddp is not None and ddp[3] is not None:
        out["ddpdoctor/ddp_comm_seconds"] = ddp[3]
    return out
