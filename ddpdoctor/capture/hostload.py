"""The host's load during the profiled steps, as one rank saw it (Linux ``/proc``; "not recorded" elsewhere).

A rank that waits for a CPU (the host is busy with other processes) arrives late at the collectives exactly as a
rank with more work does; only the kernel's scheduler statistics tell them apart. Each profiled window (the
steps the profiler records, not its warm-up, and not the trace export that follows it) records:

- the process's CPU time and context switches (``getrusage``: user + system seconds, voluntary and involuntary
  switches, all threads);
- its threads' time on a CPU and waiting on a run queue (``/proc/self/task/<tid>/schedstat``: "time spent on the
  cpu", "time spent waiting on a runqueue", in ns, and the time slices run), summed over the threads, and the
  training loop's thread alone;
- the host: CPU time by kind over the window (``/proc/stat``'s ``cpu`` line, in clock ticks: busy, idle, iowait,
  steal), its online CPUs, the runnable tasks sampled at every step (``/proc/loadavg``'s 4th field; the sampling
  thread itself is one of them) and the 1-minute load average at the end;
- the CPU time of the process's descendants (``children_cpu_s``: its DataLoader workers, compile workers), so
  that the job's own processes are not taken for another's load: the live ones' user + system ticks from
  ``/proc/<pid>/stat`` (found by their parent pids where the window starts: ``/proc/<pid>/task/<tid>/children``
  is not on every kernel), and the reaped ones' from ``getrusage(RUSAGE_CHILDREN)``. ddpdoctor's own helper
  processes (the GIL probe, ``gilwatch``; registered with ``own_helper``) are not the job's: their CPU time is
  recorded apart (``probe_cpu_s``), so that neither the job's children nor other processes carry it.

Cost: one ``/proc/loadavg`` read and nothing else per step (microseconds); a read of every thread's schedstat
and of ``/proc/stat`` at the window's start and end; where it starts, before its first step's clock, a read of
every process's ``/proc/<pid>/stat`` (about 12 us each: 1 ms for 70 processes), and where it ends those of the
descendants found then. The metrics are in ``ddpdoctor.metrics.hostload``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# ddpdoctor's own helper processes of this process (gilwatch): their CPU is ddpdoctor's, not the job's children's
_OWN_HELPERS: set[int] = set()
_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")
NOT_LINUX = "no /proc scheduler statistics on this system (they are Linux's): the host's load was not recorded"


# ---- parsing (pure: tested on recorded text) ------------------------------------------------------------------
def parse_schedstat(text: str) -> tuple[int, int, int] | None:
    """``/proc/<pid>/task/<tid>/schedstat``: (ns on a CPU, ns waiting on a run queue, time slices run)."""
    fields = text.split()
    if len(fields) < 3:
        return None
    try:
        run, wait, slices = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        return None
    return (run, wait, slices) if min(run, wait, slices) >= 0 else None


def parse_proc_stat(text: str) -> dict[str, int] | None:
    """``/proc/stat``: the ``cpu`` line's fields (clock ticks, all CPUs together; fields a kernel lacks are 0),
    ``cpus`` (the ``cpuN`` lines: online CPUs), ``procs_running`` and ``procs_blocked`` (None if no ``cpu``
    line)."""
    out: dict[str, int] = {}
    cpus = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name == "cpu":
            values = rest.split()
            try:
                numbers = [int(v) for v in values[: len(_STAT_FIELDS)]]
            except ValueError:
                return None
            numbers += [0] * (len(_STAT_FIELDS) - len(numbers))
            out.update(zip(_STAT_FIELDS, numbers, strict=True))
        elif name.startswith("cpu") and name[3:].isdigit():
            cpus += 1
        elif name in ("procs_running", "procs_blocked"):
            try:
                out[name] = int(rest.strip())
            except ValueError:
                pass
    if "user" not in out:
        return None
    out["cpus"] = cpus
    return out


def parse_loadavg(text: str) -> tuple[float, int, int] | None:
    """``/proc/loadavg``: (1-minute load average, runnable tasks now, tasks in all)."""
    fields = text.split()
    try:
        load1 = float(fields[0])
        running, _, total = fields[3].partition("/")
        return load1, int(running), int(total)
    except (IndexError, ValueError):
        return None


def busy_ticks(stat: dict[str, int]) -> int:
    """CPU time (ticks) not idle: user (guest time is inside it), nice, system, irq, softirq, steal."""
    return sum(stat[k] for k in ("user", "nice", "system", "irq", "softirq", "steal"))


def total_ticks(stat: dict[str, int]) -> int:
    return busy_ticks(stat) + stat["idle"] + stat["iowait"]


# ---- reading ----------------------------------------------------------------------------------------------------
def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _threads() -> dict[int, tuple[int, int, int]]:
    """tid -> schedstat of every thread of this process (empty where ``/proc`` has none)."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        parsed = parse_schedstat(_read(f"/proc/self/task/{tid}/schedstat") or "")
        if parsed is not None and tid.isdigit():
            out[int(tid)] = parsed
    return out


def parse_pid_stat(data: bytes) -> tuple[int, int] | None:
    """``/proc/<pid>/stat``: (parent pid, user + system clock ticks), read after the command's closing
    parenthesis (a command may hold spaces and parentheses)."""
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return int(fields[1]), int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None


def descendants(pid: int, parents: dict[int, tuple[int, int]]) -> dict[int, int]:
    """pid -> clock ticks of every descendant of ``pid`` in ``parents`` (pid -> (parent pid, ticks))."""
    children: dict[int, list[int]] = {}
    for p, (parent, _) in parents.items():
        children.setdefault(parent, []).append(p)
    out: dict[int, int] = {}
    todo = list(children.get(pid, ()))
    while todo:
        p = todo.pop()
        if p not in out:
            out[p] = parents[p][1]
            todo.extend(children.get(p, ()))
    return out


def _descendant_ticks(known: dict[int, int] | None = None) -> dict[int, int] | None:
    """pid -> user + system clock ticks of this process's live descendants (its DataLoader workers, compile
    workers); None where ``/proc`` cannot be read. Without ``known``: one pass over every ``/proc/<pid>/stat``
    (no ``/proc/<pid>/task/<tid>/children`` on every kernel), made where a window starts, before its first step.
    With ``known`` (the descendants found then): only theirs are read, so that the window's last step is not
    lengthened by a pass over a host of thousands of processes (a descendant born inside the window and alive at
    its end is missed: its CPU counts as another process's, as it did before this was recorded)."""
    try:
        pids = list(known) if known is not None else [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return None
    parents: dict[int, tuple[int, int]] = {}
    for p in pids:
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                parsed = parse_pid_stat(f.read())
        except OSError:  # gone since the listing (or reaped since the window started)
            continue
        if parsed is not None:
            parents[p] = parsed
    if known is not None:
        return {p: ticks for p, (_, ticks) in parents.items()}
    return descendants(os.getpid(), parents)


def own_helper(pid: int) -> None:
    """``pid`` is a helper process ddpdoctor started beside this one (not the job's): its CPU time in a window is
    ``probe_cpu_s``, not ``children_cpu_s``."""
    _OWN_HELPERS.add(pid)


def own_helper_gone(pid: int) -> None:
    _OWN_HELPERS.discard(pid)


def probe_cpu_s(start: dict[int, int], end: dict[int, int]) -> float:
    """CPU seconds ddpdoctor's helpers alive at a window's end ran in it (descendants' ticks at its start and end;
    one born inside it ran only inside it). A helper reaped inside the window is not among them: its time stays in
    ``children_cpu_s`` (a helper ends with the run)."""
    return max(0.0, sum(t - start.get(p, 0) for p, t in end.items() if p in _OWN_HELPERS) / _TICK)


def children_cpu_s(start: dict[int, int], end: dict[int, int], reaped_start: float, reaped_end: float) -> float:
    """CPU seconds the descendants ran between two instants: the live ones' ticks, less those they had at the
    start (a descendant born in between ran only in between), and the reaped children's (``RUSAGE_CHILDREN``),
    less what those that were live at the start had then."""
    live = sum(t - start.get(p, 0) for p, t in end.items())
    gone = sum(t for p, t in start.items() if p not in end)
    return max(0.0, (live - gone) / _TICK + (reaped_end - reaped_start))


class _Snapshot:
    """The counters at one instant."""

    def __init__(self, main_tid: int | None, start: _Snapshot | None = None) -> None:
        """``start``: the window's first snapshot, when this is its last (its descendants only are read)."""
        if start is None:  # before the window's clock starts: the pass over /proc is not the window's time
            self.children = _descendant_ticks()
        else:
            self.children = None if start.children is None else _descendant_ticks(start.children)
        self.wall = time.monotonic()
        self.threads = _threads()
        self.main = self.threads.get(main_tid) if main_tid is not None else None
        self.stat = parse_proc_stat(_read("/proc/stat") or "")
        self.load = parse_loadavg(_read("/proc/loadavg") or "")
        self.reaped: float | None = None
        try:
            import resource

            usage = resource.getrusage(resource.RUSAGE_SELF)
            self.cpu: float | None = usage.ru_utime + usage.ru_stime
            self.switches: tuple[int, int] | None = (int(usage.ru_nvcsw), int(usage.ru_nivcsw))
            reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
            self.reaped = reaped.ru_utime + reaped.ru_stime
        except (ImportError, OSError):  # not POSIX
            self.cpu, self.switches = time.process_time(), None


class HostLoad:
    """Records the host's load over each profiled window (see the module docstring). ``step`` is called by the
    session at every step boundary, before the profiler moves on, with whether the iteration about to begin is
    recorded; ``stop`` at the end of the run."""

    def __init__(self) -> None:
        self.main_tid = threading.get_native_id()
        self.windows: list[dict[str, Any]] = []
        self.reason: str | None = None if os.path.exists("/proc/self/task") else NOT_LINUX
        self._start: _Snapshot | None = None
        self._first = 0
        self._runnable: list[int] = []

    @property
    def running(self) -> bool:
        return self._start is not None

    def step(self, iteration: int, recording: bool) -> None:
        """Iteration ``iteration`` is about to begin; ``recording``: the profiler records it."""
        try:
            if self._start is None:
                if recording:
                    self._start, self._first, self._runnable = _Snapshot(self.main_tid), iteration, []
            elif not recording:
                self._close(iteration - 1, complete=True)
            else:
                load = parse_loadavg(_read("/proc/loadavg") or "")
                if load is not None:
                    self._runnable.append(load[1])
        except Exception as exc:  # never break the run for it: say why instead
            self._start = None
            self.reason = f"recording the host's load failed: {type(exc).__name__}: {exc}"

    def stop(self, last_step: int) -> None:
        """The run ends (inside a window, or after it): a window still open ends at ``last_step``, the last step
        completed (its wall time runs to now: marked not ``complete``)."""
        if self._start is not None:
            try:
                self._close(last_step, complete=False)
            except Exception as exc:
                self._start = None
                self.reason = f"recording the host's load failed: {type(exc).__name__}: {exc}"

    def _close(self, last: int, complete: bool) -> None:
        start, self._start = self._start, None
        assert start is not None
        end = _Snapshot(self.main_tid, start)
        if last < self._first:
            return
        window: dict[str, Any] = {
            "first_step": self._first,
            "last_step": last,
            "complete": complete,
            "wall_s": round(end.wall - start.wall, 6),
            "cpu_s": round(end.cpu - start.cpu, 6) if end.cpu is not None and start.cpu is not None else None,
            "voluntary_switches": None,
            "involuntary_switches": None,
            "threads": len(end.threads) or None,
            "run_s": None,
            "run_delay_s": None,
            "timeslices": None,
            "main_run_s": None,
            "main_run_delay_s": None,
            "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        }
        if start.switches and end.switches:
            window["voluntary_switches"] = end.switches[0] - start.switches[0]
            window["involuntary_switches"] = end.switches[1] - start.switches[1]
        if end.threads:
            zero = (0, 0, 0)  # a thread started inside the window ran only inside it
            deltas = [
                tuple(e - s for e, s in zip(v, start.threads.get(t, zero), strict=True)) for t, v in end.threads.items()
            ]
            window["run_s"] = round(sum(d[0] for d in deltas) / 1e9, 6)
            window["run_delay_s"] = round(sum(d[1] for d in deltas) / 1e9, 6)
            window["timeslices"] = sum(d[2] for d in deltas)
        if start.main is not None and end.main is not None:
            window["main_run_s"] = round((end.main[0] - start.main[0]) / 1e9, 6)
            window["main_run_delay_s"] = round((end.main[1] - start.main[1]) / 1e9, 6)
        if start.stat is not None and end.stat is not None:
            window["host_cpus"] = end.stat["cpus"] or None
            window["host_total_s"] = round((total_ticks(end.stat) - total_ticks(start.stat)) / _TICK, 3)
            window["host_busy_s"] = round((busy_ticks(end.stat) - busy_ticks(start.stat)) / _TICK, 3)
            window["host_steal_s"] = round((end.stat["steal"] - start.stat["steal"]) / _TICK, 3)
            window["host_iowait_s"] = round((end.stat["iowait"] - start.stat["iowait"]) / _TICK, 3)
        samples = self._runnable + [x[1] for x in (start.load, end.load) if x is not None]
        if samples:
            window["runnable_mean"] = round(sum(samples) / len(samples), 3)
            window["runnable_max"] = max(samples)
        if end.load is not None:
            window["load1"] = end.load[0]
        if None not in (start.children, end.children, start.reaped, end.reaped):
            assert start.children is not None and end.children is not None
            total = children_cpu_s(start.children, end.children, start.reaped, end.reaped)
            probe = probe_cpu_s(start.children, end.children) if _OWN_HELPERS & end.children.keys() else None
            window["children_cpu_s"] = round(max(0.0, total - (probe or 0.0)), 3)
            if probe is not None:
                window["probe_cpu_s"] = round(probe, 3)
        self.windows.append(window)

    def to_json(self) -> dict[str, Any]:
        return {"source": "procfs", "reason": self.reason, "windows": list(self.windows)}


def recording_next(prof: Any) -> bool:
    """Whether torch.profiler's next step (the iteration about to begin) is recorded: asked of its schedule
    before ``prof.step()``, so the window closes before the trace export that ends it."""
    from torch.profiler import ProfilerAction

    try:
        action = prof.schedule(prof.step_num + 1)
    except Exception:
        return False
    return action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
