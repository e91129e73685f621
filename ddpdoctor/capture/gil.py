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
# A thread that got at least this share of the CPU time the job's threads used in a step (and one clock tick) made
# progress in it: on a busy host a process may get a fraction of a core, so the share is of what it got.
_ACTIVE_SHARE = 0.1
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _job_threads() -> list[threading.Thread]:
    """The job's own Python threads (the main thread included), not ddpdoctor's."""
    return [t for t in threading.enumerate() if not t.name.startswith("ddpdoctor")]


def _cpu_seconds(native_id: int | None) -> float | None:
    """User + system CPU time of one thread of this process (Linux), None where unknown."""
    if native_id is None:
        return None
    try:
        with open(f"/proc/self/task/{native_id}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15 of stat)
    except (OSError, IndexError, ValueError):
        return None


def _native_threads() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


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
            "active_threads": [],  # of them, those that used the CPU for over 10% of the step
            "cpu_cores": [],  # their CPU time together / the step's wall time
        }
        self._cpu: dict[int, float] = {}
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
        self._cpu, self._wall = self._thread_cpu(), time.monotonic()

    def sample(self, step: int) -> None:
        if self._knocker is None:
            return
        self.series["step"].append(step)
        self.series["contention"].append(round(float(self._knocker.contention_metric), 4))
        self.series["threads"].append(threading.active_count())
        self.series["native_threads"].append(_native_threads())
        cpu, wall = self._thread_cpu(), time.monotonic()
        elapsed = wall - self._wall if self._wall is not None else 0.0
        used = {tid: cpu[tid] - self._cpu.get(tid, 0.0) for tid in cpu}  # a new thread ran only since then
        self.series["job_threads"].append(len(cpu) or None)
        if elapsed > 0 and used:
            floor = max(1.0 / _TICK, _ACTIVE_SHARE * sum(used.values()))
            self.series["active_threads"].append(sum(1 for u in used.values() if u >= floor))
            self.series["cpu_cores"].append(round(sum(used.values()) / elapsed, 3))
        else:
            self.series["active_threads"].append(None)
            self.series["cpu_cores"].append(None)
        self._cpu, self._wall = cpu, wall
        self._knocker.reset_contention_metric()

    @staticmethod
    def _thread_cpu() -> dict[int, float]:
        out = {}
        for t in _job_threads():
            seconds = _cpu_seconds(t.native_id)
            if t.native_id is not None and seconds is not None:
                out[t.native_id] = seconds
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
