"""DataParallel (single-process, multi-GPU) metrics from its stages in the trace.

``dp_<phase>_ms``: per-step time of each of DataParallel's stages (ms), from the
``DataParallel.scatter/replicate/parallel_apply/gather/backward_reduce`` ranges ``ddpdoctor trace`` records
(``capture/dp.py``). ``dp_replicas``: distinct ``DataParallel.replica[i]``. ``thread_parallelism``: inside
parallel_apply, Σ per-thread busy time ÷ busy time of all threads together (1 = replicas ran one after another,
e.g. on the GIL; N = N threads busy at once).

A plain ``torch.profiler`` trace of a DataParallel job has none of those ranges, only torch's own
``DataParallel.forward`` around each forward. Its stages are then read from the autograd functions DataParallel
runs, which the profiler records as ops on the training thread (``PLAIN_STAGE_OPS``): ``Scatter`` (the inputs
split), ``Broadcast`` (the parameters copied to every device: replicate's copies, not its Python work),
``Gather`` (the outputs), inside a ``DataParallel.forward``; ``ReduceAddCoalesced`` (Broadcast's backward, the
gradients summed onto the source device). The replicas' forwards run in threads the profiler does not follow by
default, so ``dp_parallel_apply_ms`` and ``thread_parallelism`` are not measured from such a trace, and
``dp_replicas`` only where the replicas' GPUs show: the devices the step's kernels ran on, where the forward
replicated the module (a ``Broadcast`` and a ``Gather`` in it: DataParallel over one device runs neither).
"""

from __future__ import annotations

import re

import numpy as np

from ddpdoctor.metrics import intervals as iv
from ddpdoctor.metrics.phases import names_matching
from ddpdoctor.table import Table, distinct

DP_PHASES = ("scatter", "replicate", "parallel_apply", "gather", "backward_reduce")
_REPLICA = re.compile(r"^DataParallel\.replica\[(\d+)\]$")
_STAGE = re.compile(rf"^DataParallel\.({'|'.join(DP_PHASES)})$")
_FORWARD = re.compile(r"^DataParallel\.forward$")
# a plain trace's stages: the op DataParallel's autograd function records, and whether it runs in the forward
PLAIN_STAGE_OPS = {
    "scatter": ("Scatter", True),
    "replicate": ("Broadcast", True),
    "gather": ("Gather", True),
    "backward_reduce": ("ReduceAddCoalesced", False),
}

Stages = dict[str, "iv.Intervals | None"]  # phase -> its intervals (µs); None: not measured


def dp_stages(ops: Table) -> Stages | None:
    """Each of ``DP_PHASES`` as one interval set (µs), None for a phase the trace cannot show (a plain trace's
    parallel_apply); None where the trace has no DataParallel activity."""
    names = [str(n) for n in ops["name"].categories]
    if not any(n.startswith("DataParallel.") for n in names):
        return None
    ts, te = ops["ts_us"], ops["end_us"]
    if any(_STAGE.match(n) for n in names):  # ddpdoctor's ranges
        out: Stages = {}
        for phase in DP_PHASES:
            rows = names_matching(ops, re.compile(rf"^DataParallel\.{phase}$"))
            out[phase] = iv.union(ts[rows], te[rows])
        return out
    rows = names_matching(ops, _FORWARD)
    if not rows.any():
        return None
    forward = iv.union(ts[rows], te[rows])
    cpu = ops["cat"].isin(["cpu_op"])
    plain: Stages = {"parallel_apply": None}
    for phase, (name, in_forward) in PLAIN_STAGE_OPS.items():
        rows = cpu & ops["name"].isin([name])
        found = iv.union(ts[rows], te[rows])
        plain[phase] = iv.intersect(found, forward) if in_forward else found
    return {phase: plain[phase] for phase in DP_PHASES}


def dp_per_step(stages: Stages, lo: np.ndarray, hi: np.ndarray) -> dict[str, np.ndarray]:
    """Per step: ``dp_<phase>_ms`` for each of ``DP_PHASES`` (ms; NaN where the phase is not measured)."""
    out = {}
    for phase in DP_PHASES:
        found = stages[phase]
        out[f"dp_{phase}_ms"] = iv.coverage(found, lo, hi) / 1e3 if found is not None else np.full(len(lo), np.nan)
    return out


def dp_rank_metrics(
    ops: Table, lo: np.ndarray, hi: np.ndarray, stages: Stages | None = None, kernels: Table | None = None
) -> dict[str, float | int | None]:
    """``dp_replicas`` and ``thread_parallelism`` over the analysed step windows [lo, hi]; ``stages`` and
    ``kernels`` (the rank's device events) for a plain trace's replicas."""
    names = [str(n) for n in ops["name"].categories]
    replicas = {int(m.group(1)) for n in names if (m := _REPLICA.match(n))}
    apply = names_matching(ops, re.compile(r"^DataParallel\.parallel_apply$"))
    if not apply.any():
        plain = _plain_replicas(stages, kernels, lo, hi) if stages and stages["parallel_apply"] is None else None
        return {"dp_replicas": len(replicas) or plain, "thread_parallelism": None}
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


def _plain_replicas(stages: Stages, kernels: Table | None, lo: np.ndarray, hi: np.ndarray) -> int | None:
    """A plain trace's replicas: the GPUs its kernels ran on in the analysed steps, where those steps' forwards
    replicated the module (a Broadcast and a Gather in them); None where that does not show two or more."""
    if kernels is None or not len(kernels) or not len(lo):
        return None
    steps = iv.union(lo, hi)
    for phase in ("replicate", "gather"):
        found = stages[phase]
        if found is None or iv.total(iv.intersect(found, steps)) <= 0:
            return None
    rows = kernels["cat"].isin(["kernel"])
    device = kernels["device"][rows]
    ts, te = kernels["ts_us"][rows], kernels["end_us"][rows]
    inside = (te > float(np.min(lo))) & (ts < float(np.max(hi))) & (device >= 0)
    found = set(np.unique(device[inside]).tolist())
    return len(found) if len(found) >= 2 else None
