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


def derived_rank_metrics(metrics: Any) -> dict[int, dict[str, Any]]:
    """rank -> {broadcast_ms, allreduce_count, allreduce_message_bytes} (values None when not measurable)."""
    frame = getattr(metrics, "collectives", None)
    ranks = getattr(metrics, "ranks", []) or []
    steps = {
        int(clean_value(r.get("rank", i))): clean_value(r.get("steps_analyzed")) for i, r in enumerate(ranks)
    }
    out: dict[int, dict[str, Any]] = {}
    if frame is None or len(frame) == 0 or not {"rank", "kind"} <= set(frame.columns):
        return out
    for rank, rows in frame.groupby("rank"):
        rank = int(clean_value(rank))
        n_steps = steps.get(rank) or clean_value(getattr(metrics, "run", {}).get("steps_analyzed"))
        kinds = rows["kind"].map(_kind)
        ar, bc = rows[kinds == "allreduce"], rows[kinds == "broadcast"]
        values: dict[str, Any] = {
            "broadcast_ms": None,
            "allreduce_count": None,
            "allreduce_message_bytes": None,
        }
        if n_steps:
            if "ms" in rows:
                values["broadcast_ms"] = float(bc["ms"].sum()) / n_steps
            if "count" in rows:
                values["allreduce_count"] = float(ar["count"].sum()) / n_steps
        if "count" in rows and "bytes" in rows and ar["count"].sum() > 0:
            values["allreduce_message_bytes"] = float(ar["bytes"].sum()) / float(ar["count"].sum())
        out[rank] = values
    return out
