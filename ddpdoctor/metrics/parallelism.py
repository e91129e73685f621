"""Which parallelism a job uses, from what its traces show (and the capture, when there is one).

Per rank (``parallelism_evidence``, from one rank's trace): the collective calls per analysed step by kind and by
the host phase they were issued in, and whether DDP's or FSDP's own ranges are in the trace. Per run
(``detect_parallelism``), the signatures, each on evidence in the data:

- ``dp``: ``nn.DataParallel`` (one process, ``run.mode == "dp"``).
- ``ddp``: DDP's ranges (``DistributedDataParallel.forward``, ``ddp.reducer::*``) or its configuration in the
  capture; or, without them, gradient all-reduces issued only during backward (data-parallel gradient sync).
- ``fsdp2``: FSDP2's (``fully_shard``) per-unit ranges (``FSDP::all_gather (<fqn>)``...: ``metrics/fsdp.py``).
- ``fsdp``: FSDP's ranges, or all_gather and reduce_scatter in every step (parameter shards gathered for compute,
  gradient shards reduced: FSDP / ZeRO-3). Rules that fit ``fsdp`` fit ``fsdp2`` too.
- ``tp``: collectives issued inside tensor-parallel ranges (Megatron-LM's ``_ReduceFromModelParallelRegion``,
  ``ColumnParallelLinear``..., DTensor's ``Redistribute``), or all-reduces issued during the forward pass, several
  per step (tensor-parallel layers reduce their partial outputs in forward and backward; data parallelism never
  all-reduces in forward). Collectives are placed where the training thread issues them (``c10d::*`` ops), not
  where gloo's threads run them.
- ``pipeline``: point-to-point send/recv between stages.
- ``zero1``: optimizer-state sharding (``ZeroRedundancyOptimizer``): parameter broadcasts or all-gathers issued
  inside the optimizer's step (``Optimizer.step#...``), after the local update, on top of DDP's gradient
  all-reduce (``ddp+zero1``). A qualifier: the DDP rules still fit such a job.

Several signatures make a mix (``"tp+ddp"``). ``"none"``: several ranks and no collective in the analysed steps;
``"single"``: one process; ``"unknown"``: collectives that fit no signature (the rules that need to know say so).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ddpdoctor.load.model import RankTrace
from ddpdoctor.metrics import catalog
from ddpdoctor.metrics.comm import _enclosing, _notna, kinds_of
from ddpdoctor.metrics.issuers import OPTIMIZER_STEP, enclosing_any
from ddpdoctor.metrics.phases import host_phases, names_matching, phase_at
from ddpdoctor.table import Table

_DDP_RANGES = re.compile(
    r"^DistributedDataParallel\.forward$|^torch\.distributed\.ddp\.reducer::|^torch::distributed::reducer::"
)
_FSDP_RANGES = re.compile(r"^FullyShardedDataParallel\.|^FSDP::|^FSDP2?\b|fully_shard")
# Ranges of tensor-parallel layers and functions: Megatron-LM's mappings and layers, DTensor's redistribution,
# torch.distributed.tensor.parallel styles. Not "DTensor" alone: FSDP2 keeps its parameters as DTensors too.
_TP_RANGES = re.compile(
    r"ModelParallelRegion|SequenceParallelRegion|(Column|Row|Vocab)Parallel|tensor_parallel|TensorParallel"
    r"|[Rr]edistribute|ColwiseParallel|RowwiseParallel"
)
# DDP rebuilds its buckets and broadcasts buffers in forward; SyncBatchNorm gathers statistics there: those are
# not tensor parallelism. A model-parallel layer all-reduces its partial output, at least twice per transformer
# block (attention and MLP).
MIN_FORWARD_ALLREDUCES_TP = 4

PARALLELISM_METRICS = catalog.group("parallelism")


def parallelism_evidence(rt: RankTrace, steps: Table, calls: Table, timed: int = 0) -> dict[str, Any]:
    """Per-rank evidence over the analysed steps of ``steps`` (``analyzed``, ``host_start_us``,
    ``host_end_us``): collective calls per step (counts), DDP/FSDP ranges seen (flags).

    ``calls``: the rank's collective calls with ``kind`` and host ``ts_us`` (``comm.collective_calls``); ``timed``:
    the collectives timed in the analysed steps (NCCL kernels or gloo ranges, ``comm.collectives``), which count
    too where a trace has kernels but no calls (``collectives_per_step`` is never 0 while communication ran)."""
    out: dict[str, Any] = dict.fromkeys(PARALLELISM_METRICS)
    ops = rt.tables.ops if rt.tables is not None else None
    if ops is not None and len(ops):
        out["ddp_ranges"] = bool(names_matching(ops, _DDP_RANGES).any())
        out["fsdp_ranges"] = bool(names_matching(ops, _FSDP_RANGES).any())
    analysed = steps[steps["analyzed"]] if "analyzed" in steps else steps
    if len(analysed) == 0 or "host_start_us" not in analysed:
        return out
    n_steps = len(analysed)
    lo, hi = analysed["host_start_us"], analysed["host_end_us"]
    if calls is None or len(calls) == 0:
        for key in [k for k in PARALLELISM_METRICS if k.endswith("_per_step")]:
            out[key] = 0.0
        out["collectives_per_step"] = timed / n_steps
        return out
    calls = _issued(rt, calls)
    ts = calls["ts_us"].astype(np.float64)
    order = np.argsort(lo, kind="stable")
    i = np.searchsorted(lo[order], ts, side="right") - 1
    inside = (i >= 0) & (ts < hi[order][np.maximum(i, 0)])
    c = calls[inside]
    kinds = np.array([str(k) for k in c["kind"]], dtype=object)
    phase = phase_at(host_phases(ops, analysed), c["ts_us"].astype(np.float64)) if len(c) else np.array([])
    all_reduce = kinds == "all_reduce"
    out["collectives_per_step"] = max(len(c), timed) / n_steps
    tp_ranges = ops[names_matching(ops, _TP_RANGES)] if ops is not None and len(ops) else ops
    out["tp_collectives_per_step"] = (
        float((_enclosing(tp_ranges, c) >= 0).sum()) / n_steps if tp_ranges is not None and len(tp_ranges) else 0.0
    )
    out["forward_allreduce_per_step"] = float((all_reduce & (phase == "forward")).sum()) / n_steps
    out["backward_allreduce_per_step"] = float((all_reduce & (phase == "backward")).sum()) / n_steps
    out["allgather_per_step"] = float((kinds == "all_gather").sum()) / n_steps
    out["reduce_scatter_per_step"] = float((kinds == "reduce_scatter").sum()) / n_steps
    out["p2p_per_step"] = float(np.isin(kinds.astype(str), ["send", "recv", "send_recv"]).sum()) / n_steps
    opt_ranges = ops[names_matching(ops, OPTIMIZER_STEP)] if ops is not None and len(ops) else ops
    sync = np.isin(kinds.astype(str), ["broadcast", "all_gather"])
    out["optimizer_collectives_per_step"] = (
        float((enclosing_any(opt_ranges, c[sync]) if sync.any() else np.zeros(0, dtype=bool)).sum()) / n_steps
        if opt_ranges is not None and len(opt_ranges)
        else 0.0
    )
    return out


def _issued(rt: RankTrace, calls: Table) -> Table:
    """Where the training threads issue each collective: the ``c10d::*`` dispatcher ops (``c10d::allreduce_``...),
    which run on the thread that called the collective, inside its layer's ranges and phase -- gloo's own
    ``gloo:*`` ranges run later on gloo's threads. The calls themselves where a trace has no ``c10d::*`` ops."""
    ops = rt.tables.comm_ops if rt.tables is not None else None
    if ops is None or len(ops) == 0:
        return calls
    issued = ops[ops["name"].startswith("c10d::")]
    if len(issued) == 0:
        return calls
    issued["kind"] = kinds_of(issued["name"])
    issued = issued[_notna(issued["kind"])]
    return issued if len(issued) else calls


def detect_parallelism(ranks: list[dict[str, Any]], mode: str | None, world_size: int | None) -> tuple[str, str]:
    """(parallelism, the evidence in words) from the per-rank evidence of ``parallelism_evidence`` (and
    ``ddp_bucket_count`` from the capture)."""
    if mode == "dp":
        return "dp", "nn.DataParallel ranges in a single process"
    if (world_size or 1) <= 1 and len(ranks) <= 1 and not any(r.get("collectives_per_step") for r in ranks):
        return "single", "one process and no collectives"

    def most(key: str) -> float:
        values = [r.get(key) for r in ranks if r.get(key) is not None]
        return max(values) if values else 0.0

    known = [r for r in ranks if r.get("collectives_per_step") is not None]
    if known and most("collectives_per_step") == 0:
        return "none", f"{len(known)} rank(s) of {world_size} issue no collective in the analysed steps"
    parts: list[str] = []
    why: list[str] = []
    fsdp2_units = most("fsdp_units")  # FSDP2's per-unit ranges (ddpdoctor.metrics.fsdp)
    if fsdp2_units:
        parts.append("fsdp2")
        why.append(f"FSDP2 (fully_shard) ranges of {fsdp2_units:.0f} unit(s) in the trace")
    elif any(r.get("fsdp_ranges") for r in ranks):
        parts.append("fsdp")
        why.append("FSDP ranges in the trace")
    elif most("allgather_per_step") >= 1 and most("reduce_scatter_per_step") >= 1:
        parts.append("fsdp")
        why.append(
            f"{most('allgather_per_step'):.0f} all_gather and {most('reduce_scatter_per_step'):.0f} reduce_scatter"
            " per step (sharded parameters and gradients)"
        )
    if most("tp_collectives_per_step") >= 1:
        parts.append("tp")
        why.append(f"{most('tp_collectives_per_step'):.0f} collectives per step inside tensor-parallel layers")
    elif most("forward_allreduce_per_step") >= MIN_FORWARD_ALLREDUCES_TP:
        parts.append("tp")
        why.append(f"{most('forward_allreduce_per_step'):.0f} all-reduces per step issued during forward")
    if most("p2p_per_step") > 0:
        parts.append("pipeline")
        why.append(f"{most('p2p_per_step'):.0f} send/recv per step")
    ddp_config = any(r.get("ddp_bucket_count") is not None for r in ranks)
    if any(r.get("ddp_ranges") for r in ranks) or ddp_config:
        parts.append("ddp")
        why.append("DDP's configuration in the capture" if ddp_config else "DDP's ranges in the trace")
    elif not {"fsdp", "fsdp2", "tp"} & set(parts) and most("backward_allreduce_per_step") > 0:
        parts.append("ddp")
        why.append(
            f"{most('backward_allreduce_per_step'):.0f} gradient all-reduces per step, issued during backward only"
        )
    if most("optimizer_collectives_per_step") >= 1:
        parts.append("zero1")
        why.append(
            f"{most('optimizer_collectives_per_step'):.0f} parameter broadcasts/all-gathers per step issued inside the"
            " optimizer's step (optimizer state sharded: ZeroRedundancyOptimizer)"
        )
    if not parts:
        return "unknown", "collectives that fit no known signature"
    return "+".join(parts), "; ".join(why)
