"""``summarize_rank``: everything one rank's own trace tells, as a JSON-serialisable dict.

The capture calls it at the end of each rank (``ranks/rank<R>.summary.json``) and ``analyze`` calls it for
ranks loaded from traces, so both paths give the same numbers. Cross-rank metrics (waits, late arrival,
straggler) are left to ``analyze``, which matches the ``collectives`` lists of all ranks.

Layout (``schema_version`` 1)::

    {"schema_version", "rank", "files", "distributed_info", "hostname", "own_device",
     "metrics":     {per-rank metric name: value or None},
     "per_step":    {column: [...]}   # step, span, start_us, end_us, analyzed, step_ms, breakdown columns,
     ...
     "collectives": {column: [...]}   # step, kind, index, start_us, end_us, dur_us, bytes, group_size, issued_in,
                                      # arrival_us (gloo: when the rank called it, comm.gloo_arrivals; else null)
     "exposed_comm": {"start_us": [...], "end_us": [...]}  # communication not hidden by computation, analysed steps
     "devices":     [{"device", "peak_allocated_bytes", "peak_reserved_bytes", "capacity_bytes"}],
     "fsdp_units":  {column: [...]},  # FSDP2 units: unit, param_bytes, ..., reduce_exposed_ms (metrics/fsdp.py)
     "timeline":    {column: [...]},  # step, lane, start_us, end_us of a few analysed steps (metrics/timeline.py)
     "op_work":     {name: [ops, top-level ops, top-level ms] per analysed step} | None  # (metrics/same_work.py)}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ddpdoctor import ranklist
from ddpdoctor._version import __version__
from ddpdoctor.load.model import RankTrace
from ddpdoctor.metrics import catalog, timeline
from ddpdoctor.metrics import intervals as iv
from ddpdoctor.metrics.breakdown import BREAKDOWN, per_step
from ddpdoctor.metrics.capture import ddp_metrics, thread_metrics
from ddpdoctor.metrics.comm import collective_calls, collectives, exposed_set
from ddpdoctor.metrics.compile import compile_rank
from ddpdoctor.metrics.dp import dp_per_step, dp_rank_metrics, dp_stages
from ddpdoctor.metrics.fsdp import fsdp_rank
from ddpdoctor.metrics.group_sums import positions_within
from ddpdoctor.metrics.issuers import issuers
from ddpdoctor.metrics.memory import device_rows, memory_metrics, own_device
from ddpdoctor.metrics.parallelism import parallelism_evidence
from ddpdoctor.metrics.phases import loads_batches
from ddpdoctor.metrics.profiled_steps import running_step
from ddpdoctor.metrics.same_work import op_work
from ddpdoctor.metrics.setup import compute_device
from ddpdoctor.metrics.steps import step_windows
from ddpdoctor.table import Codes, Table, cumcount, group_ids
from ddpdoctor.values import jsonable

SCHEMA_VERSION = 1
STEP_MEANS = BREAKDOWN + catalog.group("step_means") + catalog.group("dp_stages")


def summarize_rank(
    rank_trace: RankTrace,
    capture: dict[str, Any] | None = None,
    step_range: tuple[int, int | None] | None = None,
) -> dict[str, Any]:
    """Per-rank metrics (see CONTRACTS.md), per-step rows and the collective list of one rank. Pure; no
    I/O."""
    rt = rank_trace
    ops = rt.tables.ops
    windows = step_windows(rt)
    lanes: dict[str, iv.Intervals] = {}
    steps = per_step(rt, windows, lanes)
    lo, hi = steps["start_us"], steps["end_us"]
    gather = None
    stages = dp_stages(ops)  # DataParallel's stages: ddpdoctor's ranges, or a plain trace's ops (metrics/dp.py)
    if stages is not None:
        for key, values in dp_per_step(stages, lo, hi).items():
            steps[key] = values
        gather = stages["gather"]
    running = running_step(capture)
    if running is not None and len(steps):  # the step the run ended in: its range is cut short, not a step
        steps["analyzed"] = steps["analyzed"] & (steps["step"] != running)
    if step_range is not None:  # only ProfilerStep#N..M (inclusive; M None = to the end)
        first, last = step_range
        in_range = steps["step"] >= first
        if last is not None:
            in_range &= steps["step"] <= last
        steps["analyzed"] = steps["analyzed"] & in_range
    analysed = steps[steps["analyzed"]]
    world = (rt.distributed_info or {}).get("world_size") or (capture or {}).get("world_size") or 1
    calls = collective_calls(rt)
    timed = collectives(rt, calls)
    timed["issued_in"] = issuers(rt, timed)
    colls = _assign_steps(timed, steps)
    metrics: dict[str, Any] = {"rank": rt.rank}
    metrics.update(_step_metrics(analysed))
    hosts = _inner_join(
        windows.select(["step", "span", "host_start_us", "host_end_us"]), steps.select(["step", "span", "analyzed"])
    )
    host = hosts[hosts["analyzed"]].sort("host_start_us")  # the analysed steps' host windows
    if not loads_batches(ops, host["host_start_us"], host["host_end_us"]):
        metrics["dataloader_ms"] = None  # no DataLoader in the steps: data loaded otherwise is not timed apart
    comm_total = float(np.sum(analysed["comm_ms"]))
    metrics["overlap_ratio"] = float(np.sum(analysed["overlapped_comm_ms"])) / comm_total if comm_total > 0 else None
    in_analysed = np.isin(colls["step"], analysed["step"])
    # bandwidth needs the time from the last peer's arrival (cross_rank.py); the rank's own durations include waiting
    metrics["algbw_gbps"] = None
    metrics["busbw_gbps"] = None
    metrics["buffer_broadcast_ms"] = _buffer_broadcast_ms(colls[in_analysed], analysed)
    exposed = _exposed_in(exposed_set(rt), analysed)
    metrics["collective_wait_ms"] = None  # cross-rank: filled in by analyze()
    metrics["late_arrival_ms"] = None
    metrics.update(dp_rank_metrics(ops, analysed["start_us"], analysed["end_us"], stages, rt.tables.kernels))
    # which parallelism: collectives by kind and phase (host step windows, the analysed ones as above)
    n_timed = int(in_analysed.sum())
    metrics.update(parallelism_evidence(rt, hosts, calls, n_timed))
    # The GPU the DDP model lives on: a rank that never calls set_device still has current device cuda:0.
    own = compute_device(capture) or own_device(rt, capture)
    devices = device_rows(rt, capture)
    metrics.update(memory_metrics(devices, own))
    metrics.update(ddp_metrics(capture))
    metrics.update(thread_metrics(capture, None))
    metrics.update(compile_rank(rt, analysed))  # torch.compile's regions, graphs, recompiles
    fsdp, fsdp_units = fsdp_rank(rt, analysed)  # FSDP2's units: their all-gathers and reduces
    metrics.update(fsdp)
    return jsonable(
        {
            "schema_version": SCHEMA_VERSION,
            "ddpdoctor_version": __version__,
            "rank": rt.rank,
            "files": [Path(f).name for f in rt.files],  # beside the run directory's other files: movable
            "distributed_info": _compact_groups(rt.distributed_info),
            "hostname": (capture or {}).get("hostname"),
            "world_size": world,
            "own_device": own,
            "metrics": metrics,
            "per_step": steps.to_lists(),
            "collectives": colls.to_lists(),
            "exposed_comm": {"start_us": exposed[0].tolist(), "end_us": exposed[1].tolist()},
            "devices": devices,
            "fsdp_units": fsdp_units,
            "timeline": timeline.record(lanes, steps, gather),  # a few steps' phase intervals (metrics/timeline.py)
            "op_work": op_work(rt, analysed),  # CPU ops per step by name: same work as the others? (same_work.py)
        }
    )


def _compact_groups(info: dict[str, Any] | None) -> dict[str, Any] | None:
    """``distributed_info`` with each process group's rank list written as ranges (``ranklist.compact``): the
    default group lists every rank, in every rank's file (O(ranks²) bytes written as is)."""
    groups = (info or {}).get("pg_config")
    items = groups.values() if isinstance(groups, dict) else groups if isinstance(groups, list) else ()
    if not any(isinstance(g, dict) and isinstance(g.get("ranks"), (list, tuple)) for g in items):
        return info

    def one(g: Any) -> Any:
        return {**g, "ranks": ranklist.compact(g["ranks"])} if isinstance(g, dict) and "ranks" in g else g

    pgs = {k: one(g) for k, g in groups.items()} if isinstance(groups, dict) else [one(g) for g in groups]
    return {**info, "pg_config": pgs}  # type: ignore[dict-item]


def _inner_join(left: Table, right: Table) -> Table:
    """Rows of ``left`` with the columns of the rows of ``right`` that have the same ``step`` and ``span``, as
    pandas' inner ``merge``: left's order, each left row once per matching right row (in right's order)."""
    n = len(left)
    keys, _ = group_ids(np.concatenate([left["step"], right["step"]]), np.concatenate([left["span"], right["span"]]))
    lk, rk = keys[:n], keys[n:]
    r_order = np.argsort(rk, kind="stable")
    r_sorted = rk[r_order]
    start = np.searchsorted(r_sorted, lk, side="left")
    count = np.searchsorted(r_sorted, lk, side="right") - start
    left_rows = np.repeat(np.arange(n), count)
    offsets = positions_within(count)
    right_rows = r_order[np.repeat(start, count) + offsets]
    out = left[left_rows]
    for name in right.columns:
        if name not in ("step", "span"):
            out[name] = right[name][right_rows]
    return out


def _step_metrics(analysed: Table) -> dict[str, Any]:
    step_ms = analysed["step_ms"]
    out: dict[str, Any] = {
        "steps_analyzed": len(analysed),
        "step_ms_median": _median(step_ms) if len(step_ms) else None,
        "step_ms_p90": _percentile(step_ms, 90) if len(step_ms) else None,
        "step_ms_mean": float(np.mean(step_ms)) if len(step_ms) else None,
    }
    for col in STEP_MEANS:
        values = analysed[col].astype(np.float64) if col in analysed else np.zeros(0)
        values = values[~np.isnan(values)]
        out[col] = float(values.mean()) if len(values) else None
        if col == "dataloader_ms":  # the same mean without its longest step: a wait of one step is not every step's
            trimmed = len(values) >= TRIMMED_FROM and out[col] is not None
            out["dataloader_ms_trimmed"] = float((values.sum() - values.max()) / (len(values) - 1)) if trimmed else None
    return out


TRIMMED_FROM = 3  # analysed steps from which dataloader_ms_trimmed is measured


def _median(values: np.ndarray) -> float:
    """``np.median`` of a non-empty 1-d array (which imports ``numpy.ma``, ~10 ms, to check for NaN)."""
    v = np.sort(values)
    if np.isnan(v[-1]):  # NaN sorts last
        return float("nan")
    n = len(v)
    return float((v[(n - 1) // 2] + v[n // 2]) / 2.0)


def _percentile(values: np.ndarray, q: float) -> float:
    """``np.percentile(values, q)`` (method "linear") of a non-empty 1-d array, computed as numpy does (which
    imports ``numpy.ma``)."""
    v = np.sort(values)
    if np.isnan(v[-1]):
        return float("nan")
    n = len(v)
    virtual = (n - 1) * (q / 100)
    if virtual >= n - 1:
        return float(v[-1])
    below = int(np.floor(virtual))
    a, b = float(v[below]), float(v[below + 1])
    gamma = virtual - below
    diff = b - a
    return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma


def _assign_steps(colls: Table, steps: Table) -> Table:
    """Add ``step`` (the step window holding the collective's start; -1 outside) and ``index`` (its order
    among the same kind in that step), the key that matches a collective across ranks."""
    lo, hi = steps["start_us"], steps["end_us"]
    order = np.argsort(lo, kind="stable")
    start = colls["start_us"]
    i = np.searchsorted(lo[order], start, side="right") - 1
    ok = (i >= 0) & (start < hi[order][np.maximum(i, 0)]) if len(lo) else np.zeros(len(start), dtype=bool)
    step_ids = steps["step"][order]
    step = np.where(ok, step_ids[np.maximum(i, 0)], -1) if len(lo) else np.full(len(start), -1)
    colls = colls.assign(step=step)
    ids, _ = group_ids(step, Codes.from_values(colls["kind"]))
    colls["index"] = cumcount(ids)
    return colls.select(
        ["step", "kind", "index", "start_us", "end_us", "dur_us", "bytes", "group_size", "issued_in", "arrival_us"]
    )


def _buffer_broadcast_ms(colls: Table, analysed: Table) -> float | None:
    """Wall time per analysed step of the broadcasts DDP issued in its forward (its buffer broadcast), concurrent
    ones counted once; None where a broadcast's issuer is unknown (``issuers.issuers``)."""
    if len(analysed) == 0:
        return None
    bc = colls[np.asarray(colls["kind"], dtype=object) == "broadcast"]
    if len(bc) == 0:
        return 0.0
    where = np.asarray(bc["issued_in"], dtype=object)
    if any(w is None for w in where.tolist()):
        return None
    mine = bc[where == "ddp_forward"]
    union = iv.union(mine["start_us"], mine["end_us"])
    covered = iv.coverage(union, analysed["start_us"], analysed["end_us"])
    return float(np.sum(covered)) / len(analysed) / 1e3


def _exposed_in(exposed: iv.Intervals, analysed: Table) -> iv.Intervals:
    """The exposed communication inside the analysed steps' windows."""
    if len(analysed) == 0:
        return iv.EMPTY
    return iv.intersect(exposed, iv.union(analysed["start_us"], analysed["end_us"]))
