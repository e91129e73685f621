"""Metrics read from a rank's capture file (``ranks/rank<R>.json``): GIL, threads, DDP's own configuration
and timers.

``ddp[].logging_data`` is ``DistributedDataParallel._get_ddp_logging_data()``; its times are ns and its lists
are
comma-separated strings (``"bucket_sizes": "1071144, 526336"``).
"""

from __future__ import annotations

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
HOST_BUSY_CORES = 0.5


def thread_metrics(capture: dict[str, Any] | None, ranks_on_host: int | None) -> dict[str, Any]:
    """``gil_contention`` (mean over steps, 0-1; None where a low reading on a busy host cannot decide, see
    ``GIL_READABLE`` and ``gil_reasons``), ``threads`` (max), ``active_python_threads``, ``python_cpu_cores`` and
    ``python_cpu_share`` (median step), ``gil_host_other_cores``, ``cpu_count``, ``intra_op_threads``,
    ``local_world_size``."""
    capture = capture or {}
    gil = (capture.get("gil") or {}).get("per_step") or {}
    contention = [c for c in gil.get("contention") or [] if isinstance(c, (int, float))]
    threads = [t for t in gil.get("threads") or [] if isinstance(t, (int, float))]
    active = [t for t in gil.get("active_threads") or [] if isinstance(t, (int, float))]
    cores = [c for c in gil.get("cpu_cores") or [] if isinstance(c, (int, float))]
    shares = [c for c in gil.get("cpu_share") or [] if isinstance(c, (int, float))]
    mean = sum(contention) / len(contention) if contention else None
    working = _quantile(active, 0.5) if active else None
    others = _other_cores(capture) if contention else None
    unreadable = (
        mean is not None
        and mean <= GIL_READABLE
        and working is not None
        and working >= 2
        and others is not None
        and others >= HOST_BUSY_CORES
    )
    info = capture.get("threads") or {}
    return {
        "gil_contention": None if unreadable else mean,
        "gil_contention_spread": _quantile(contention, 0.9) - _quantile(contention, 0.1) if contention else None,
        "threads": max(threads) if threads else None,
        "active_python_threads": working,
        "python_cpu_cores": _quantile(cores, 0.5) if cores else None,
        "python_cpu_share": _quantile(shares, 0.5) if shares else None,
        "gil_host_other_cores": others,
        # CPUs the process may run on (taskset, cgroup cpusets), else all the host has
        "cpu_count": next((info[k] for k in ("affinity_cpus", "cpu_count") if isinstance(info.get(k), int)), None),
        "intra_op_threads": info.get("torch_intra_op_threads")
        if isinstance(info.get("torch_intra_op_threads"), int)
        else None,
        "local_world_size": ranks_on_host,
    }


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


def gil_reasons(ranks: list[dict[str, Any]]) -> dict[str, str]:
    """``not_measured`` reason for ``gil_contention`` where every rank without it had a low reading on a busy host
    with two or more of the job's threads at work (see ``GIL_READABLE``), with the numbers."""
    missing = [r for r in ranks if r.get("gil_contention") is None]
    busy = [
        r
        for r in missing
        if isinstance(r.get("gil_host_other_cores"), (int, float))
        and r["gil_host_other_cores"] >= HOST_BUSY_CORES
        and isinstance(r.get("active_python_threads"), (int, float))
        and r["active_python_threads"] >= 2
    ]
    if not busy or len(busy) < len(missing):
        return {}
    r = max(busy, key=lambda r: r["gil_host_other_cores"])
    share = r.get("python_cpu_share")
    got = f", the job's threads got {100 * share:.0f}% of the CPU time they were runnable for" if share else ""
    return {
        "gil_contention": (
            f"the host was too busy to tell: other processes used {r['gil_host_other_cores']:.1f} CPUs"
            f" (rank {r.get('rank')}){got}; with {r['active_python_threads']:.0f} of the job's Python threads at"
            f" work, a GIL probe reading of {100 * GIL_READABLE:.0f}% or less is no evidence either way (the probe's"
            " own thread is starved of CPU)"
        )
    }


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
    for i, step in enumerate(gil.get("step") or []):
        row = rows.setdefault(
            int(step), {"rank": rank, "step": int(step), "step_ms": None, "profiled": int(step) in profiled}
        )
        for key, column in (("contention", "gil_contention"), ("threads", "threads")):
            values = gil.get(key) or []
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
