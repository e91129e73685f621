"""The host's load during the profiled steps, from what each rank recorded (``ranks/rank<R>.json``, key
``"hostload"``, written by ``ddpdoctor/capture/hostload.py``): whether a rank waited for a CPU, and whether that,
not more work of its own, is why the others waited for it at the collectives.

A rank on a busy host is late at the collectives as a rank with more work is; the kernel's scheduler tells them
apart. The training loop's thread (the one that steps) is the rank's critical path: its time *waiting on a run
queue* (runnable, no CPU to run on) is time the host took from the rank; its time *on a CPU* is its work. Per rank
and profiled step: ``cpu_wait_ms`` (waiting) and ``loop_cpu_ms`` (working). A rank that arrived last at the
collectives (``wait_caused_ms``: the others' wait for it per step) is **starved** (``cpu_starved``) when

- it waited for a CPU at least ``STARVED_SHARE`` of that lateness more than the other ranks did (the median of
  theirs), and
- its extra work, at the share of the CPU it got, accounts for less than ``STARVED_SHARE`` of it (a rank with
  more work on a busy host also waits more: it is slow by its own work, the host only magnifies it).

A rank that sleeps or computes more each step stays a straggler on a loaded host: its extra time is not run-queue
wait. ``late_own_ms`` is the part of its lateness its extra run-queue wait does not explain (the lateness less
that wait): where it is large (the rules' thresholds), the rank is a straggler of its own even when the host
starved it too (a rank that sleeps 100 ms a step and also waits 250 ms for a CPU). The scheduler measures that
part too, as the time it worked or was blocked beyond the others: its extra CPU time and its extra time neither
on a CPU nor waiting for one outside the collectives (``loop_blocked_ms`` less its ``collective_wait_ms``, or
its ``exposed_comm_ms`` where larger: asleep, blocked on data, I/O or a lock); where both are known,
``late_own_ms`` is the smaller of the two measures. (A balanced tensor-parallel job on a busy host: a rank 20.4 ms
late, 12.9 ms of it more run-queue wait than the other's, left 7.5 ms "of its own" by the first measure, with less
CPU time than the other and as long blocked: none by the second. It is starved, not a straggler.)

A rank can be late on a busy host without waiting for a CPU: it ran, but slower (ranks, their communication
threads and the profiler sharing too few cores, their caches and memory bandwidth): its extra time is CPU time,
as that of a rank with more work. The CPU ops of the ranks' traces tell them apart (``ddpdoctor.metrics.same_work``):
a rank is ``same_work_slower`` when the ranks share one host with more runnable threads than CPUs
(``host_runnable_per_cpu`` >= ``OVERSUBSCRIBED``), it ran the ops the others ran (``extra_ops_ms``, the time of
its ops beyond theirs, under ``SAME_OPS_SHARE`` of its lateness), the ops were slower, and what is left of its
own is not large by rank-straggler's own test (``OWN_MS``/``OWN_STEP_SHARE``/``OWN_SHARE``). Its own is two parts:

- its extra CPU time that its ops do not show. The same work run slower is slower everywhere, so the ops, which
  take a share f of the others' busy time (top-level op time / CPU time and run-queue wait of their loop), carry
  about f of its extra CPU time (and f of its extra wait, as the preemptions fall where they fall); work of its own
  between the ops (Python that calls no op, extra ops of another kind) leaves them as fast, their extra time f of
  the wait alone. What the ops carry beyond f times its extra wait, divided by ``SLOWER_OPS_SHARE`` times f, is the
  part of its extra CPU time the same work explains (ops that carry half their share explain all of it: measured
  on 2 CPUs, 0.46-3.0 of their share for ranks late by CPU time with the same ops, -1.4 to +0.22 for a rank with
  5 ms of pure Python or extra matmuls); the rest is work of its own. (A balanced job, named in 1 run of 16 when
  the ops had to carry half or the rank was its own: 46% of its share, 5.8 ms more CPU time in a 95 ms step;
  0.5 ms of its own now.)
- what its extra CPU time and run-queue wait leave of its lateness: time the rank spent neither on a CPU nor
  waiting for one (asleep, blocked on data, I/O or a lock), which the scheduler measures too: ``loop_blocked_ms``
  (the window's wall time less the loop's CPU time and run-queue wait, per step) less the rank's wait in the
  collectives; the smaller of the two measures, its excess over the others'. (A balanced tensor-parallel job on a
  busy host: the late rank's CPU time and wait left 5.6 ms of an 18 ms lateness, but it was blocked outside the
  collectives 6.4 ms a step and the other rank 6.6 ms: none of its own.)

Where every slow rank is, ``slow_rank_cause_known`` is None: a slower rank cannot be told from a slower share of the
host, and rank-straggler is not evaluated. The ``--steps`` range of ``diagnose`` does not narrow these: they cover
the profiled windows.

Pure functions of the capture dicts; no trace needed. Runs without the record (foreign traces, not Linux, runs
traced by an older ddpdoctor) get None and the reason in ``not_measured``.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from ddpdoctor.metrics import catalog
from ddpdoctor.metrics.same_work import compare

HOSTLOAD_RANK_METRICS = catalog.names("rank", "hostload")
HOSTLOAD_RUN_METRICS = catalog.names("run", "hostload")

# A rank's lateness is the host's when its extra run-queue wait is at least this share of it (and its extra work
# is less than that share).
STARVED_SHARE = 0.5
# The host was contended when a rank's training loop waited for a CPU this share of the window or more, or the
# hypervisor took this share of the host's CPU time (steal).
CONTENDED_WAIT_SHARE = 0.1
# Below CONTENDED_WAIT_SHARE but from this share on, the report's line says there was some contention ("no
# contention" beside "waited 9% of the window for a CPU" read as a contradiction).
NOTICED_WAIT_SHARE = 0.02
CONTENDED_STEAL_SHARE = 0.05

# Same work, slower (module docstring): more runnable threads per CPU than this on a host all ranks share; ops only
# the rank ran under SAME_OPS_SHARE of its lateness; ops slower by SLOWER_OPS_SHARE of their share of its extra CPU
# time (beyond their share of its extra wait) explain all of it; its own (the extra CPU time they do not explain,
# and the lateness its extra CPU time and wait leave) is large when over all three of rank-straggler's min_own_ms,
# min_own_share (of the step) and own_share (of the lateness): the same numbers (tests/unit/test_same_work.py).
OVERSUBSCRIBED = 1.0
SAME_OPS_SHARE = 0.2
SLOWER_OPS_SHARE = 0.5
OWN_MS, OWN_STEP_SHARE, OWN_SHARE = 2.0, 0.05, 0.2

ONE_HOST_ONLY = (
    "a rank's CPU ops are compared with the others' only where all ranks share one host (these ran on several, or"
    " their host is unknown): ranks of several hosts run on CPUs of their own"
)
NOT_RECORDED = "the host's load was not recorded (only `ddpdoctor trace` runs on Linux record it)"


def _windows(capture: Mapping[str, Any] | None) -> tuple[list[dict[str, Any]], str | None]:
    """The rank's complete windows (all of them when none is complete), or [] and why."""
    record = (capture or {}).get("hostload")
    if not isinstance(record, dict):
        return [], NOT_RECORDED if capture else "no rank file (a foreign trace): the host's load was not recorded"
    windows = [w for w in record.get("windows") or [] if isinstance(w, dict) and (w.get("wall_s") or 0) > 0]
    if not windows:
        return [], record.get("reason") or "the host's load was recorded in no profiled window"
    complete = [w for w in windows if w.get("complete", True)]
    return complete or windows, None


def _sum(windows: list[dict[str, Any]], key: str) -> float | None:
    if len(windows) == 1:  # the usual profiled window: sum() of one value is 0 + it
        value = windows[0].get(key)
        return None if value is None else float(0 + value)
    values = [w.get(key) for w in windows]
    if any(v is None for v in values):
        return None
    return float(sum(values))


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def rank_hostload(capture: Mapping[str, Any] | None) -> tuple[dict[str, Any], str | None]:
    """One rank's own host-load metrics (those that need the other ranks are None here) and, when there are
    none, why. Units: ms per profiled step, ratios 0-1, cores (CPU seconds per second)."""
    return _rank_hostload(*_windows(capture))


def _rank_hostload(windows: list[dict[str, Any]], why: str | None) -> tuple[dict[str, Any], str | None]:
    """``rank_hostload`` of the rank's ``_windows`` (found once a rank for it and ``_busy_cores``)."""
    out: dict[str, Any] = dict.fromkeys(HOSTLOAD_RANK_METRICS)
    if not windows:
        return out, why
    steps = sum(int(w.get("last_step", 0)) - int(w.get("first_step", 0)) + 1 for w in windows)
    wall = _sum(windows, "wall_s") or 0.0
    run, delay = _sum(windows, "main_run_s"), _sum(windows, "main_run_delay_s")
    if run is None or delay is None:
        why = "the training loop's scheduler statistics were not recorded (/proc/<pid>/task/<tid>/schedstat)"
    else:
        out["cpu_wait_ms"] = 1e3 * delay / steps
        out["loop_cpu_ms"] = 1e3 * run / steps
        out["loop_blocked_ms"] = 1e3 * max(0.0, wall - run - delay) / steps
        out["cpu_wait_share"] = min(1.0, delay / wall)
        out["cpu_got_ratio"] = run / (run + delay) if run + delay > 0 else None
        every = _sum(windows, "run_delay_s")  # every thread's wait, the loop's among them
        if every is not None:
            out["other_threads_cpu_wait_ms"] = 1e3 * max(0.0, every - delay) / steps
    out["cpu_used_cores"] = _ratio(_sum(windows, "cpu_s"), wall)
    switches = _sum(windows, "involuntary_switches")
    out["involuntary_switches_per_step"] = switches / steps if switches is not None else None
    total = _sum(windows, "host_total_s")
    out["host_cpu_busy_ratio"] = _ratio(_sum(windows, "host_busy_s"), total)
    out["host_steal_ratio"] = _ratio(_sum(windows, "host_steal_s"), total)
    cpus = windows[-1].get("host_cpus")
    runnable = _sum([{"r": (w.get("runnable_mean") or 0) * w["wall_s"]} for w in windows], "r")
    if cpus and all(w.get("runnable_mean") is not None for w in windows):
        out["host_runnable_per_cpu"] = runnable / wall / cpus
    return out, why


def hostload_metrics(
    captures: Mapping[int, Mapping[str, Any]],
    ranks: list[dict[str, Any]],
    work: Mapping[int, Mapping[str, Any] | None] | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Fill every rank's host-load metrics in ``ranks`` (rows of ``RunMetrics.ranks``, with ``wait_caused_ms``
    from the cross-rank matching) and return the run-level ones and the reasons for what is missing. ``work``:
    each rank's CPU ops per step (``same_work.op_work``), where its trace has them."""
    why: dict[int, str] = {}
    own: dict[int, dict[str, Any]] = {}
    for row in ranks:
        rank = int(row["rank"])
        capture = captures.get(rank)
        windows, reason = _windows(capture)
        metrics, reason = _rank_hostload(windows, reason)
        own[rank] = metrics
        if reason:
            why[rank] = reason
        host = (capture or {}).get("hostname")
        metrics["_host"] = host
        metrics["_busy_cores"] = _busy_cores(windows)
        metrics["_children_cores"] = _ratio(_sum(windows, "children_cpu_s"), _sum(windows, "wall_s"))
        metrics["_probe_cores"] = _ratio(_sum(windows, "probe_cpu_s"), _sum(windows, "wall_s"))
    # other processes' CPU on each rank's host: the host's busy cores less this job's ranks on it, their child
    # processes (DataLoader workers: the job's own load, not another's; not recorded before 2026-12-07: 0 then) and
    # ddpdoctor's helpers beside them (the GIL probe: ddpdoctor's load; with the children in a capture without it)
    job_cores: dict[Any, float] = {}
    children: dict[Any, float] = {}
    probes: dict[Any, float] = {}
    for m in own.values():
        if m["_host"] is not None and m["cpu_used_cores"] is not None:
            job_cores[m["_host"]] = job_cores.get(m["_host"], 0.0) + m["cpu_used_cores"]
            if m["_children_cores"] is not None:
                children[m["_host"]] = children.get(m["_host"], 0.0) + m["_children_cores"]
            if m["_probe_cores"] is not None:
                probes[m["_host"]] = probes.get(m["_host"], 0.0) + m["_probe_cores"]
    for m in own.values():
        busy = m.pop("_busy_cores")
        host = m.pop("_host")
        m.pop("_children_cores")
        m.pop("_probe_cores")
        if busy is not None and host in job_cores:
            m["other_cpu_cores"] = max(0.0, busy - job_cores[host] - children.get(host, 0.0) - probes.get(host, 0.0))
            m["job_children_cpu_cores"] = children.get(host)
            m["probe_cpu_cores"] = probes.get(host)
    waits = {r: m["cpu_wait_ms"] for r, m in own.items() if m["cpu_wait_ms"] is not None}
    # the others' medians, each rank left out: sorted once (O(ranks log ranks), not a sort per rank)
    wait_medians = _LeaveOneOutMedian(waits.values())
    work_medians = _LeaveOneOutMedian(own[r]["loop_cpu_ms"] for r in waits)
    blocked = _blocked_outside_collectives(
        (
            row["rank"],
            own[int(row["rank"])].get("loop_blocked_ms"),
            row.get("collective_wait_ms"),
            row.get("exposed_comm_ms"),
        )
        for row in ranks
    )
    blocked_medians = _LeaveOneOutMedian(blocked.values())
    for row in ranks:
        rank = int(row["rank"])
        m = own[rank]
        others = len(waits) - (rank in waits)
        if m["cpu_wait_ms"] is not None and others:
            typical = wait_medians.without(m["cpu_wait_ms"])
            m["cpu_wait_excess_ms"] = m["cpu_wait_ms"] - typical
            work_excess = m["loop_cpu_ms"] - work_medians.without(m["loop_cpu_ms"])
            m["cpu_starved"] = starved(
                lateness_ms=row.get("wait_caused_ms"),
                wait_excess_ms=m["cpu_wait_excess_ms"],
                work_excess_ms=work_excess,
                got_ratio=m["cpu_got_ratio"],
            )
            lateness = row.get("wait_caused_ms")
            if lateness is not None:
                m["late_own_ms"] = max(0.0, lateness - max(0.0, m["cpu_wait_excess_ms"]))
                blocked_excess = _excess(blocked, blocked_medians, rank)
                if blocked_excess is not None:  # the scheduler's measure of the same (docstring)
                    measured = max(0.0, work_excess) + max(0.0, blocked_excess)
                    m["late_own_ms"] = min(m["late_own_ms"], measured)
        m["dataloader_own_ms"] = dataloader_own(row, m)
        row.update(m)
    shared = _same_work(captures, ranks, work or {}, work_medians, blocked, blocked_medians)
    run = _run_level(ranks)
    reasons = _reasons(why, ranks, run)
    if not shared and not why:
        for name in catalog.group("same_work"):
            reasons[name] = ONE_HOST_ONLY
    run["slow_rank_cause_known"], doubt = cause_known(ranks, blocked, blocked_medians)
    run["slow_ranks_same_work"] = doubt is not None
    reasons.pop("slow_rank_cause_known", None)
    reasons.pop("slow_ranks_same_work", None)
    if doubt:
        reasons["slow_rank_cause_known"] = doubt
    return run, reasons


def _same_work(
    captures: Mapping[int, Mapping[str, Any]],
    ranks: list[dict[str, Any]],
    work: Mapping[int, Mapping[str, Any] | None],
    work_medians: _LeaveOneOutMedian,
    blocked: Mapping[int, float],
    blocked_medians: _LeaveOneOutMedian,
) -> bool:
    """``extra_ops_ms``, ``ops_slower_ms`` and ``same_work_slower`` of every rank (module docstring), where all
    ranks share one host (then there are few: one rank's ops are compared with every other's); whether they do."""
    hosts = {(captures.get(int(r["rank"])) or {}).get("hostname") for r in ranks}
    shared = len(ranks) >= 2 and len(hosts) == 1 and None not in hosts  # every rank on one host
    if not shared:
        return False
    steps = [r["step_ms_median"] for r in ranks if r.get("step_ms_median")]
    step_ms = sum(steps) / len(steps) if steps else None
    for row in ranks:
        rank = int(row["rank"])
        mine = work.get(rank)
        others = [w for r, w in work.items() if r != rank and w]
        if not mine or not others or len(others) < len(ranks) - 1:
            continue
        row["extra_ops_ms"], row["ops_slower_ms"] = compare(mine, others)
        if row.get("loop_cpu_ms") is None or row.get("cpu_wait_excess_ms") is None or not step_ms:
            continue
        peers = [r for r in ranks if int(r["rank"]) != rank]
        busy = [r["loop_cpu_ms"] + r["cpu_wait_ms"] for r in peers if r.get("loop_cpu_ms") is not None]
        idle_excess = _excess(blocked, blocked_medians, rank)
        op_ms = statistics.median(sum(v[2] for v in w.values()) for w in others)
        share = min(1.0, op_ms / statistics.median(busy)) if busy and statistics.median(busy) > 0 else None
        row["same_work_slower"] = same_work_slower(
            lateness_ms=row.get("wait_caused_ms"),
            extra_ops_ms=row["extra_ops_ms"],
            ops_slower_ms=row["ops_slower_ms"],
            cpu_excess_ms=row["loop_cpu_ms"] - work_medians.without(row["loop_cpu_ms"]),
            wait_excess_ms=row["cpu_wait_excess_ms"],
            step_ms=step_ms,
            runnable_per_cpu=row.get("host_runnable_per_cpu"),
            ops_share=share,
            idle_excess_ms=idle_excess,
        )
    return True


def dataloader_own(row: Mapping[str, Any], load: Mapping[str, Any]) -> float | None:
    """``dataloader_own_ms``: the rank's wait for data (``dataloader_ms``), less all of its loop's run-queue wait
    where the loop waited ``CONTENDED_WAIT_SHARE`` of the window or more for a CPU and loads its batches itself (no
    DataLoader workers: the loading runs in the loop, and the host's load stretches it as much as its own work)."""
    data = row.get("dataloader_ms")
    if data is None:
        return None
    share, wait = load.get("cpu_wait_share"), load.get("cpu_wait_ms")
    if share is None or wait is None or share < CONTENDED_WAIT_SHARE or (row.get("dataloader_workers") or 0) > 0:
        return data
    return max(0.0, data - wait)


def _blocked_outside_collectives(ranks: Iterable[tuple[int, Any, Any, Any]]) -> dict[int, float]:
    """Per rank, the time per step its training loop was blocked or asleep outside the collectives: its
    ``loop_blocked_ms`` less its time in them, where both are known. ``ranks``: (rank, loop_blocked_ms,
    collective_wait_ms, exposed_comm_ms) of each. Its time in them is its wait for the others
    (``collective_wait_ms``) or, where larger, its exposed communication (``exposed_comm_ms``: wait and transfer
    with nothing computing beside them, when the loop blocks for them). The wait alone left out the transfer the
    late rank waits for too, and counted the early ranks' wait hidden under their backward: beside CPU burners,
    where gloo's threads wait for a CPU and transfer stretches, a balanced job's late rank was "blocked outside
    the collectives" 10.4 ms a step more than the other, its exposed transfer, and named a straggler on it."""
    out = {}
    for rank, blocked, waited, exposed in ranks:
        if blocked is not None and waited is not None and math.isfinite(blocked) and math.isfinite(waited):
            inside = max(waited, exposed) if exposed is not None and math.isfinite(exposed) else waited
            out[int(rank)] = max(0.0, blocked - inside)
    return out


def _excess(blocked: Mapping[int, float], medians: _LeaveOneOutMedian, rank: int) -> float | None:
    """The rank's blocked time outside the collectives less the other ranks' median; None without both."""
    return blocked[rank] - medians.without(blocked[rank]) if rank in blocked and len(blocked) > 1 else None


def same_work_slower(
    *,
    lateness_ms: float | None,
    extra_ops_ms: float,
    ops_slower_ms: float,
    cpu_excess_ms: float,
    wait_excess_ms: float,
    step_ms: float,
    runnable_per_cpu: float | None,
    ops_share: float | None,
    idle_excess_ms: float | None = None,
) -> bool | None:
    """Whether a rank's lateness (the others' wait for it per step) is the same work run slower on an
    oversubscribed host the ranks share (module docstring). ``runnable_per_cpu``: None when the ranks do not all
    share the host (False then: ranks of several hosts run on CPUs of their own); ``ops_share``: the others'
    top-level op time per step / their loop's CPU time and wait (None: unknown, False then); ``idle_excess_ms``:
    its time blocked or asleep outside the collectives per step less the others' (None: unknown). None when its
    lateness is unknown."""
    if lateness_ms is None:
        return None
    if lateness_ms <= 0 or runnable_per_cpu is None or runnable_per_cpu < OVERSUBSCRIBED or not ops_share:
        return False
    if extra_ops_ms >= SAME_OPS_SHARE * lateness_ms or ops_slower_ms <= 0:
        return False
    cpu, wait = max(0.0, cpu_excess_ms), max(0.0, wait_excess_ms)
    # of its extra CPU time, what its slower ops account for (SLOWER_OPS_SHARE of their share of it counts as all
    # of it); the rest is work of its own between the ops (Python that calls no op)
    in_ops = max(0.0, ops_slower_ms - ops_share * wait) / (SLOWER_OPS_SHARE * ops_share)
    between = cpu - min(cpu, in_ops)
    left = lateness_ms - cpu - wait
    if idle_excess_ms is not None:  # two measures of its own lateness (module docstring): the smaller
        left = min(left, max(0.0, idle_excess_ms))
    own = between + max(0.0, left)
    return not (own > OWN_MS and own / step_ms > OWN_STEP_SHARE and own >= OWN_SHARE * lateness_ms)


def cause_known(
    ranks: list[dict[str, Any]], blocked: Mapping[int, float], blocked_medians: _LeaveOneOutMedian
) -> tuple[bool | None, str | None]:
    """``slow_rank_cause_known``: True, or None and why when every slow rank is ``same_work_slower`` and one of
    them at least is not ``cpu_starved`` (a starved rank's cause is known: rank-starved-of-cpu names it).
    ``blocked``: each rank's time blocked outside the collectives (``_blocked_outside_collectives``)."""
    slow = [r for r in ranks if r.get("slow_rank")]
    if not slow or not all(r.get("same_work_slower") for r in slow) or all(r.get("cpu_starved") for r in slow):
        return True, None
    step = [r["step_ms_median"] for r in ranks if r.get("step_ms_median")]
    step_ms = sum(step) / len(step) if step else float("nan")
    said = []
    for r in slow:
        others = [o["loop_cpu_ms"] for o in ranks if o is not r and o.get("loop_cpu_ms") is not None]
        more = r["loop_cpu_ms"] - statistics.median(others) if others else float("nan")
        mine = blocked.get(int(r["rank"]))
        rest = (
            f" (what they leave is not time of its own: it was blocked or asleep outside the collectives"
            f" {mine:.1f} ms per step, the others {blocked_medians.without(mine):.1f} ms)"
            if mine is not None and len(blocked) > 1
            else ""
        )
        said.append(
            f"rank {r['rank']} arrived last at {100 * (r.get('last_arrival_share') or 0):.0f}% of the matched"
            f" collectives (p = {r.get('last_arrival_p_value') or 0:.1g}) and the others waited"
            f" {r['wait_caused_ms']:.1f} ms per step for it ({100 * r['wait_caused_ms'] / step_ms:.0f}% of a"
            f" {step_ms:.1f} ms step), but it ran the same CPU ops as they did ({r['extra_ops_ms']:.1f} ms per step"
            f" in ops only it ran), those ops {r['ops_slower_ms']:.1f} ms per step slower, and its extra CPU time"
            f" ({more:+.1f} ms per step: {r['loop_cpu_ms']:.1f} ms) and run-queue wait"
            f" ({r['cpu_wait_excess_ms']:+.1f} ms per step against the others) explain its lateness{rest}, with"
            f" {r['host_runnable_per_cpu']:.1f} runnable threads"
            " per CPU on the host all ranks share"
        )
    return None, (
        "; ".join(said) + ": the same work ran slower on an oversubscribed host, which cannot be told from a slower"
        " rank (which rank's threads lose the contended cores is chance); trace with a CPU core per rank and its"
        " threads (fewer ranks per host, or OMP_NUM_THREADS and taskset) to decide"
    )


class _LeaveOneOutMedian:
    """``statistics.median`` of ``values`` with one occurrence of a value left out, for each value in turn, from
    one sort (a rank's "median of the other ranks" at 131,072 ranks is a sort per rank otherwise). The same
    floats as ``statistics.median`` of the list without that value: the same middle element(s), the same
    ``(a + b) / 2``. Falls back to that (a sort per call) where a value is NaN, which sorting does not order."""

    def __init__(self, values: Iterable[Any]) -> None:
        self.values = list(values)
        self.nan = any(v != v for v in self.values)
        self.sorted = self.values if self.nan else sorted(self.values)

    def without(self, value: Any) -> Any:
        if self.nan:
            rest = list(self.values)
            rest.remove(value)
            return statistics.median(rest)
        data = self.sorted
        gone = bisect.bisect_left(data, value)  # every occurrence of value gives the same remaining list
        n = len(data) - 1

        def at(j: int) -> Any:
            return data[j] if j < gone else data[j + 1]

        if n == 0:
            raise statistics.StatisticsError("no median for empty data")
        if n % 2 == 1:
            return at(n // 2)
        return (at(n // 2 - 1) + at(n // 2)) / 2


def starved(
    *, lateness_ms: float | None, wait_excess_ms: float, work_excess_ms: float, got_ratio: float | None
) -> bool | None:
    """Whether a rank's lateness (``lateness_ms``: the others' wait for it per step) is the host's: it waited
    for a CPU at least ``STARVED_SHARE`` of it more than the others, and its extra work at the share of the CPU
    it got (``got_ratio``) is less than ``STARVED_SHARE`` of it. None when its lateness is unknown; False when it
    was not late."""
    if lateness_ms is None:
        return None
    if lateness_ms <= 0:
        return False
    work_cost = max(0.0, work_excess_ms) / max(got_ratio or 1.0, 0.05)
    return wait_excess_ms >= STARVED_SHARE * lateness_ms and work_cost < STARVED_SHARE * lateness_ms


def _busy_cores(windows: list[dict[str, Any]]) -> float | None:
    """The host's busy CPUs over the rank's ``_windows``."""
    busy, total = _sum(windows, "host_busy_s"), _sum(windows, "host_total_s")
    wall = _sum(windows, "wall_s")
    cpus = windows[-1].get("host_cpus") if windows else None
    if busy is None or not total or not wall or not cpus:
        return None
    return cpus * busy / total  # the share of the host's CPU time that was busy, in CPUs


def _run_level(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(HOSTLOAD_RUN_METRICS)
    measured = [r for r in ranks if r.get("cpu_wait_share") is not None]
    if not measured:
        return out
    worst = max(measured, key=lambda r: r["cpu_wait_share"])
    steal = max((r["host_steal_ratio"] for r in measured if r.get("host_steal_ratio") is not None), default=None)
    contended = worst["cpu_wait_share"] >= CONTENDED_WAIT_SHARE or (steal or 0.0) >= CONTENDED_STEAL_SHARE
    out["host_contended"] = contended
    out["host_load_summary"] = summary_line(measured, worst, steal, contended)
    out["host_comm_cpu_wait_ms"] = comm_cpu_wait(ranks, contended)
    return out


def comm_cpu_wait(ranks: Iterable[Mapping[str, Any]], contended: bool | None) -> float:
    """``host_comm_cpu_wait_ms``: what the communication rules take out of exposed transfer on a busy host, the most
    any rank's threads other than its training loop (the backend's among them) waited for a CPU per step (0 where
    that was not measured); 0 on a host that was not contended."""
    if not contended:
        return 0.0
    return max(
        (r["other_threads_cpu_wait_ms"] for r in ranks if r.get("other_threads_cpu_wait_ms") is not None), default=0.0
    )


def summary_line(measured: list[dict[str, Any]], worst: dict[str, Any], steal: float | None, contended: bool) -> str:
    """The report's line on the host's load (``host_load_summary``)."""
    rank = worst["rank"]
    waited = (
        f"rank {rank}'s training loop waited {100 * worst['cpu_wait_share']:.0f}% of the profiled window for a CPU "
        f"(run-queue delay {worst['cpu_wait_ms']:.1f} ms per step"
        + (f", {100 * worst['cpu_got_ratio']:.0f}% of the CPU time it wanted" if worst.get("cpu_got_ratio") else "")
        + ")"
    )
    facts = []
    runnable = [r["host_runnable_per_cpu"] for r in measured if r.get("host_runnable_per_cpu") is not None]
    if runnable:
        facts.append(f"{max(runnable):.1f} runnable tasks per CPU")
    others = [r for r in measured if r.get("other_cpu_cores") is not None]
    if others:
        busiest = max(others, key=lambda r: r["other_cpu_cores"])
        facts.append(f"other processes used {busiest['other_cpu_cores']:.1f} CPUs")
        children = busiest.get("job_children_cpu_cores")
        if children and children >= 0.05:
            facts.append(f"the ranks' DataLoader workers and other child processes {children:.1f} CPUs")
        probe = busiest.get("probe_cpu_cores")
        if probe and probe >= 0.05:
            facts.append(f"ddpdoctor's GIL probe {probe:.1f} CPUs")
    if steal:
        facts.append(f"the hypervisor took {100 * steal:.0f}% of the CPU time (steal)")
    tail = f" ({'; '.join(facts)})" if facts else ""
    if contended:
        return f"The host was busy: {waited}{tail}; timing verdicts weigh it"
    if worst["cpu_wait_share"] >= NOTICED_WAIT_SHARE:
        return (
            f"Some CPU contention, below the {100 * CONTENDED_WAIT_SHARE:.0f}% at which timing verdicts weigh it: "
            f"{waited}{tail}"
        )
    return f"No CPU contention for this job: {waited}{tail}"


def _reasons(why: dict[int, str], ranks: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, str]:
    """``not_measured`` reasons of the host-load metrics no rank has."""
    if not why:
        return {}
    reason = next(iter(why.values()))
    if len(set(why.values())) > 1 or len(why) < len(ranks):
        reason = "; ".join(f"rank {r}: {w}" for r, w in sorted(why.items()))
    out = {n: reason for n in HOSTLOAD_RANK_METRICS if all(r.get(n) is None for r in ranks)}
    out.update({n: reason for n in HOSTLOAD_RUN_METRICS if run.get(n) is None})
    return out
