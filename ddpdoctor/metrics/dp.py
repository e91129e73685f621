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
import pandas as pd

from ddpdoctor.metrics import intervals as iv
from ddpdoctor.metrics.phases import names_matching

DP_PHASES = ("scatter", "replicate", "parallel_apply", "gather", "backward_reduce")
_REPLICA = re.compile(r"^DataParallel\.replica\[(\d+)\]$")


def dp_per_step(ops: pd.DataFrame, lo: np.ndarray, hi: np.ndarray) -> dict[str, np.ndarray]:
    """Per step: ``dp_<phase>_ms`` for each of ``DP_PHASES`` (ms)."""
    out = {}
    for phase in DP_PHASES:
        rows = ops[names_matching(ops, re.compile(rf"^DataParallel\.{phase}$"))]
        out[f"dp_{phase}_ms"] = (
            iv.coverage(iv.union(rows["ts_us"].to_numpy(), rows["end_us"].to_numpy()), lo, hi) / 1e3
        )
    return out


def dp_rank_metrics(ops: pd.DataFrame, lo: np.ndarray, hi: np.ndarray) -> dict[str, float | int | None]:
    """``dp_replicas`` and ``thread_parallelism`` over the analysed step windows [lo, hi]."""
    names = [str(n) for n in ops["name"].cat.categories]
    replicas = {int(m.group(1)) for n in names if (m := _REPLICA.match(n))}
    apply = ops[names_matching(ops, re.compile(r"^DataParallel\.parallel_apply$"))]
    if len(apply) == 0:
        return {"dp_replicas": len(replicas) or None, "thread_parallelism": None}
    steps = iv.union(lo, hi)
    windows = iv.intersect(iv.union(apply["ts_us"].to_numpy(), apply["end_us"].to_numpy()), steps)
    busy_ops = ops[(ops["cat"] == "cpu_op")]
    per_thread = 0.0
    all_threads: list[iv.Intervals] = []
    for _, g in busy_ops.groupby("tid"):
        busy = iv.intersect(iv.union(g["ts_us"].to_numpy(), g["end_us"].to_numpy()), windows)
        per_thread += iv.total(busy)
        all_threads.append(busy)
    together = iv.total(iv.union_all(*all_threads)) if all_threads else 0.0
    return {
        "dp_replicas": len(replicas) or None,
        "thread_parallelism": per_thread / together if together > 0 else None,
    }
