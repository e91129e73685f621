"""FSDP2 (``torch.distributed.fsdp.fully_shard``) units: the all-gather and gradient reduce of each unit, and how
much of each is exposed (not overlapped by computation on the rank).

What FSDP2 writes into a torch.profiler trace (torch 2.4 to 2.13), on the thread that runs forward and backward:

- ``FSDP::all_gather (<fqn>)`` around the all-gather of one unit's parameters (``fsdp::all_gather_copy_in``, then
  the ``c10d::_allgather_base_`` call), ``FSDP::all_gather_copy_out (<fqn>)`` where it waits and splits the output;
  inside ``FSDP::pre_forward``/``FSDP::forward_prefetch for <fqn>`` in forward and ``FSDP::pre_backward``/
  ``FSDP::backward_prefetch for <fqn>`` in backward (when ``reshard_after_forward`` freed them after forward).
- ``FSDP::post_backward_reduce (<fqn>)`` around the gradient reduce (``fsdp::chunk_cat``, then
  ``c10d::_reduce_scatter_base_``; HSDP adds an all-reduce); the root's run in
  ``FSDP::root_post_backward_callback``.
- The unit of the module ``fully_shard`` was called on last (the root, fqn ``""``) has no ``(<fqn>)``; a unit with
  several parameter groups adds `` [pg=N]``. Shown here as ``(root)`` and the fqn.

A unit's collectives are timed where they run: NCCL kernels (on the device, matched to the unit by the host time
of their launch, which lies inside the unit's range), or gloo's own ``gloo:*`` ranges on gloo's threads, matched
to the ``c10d::*`` call that issued them in issue order (gloo runs a process group's work first in, first out).
Exposed time = that time less the computation of ``comm.busy_sets`` (the same sets as ``exposed_comm_ms``), per
analysed step.

On gloo, which has no reduce-scatter of tensors, ``_reduce_scatter_base`` runs as an all-reduce of every rank's whole
gradient and a copy of this rank's shard: each rank moves about twice what NCCL's reduce-scatter moves, so the
reduce time here overstates what the same job pays on NCCL. And on CPU FSDP2 waits for every collective in the
training thread (``async_op`` is off and there are no streams): nothing overlaps, however the model is wrapped.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ddpdoctor.load.model import RankTrace
from ddpdoctor.metrics import catalog
from ddpdoctor.metrics import intervals as iv
from ddpdoctor.metrics.comm import COLLECTIVE_CALL, _numel, _type_bytes, busy_sets, comm_kernels, kind_of
from ddpdoctor.metrics.phases import names_matching
from ddpdoctor.metrics.steps import first_index, launch_times
from ddpdoctor.table import Table, distinct

FSDP_METRICS = catalog.group("fsdp")
ROOT = "(root)"
UNIT_COLUMNS = (
    "unit",
    "param_bytes",
    "param_share",
    "allgather_calls",
    "allgather_ms",
    "allgather_exposed_ms",
    "reduce_calls",
    "reduce_ms",
    "reduce_exposed_ms",
)
_UNIT_RANGE = re.compile(r"^FSDP::(?P<what>all_gather|post_backward_reduce)(?: \((?P<fqn>[^()]*)\))?(?: \[pg=\d+\])?$")
_PREFETCH = re.compile(r"^FSDP::(forward|backward)_prefetch for ")
_BACKWARD_CONTEXT = re.compile(r"^FSDP::(pre_backward|backward_prefetch)\b")
_RUNS_ON_CPU = re.compile(r"^(gloo|ucc|mpi):")
# FSDP2's ranges in which the training thread issues a collective and, on CPU, waits for it
WAITS_IN = re.compile(r"^FSDP::(all_gather|all_gather_copy_out|post_backward_reduce|post_backward_rs_wait)\b")
# not work inside those ranges: the collective calls (their wait) and what comm.busy_sets leaves out
_NOT_WORK = re.compile(rf"^({COLLECTIVE_CALL}|ProfilerStep#)")


def fsdp_rank(rt: RankTrace, analysed: Table) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """(per-rank metrics of the catalog group ``fsdp``, the per-unit table as columns of ``UNIT_COLUMNS``) over
    the analysed step windows of ``analysed`` (``start_us``, ``end_us``). All None / empty without FSDP2's
    ranges in the trace."""
    out: dict[str, Any] = dict.fromkeys(FSDP_METRICS)
    ops = rt.tables.ops if rt.tables is not None else None
    if ops is None or len(ops) == 0 or len(analysed) == 0:
        return out, {}
    is_unit = names_matching(ops, _UNIT_RANGE)
    if not is_unit.any():
        return out, {}
    ranges = ops[is_unit]
    parsed = {name: _UNIT_RANGE.match(name) for name in ranges["name"].used()}
    names = ranges["name"].values()
    unit = np.array([_unit_name(parsed[n].group("fqn")) for n in names], dtype=object)
    is_ag = np.array([parsed[n].group("what") == "all_gather" for n in names], dtype=bool)
    backward_ctx = ops[names_matching(ops, _BACKWARD_CONTEXT)]
    in_backward = _inside(backward_ctx, ranges["tid"], ranges["ts_us"])
    rows = _executions(rt, ranges)  # (range row, start, end, bytes, elem bytes, executed kind) per collective
    comm, compute, on_device = busy_sets(rt)
    if not on_device:
        compute = _without_fsdp_waits(ops, compute)
    lo, hi = analysed["start_us"], analysed["end_us"]
    n_steps = len(analysed)

    def per_step(mask: np.ndarray, exposed: bool) -> float:
        spans = iv.union(rows["start_us"][mask], rows["end_us"][mask])
        if exposed:
            spans = iv.subtract(spans, compute)
        return float(np.sum(iv.coverage(spans, lo, hi))) / 1e3 / n_steps

    in_window = _in_windows(rows["start_us"], lo, hi)
    r_unit = unit[rows["range"]] if len(rows) else np.zeros(0, dtype=object)
    r_ag = is_ag[rows["range"]] if len(rows) else np.zeros(0, dtype=bool)
    r_bwd = in_backward[rows["range"]] if len(rows) else np.zeros(0, dtype=bool)
    units = [u for u in dict.fromkeys(unit.tolist()) if np.any(in_window & (r_unit == u))]
    if not units:
        return out, {}
    table: dict[str, list[Any]] = {c: [] for c in UNIT_COLUMNS}
    for u in units:
        mine = in_window & (r_unit == u)
        ag, red = mine & r_ag, mine & ~r_ag
        sizes = rows["bytes"][ag] if ag.any() else rows["bytes"][red]
        sizes = sizes[~np.isnan(sizes)]
        table["unit"].append(u)
        table["param_bytes"].append(float(np.max(sizes)) if len(sizes) else None)
        table["allgather_calls"].append(float(ag.sum()) / n_steps)
        table["allgather_ms"].append(per_step(ag, False))
        table["allgather_exposed_ms"].append(per_step(ag, True))
        table["reduce_calls"].append(float(red.sum()) / n_steps)
        table["reduce_ms"].append(per_step(red, False))
        table["reduce_exposed_ms"].append(per_step(red, True))
    sized = [b for b in table["param_bytes"] if b is not None]
    total = float(sum(sized)) if sized else 0.0
    table["param_share"] = [(b / total if b is not None and total > 0 else None) for b in table["param_bytes"]]
    ag_all, red_all = in_window & r_ag, in_window & ~r_ag
    out["fsdp_units"] = len(units)
    out["fsdp_allgather_ms"] = per_step(ag_all, False)
    out["fsdp_allgather_exposed_ms"] = per_step(ag_all, True)
    out["fsdp_backward_allgather_ms"] = per_step(ag_all & r_bwd, False)
    out["fsdp_reduce_ms"] = per_step(red_all, False)
    out["fsdp_reduce_exposed_ms"] = per_step(red_all, True)
    shares = [s if s is not None else -1.0 for s in table["param_share"]]
    big = int(np.argmax(shares)) if shares else 0
    out["fsdp_largest_unit"] = table["unit"][big]
    out["fsdp_largest_unit_share"] = table["param_share"][big]
    out["fsdp_largest_unit_exposed_ms"] = table["allgather_exposed_ms"][big] + table["reduce_exposed_ms"][big]
    tensors = _unit_tensors(rt, ranges, unit, is_ag).get(table["unit"][big])
    share = table["param_share"][big]
    if tensors and share is not None:
        out["fsdp_largest_unit_tensors"] = len(tensors)
        out["fsdp_largest_unit_tensor_share"] = share * max(tensors) / sum(tensors)
    out["fsdp_explicit_prefetch"] = bool(names_matching(ops, _PREFETCH).any())
    kinds = rows["kind"][red_all]
    out["fsdp_reduce_as_allreduce"] = bool(len(kinds)) and bool(np.all(kinds == "all_reduce"))
    out["fsdp_comm_on_device"] = bool(on_device)
    elem = rows["elem_bytes"][ag_all]
    elem = elem[~np.isnan(elem)]
    out["fsdp_allgather_elem_bytes"] = float(np.max(elem)) if len(elem) else None
    elem = rows["elem_bytes"][red_all]
    elem = elem[~np.isnan(elem)]
    out["fsdp_reduce_elem_bytes"] = float(np.max(elem)) if len(elem) else None
    return out, table


_COPY_IN = "fsdp::all_gather_copy_in"


def _unit_tensors(rt: RankTrace, ranges: Table, unit: np.ndarray, is_ag: np.ndarray) -> dict[str, list[int]]:
    """unit -> the elements of each parameter tensor (this rank's shard of it) the unit all-gathers: the first
    argument of the ``fsdp::all_gather_copy_in`` inside its ``FSDP::all_gather`` range, a list of each tensor's
    Input Dims (recorded with ``record_shapes``; a unit absent where none was)."""
    c = rt.tables.comm_ops
    if c is None or len(c) == 0:
        return {}
    calls = c[c["name"].isin([_COPY_IN])]
    if len(calls) == 0:
        return {}
    at = _range_at(ranges, calls["tid"], calls["ts_us"].astype(np.float64))
    out: dict[str, list[int]] = {}
    for row, dims in zip(at.tolist(), calls["input_dims"].tolist(), strict=True):
        if row < 0 or not is_ag[row] or unit[row] in out:
            continue
        numels = _tensor_numels(dims[0] if isinstance(dims, list) and dims else None)
        if numels:
            out[unit[row]] = numels
    return out


def _tensor_numels(dims: Any) -> list[int] | None:
    """The elements of each tensor of a TensorList's Input Dims (``[[1280], [5]]`` -> ``[1280, 5]``); None
    where it is not one."""
    if not isinstance(dims, list) or not dims:
        return None
    out = []
    for shape in dims:
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            return None
        out.append(int(np.prod(shape, dtype=np.int64)) if shape else 1)
    return out if sum(out) > 0 else None


def _without_fsdp_waits(ops: Table, compute: iv.Intervals) -> iv.Intervals:
    """The CPU computation less the time the training thread waits inside FSDP2's collective ranges: an op that
    encloses one (``autograd::engine::evaluate_function: AddBackward0`` around the pre-backward hook) counts as
    computation for its whole length in ``busy_sets``, although on CPU the thread is blocked in the all-gather or
    reduce inside it. The ops inside those ranges that do work (``fsdp::all_gather_copy_in``, ``fsdp::chunk_cat``,
    copies) stay computation."""
    waits = ops[names_matching(ops, WAITS_IN)]
    if len(waits) == 0:
        return compute
    spans = iv.union(waits["ts_us"], waits["end_us"])
    work = ops["cat"].isin(["cpu_op"]) & ~names_matching(ops, _NOT_WORK)
    inner = np.zeros(len(ops), dtype=bool)
    for tid in distinct(waits["tid"]):
        mine = waits[waits["tid"] == tid]
        own = iv.union(mine["ts_us"], mine["end_us"])
        rows = np.flatnonzero(work & (ops["tid"] == tid))
        start = iv.locate(own[0], own[1], ops["ts_us"][rows].astype(np.float64))
        end = iv.locate(own[0], own[1], ops["end_us"][rows].astype(np.float64))
        inner[rows[(start >= 0) & (start == end)]] = True
    return iv.union_all(iv.subtract(compute, spans), iv.union(ops["ts_us"][inner], ops["end_us"][inner]))


def _unit_name(fqn: str | None) -> str:
    return fqn if fqn else ROOT


def _in_windows(t: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    if len(t) == 0 or len(lo) == 0:
        return np.zeros(len(t), dtype=bool)
    order = np.argsort(lo, kind="stable")
    i = np.searchsorted(lo[order], t, side="right") - 1
    return (i >= 0) & (t < hi[order][np.maximum(i, 0)])


def _inside(ranges: Table, tids: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Whether each time ``t`` (on thread ``tids``) lies inside one of ``ranges`` on the same thread."""
    out = np.zeros(len(t), dtype=bool)
    if len(ranges) == 0:
        return out
    for tid in distinct(ranges["tid"]):
        sel = np.flatnonzero(tids == tid)
        if len(sel) == 0:
            continue
        mine = ranges[ranges["tid"] == tid]
        spans = iv.union(mine["ts_us"], mine["end_us"])
        out[sel] = iv.locate(spans[0], spans[1], t[sel].astype(np.float64)) >= 0
    return out


def _range_at(ranges: Table, tids: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For each time ``t`` on thread ``tids``, the row of ``ranges`` (same thread) holding it: the latest one
    that starts at or before it and ends at or after it; -1 when none."""
    out = np.full(len(t), -1, dtype=np.int64)
    if len(ranges) == 0 or len(t) == 0:
        return out
    r_tid, r_ts, r_end = ranges["tid"], ranges["ts_us"], ranges["end_us"]
    for tid in distinct(r_tid):
        sel = np.flatnonzero((tids == tid) & ~np.isnan(t))
        if len(sel) == 0:
            continue
        rows = np.flatnonzero(r_tid == tid)
        rows = rows[np.argsort(r_ts[rows], kind="stable")]
        j = np.searchsorted(r_ts[rows], t[sel], side="right") - 1
        ok = (j >= 0) & (r_end[rows][np.maximum(j, 0)] >= t[sel])
        out[sel[ok]] = rows[j[ok]]
    return out


def _executions(rt: RankTrace, ranges: Table) -> Table:
    """One row per collective that ran for an FSDP unit: ``range`` (its row of ``ranges``), ``start_us``,
    ``end_us`` (when it ran), ``bytes`` (the whole buffer, nccl-tests' convention), ``elem_bytes`` and ``kind``
    (what ran: all_gather, reduce_scatter, or all_reduce where gloo reduces that way)."""
    c = rt.tables.comm_ops
    empty = Table(
        {
            "range": np.zeros(0, dtype=np.int64),
            "start_us": np.zeros(0),
            "end_us": np.zeros(0),
            "bytes": np.zeros(0),
            "elem_bytes": np.zeros(0),
            "kind": np.zeros(0, dtype=object),
        }
    )
    if c is None or len(c) == 0:
        return empty
    issued = c[c["name"].startswith("c10d::")]
    issued_kind = issued["name"].map({n: kind_of(n) for n in issued["name"].used()})
    has_kind = np.array([k is not None for k in issued_kind], dtype=bool)
    issued, issued_kind = issued[has_kind], issued_kind[has_kind]
    # the unit each call was issued for, its size and element size
    issue_range = _range_at(ranges, issued["tid"], issued["ts_us"].astype(np.float64))
    dims, types = issued["input_dims"].tolist(), issued["input_type"].tolist()
    elem = np.array([_type_bytes(t) or np.nan for t in types], dtype=np.float64)
    nbytes = np.array([_numel(d) for d in dims], dtype=np.float64) * elem
    nbytes[nbytes <= 0] = np.nan
    kernels = comm_kernels(rt)
    if len(kernels):
        ops = rt.tables.ops
        launched = launch_times(rt, kernels)
        at = first_index(ops["correlation"], kernels["correlation"])
        tids = np.where(at >= 0, ops["tid"][np.maximum(at, 0)], -1) if len(ops) else np.full(len(kernels), -1)
        k_range = _range_at(ranges, tids, launched)
        # the call issued in the same range (its size): the latest one launched before the kernel
        call = _latest_before(issued, issue_range, k_range, launched)
        keep = k_range >= 0
        kind = np.array([kind_of(n) for n in kernels["name"].values()], dtype=object)
        k_bytes = (
            np.where(call >= 0, nbytes[np.maximum(call, 0)], np.nan) if len(nbytes) else np.full(len(call), np.nan)
        )
        k_elem = np.where(call >= 0, elem[np.maximum(call, 0)], np.nan) if len(elem) else np.full(len(call), np.nan)
        return Table(
            {
                "range": k_range[keep],
                "start_us": kernels["ts_us"][keep].astype(np.float64),
                "end_us": kernels["end_us"][keep].astype(np.float64),
                "bytes": k_bytes[keep],
                "elem_bytes": k_elem[keep],
                "kind": kind[keep],
            }
        )
    runs = c[c["name"].matches(_RUNS_ON_CPU)]
    if len(runs) == 0:
        return empty
    run_kind = runs["name"].map({n: kind_of(n) for n in runs["name"].used()})
    reduce_as = "reduce_scatter" if np.any(run_kind == "reduce_scatter") else "all_reduce"
    queue_kind = np.array([reduce_as if k == "reduce_scatter" else k for k in issued_kind], dtype=object)
    match = _fifo(issued["ts_us"].astype(np.float64), queue_kind, runs["ts_us"].astype(np.float64), run_kind)
    ok = (match >= 0) & (issue_range >= 0)
    return Table(
        {
            "range": issue_range[ok],
            "start_us": runs["ts_us"][match[ok]].astype(np.float64),
            "end_us": runs["end_us"][match[ok]].astype(np.float64),
            "bytes": nbytes[ok],
            "elem_bytes": elem[ok],
            "kind": run_kind[match[ok]],
        }
    )


def _latest_before(issued: Table, issue_range: np.ndarray, k_range: np.ndarray, launched: np.ndarray) -> np.ndarray:
    """For each kernel, the issued call in the same FSDP range launched last before it (-1 when none)."""
    out = np.full(len(k_range), -1, dtype=np.int64)
    if len(issued) == 0:
        return out
    ts = issued["ts_us"].astype(np.float64)
    for r in distinct(k_range[k_range >= 0]):
        calls = np.flatnonzero(issue_range == r)
        if len(calls) == 0:
            continue
        calls = calls[np.argsort(ts[calls], kind="stable")]
        sel = np.flatnonzero(k_range == r)
        j = np.searchsorted(ts[calls], launched[sel], side="right") - 1
        out[sel] = np.where(j >= 0, calls[np.maximum(j, 0)], calls[0])
    return out


def _fifo(issue_ts: np.ndarray, issue_kind: np.ndarray, run_ts: np.ndarray, run_kind: np.ndarray) -> np.ndarray:
    """For each issued call, the gloo range that ran it (-1 when none): per kind, in order, the first range not yet
    taken that starts at or after the call (a range that starts before any call left is one issued before the
    trace began)."""
    out = np.full(len(issue_ts), -1, dtype=np.int64)
    for kind in {k for k in issue_kind.tolist() if k is not None}:
        calls = np.flatnonzero(issue_kind == kind)
        calls = calls[np.argsort(issue_ts[calls], kind="stable")]
        runs = np.flatnonzero(run_kind == kind)
        runs = runs[np.argsort(run_ts[runs], kind="stable")]
        j = 0
        for i in calls:
            while j < len(runs) and run_ts[runs[j]] < issue_ts[i]:
                j += 1
            if j == len(runs):
                break
            out[i] = runs[j]
            j += 1
    return out


def run_units(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-unit table of the run: each unit's values, the mean over the ranks that have it (ms per step), and
    the rank where its exposed time is largest."""
    per_unit: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for s in summaries:
        cols = s.get("fsdp_units") or {}
        n = len(cols.get("unit") or [])
        for i in range(n):
            row = {c: (cols.get(c) or [None] * n)[i] for c in UNIT_COLUMNS}
            per_unit.setdefault(str(row["unit"]), []).append((int(s["rank"]), row))
    out = []
    for unit, rows in per_unit.items():
        entry: dict[str, Any] = {"unit": unit, "ranks": len(rows)}
        for c in UNIT_COLUMNS[1:]:
            values = [r[c] for _, r in rows if r.get(c) is not None]
            entry[c] = float(np.mean(values)) if values else None
        exposed = [
            ((r.get("allgather_exposed_ms") or 0.0) + (r.get("reduce_exposed_ms") or 0.0), rank) for rank, r in rows
        ]
        entry["worst_rank"] = max(exposed)[1] if exposed else None
        out.append(entry)
    return out
