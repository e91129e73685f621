"""DataParallel (single-process, multi-GPU) metrics from the ``DataParallel.*`` ranges.

``dp_<phase>_ms``: per-step total of the
``DataParallel.scatter/replicate/parallel_apply/gather/backward_reduce`` ranges (ms). ``dp_replicas``:
distinct ``DataParallel.replica[i]``. ``thread_parallelism``: inside parallel_apply, Σ per-thread busy
time ÷ busy time of all threads together (1 = replicas ran one after another, e.g. on the GIL; N = N
threads busy at once).
"""

from __future__ import annotations

import re

import numpy as np

from ddpdoctor.metrics import intervals as iv
from ddpdoctor.metrics.phases import names_matching
from ddpdoctor.table import Table, distinct

DP_PHASES = ("scatter", "replicate", "parallel_apply", "gather", "backward_reduce")
_REPLICA = re.compile(r"^DataParallel\.replica\[(\d+)\]$")


def dp_per_step(ops: Table, lo: np.ndarray, hi: np.ndarray) -> dict[str, np.ndarray]:
    """Per step: ``dp_<phase>_ms`` for each of ``DP_PHASES`` (ms)."""
    out = {}
    ts, te = ops["ts_us"], ops["end_us"]
    for phase in DP_PHASES:
        rows = names_matching(ops, re.compile(rf"^DataParallel\.{phase}$"))
        out[f"dp_{phase}_ms"] = iv.coverage(iv.union(ts[rows], te[rows]), lo, hi) / 1e3
    return out


def dp_intervals(ops: Table, phase: str) -> iv.Intervals:
    """The ``DataParallel.<phase>`` ranges of ``ops`` as one interval set (µs)."""
    rows = names_matching(ops, re.compile(rf"^DataParallel\.{phase}$"))
    return iv.union(ops["ts_us"][rows], ops["end_us"][rows])


def dp_rank_metrics(ops: Table, lo: np.ndarray, hi: np.ndarray) -> dict[str, float | int | None]:
    """``dp_replicas`` and ``thread_parallelism`` over the analysed step windows [lo, hi]."""
    names = [str(n) for n in ops["name"].categories]
    replicas = {int(m.group(1)) for n in names if (m := _REPLICA.match(n))}
    apply = names_matching(ops, re.compile(r"^DataParallel\.parallel_apply$"))
    if not apply.any():
        return {"dp_replicas": len(replicas) or None, "thread_parallelism": None}
    ts, te = ops["ts_us"], ops["end_us"]
    steps = iv.union(lo, hi)
    windows = iv.intersect(iv.union(ts[apply], te[apply]), steps)
    busy = ops["cat"].isin(["cpu_op"])
    tid, ts, te = ops["tid"][busy], ts[busy], te[busy]
    per_thread = 0.0
    all_threads: list[iv.Intervals] = []
    for t in distinct(tid):
        mine = tid == t
        thread_busy = iv.intersect(iv.union(ts[mine], te[mine]), windows)
        per_thread += iv.total(thread_busy)
        all_threads.append(thread_busy)
    together = iv.total(iv.union_all(*all_threads)) if all_threads else 0.0
    return {
        "dp_replicas": len(replicas) or None,
        "thread_parallelism": per_thread / together if together > 0 else None,
    }
