"""Whether a late rank did the same work as the others, only slower: the CPU ops of its training loop per step.

A rank that arrives last at the collectives because it does more (extra matmuls, logging, evaluation) runs ops the
others do not run; a rank that sleeps or waits on data of its own runs the same ops in the same time and spends the
rest of its step between them. A rank that runs the same ops, each of them slower, on a host whose CPUs all ranks
share and that has more runnable threads than CPUs, ran the same work on a slower share of the host: two ranks,
their communication threads and the profiler on 2 CPUs contend for cores, caches and memory bandwidth, and which
rank loses is chance (it shows as CPU time, not as run-queue wait, so ``cpu_starved`` does not see it).

``op_work`` (per rank, from its trace; stored in the rank summary as ``"op_work"``): per CPU-op name on the
training loop's thread, over the analysed steps: ops per step, top-level ops per step (not inside another op) and
their wall time per step (ms). Collective calls (``c10d::``, ``gloo:``, ``nccl:``, ``record_param_comms``, the
functional collectives ``_c10d_functional::`` and their waits) are left out: their time is waiting for the others.
So is their time inside the ops that hold them: a DTensor op waits in ``_c10d_functional::wait_tensor`` inside its
``aten::linear`` (tensor parallelism's collectives are waited for where their result is first used), and the rank
that arrived first waits longest there: counted as op time, its ops looked slower and the late rank's faster
(a balanced tensor-parallel job on a busy host: rank 1's ``aten::linear`` 19.7 ms a step, rank 0's 10.5). FSDP2
issues its collectives and, on the CPU, waits for them in ranges of its own (``FSDP::all_gather``,
``FSDP::post_backward_reduce``, ...: ``fsdp.WAITS_IN``), inside the autograd node that runs its post-backward
hook; their time is taken out of the ops that hold them as well.

``compare`` (per rank, against the median of the other ranks, per name):

- ``extra_ops_ms``: the wall time per step of its top-level ops beyond the others' count (its surplus ops of each
  name, at its own mean duration): work only it does;
- ``ops_slower_ms``: the extra wall time per step of the top-level ops both ran (matched counts, its mean duration
  less the others'): the same ops, slower.

Pure functions; no I/O.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping
from typing import Any

import numpy as np

from ddpdoctor.load.model import RankTrace
from ddpdoctor.metrics import intervals as iv
from ddpdoctor.metrics.comm import COLLECTIVE_CALL
from ddpdoctor.metrics.fsdp import WAITS_IN
from ddpdoctor.metrics.phases import names_matching
from ddpdoctor.table import Table

# Collective calls and their waits: the others' time, not this rank's work
COLLECTIVE = re.compile(rf"^({COLLECTIVE_CALL})")


def op_work(rt: RankTrace, analysed: Table) -> dict[str, list[float]] | None:
    """``{name: [ops per step, top-level ops per step, top-level ms per step]}`` of the CPU ops on the training
    loop's thread (the thread of its ``ProfilerStep#`` ranges) in the analysed steps; None without them."""
    steps = rt.tables.steps
    if not len(steps) or not len(analysed):
        return None
    keep = np.isin(steps["step"], analysed["step"])
    steps = steps[keep]
    if not len(steps):
        return None
    ops = rt.tables.ops
    is_cpu, is_comm = ops["cat"].isin(["cpu_op"]), names_matching(ops, COLLECTIVE)
    in_fsdp_wait = ops["cat"].isin(["user_annotation"]) & names_matching(ops, WAITS_IN)
    cpu, comm = ops[is_cpu & ~is_comm], ops[(is_cpu & is_comm) | in_fsdp_wait]
    names = list(cpu["name"].categories)
    k = len(names) + 1  # the last slot: ops without a name (code -1)
    count, top_count, top_ms = np.zeros(k), np.zeros(k), np.zeros(k)
    for lo, hi, tid, span in zip(
        steps["ts_us"].tolist(), steps["end_us"].tolist(), steps["tid"].tolist(), steps["span"].tolist(), strict=True
    ):
        rows = (cpu["tid"] == tid) & (cpu["span"] == span) & (cpu["ts_us"] >= lo) & (cpu["ts_us"] < hi)
        if not rows.any():
            continue
        part = cpu[rows]
        ts, dur = part["ts_us"].astype(np.float64), part["dur_us"].astype(np.float64)
        order = np.lexsort((-dur, ts))
        ts, dur, codes = ts[order], dur[order], part["name"].codes[order]
        codes = np.where(codes >= 0, codes, k - 1)
        reach = np.maximum.accumulate(ts + dur)
        top = np.r_[True, ts[1:] >= reach[:-1]]  # not inside an earlier op
        top_dur = dur[top] - _waited_inside(comm, tid, span, lo, hi, ts[top], ts[top] + dur[top])
        count += np.bincount(codes, minlength=k)
        top_count += np.bincount(codes[top], minlength=k)
        top_ms += np.bincount(codes[top], weights=top_dur / 1e3, minlength=k)
    n = len(steps)
    labels = [*names, "?"]
    return {labels[i]: [count[i] / n, top_count[i] / n, top_ms[i] / n] for i in np.flatnonzero(count).tolist()}


def _waited_inside(
    comm: Table, tid: int, span: int, lo: float, hi: float, top_ts: np.ndarray, top_end: np.ndarray
) -> np.ndarray:
    """The time of the collective calls (the outermost of nested ones) inside each of the top-level ops
    ``[top_ts, top_end)`` (sorted, disjoint) of one step's thread."""
    waited = np.zeros(len(top_ts))
    rows = (comm["tid"] == tid) & (comm["span"] == span) & (comm["ts_us"] >= lo) & (comm["ts_us"] < hi)
    if not len(top_ts) or not rows.any():
        return waited
    part = comm[rows]
    ts, end = iv.union(part["ts_us"], part["ts_us"] + part["dur_us"])  # a thread's calls nest: the outermost
    at = np.searchsorted(top_ts, ts, side="right") - 1
    inside = (at >= 0) & (end <= top_end[np.maximum(at, 0)])
    np.add.at(waited, at[inside], end[inside] - ts[inside])
    return waited


def compare(mine: Mapping[str, Any], others: list[Mapping[str, Any]]) -> tuple[float, float]:
    """(``extra_ops_ms``, ``ops_slower_ms``) of one rank's ``op_work`` against the other ranks' (module
    docstring)."""
    extra = slower = 0.0
    for name, (_, top, ms) in mine.items():
        if top <= 0:
            continue
        theirs = [o.get(name) for o in others]
        count = statistics.median([t[1] if t else 0.0 for t in theirs])
        mean = ms / top
        extra += max(0.0, top - count) * mean
        durations = [t[2] / t[1] for t in theirs if t and t[1] > 0]
        if count > 0 and durations:
            slower += min(top, count) * (mean - statistics.median(durations))
    return extra, slower
