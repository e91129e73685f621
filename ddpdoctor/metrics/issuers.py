"""Where the job issued each collective (``issuers``), from the ranges that enclose its issuing op on the CPU
timeline: DDP's forward, the backward pass, an optimizer's step, or the training loop itself. What the summaries'
``collectives.issued_in`` column holds; ``metrics.transfer`` splits the exposed transfer by it."""

from __future__ import annotations

import re

import numpy as np

from ddpdoctor.load.model import RankTrace
from ddpdoctor.metrics import intervals as iv
from ddpdoctor.metrics.comm import _COMM_CALL, _CPU_COMM_RANGE, _enclosing, kinds_of
from ddpdoctor.metrics.phases import BACKWARD_OPS, names_matching
from ddpdoctor.table import Table, distinct

# Where the training thread issued a collective (``issuers``): DDP's buffer broadcast runs inside
# ``DistributedDataParallel.forward``; an optimizer's own collectives (ZeroRedundancyOptimizer's parameter
# broadcasts after its local step) inside torch's ``Optimizer.step#<Class>.step`` range; DDP's gradient all-reduces
# inside the backward pass (its reducer's hooks run in ``autograd::engine::evaluate_function: AccumulateGrad``, on
# the training thread on a CPU, on autograd's device thread on a GPU: seen so in every DDP trace of ../shared);
# the training loop's own (a loss or metric all_reduce, all_gather_object) outside all three.
_DDP_FORWARD = re.compile(r"^DistributedDataParallel\.forward$")
OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")
ISSUED_IN = ("ddp_forward", "optimizer", "backward", "loop", "other")


def issuers(rt: RankTrace, colls: Table) -> np.ndarray:
    """For each row of ``collectives(rt)``, where the job issued it: "ddp_forward" (inside
    ``DistributedDataParallel.forward``: DDP's buffer broadcast), "optimizer" (inside an ``Optimizer.step#...``
    range: ZeRO's parameter sync), "backward" (inside an autograd op on its thread: DDP's gradient all-reduce from
    its reducer's hooks, a comm hook's, a custom autograd function's), "loop" (its issuing op found outside all of
    those, on a thread that runs DDP's forward: the training loop's own collective), "other" (issued on another
    thread outside those ranges, or no issuing op of its kind in the trace: a thread of its own); None for every row
    where the trace cannot tell (no issuing ``c10d::*``/``nccl:*``/``gloo:*`` op on a training thread, or no range
    of DDP or an optimizer at all). Without a DDP forward range only "optimizer" is said (nothing else can be told
    apart from it).

    A collective is issued by the latest issuing op of its kind at or before its issue time (the kernel's launch,
    or the start of gloo's work, which runs on gloo's own threads after the training thread queued it): several
    queued at once (ZeRO's asynchronous broadcasts) may be matched one off, but to an op in the same range."""
    out = np.full(len(colls), None, dtype=object)
    if len(colls) == 0 or rt.tables is None:
        return out
    ops = rt.tables.ops
    if len(ops) == 0:
        return out
    ddp_fwd = ops[names_matching(ops, _DDP_FORWARD)]
    opt_step = ops[names_matching(ops, OPTIMIZER_STEP)]
    if len(ddp_fwd) == 0 and len(opt_step) == 0:
        return out
    comm_ops = rt.tables.comm_ops
    if len(comm_ops) == 0:
        return out
    names = comm_ops["name"]
    issued = comm_ops[names.startswith("c10d::")]
    if len(issued) == 0:  # no dispatcher ops: the calls themselves, where they run on a training thread
        issued = comm_ops[names.matches(_COMM_CALL)]
        gloo_threads = distinct(ops["tid"][names_matching(ops, _CPU_COMM_RANGE)])
        issued = issued[~np.isin(issued["tid"], gloo_threads)]
    if len(issued) == 0:
        return out
    kinds = kinds_of(issued["name"])
    in_fwd = _enclosing(ddp_fwd, issued) >= 0 if len(ddp_fwd) else np.zeros(len(issued), dtype=bool)
    in_opt = enclosing_any(opt_step, issued) if len(opt_step) else np.zeros(len(issued), dtype=bool)
    in_bwd = enclosing_any(ops[names_matching(ops, BACKWARD_OPS)], issued)
    # the loop's own: on a thread that runs DDP's forward (the training loop's), outside the three; a collective
    # another thread issued (a comm hook's callback on a backend thread) is not placed
    on_loop = np.isin(issued["tid"], distinct(ddp_fwd["tid"])) if len(ddp_fwd) else np.zeros(len(issued), dtype=bool)
    # backward before the optimizer: a closure (Lightning's automatic optimisation, LBFGS) runs forward and backward
    # inside the optimizer's step, and DDP's gradient all-reduce there is still DDP's
    where = np.select(
        [in_fwd, in_bwd, in_opt, on_loop], ["ddp_forward", "backward", "optimizer", "loop"], "other"
    ).astype(object)
    ts = issued["ts_us"].astype(np.float64)
    at = colls["issued_us"].astype(np.float64)
    row_kinds = np.asarray(colls["kind"], dtype=object)
    for kind in {k for k in row_kinds.tolist() if k is not None}:
        mine = np.flatnonzero(kinds == kind)
        rows = np.flatnonzero(row_kinds == kind)
        if len(mine) == 0:
            out[rows] = "other" if len(ddp_fwd) else None  # issued by nothing the trace shows (a thread of its own)
            continue
        mine = mine[np.argsort(ts[mine], kind="stable")]
        j = np.searchsorted(ts[mine], at[rows] + 1.0, side="right") - 1  # 1 µs: the trace's resolution
        ok = j >= 0
        out[rows[ok]] = where[mine[j[ok]]]
        out[rows[~ok]] = "other"
    if len(ddp_fwd) == 0:  # no DDP forward range: a buffer broadcast cannot be told from any other
        out[out != "optimizer"] = None
    return out


def enclosing_any(ranges: Table, calls: Table) -> np.ndarray:
    """For each call, whether any row of ``ranges`` on its thread encloses it (ranges that nest: an optimizer's
    step inside another's)."""
    out = np.zeros(len(calls), dtype=bool)
    if len(ranges) == 0 or len(calls) == 0:
        return out
    c_tid, c_ts, c_end = calls["tid"], calls["ts_us"], calls["end_us"]
    for tid in distinct(ranges["tid"]):
        rows = ranges[ranges["tid"] == tid]
        sel = np.flatnonzero(c_tid == tid)
        if len(sel) == 0:
            continue
        merged = iv.union(rows["ts_us"], rows["end_us"])
        i = iv.locate(merged[0], merged[1], c_ts[sel].astype(np.float64))
        ok = i >= 0
        ok[ok] = merged[1][i[ok]] >= c_end[sel][ok]
        out[sel] = ok
    return out
