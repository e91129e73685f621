"""Whether a late rank did the same work as the others, only slower: the CPU ops of its training loop per step.

A rank that arrives last at the collectives because it does more (extra matmuls, logging, evaluation) runs ops the
others do not run; a rank that sleeps or waits on data of its own runs the same ops in the same time and spends the
rest of its step between them. A rank that runs the same ops, each of them slower, on a host whose CPUs all ranks
share and that has more runnable threads than CPUs, ran the same work on a slower share of the host: two ranks,
their communication threads and the profiler on 2 CPUs contend for cores, caches and memory bandwidth, and which
rank loses is chance (it shows as CPU time, not as run-queue wait, so ``cpu_starved`` does not see it).

``op_work`` (per rank, from its trace; stored in the rank summary as ``"op_work"``): per CPU-op name on the
training loop's thread, over the analysed steps: ops per step, top-level ops per step (not inside another op) and
their wall time per step (ms). Collective calls (``c10d::``, ``gloo:``, ``nccl:``, ``record_param_comms``) are left
out: their time is waiting for the others.

``compare`` (per rank, against the median of the other ranks, per name):

- ``extra_ops_ms``: the wall time per step of its top-level ops beyond the others' count (its surplus ops of each
  name, at its own mean duration): work only it does;
- ``ops_slower_ms``: the extra wall time per step of the top-level ops both ran (matched counts, its mean duration
  less the others'): the same ops, slower.

Pure functions; no I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

import numpy as np

from ddpdoctor.load.columns import COMM_NAME
from ddpdoctor.load.model import RankTrace
from ddpdoctor.table import Table


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
    cpu = ops[ops["cat"].isin(["cpu_op"]) & ~ops["name"].matches(COMM_NAME)]
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
        count += np.bincount(codes, minlength=k)
        top_count += np.bincount(codes[top], minlength=k)
        top_ms += np.bincount(codes[top], weights=dur[top] / 1e3, minlength=k)
    n = len(steps)
    labels = [*names, "?"]
    return {labels[i]: [count[i] / n, top_count[i] / n, top_ms[i] / n] for i in np.flatnonzero(count).tolist()}


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
