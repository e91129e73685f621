"""Metrics read from a rank's capture file (``ranks/rank<R>.json``): GIL, threads, DDP's own configuration
and timers.

``ddp[].logging_data`` is ``DistributedDataParallel._get_ddp_logging_data()``; its times are ns and its lists
are
comma-separated strings (``"bucket_sizes": "1071144, 526336"``).
"""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Any

from ddpdoctor.metrics import catalog


def _ints(text: Any) -> list[int]:
    if isinstance(text, (list, tuple)):
        return [int(v) for v in text if isinstance(v, (int, float))]
    if not isinstance(text, str):
        return []
    return [int(t) for t in text.replace(",", " ").split() if t.strip().lstrip("-").isdigit()]


def _bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false", "0", "1"):
        return value.lower() in ("true", "1")
    return None


def _ddp_logging_data(capture: dict[str, Any] | None) -> dict[str, Any] | None:
    """``_get_ddp_logging_data()`` of the first DDP module the capture recorded, or None."""
    modules = (capture or {}).get("ddp") or []
    data = next((m.get("logging_data") for m in modules if isinstance(m, dict) and m.get("logging_data")), None)
    return data if isinstance(data, dict) else None


NOOP_HOOK = "noop_hook"  # torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks.noop_hook


def ddp_metrics(capture: dict[str, Any] | None) -> dict[str, Any]:
    """``ddp_*`` configuration metrics and ``ddp_reported_overlap_ratio`` (0-1) of the first DDP module."""
    out: dict[str, Any] = dict.fromkeys(catalog.group("ddp_config"))
    data = _ddp_logging_data(capture)
    if data is None:
        return out
    buckets = _ints(data.get("rebuilt_bucket_sizes")) or _ints(data.get("bucket_sizes"))
    out["ddp_bucket_count"] = len(buckets) or None
    cap = data.get("bucket_cap_bytes")
    out["ddp_bucket_cap_mb"] = cap / 2**20 if isinstance(cap, (int, float)) and cap > 0 else None
    out["ddp_find_unused_parameters"] = _bool(data.get("find_unused_parameters"))
    out["ddp_gradient_as_bucket_view"] = _bool(data.get("gradient_as_bucket_view"))
    out["ddp_static_graph"] = _bool(data.get("static_graph"))
    out["ddp_broadcast_buffers"] = _bool(data.get("broadcast_buffers"))
    hook = data.get("comm_hook")
    out["ddp_comm_hook"] = hook if isinstance(hook, str) and hook else None
    unused, total = data.get("unused_parameter_size"), data.get("total_parameter_size_bytes")
    if isinstance(unused, (int, float)) and isinstance(total, (int, float)) and total > 0:
        out["ddp_unused_parameter_size_ratio"] = unused / total
    overlap, comm = data.get("avg_backward_compute_comm_overlap_time"), data.get("avg_backward_comm_time")
    if isinstance(overlap, (int, float)) and isinstance(comm, (int, float)) and comm > 0:
        out["ddp_reported_overlap_ratio"] = min(max(overlap / comm, 0.0), 1.0)
    out.update(_largest_gradient(capture, buckets, cap))
    return out


def _largest_gradient(capture: dict[str, Any] | None, buckets: list[int], cap: Any) -> dict[str, Any]:
    """The largest gradient of the first DDP module (``ddp[].gradients``, capture/ddp.py): its bytes, share of all
    gradient bytes, name, module type, sparse flag (embeddings), and whether it is a bucket of its own: larger than
    bucket_cap_mb (DDP never splits a parameter), or a bucket of exactly its size in DDP's layout."""
    modules = (capture or {}).get("ddp") or []
    grads = next((m.get("gradients") for m in modules if isinstance(m, dict) and m.get("logging_data")), None)
    if not isinstance(grads, dict):
        return {}
    size, total = grads.get("bytes"), grads.get("total_bytes")
    if not (isinstance(size, int) and isinstance(total, int) and total > 0 and size > 0):
        return {}
    own = (isinstance(cap, (int, float)) and cap > 0 and size >= cap) or size in buckets
    name, module = grads.get("name"), grads.get("module_type")
    sparse = grads.get("sparse")
    return {
        "ddp_largest_grad_bytes": size,
        "ddp_largest_grad_share": size / total,
        "ddp_largest_grad_name": name if isinstance(name, str) and name else None,
        "ddp_largest_grad_module": module if isinstance(module, str) and module else None,
        "ddp_largest_grad_sparse": sparse if isinstance(sparse, bool) else None,
        "ddp_largest_grad_own_bucket": own,
    }


_NS_PER_MS = 1e6
# DDP's logging keys (ns) of its own timers -> catalog names (ms)
_DDP_TIMERS = dict(
    zip(
        (
            "avg_forward_compute_time",
            "avg_backward_compute_time",
            "avg_backward_comm_time",
            "avg_backward_compute_comm_overlap_time",
        ),
        catalog.group("ddp_timers"),
        strict=True,
    )
)


def ddp_noop_hook(capture: dict[str, Any] | None) -> bool | None:
    """Whether the first DDP module's communication hook is torch's ``noop_hook``, which reduces nothing (it is
    there to measure the headroom of communication; DDP's logging data names the hook). None where DDP's logging
    data was not captured. Read from the capture when the run is analysed, so that summaries written before this
    flag have it too."""
    data = _ddp_logging_data(capture)
    if data is None:
        return None
    return data.get("comm_hook") == NOOP_HOOK


def ddp_timers(capture: dict[str, Any] | None) -> dict[str, Any]:
    """DDP's own averages of forward, backward, backward communication and their overlap (ms per step) of
    the first DDP module, as its logging data reports them (None when not logged)."""
    out: dict[str, Any] = dict.fromkeys(catalog.group("ddp_timers"))
    data = _ddp_logging_data(capture)
    if data is None:
        return out
    for key, name in _DDP_TIMERS.items():
        value = data.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            out[name] = value / _NS_PER_MS
    return out


# A GIL probe reading at or below this (the rule's default threshold) is no evidence either way when other processes
# kept the host busy (at least HOST_BUSY_CORES of its CPUs) while two or more of the job's threads had work: the
# probe's own thread then gets 1-8% of the CPU time it is runnable for, and its readings of one GIL-bound job range
# from 0.02 to 0.6 between steps (measured: 4 threads of samples/gil_small_ops.py on a 2-core host at load 8-15).
GIL_READABLE = 0.2
# gilwatch's ratio needs this many samples of the job's Python threads (2 ms apart, summed over the threads) in the
# profiled steps: at 100, a ratio of 0.2 is known to about +-0.04 (4 threads, 5 steps of 20 ms give about 200)
WATCH_MIN_TICKS = 100
HOST_BUSY_CORES = 0.5
# The job's own threads starve the probe the same way when they are runnable for more CPU time than the host has:
# below this share of their runnable time on a CPU (``python_cpu_share``, median step) a low reading cannot decide
# either. Measured on a quiet 2-core host: the 4 small-op threads of samples/gil_small_ops.py (0.45-0.5x the speed
# of serial) got 0.48-0.58 of it and read 0.09-0.13; the same work on one thread got 0.89-0.998.
THREADS_STARVED_SHARE = 0.8
# A low gilwatch ratio passes only when its upper bound (the ratio plus twice its standard error: from the spread
# of the steps' ratios, and from the samples as independent looks, whichever is larger) is at or below
# GIL_READABLE too. CI clone, 2026-12-04, quiet host: 4 mostly-Python threads (0.31-0.46 in 9 other runs) read 0.144
# over 4 steps of 0.05-0.26 and 107 samples, and the rule passed them; the bound there was 0.23 (the ratio as
# counted then, with the threads' time blocked elsewhere in its denominator: ``_watched``).
UPPER_SE = 2.0
# A reading above GIL_READABLE cannot decide either when the job's threads with work used this many CPU cores or
# more between them: GIL-bound threads take turns on about one core, so they also ran native code in parallel, and
# how much of their time the GIL cost is not in the data. Measured: the 4 threads of samples/gil_small_ops.py
# (0.45-0.5x the speed of the same work done serially) used 1.1-1.6 cores of a quiet 2-core host with probe
# readings of 0.09-0.22; threads in large matmuls and sleeps read 0.02-0.15 at 0.7 cores.
PARALLEL_CORES = 1.3
# gilwatch's ratio says how much of their working time the threads waited for the GIL; this is how much of their
# time in all (alive and not waiting for a CPU: blocked on queues, sleeps and I/O too) that wait took
# (``gil_wait_share``), the rule's other condition. Threads that mostly sleep (samples/gil_small_ops.py --sleepy: 4
# threads each sleeping 1 ms between small ops, 4-10% of a CPU each) meet the GIL now and then when they wake
# together: a few samples of GIL wait against their little CPU time read up to 0.35, but 0.002-0.043 of their time
# in 4 traced runs (2026-12-05); the sample's 4 GIL-bound threads read 0.13-0.34. At or below this share a ratio too
# close to call decides (the rule passes on the share).
MIN_WAIT_SHARE = 0.1


def thread_metrics(capture: dict[str, Any] | None, ranks_on_host: int | None) -> dict[str, Any]:
    """``gil_contention`` (mean over steps, 0-1; None where the reading cannot decide: low on a busy host or high
    from threads that ran in parallel, see ``GIL_READABLE``, ``PARALLEL_CORES`` and ``gil_reasons``), ``threads``
    (max), ``active_python_threads``, ``python_cpu_cores`` and ``python_cpu_share`` (median step),
    ``gil_host_other_cores``, ``cpu_count``, ``intra_op_threads``, ``local_world_size``."""
    capture = capture or {}
    gil = (capture.get("gil") or {}).get("per_step") or {}
    contention = [c for c in step_contention(gil) if isinstance(c, (int, float))]
    watched = _watched(gil)
    threads = [t for t in gil.get("threads") or [] if isinstance(t, (int, float))]
    active = [t for t in gil.get("active_threads") or [] if isinstance(t, (int, float))]
    cores = [c for c in gil.get("cpu_cores") or [] if isinstance(c, (int, float))]
    shares = [c for c in gil.get("cpu_share") or [] if isinstance(c, (int, float))]
    mean = sum(contention) / len(contention) if contention else None
    working = _quantile(active, 0.5) if active else None
    others = _other_cores(capture) if contention else None
    median_cores = _quantile(cores, 0.5) if cores else None
    share = _quantile(shares, 0.5) if shares else None
    upper, wait_share = None, mean  # gilknocker: the probe's share of time it waited for the GIL, both
    if watched is not None:  # gilwatch: the job's threads' GIL wait over their time on a CPU or in it, pooled
        wait, spent, ready, ticks = watched
        mean = wait / spent if spent > 0 else None
        wait_share = wait / ready if ready > 0 else None
        # the samples that saw the threads working (on a CPU or in the GIL's wait), not those of them blocked
        upper = _upper(mean, contention, ticks * min(1.0, spent / ready) if ready > 0 else ticks)
        unreadable = _watch_undecided(mean, ticks, working, share, others, upper, wait_share) is not None
    else:
        unreadable = _undecided(mean, working, median_cores, share, others) is not None
    info = capture.get("threads") or {}
    return {
        "gil_contention": None if unreadable else mean,
        "gil_wait_share": None if unreadable else wait_share,
        "gil_probe_reading": mean,
        "gil_samples": watched[3] if watched is not None else None,
        "gil_contention_upper": upper,
        "gil_contention_spread": _quantile(contention, 0.9) - _quantile(contention, 0.1) if contention else None,
        "threads": max(threads) if threads else None,
        "active_python_threads": working,
        "python_cpu_cores": median_cores,
        "python_cpu_share": share,
        "gil_host_other_cores": others,
        # CPUs the process may run on (taskset, cgroup cpusets), else all the host has
        "cpu_count": next((info[k] for k in ("affinity_cpus", "cpu_count") if isinstance(info.get(k), int)), None),
        "intra_op_threads": info.get("torch_intra_op_threads")
        if isinstance(info.get("torch_intra_op_threads"), int)
        else None,
        "local_world_size": ranks_on_host,
    }


def _watched(gil: dict[str, Any]) -> tuple[float, float, float, int] | None:
    """gilwatch's steps summed: (seconds the job's Python threads waited for the GIL, seconds they waited for it or
    ran on a CPU, seconds they were alive and not waiting for a CPU, samples), None where gilknocker (or nothing)
    measured the steps."""
    wait = spent = ready = 0.0
    ticks, any_step = 0, False
    columns = [gil.get(k) or [] for k in ("gil_wait_s", "gil_run_s", "gil_ready_s", "gil_ticks")]
    for w, r, alive, t in itertools.zip_longest(*columns):
        if _number(w) and _number(r) and _number(t):
            wait, spent, ready = wait + w, spent + w + r, ready + max(alive if _number(alive) else 0.0, w + r)
            ticks, any_step = ticks + int(t), True
    return (wait, spent, ready, ticks) if any_step else None


def step_contention(gil: dict[str, Any]) -> list[Any]:
    """The GIL contention of each step of a capture's ``gil.per_step`` (0-1, None where not measured): where
    gilwatch measured the step, the time the job's Python threads waited for the GIL over that time plus their time
    on a CPU; else the stored reading (gilknocker's probe)."""
    stored = list(gil.get("contention") or [])
    waits, runs = gil.get("gil_wait_s") or [], gil.get("gil_run_s") or []
    out = []
    for i, value in enumerate(stored):
        w = waits[i] if i < len(waits) else None
        r = runs[i] if i < len(runs) else None
        if _number(w) and _number(r):
            value = round(w / (w + r), 4) if w + r > 0 else None
        out.append(value)
    return out


def _other_cores(capture: dict[str, Any]) -> float | None:
    """CPUs of the host busy with other processes than this one in the profiled windows (``hostload.windows``:
    the host's busy share of its CPU time, in CPUs, less this process's CPU time per second), None unrecorded."""
    windows = [w for w in (capture.get("hostload") or {}).get("windows") or [] if isinstance(w, dict)]
    try:
        wall = sum(float(w["wall_s"]) for w in windows)
        total = sum(float(w["host_total_s"]) for w in windows)
        busy = sum(float(w["host_busy_s"]) for w in windows)
        own = sum(float(w["cpu_s"]) for w in windows)
        cpus = int(windows[-1]["host_cpus"])
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    if wall <= 0 or total <= 0 or cpus <= 0:
        return None
    return max(cpus * busy / total - own / wall, 0.0)


def _undecided(reading: Any, threads: Any, cores: Any, share: Any, others: Any) -> str | None:
    """Why a probe reading with two or more of the job's threads at work cannot decide: "starved" (low while the
    CPUs were oversubscribed: other processes used ``HOST_BUSY_CORES`` or more, or the job's threads got less than
    ``THREADS_STARVED_SHARE`` of their runnable time), "parallel" (high from threads that used ``PARALLEL_CORES``
    or more), None when it decides (or there is no reading)."""
    if not (_number(reading) and _number(threads) and threads >= 2):
        return None
    if reading > GIL_READABLE:
        return "parallel" if _number(cores) and cores >= PARALLEL_CORES else None
    busy = _number(others) and others >= HOST_BUSY_CORES
    return "starved" if busy or (_number(share) and share < THREADS_STARVED_SHARE) else None


def _upper(reading: float | None, steps: list[float], samples: int) -> float | None:
    """The ratio plus UPPER_SE standard errors: the larger of the steps' spread (their standard deviation over the
    square root of their number) and the samples' (a proportion of ``samples`` independent looks)."""
    if reading is None or samples <= 0:
        return None
    se = math.sqrt(max(reading * (1.0 - reading), 0.0) / samples)
    if len(steps) >= 2:
        se = max(se, statistics.stdev(steps) / math.sqrt(len(steps)))
    return min(1.0, reading + UPPER_SE * se)


def _watch_undecided(
    reading: Any, samples: Any, threads: Any, share: Any, others: Any, upper: Any = None, wait_share: Any = None
) -> str | None:
    """Why gilwatch's ratio cannot decide: "few" (under ``WATCH_MIN_TICKS`` samples), "cpu" (two or more of the
    job's threads at work, a ratio at or below ``GIL_READABLE``, while other processes kept ``HOST_BUSY_CORES`` of
    the host busy and the threads got less than ``THREADS_STARVED_SHARE`` of the CPU time they were runnable for):
    with the host's CPU rationed, the threads wait for a CPU, not for the GIL, and take turns on what they get (4
    threads of small torch ops, 2026-12-05: 0.27-0.39 quiet, 0.00-0.01 in their own session beside two burners in
    another, where the kernel gives each session half of the 2 CPUs; 0.27-0.39 where the burners shared the job's
    session). A low ratio there says nothing of a host with CPUs to spare. "close": a ratio at or below
    ``GIL_READABLE`` whose upper bound is above it, unless the wait took ``MIN_WAIT_SHARE`` or less of the threads'
    time (``wait_share``: the rule passes on that). None when it decides."""
    if not _number(samples) or samples < WATCH_MIN_TICKS:
        return "few"
    if not (_number(reading) and _number(threads) and threads >= 2) or reading > GIL_READABLE:
        return None
    busy = _number(others) and others >= HOST_BUSY_CORES
    if busy and _number(share) and share < THREADS_STARVED_SHARE:
        return "cpu"
    if _number(wait_share) and wait_share <= MIN_WAIT_SHARE:
        return None
    return "close" if _number(upper) and upper > GIL_READABLE else None


def gil_reasons(ranks: list[dict[str, Any]]) -> dict[str, str]:
    """``not_measured`` reason for ``gil_contention`` and ``gil_wait_share`` where every rank without them had a
    probe reading that cannot decide (``_undecided``), with the numbers; {} where a rank lacks it for another reason
    (--no-gil, an old summary)."""
    missing = [r for r in ranks if r.get("gil_contention") is None]
    why: dict[str, tuple[float, str]] = {}
    for r in missing:
        reading, threads = r.get("gil_probe_reading"), r.get("active_python_threads")
        samples = r.get("gil_samples")
        if _number(samples):
            share, others = r.get("python_cpu_share"), r.get("gil_host_other_cores")
            upper = r.get("gil_contention_upper")
            kind = _watch_undecided(reading, samples, threads, share, others, upper)
            if kind == "few":
                text = (
                    f"too few samples on rank {r.get('rank')}: gilwatch looked at the job's Python threads"
                    f" {samples:.0f} times in the profiled steps (it needs {WATCH_MIN_TICKS}, 2 ms apart):"
                    " profile more steps"
                )
                why["few"] = max(why.get("few", (-samples, text)), (-samples, text))
            elif kind == "cpu":
                text = (
                    f"the host rationed the CPUs on rank {r.get('rank')}: other processes used {others:.1f} CPUs"
                    f" and the job's {threads:.0f} Python threads at work got {100 * share:.0f}% of the CPU time"
                    f" they were runnable for, so they waited for a CPU rather than for the GIL (gilwatch saw"
                    f" {100 * reading:.0f}% of their time in the GIL's wait); what they would do on a host with"
                    " CPUs to spare is not in the data: trace again on a quieter host"
                )
                why["cpu"] = max(why.get("cpu", (-share, text)), (-share, text))
            elif kind == "close":
                text = (
                    f"too close to call on rank {r.get('rank')}: the job's {threads:.0f} Python threads at work"
                    f" waited for the GIL {100 * reading:.0f}% of their time, but that reading could be as high as"
                    f" {100 * upper:.0f}% ({samples:.0f} samples; its steps ranged over"
                    f" {100 * (r.get('gil_contention_spread') or 0.0):.0f} points), and the rule fires above"
                    f" {100 * GIL_READABLE:.0f}%: profile more steps (--active N)"
                )
                why["close"] = max(why.get("close", (upper, text)), (upper, text))
            else:
                return {}
            continue
        cores, share, others = r.get("python_cpu_cores"), r.get("python_cpu_share"), r.get("gil_host_other_cores")
        kind, rank = _undecided(reading, threads, cores, share, others), r.get("rank")
        if kind is None:
            return {}
        if kind == "parallel":
            key = cores
            text = (
                f"the evidence conflicts on rank {rank}: the GIL probe read {100 * reading:.0f}% contention, but"
                f" the job's {threads:.0f} Python threads at work used {cores:.2f} CPU cores between them, so they"
                " also ran native code in parallel; how much of their time the GIL cost is not in the data (time"
                " the threads against the same work done serially)"
            )
        else:
            busy = f"other processes used {others:.1f} CPUs and " if _number(others) and others >= 0.05 else ""
            got = f"got {100 * share:.0f}% of the CPU time they were runnable for" if _number(share) else "waited"
            key = -share if _number(share) else 0.0
            text = (
                f"the CPUs were too busy to tell on rank {rank}: {busy}the job's {threads:.0f} Python threads at"
                f" work {got}; the GIL probe's own thread is starved likewise, and its reading of"
                f" {100 * reading:.0f}% ({100 * GIL_READABLE:.0f}% or less) is no evidence either way"
            )
        why[kind] = max(why.get(kind, (key, text)), (key, text))  # the worst rank of each kind speaks for it
    if not why:
        return {}
    kinds = ("few", "cpu", "close", "starved", "parallel")
    text = "; ".join(why[k][1] for k in kinds if k in why)
    # ``thread_metrics`` leaves the wait share out with the ratio (the same reading): one reason for both, never the
    # catalog's "no GIL probe data" on a run that has it
    return dict.fromkeys(("gil_contention", "gil_wait_share"), text)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


def _profiled_steps(capture: dict[str, Any]) -> set[int]:
    steps: set[int] = set()
    for window in (capture.get("steps") or {}).get("profiled") or []:
        if isinstance(window, (list, tuple)) and len(window) == 2:
            steps.update(range(int(window[0]), int(window[1]) + 1))
    return steps


def step_rows(rank: int, capture: dict[str, Any]) -> list[dict[str, Any]]:
    """Every step the rank recorded, profiled or not: ``rank, step, step_ms`` (wall time, ms), ``profiled``,
    ``gil_contention`` (0-1) and ``threads`` of the GIL probe."""
    steps = capture.get("steps") or {}
    first = int(steps.get("first") or 1)
    profiled = _profiled_steps(capture)
    rows = {
        first + i: {"rank": rank, "step": first + i, "step_ms": float(ms), "profiled": first + i in profiled}
        for i, ms in enumerate(steps.get("wall_ms") or [])
    }
    gil = (capture.get("gil") or {}).get("per_step") or {}
    contention = step_contention(gil)
    for i, step in enumerate(gil.get("step") or []):
        row = rows.setdefault(
            int(step), {"rank": rank, "step": int(step), "step_ms": None, "profiled": int(step) in profiled}
        )
        for values, column in ((contention, "gil_contention"), (gil.get("threads") or [], "threads")):
            row[column] = values[i] if i < len(values) else None
    return [rows[s] for s in sorted(rows)]


def device_rows(rank: int, capture: dict[str, Any]) -> list[dict[str, Any]]:
    """Peak memory of every device the rank touched (``rank, device`` and the device-memory metrics, bytes),
    from the capture's allocator counters."""
    return [
        {"rank": rank, "device": dev.get("device"), **{k: dev.get(k) for k in catalog.group("device_memory")}}
        for dev in (capture.get("memory") or {}).get("devices") or []
        if isinstance(dev, dict)
    ]
