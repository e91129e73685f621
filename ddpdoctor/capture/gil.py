"""GIL contention per step, measured with gilknocker (a maintained Rust probe).

gilknocker runs a native thread that repeatedly tries to take the GIL and reports the fraction of time it had to
wait (0-1). It runs only during the profiled window, so steps outside it pay nothing.

The probe's wait alone is no proof of contention: a single busy Python thread makes it wait too (it holds the GIL
until the switch interval), and contention needs a contender. So each step also records the job's own Python threads
(ddpdoctor's ``ddpdoctor-*`` threads and the probe excluded), how many of them made progress (each at least 10% of
the CPU time the job's threads used in the step, from ``/proc/self/task/<tid>/stat``) and their CPU time together
against the step's wall time: threads that
are GIL-bound make progress one at a time (together about one core or less).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

# Poll every 100 µs for 10 ms, then sleep 1 ms: about 90% of the window sampled (a 10 ms sleep sampled half of it
# and made the verdict vary between runs of one job). A 1 ms poll missed most of the contention of four threads
# running tiny ops (0.03 vs 0.17 measured on the same run), 100 µs did not.
_POLL_US, _SAMPLE_US, _SLEEP_US = 100, 10_000, 1_000
# A thread that ran (on a CPU, ns from schedstat) at least this share of what the job's busiest thread ran in a step,
# and at least _MIN_RUN_S, had work in it: a share of the busiest thread, not of the total nor of the wall time, holds
# whatever share of the host the process gets and however many threads share the work; the main thread that only
# waits for a pool and steps the optimizer runs 5-10% of its worker (measured, loaded 2-core host).
_ACTIVE_SHARE = 0.25
_MIN_RUN_S = 0.001
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _job_threads() -> list[threading.Thread]:
    """The job's own Python threads (the main thread included), not ddpdoctor's."""
    return [t for t in threading.enumerate() if not t.name.startswith("ddpdoctor")]


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _cpu_seconds(native_id: int | None) -> float | None:
    """User + system CPU time of one thread of this process (Linux, clock ticks), None where unknown."""
    if native_id is None:
        return None
    text = _read(f"/proc/self/task/{native_id}/stat")
    try:
        fields = text.rsplit(")", 1)[1].split()  # type: ignore[union-attr]
        return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15 of stat)
    except (AttributeError, IndexError, ValueError):
        return None


def _thread_times(native_id: int) -> tuple[float, float, int] | None:
    """(seconds on a CPU, seconds runnable but waiting for a CPU, voluntary switches) of one thread of this process:
    ``/proc/self/task/<tid>/schedstat`` (ns) and the ``voluntary_ctxt_switches`` of its ``status``; a thread that
    blocks (on the GIL's futex, a lock, I/O) switches voluntarily, one the host preempts waits in the run queue.
    Where schedstat is absent, the clock-tick CPU time of ``stat`` and no run-queue wait; None where unknown."""
    base = f"/proc/self/task/{native_id}"
    sched = _read(f"{base}/schedstat")
    status = _read(f"{base}/status")
    voluntary = -1
    for line in (status or "").splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            voluntary = int(line.split()[1])
            break
    try:
        run_ns, delay_ns = (int(v) for v in sched.split()[:2])  # type: ignore[union-attr]
        return run_ns / 1e9, delay_ns / 1e9, voluntary
    except (AttributeError, ValueError):
        seconds = _cpu_seconds(native_id)
        return None if seconds is None else (seconds, 0.0, voluntary)


def _native_threads() -> int | None:
    text = _read("/proc/self/status")
    for line in (text or "").splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return None


_DERIVED = ("active_threads", "cpu_cores", "runnable_cores", "cpu_share", "blocked_share", "switches")


def _step_values(
    now: dict[int, tuple[float, float, int]], before: dict[int, tuple[float, float, int]], elapsed: float
) -> tuple[Any, ...]:
    """The ``_DERIVED`` values of one step from the job's threads' times at its end and at its start (a thread new
    since then ran only since then); Nones where nothing was measured."""
    if elapsed <= 0 or not now:
        return (None,) * len(_DERIVED)
    run, busy, switches = {}, {}, {}
    for tid, (cpu, delay, vol) in now.items():
        cpu0, delay0, vol0 = before.get(tid, (0.0, 0.0, vol if vol < 0 else 0))
        run[tid], busy[tid] = max(cpu - cpu0, 0.0), max(cpu - cpu0 + delay - delay0, 0.0)
        switches[tid] = vol - vol0 if vol >= 0 and vol0 >= 0 else None
    total_run, total_busy = sum(run.values()), sum(busy.values())
    floor = max(_MIN_RUN_S, _ACTIVE_SHARE * max(run.values()))
    active = [tid for tid in now if run[tid] >= floor]
    blocked = sum(max(elapsed - busy[tid], 0.0) for tid in active)
    counted = [switches[tid] for tid in active]
    return (
        len(active),
        round(total_run / elapsed, 3),
        round(total_busy / elapsed, 3),
        round(total_run / total_busy, 3) if total_busy > 0 else None,
        round(blocked / (elapsed * len(active)), 3) if active else None,
        sum(counted) if active and all(c is not None for c in counted) else None,  # type: ignore[misc]
    )


class GilProbe:
    def __init__(self, enabled: bool = True) -> None:
        self._knocker: Any = None
        self.reason: str | None = None
        self.series: dict[str, list] = {
            "step": [],
            "contention": [],
            "threads": [],
            "native_threads": [],
            "job_threads": [],  # the job's Python threads alive (ddpdoctor's excluded)
            "active_threads": [],  # of them, those running or runnable for over 10% of what they all were
            "cpu_cores": [],  # their CPU time together / the step's wall time
            "runnable_cores": [],  # their time running or waiting for a CPU together / wall time
            "cpu_share": [],  # their CPU time / their time running or waiting for a CPU (what the host gave them)
            "blocked_share": [],  # of the active threads' wall time, the share they were blocked (not runnable)
            "switches": [],  # voluntary context switches of the active threads (each a block: GIL, lock, I/O)
        }
        self._times: dict[int, tuple[float, float, int]] = {}
        self._wall: float | None = None
        if not enabled:
            self.reason = "disabled with --no-gil"
            return
        try:
            from gilknocker import KnockKnock
        except ImportError as exc:  # pragma: no cover - it is a dependency
            self.reason = f"gilknocker not importable: {exc}"
            return
        self._factory = KnockKnock

    @property
    def available(self) -> bool:
        return self.reason is None

    @property
    def running(self) -> bool:
        return self._knocker is not None

    def start(self) -> None:
        if not self.available or self._knocker is not None:
            return
        self._knocker = self._factory(
            polling_interval_micros=_POLL_US,
            sampling_interval_micros=_SAMPLE_US,
            sleeping_interval_micros=_SLEEP_US,
        )
        self._knocker.start()
        self._times, self._wall = self._thread_times(), time.monotonic()

    def sample(self, step: int) -> None:
        if self._knocker is None:
            return
        self.series["step"].append(step)
        self.series["contention"].append(round(float(self._knocker.contention_metric), 4))
        self.series["threads"].append(threading.active_count())
        self.series["native_threads"].append(_native_threads())
        times, wall = self._thread_times(), time.monotonic()
        elapsed = wall - self._wall if self._wall is not None else 0.0
        self.series["job_threads"].append(len(times) or None)
        for key, value in zip(_DERIVED, _step_values(times, self._times, elapsed), strict=True):
            self.series[key].append(value)
        self._times, self._wall = times, wall
        self._knocker.reset_contention_metric()

    @staticmethod
    def _thread_times() -> dict[int, tuple[float, float, int]]:
        out = {}
        for t in _job_threads():
            if t.native_id is not None and (times := _thread_times(t.native_id)) is not None:
                out[t.native_id] = times
        return out

    def stop(self) -> None:
        if self._knocker is not None:
            try:
                self._knocker.stop()
            finally:
                self._knocker = None

    def to_json(self) -> dict[str, Any]:
        return {
            "probe": "gilknocker",
            "available": self.available,
            "reason": self.reason,
            "per_step": self.series,
        }
