"""GIL contention per step, measured with gilknocker (a maintained Rust probe).

gilknocker runs a native thread that repeatedly tries to take the GIL and reports the fraction of time it had to
wait (0-1). It runs only during the profiled window, so steps outside it pay nothing.

The probe's wait alone is no proof of contention: a single busy Python thread makes it wait too (it holds the GIL
until the switch interval), and contention needs a contender. So each step also records the job's own Python threads
(ddpdoctor's ``ddpdoctor-*`` threads and the probe excluded), how many of them made progress (each at least 10% of
the CPU time the job's threads used in the step, from ``/proc/self/task/<tid>/stat``) and their CPU time together
against the step's wall time: threads that
are GIL-bound make progress one at a time (together about one core or less).

On Linux the probe is not gilknocker but ``gilwatch`` (ddpdoctor.capture.gilwatch), a process beside the rank that
samples which of its threads wait in a futex on the GIL, and how long they run: the ratio holds on a busy host,
where a starved probe thread under-reads, and it is no contender itself. gilknocker is the fallback where that
cannot run (another OS, /proc unreadable).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

from ddpdoctor.capture import hostload

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
# gilwatch's sampling interval: 2 ms, about 500 looks per second at each of the rank's threads
_WATCH_TICK_S = 0.002
_WATCH_ANSWER_S = 10.0  # how long the rank waits for its answers (a busy host starts a process slowly)


class _Watcher:
    """The rank's end of a gilwatch process (started once, used for every window)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.reason: str | None = None
        self._ok: bool | None = None
        self._buffer = b""
        self.cpu_s: float | None = None  # gilwatch's own CPU time, as it last reported
        if not sys.platform.startswith("linux"):
            self.reason = "gilwatch needs Linux's /proc"
            return
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gilwatch.py")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", script, str(os.getpid()), str(_WATCH_TICK_S)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True,
            )  # fmt: skip
        except OSError as exc:
            self.reason = f"gilwatch did not start: {exc}"
            return
        _allow_reading(self.proc.pid)
        hostload.own_helper(self.proc.pid)  # its CPU is ddpdoctor's, not the job's child processes'
        self._owner = os.getpid()
        atexit.register(self.close)  # a quiet exit (no "subprocess is still running" at the rank's shutdown)

    def ready(self) -> bool:
        if self._ok is None and self.proc is not None:
            answer = self._answer()
            self._ok = bool(answer and answer.get("ok"))
            if not self._ok:
                self.reason = str((answer or {}).get("error") or "gilwatch did not answer")
                self.close()
        return bool(self._ok)

    def send(self, line: str) -> bool:
        if self.proc is None or self.proc.stdin is None:
            return False
        try:
            os.write(self.proc.stdin.fileno(), (line + "\n").encode())
            return True
        except OSError as exc:
            self.reason = f"gilwatch stopped: {exc}"
            self.close()
            return False

    def _answer(self) -> dict | None:
        """The next JSON line gilwatch writes, None if none came in ``_WATCH_ANSWER_S`` or it is not one."""
        if self.proc is None or self.proc.stdout is None:
            return None
        fd, deadline = self.proc.stdout.fileno(), time.monotonic() + _WATCH_ANSWER_S
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0.0))
            chunk = os.read(fd, 1 << 16) if ready else b""
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            answer = json.loads(line)
        except ValueError:
            return None
        return answer if isinstance(answer, dict) else None

    def steps(self) -> list[dict] | None:
        answer = self._answer()
        steps = (answer or {}).get("steps")
        if isinstance((answer or {}).get("cpu_s"), (int, float)):
            self.cpu_s = float(answer["cpu_s"])  # type: ignore[index]
        return steps if isinstance(steps, list) else None

    def close(self) -> None:
        if getattr(self, "_owner", None) != os.getpid():
            return  # a forked child (a DataLoader worker) shares the pipe: the rank's gilwatch is not its to end
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            os.write(proc.stdin.fileno(), b"quit\n")  # type: ignore[union-attr]
        for stream in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError, ValueError):
                stream.close()  # type: ignore[union-attr]
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(subprocess.SubprocessError):
                proc.wait(timeout=2)
        hostload.own_helper_gone(proc.pid)  # reaped: its pid may be another process's from now on


def _allow_reading(pid: int) -> None:
    """Let the child read this process's /proc entries where Yama restricts that to ancestors (ptrace_scope 1)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(0x59616D61, pid, 0, 0, 0)  # PR_SET_PTRACER; EINVAL where Yama is absent, which is fine
    except (OSError, AttributeError):
        pass


def _tid_list(tids: list[int]) -> str:
    return ",".join(str(t) for t in tids) or "-"


def _ddpdoctor_tids() -> list[int]:
    return [t.native_id for t in threading.enumerate() if t.name.startswith("ddpdoctor") and t.native_id is not None]


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
        self._factory: Any = None
        self._watcher: _Watcher | None = None
        self._watching = False
        self._answers = 0  # windows gilwatch has yet to report
        self.watch_error: str | None = None
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
            # gilwatch's steps: the job's Python threads' time waiting for the GIL and running, and the samples of
            # those threads it took (ticks x threads)
            "gil_wait_s": [],
            "gil_run_s": [],
            "gil_ready_s": [],  # their time alive and not waiting for a CPU (running, waiting for the GIL, blocked)
            "gil_ticks": [],
        }
        self._times: dict[int, tuple[float, float, int]] = {}
        self._wall: float | None = None
        if not enabled:
            self.reason = "disabled with --no-gil"
            return
        self._watcher = _Watcher()  # starts now, answers by the first window
        try:
            from gilknocker import KnockKnock
        except ImportError as exc:  # pragma: no cover - it is a dependency
            if self._watcher.reason is not None:
                self.reason = f"gilknocker not importable: {exc}; {self._watcher.reason}"
            return
        self._factory = KnockKnock

    @property
    def available(self) -> bool:
        return self.reason is None

    @property
    def running(self) -> bool:
        return self._knocker is not None or self._watching

    def start(self) -> None:
        if not self.available or self.running:
            return
        self._collect()
        watcher = self._watcher
        if watcher is not None and watcher.ready():
            job, ours = _tid_list(self._job_tids()), _tid_list(_ddpdoctor_tids())
            self._watching = watcher.send(f"go {time.monotonic()!r} {job} {ours}")
        if watcher is not None and watcher.reason is not None:
            self.watch_error = watcher.reason
        if not self._watching:
            if self._factory is None:
                return
            self._knocker = self._factory(
                polling_interval_micros=_POLL_US,
                sampling_interval_micros=_SAMPLE_US,
                sleeping_interval_micros=_SLEEP_US,
            )
            self._knocker.start()
        self._times, self._wall = self._thread_times(), time.monotonic()

    def sample(self, step: int) -> None:
        if not self.running:
            return
        wall = time.monotonic()
        self.series["step"].append(step)
        if self._watching:
            line = f"step {step} {wall!r} {_tid_list(self._job_tids())} {_tid_list(_ddpdoctor_tids())}"
            self._watching = self._watcher is not None and self._watcher.send(line)
            self.series["contention"].append(None)  # filled in from gilwatch's answer (``_collect``)
        else:
            self.series["contention"].append(round(float(self._knocker.contention_metric), 4))
            self._knocker.reset_contention_metric()
        for key in ("gil_wait_s", "gil_run_s", "gil_ready_s", "gil_ticks"):
            self.series[key].append(None)
        self.series["threads"].append(threading.active_count())
        self.series["native_threads"].append(_native_threads())
        times = self._thread_times()
        elapsed = wall - self._wall if self._wall is not None else 0.0
        self.series["job_threads"].append(len(times) or None)
        for key, value in zip(_DERIVED, _step_values(times, self._times, elapsed), strict=True):
            self.series[key].append(value)
        self._times, self._wall = times, wall

    @staticmethod
    def _job_tids() -> list[int]:
        return [t.native_id for t in _job_threads() if t.native_id is not None]

    def _collect(self) -> None:
        """Fill in the steps of the windows gilwatch has not reported yet (``contention``: the GIL wait / that wait
        and the time on a CPU, ``metrics.capture.step_contention``)."""
        while self._answers and self._watcher is not None:
            self._answers -= 1
            steps = self._watcher.steps()
            if steps is None:
                self.watch_error = "gilwatch did not report a window"
                continue
            where = {step: i for i, step in enumerate(self.series["step"])}  # the last time each step was sampled
            for entry in steps:
                i = where.get(entry.get("step"))
                if i is None or self.series["gil_ticks"][i] is not None:
                    continue
                wait, run, ready = entry.get("wait_s"), entry.get("run_s"), entry.get("ready_s")
                ticks = entry.get("looks")
                if not all(isinstance(v, (int, float)) for v in (wait, run, ready, ticks)):
                    continue
                self.series["gil_wait_s"][i], self.series["gil_run_s"][i] = wait, run
                self.series["gil_ready_s"][i], self.series["gil_ticks"][i] = ready, ticks
                self.series["contention"][i] = round(wait / (wait + run), 4) if wait + run > 0 else None
                seen, counted = entry.get("active"), self.series["active_threads"][i]
                if isinstance(seen, int) and (counted is None or seen > counted):
                    self.series["active_threads"][i] = seen  # threads gone by the step's end (DataParallel's)

    @staticmethod
    def _thread_times() -> dict[int, tuple[float, float, int]]:
        out = {}
        for t in _job_threads():
            if t.native_id is not None and (times := _thread_times(t.native_id)) is not None:
                out[t.native_id] = times
        return out

    def stop(self) -> None:
        if self._watching:
            self._watching = False
            if self._watcher is not None and self._watcher.send(f"off {time.monotonic()!r}"):
                self._answers += 1
        if self._knocker is not None:
            try:
                self._knocker.stop()
            finally:
                self._knocker = None

    def to_json(self) -> dict[str, Any]:
        self._collect()
        watched = any(t is not None for t in self.series["gil_ticks"])
        return {
            "probe": "gilwatch" if watched else "gilknocker",
            "available": self.available,
            "reason": self.reason,
            "watch_error": self.watch_error,
            "watch_cpu_s": self._watcher.cpu_s if self._watcher is not None else None,
            "per_step": self.series,
        }
