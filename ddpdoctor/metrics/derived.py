"""Per-rank metrics derived from ``RunMetrics.collectives`` (catalog source ``collectives``); the rule engine
adds them to each rank's row.

``RunMetrics.collectives`` has one row per rank and collective kind with ``count``, ``bytes`` and ``ms``
summed over the analysed steps; dividing by the rank's ``steps_analyzed`` gives per-step values. Kinds are
matched by name ("all_reduce", "allreduce", "nccl:all_reduce" are all-reduce; anything with "broadcast" is a
broadcast)."""

from __future__ import annotations

import re
from typing import Any

from ddpdoctor.values import clean_value


def _kind(name: Any) -> str | None:
    norm = re.sub(r"[^a-z]", "", str(name).lower())
    if "allreduce" in norm:
        return "allreduce"
    if "broadcast" in norm:
        return "broadcast"
    return None


def _column(frame: Any, name: str) -> list[Any] | None:
    """A column of a ``Table`` (or a DataFrame a caller built) as a list of Python values; None when absent."""
    if name not in frame.columns:
        return None
    col = frame[name]
    return col.tolist()


def derived_rank_metrics(metrics: Any) -> dict[int, dict[str, Any]]:
    """rank -> {broadcast_ms, allreduce_count, allreduce_message_bytes, ddp_round_bytes, collective_bytes_per_step}
    (values None when not measurable)."""
    frame = getattr(metrics, "collectives", None)
    ranks = getattr(metrics, "ranks", []) or []
    steps = {int(clean_value(r.get("rank", i))): clean_value(r.get("steps_analyzed")) for i, r in enumerate(ranks)}
    out: dict[int, dict[str, Any]] = {}
    if frame is None or len(frame) == 0 or not {"rank", "kind"} <= set(frame.columns):
        return out
    rank_col = _column(frame, "rank")
    kind_col = _column(frame, "kind")
    ms_col, count_col, bytes_col = (_column(frame, c) for c in ("ms", "count", "bytes"))
    kinds: dict[Any, str | None] = {}
    # per rank, in rank order: the rows' positions (rows of one rank in their order, as a group by rank gives them)
    by_rank: dict[Any, list[int]] = {}
    for i, r in enumerate(rank_col):
        if r is None or r != r:  # a group key that is missing matches no group
            continue
        by_rank.setdefault(r, []).append(i)
    run_steps = clean_value(getattr(metrics, "run", {}).get("steps_analyzed"))
    rows_by_rank = {int(clean_value(r.get("rank", i))): r for i, r in enumerate(ranks)}
    for r in sorted(by_rank):
        rows = by_rank[r]
        rank = int(clean_value(r))
        n_steps = steps.get(rank) or run_steps
        ar: list[int] = []
        bc: list[int] = []
        for i in rows:
            k = kind_col[i]
            kind = kinds[k] if k in kinds else kinds.setdefault(k, _kind(k))
            if kind == "allreduce":
                ar.append(i)
            elif kind == "broadcast":
                bc.append(i)
        values: dict[str, Any] = {
            "broadcast_ms": None,
            "allreduce_count": None,
            "allreduce_message_bytes": None,
        }
        if n_steps:
            if ms_col is not None:
                values["broadcast_ms"] = _sum(ms_col, bc) / n_steps
            if count_col is not None:
                values["allreduce_count"] = _sum(count_col, ar) / n_steps
        # only the rows whose bytes the trace states (a trace without collective sizes: a CPU trace recorded
        # without record_shapes, an NCCL one without their arguments): unknown sizes are no 0-byte messages
        sized = [i for i in ar if bytes_col is not None and clean_value(bytes_col[i]) is not None]
        if count_col is not None and sized and _sum(count_col, sized) > 0:
            values["allreduce_message_bytes"] = _sum(bytes_col, sized) / _sum(count_col, sized)
        values["ddp_round_bytes"] = _round_bytes(rows_by_rank.get(rank) or {}, values)
        # every collective's bytes per step, of any kind; None where one of them has no size in the trace
        values["collective_bytes_per_step"] = None
        if n_steps and bytes_col is not None and all(clean_value(bytes_col[i]) is not None for i in rows):
            values["collective_bytes_per_step"] = _sum(bytes_col, rows) / n_steps
        out[rank] = values
    return out


def _round_bytes(row: dict[str, Any], values: dict[str, Any]) -> float | None:
    """``ddp_round_bytes``: the bytes of one round of DDP's gradient all-reduces. The model's gradient bytes (its
    largest gradient over that gradient's share, from DDP's parameters); where those are unknown, the bytes
    all-reduced per step over DDP's rounds per step (``ddp_sync_rounds_per_step``, 1 when unknown). Not the bytes
    of every all-reduce in a step alone: a second DDP model's round, or each micro-batch's of gradient accumulation
    without ``no_sync()``, is not more of the same round."""
    largest, share = clean_value(row.get("ddp_largest_grad_bytes")), clean_value(row.get("ddp_largest_grad_share"))
    if largest is not None and share:
        return float(largest) / float(share)
    count, size = values.get("allreduce_count"), values.get("allreduce_message_bytes")
    if count is None or size is None:
        return None
    rounds = clean_value(row.get("ddp_sync_rounds_per_step"))
    return float(count) * float(size) / (float(rounds) if rounds else 1.0)


def _sum(column: list[Any], rows: list[int]) -> float:
    """The sum of ``column`` over ``rows`` (missing values count 0, as a Series' ``sum``), as a float."""
    import numpy as np

    if len(rows) < 8:  # numpy adds fewer than eight values one after the other
        total = 0.0
        for i in rows:
            v = column[i]
            if v is not None and v == v:
                total += v
        return float(total)
    values = np.array([column[i] for i in rows], dtype=np.float64)
    return float(np.where(np.isnan(values), 0.0, values).sum())
