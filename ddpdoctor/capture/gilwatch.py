"""How long a process's Python threads wait for the GIL, sampled from outside it (run as a script beside the rank).

A thread waiting for the GIL sleeps in a futex on CPython's runtime state (the GIL's mutex and condition variables
live in ``_PyRuntime``, in the writable mapping of libpython, or of the python executable where it is linked in);
Python's own locks, queues, events and futures wait on semaphores on the heap, sleeps and I/O in other system calls,
and a thread the host keeps off its CPU is runnable, in no system call at all. So every ``tick`` this process reads
each of the rank's threads' ``/proc/<pid>/task/<tid>/syscall`` (is it in a futex on the runtime's state?) and
``schedstat`` (nanoseconds on a CPU, and runnable waiting for one), and per step adds up, over the job's Python
threads with work, the time waited for the GIL (samples x tick), the time on a CPU, and the time alive and not
waiting for a CPU. ``ddpdoctor.metrics.capture`` takes the GIL wait over that wait plus the time on a CPU: how much
of the time the threads were working, or trying to, they spent waiting for the GIL (time blocked in a queue, a sleep
or I/O says nothing of the GIL, and is left out). Threads competing one for one with other work for the CPUs do not
move it much (measured on 2 cores: 4 threads of small torch ops 0.32-0.39 quiet, 0.27-0.39 beside 2 CPU burners;
4 threads in large matmuls, or sleeping, 0.00). Where the kernel rations the CPUs between sessions and the job gets
fewer than its threads want, they take turns on the CPU instead and the ratio falls: ddpdoctor.metrics.capture
says so rather than pass.

It is its own process so that it takes no GIL of the rank's: a sampler thread inside the rank would hold the GIL
whenever it looks and be a contender itself. It imports nothing but the standard library.

Protocol (``python -I -S gilwatch.py <pid> <tick_s>``), one line each way. First it answers ``{"ok": true}`` or
``{"error": "..."}`` (then exits). Then the rank writes, at each boundary:

- ``go <t> <job tids> <ddpdoctor's tids>``: start sampling (``t`` is the rank's ``time.monotonic()``; a tid list is
  comma-separated, ``-`` for none);
- ``step <n> <t> <job tids> <ddpdoctor's tids>``: step ``n`` ended at ``t``: the ticks since the last boundary are
  step ``n``'s;
- ``off <t>``: stop sampling, and answer one JSON line ``{"steps": [{"step", "wait_s", "run_s", "threads",
  "active", "ticks", "looks"}, ...]}`` for the steps since ``go`` (``active``: the Python threads with work in the
  step; ``looks``: the samples of those Python threads, ticks x threads), and ``"cpu_s"``, its own CPU time so far;
- ``quit``: exit (so does end of input, and the rank's death).

A step's Python threads are the job's threads the rank listed (its ``threading`` threads, ddpdoctor's excluded) and
any other thread seen waiting for the GIL in it (only a thread that takes the GIL waits for it: DataParallel's
replica threads live only inside a forward, and are gone when the step ends).
"""

from __future__ import annotations

import json
import os
import platform
import select
import sys
import time

# futex's system call number per machine; elsewhere nothing can be sampled
FUTEX = {"x86_64": b"202", "aarch64": b"98", "riscv64": b"98", "ppc64le": b"221", "s390x": b"238"}
RUNNING, GIL, OTHER = 0, 1, 2
# a thread had work in a step when it ran this share of the busiest thread's CPU time, and this long (as the rank's
# own count, ddpdoctor.capture.gil: here it also sees threads that were gone by the step's end)
ACTIVE_SHARE, ACTIVE_MIN_S = 0.25, 0.001


def runtime_ranges(pid: int) -> list[tuple[int, int]]:
    """Writable mappings of the process's libpython, else of its executable: where ``_PyRuntime`` lives."""
    exe = os.path.realpath(f"/proc/{pid}/exe")
    with open(f"/proc/{pid}/maps") as f:
        maps = [line.split() for line in f]
    writable = [(m[0], m[5]) for m in maps if len(m) >= 6 and "w" in m[1]]
    for wanted in (lambda p: "/libpython" in p, lambda p: os.path.realpath(p) == exe):
        ranges = [tuple(int(v, 16) for v in span.split("-")) for span, path in writable if wanted(path)]
        if ranges:
            return ranges  # type: ignore[return-value]
    return []


def classify(text: bytes, futex: bytes, ranges: list[tuple[int, int]]) -> int:
    """RUNNING (on a CPU or runnable: ``running``, or ``-1`` outside a system call), GIL (a futex on the runtime's
    state) or OTHER (any other system call) from one ``syscall`` line."""
    fields = text.split(None, 2)
    if not fields or fields[0] in (b"running", b"-1"):
        return RUNNING
    if fields[0] != futex or len(fields) < 2:
        return OTHER
    try:
        address = int(fields[1], 16)
    except ValueError:
        return OTHER
    return GIL if any(lo <= address < hi for lo, hi in ranges) else OTHER


def _tids(field: str) -> set[int]:
    return set() if field == "-" else {int(t) for t in field.split(",") if t}


class Watch:
    """The ticks of one process's threads and their tally per step."""

    def __init__(self, pid: int, futex: bytes, ranges: list[tuple[int, int]]) -> None:
        self.pid, self.futex, self.ranges = pid, futex, ranges
        self.fds: dict[int, tuple[int, int]] = {}  # tid: (syscall fd, schedstat fd)
        # (time, {tid: (state, ns on a CPU, ns runnable waiting for a CPU)})
        self.ticks: list[tuple[float, dict[int, tuple[int, int, int]]]] = []
        self.base: dict[int, tuple[int, int]] = {}  # each thread's ns on a CPU and waiting for one at the last boundary
        self.steps: list[dict] = []
        self.job: set[int] = set()
        self.ours: set[int] = set()
        self.last_t: float | None = None
        self.on = False

    def tick(self) -> None:
        now = time.monotonic()
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{self.pid}/task")]
        except OSError:
            return
        seen: dict[int, tuple[int, int, int]] = {}
        for tid in tids:
            if tid in self.ours:
                continue
            try:
                fds = self.fds.get(tid)
                if fds is None:
                    base = f"/proc/{self.pid}/task/{tid}"
                    fds = self.fds[tid] = (
                        os.open(f"{base}/syscall", os.O_RDONLY),
                        os.open(f"{base}/schedstat", os.O_RDONLY),
                    )
                state = classify(os.pread(fds[0], 96, 0), self.futex, self.ranges)
                run_ns, queue_ns = (int(v) for v in os.pread(fds[1], 64, 0).split()[:2])
            except (OSError, ValueError, IndexError):
                self._close(tid)
                continue
            seen[tid] = (state, run_ns, queue_ns)
        for gone in set(self.fds) - set(tids):
            self._close(gone)
        self.ticks.append((now, seen))

    def _close(self, tid: int) -> None:
        for fd in self.fds.pop(tid, ()):
            os.close(fd)

    def start(self, job: set[int], ours: set[int]) -> None:
        self.job, self.ours, self.on = job, ours, True
        self.ticks, self.steps, self.base, self.last_t = [], [], {}, None
        self.tick()
        for tid, (_, run_ns, queue_ns) in self.ticks[0][1].items():
            self.base[tid] = (run_ns, queue_ns)  # threads alive at the start ran before it; one born later from 0

    def boundary(self, step: int, t: float, job: set[int], ours: set[int]) -> None:
        mine = [k for k in self.ticks if k[0] <= t]
        self.ticks = [k for k in self.ticks if k[0] > t]
        start = self.last_t if self.last_t is not None else (mine[0][0] if mine else t)
        duration = max(t - start, 0.0)
        self.last_t = t
        gil: dict[int, int] = {}
        looks: dict[int, int] = {}
        last: dict[int, tuple[int, int]] = {}
        for _, seen in mine:
            for tid, (state, run_ns, queue_ns) in seen.items():
                gil[tid] = gil.get(tid, 0) + (state == GIL)
                looks[tid] = looks.get(tid, 0) + 1
                last[tid] = (run_ns, queue_ns)
        python = (self.job | {tid for tid, n in gil.items() if n}) - self.ours
        dt = duration / len(mine) if mine else 0.0
        ran, queued = {}, {}
        for tid in python & set(last):
            run0, queue0 = self.base.get(tid, (0, 0))
            ran[tid] = max(last[tid][0] - run0, 0) / 1e9
            queued[tid] = max(last[tid][1] - queue0, 0) / 1e9
        floor = max(ACTIVE_MIN_S, ACTIVE_SHARE * max(ran.values(), default=0.0))
        active = [tid for tid, v in ran.items() if v >= floor]  # a main thread that waits for its workers is not
        wait_s = sum(gil.get(tid, 0) for tid in active) * dt
        # the time each thread was alive in the step and not waiting for a CPU: running, waiting for the GIL, or
        # blocked in anything else (a sleep, I/O, a lock)
        ready = sum(max(looks[tid] * dt - queued[tid], gil.get(tid, 0) * dt + ran[tid]) for tid in active)
        self.steps.append(
            {
                "step": step,
                "wait_s": round(wait_s, 6),
                "run_s": round(sum(ran[tid] for tid in active), 6),
                "ready_s": round(ready, 6),
                "threads": len(ran),
                "active": len(active),
                "ticks": len(mine),
                "looks": sum(looks.get(tid, 0) for tid in active),
            }  # fmt: skip
        )
        self.base.update(last)
        self.job, self.ours = job, ours

    def stop(self) -> dict:
        self.on = False
        times = os.times()
        out = {"steps": self.steps, "cpu_s": round(times.user + times.system, 3)}  # its own cost, since it started
        self.ticks, self.steps = [], []
        return out


def main(argv: list[str]) -> int:
    pid, tick_s = int(argv[0]), float(argv[1])
    futex = FUTEX.get(platform.machine())
    try:
        ranges = runtime_ranges(pid)
        with open(f"/proc/{pid}/task/{pid}/syscall", "rb") as f:
            f.read()
    except OSError as exc:
        return _say({"error": f"cannot read /proc/{pid}/task/<tid>/syscall: {exc.strerror or exc}"}, 0)
    if futex is None:
        return _say({"error": f"no futex system call number known for {platform.machine()}"}, 0)
    if not ranges:
        return _say({"error": "no writable mapping of libpython or of the python executable"}, 0)
    _say({"ok": True})
    watch = Watch(pid, futex, ranges)
    pending = b""
    while True:
        ready, _, _ = select.select([0], [], [], tick_s if watch.on else 1.0)
        if os.getppid() != pid:
            return 0  # the rank died
        if not ready:
            if watch.on:
                watch.tick()
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return 0
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if _command(watch, line.decode().split()) == "quit":
                return 0


def _command(watch: Watch, words: list[str]) -> str | None:
    if not words or words[0] == "quit":
        return "quit"
    if words[0] == "go" and len(words) == 4:
        watch.start(_tids(words[2]), _tids(words[3]))
    elif words[0] == "step" and len(words) == 5 and watch.on:
        watch.boundary(int(words[1]), float(words[2]), _tids(words[3]), _tids(words[4]))
    elif words[0] == "off":
        _say(watch.stop())
    return None


def _say(message: dict, code: int | None = None) -> int | None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
