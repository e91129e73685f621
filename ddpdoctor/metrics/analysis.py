"""``analyze(run) -> RunMetrics``: per-rank summaries (from traces, or the capture's summary files), then the
cross-rank and run-level metrics."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from ddpdoctor.load.model import Run
from ddpdoctor.metrics import catalog
from ddpdoctor.metrics.capture import ddp_timers
from ddpdoctor.metrics.cross_rank import cross_rank, transfer_bandwidth
from ddpdoctor.metrics.evidence import run_evidence
from ddpdoctor.metrics.result import RANK_METRICS, RunMetrics
from ddpdoctor.metrics.setup import SETUP_RANK_METRICS, setup_metrics
from ddpdoctor.metrics.summary import summarize_rank


def analyze(run: Run, steps: tuple[int, int | None] | None = None) -> RunMetrics:
    """All metrics of a loaded run. Pure: no I/O, no printing.

    ``steps``: analyse only ProfilerStep#N..M (inclusive; M None = to the end).
    Needs the traces, not summaries.
    """
    summaries = []
    for rt in run.ranks:
        if rt.summary is not None and not rt.has_trace:
            if steps is not None:
                raise ValueError("a step range needs the traces; load the run without use_summaries")
            summaries.append(rt.summary)
        else:
            summaries.append(summarize_rank(rt, run.capture.get(rt.rank), steps))
    waits, straggler = cross_rank(summaries)
    hosts = Counter(c.get("hostname") for c in run.capture.values() if c.get("hostname"))
    setup_ranks, setup_run = setup_metrics(run.capture)  # the set-up checklist: from the capture, not traces
    ranks = []
    for s in summaries:
        m = {k: s["metrics"].get(k) for k in RANK_METRICS}
        m = {"rank": s["rank"], **m}
        m.update(waits.get(s["rank"], {}))
        m["exposed_transfer_ms"] = _exposed_transfer(m.get("exposed_comm_ms"), m.get("collective_wait_ms"))
        host = (run.capture.get(s["rank"]) or {}).get("hostname")
        m["local_world_size"] = hosts.get(host) if host else None
        m.update(setup_ranks.get(s["rank"]) or dict.fromkeys(SETUP_RANK_METRICS))
        m.update(ddp_timers(run.capture.get(s["rank"])))
        ranks.append(m)
    per_step = _per_step_frame(summaries)
    devices = pd.DataFrame(
        [{"rank": s["rank"], **d} for s in summaries for d in s["devices"]],
        columns=["rank", "device", *catalog.group("device_memory")],
    )
    run_metrics = _run_level(run, ranks, devices, summaries)
    undecidable = straggler.pop("slow_rank_undecidable", None)
    run_metrics.update(straggler)
    run_metrics.update(run_evidence(run_metrics, ranks, devices, summaries, undecidable))
    why_setup = setup_run.pop("not_measured", {})
    run_metrics.update(setup_run)
    run_metrics["not_measured"] = {**run_metrics.get("not_measured", {}), **why_setup}
    return RunMetrics(
        run=run_metrics,
        ranks=ranks,
        per_step=per_step,
        collectives=transfer_bandwidth(summaries),
        devices=devices,
    )


def _per_step_frame(summaries: list[dict[str, Any]]) -> pd.DataFrame:
    """The ``per_step`` rows of every rank, ``rank`` first. Ranks with the same columns (the usual case) are
    joined as lists and made into one frame: a frame per rank costs ~1 ms, seconds at 1,000 ranks."""
    if not summaries:
        return pd.DataFrame()
    columns = list(summaries[0]["per_step"])
    if any(list(s["per_step"]) != columns for s in summaries):
        per_step = pd.concat([pd.DataFrame(s["per_step"]).assign(rank=s["rank"]) for s in summaries], ignore_index=True)
    else:
        joined: dict[str, list[Any]] = {"rank": []}
        joined.update((c, []) for c in columns if c != "rank")
        for s in summaries:
            rows = s["per_step"]
            n = len(rows[columns[0]]) if columns else 0
            joined["rank"].extend([s["rank"]] * n)
            for c in columns:
                if c != "rank":
                    joined[c].extend(rows[c])
        per_step = pd.DataFrame(joined)
    if len(per_step):
        per_step = per_step[["rank"] + [c for c in per_step.columns if c != "rank"]]
        if "overlap_ratio" not in per_step.columns and {"comm_ms", "exposed_comm_ms"} <= set(per_step.columns):
            # each step's share of communication hidden behind computation (0-1; None without communication)
            comm = per_step["comm_ms"].astype(float)
            hidden = 1.0 - per_step["exposed_comm_ms"].astype(float) / comm.where(comm > 0)
            per_step["overlap_ratio"] = hidden.clip(0.0, 1.0)
    return per_step


def _exposed_transfer(exposed_ms: float | None, wait_ms: float | None) -> float | None:
    """Exposed communication that is really moving data: exposed time less the time spent waiting for a late
    peer (that part is the straggler's cost, not a lack of overlap)."""
    if exposed_ms is None:
        return None
    return max(0.0, exposed_ms - (wait_ms or 0.0))


def _run_level(
    run: Run, ranks: list[dict[str, Any]], devices: pd.DataFrame, summaries: list[dict[str, Any]]
) -> dict[str, Any]:
    medians = [r["step_ms_median"] for r in ranks if r.get("step_ms_median")]
    out: dict[str, Any] = {
        "path": str(run.path),
        "mode": run.mode,
        "world_size": run.world_size,
        "backend": run.backend,
        "ranks_loaded": len(ranks),
        "rank_source": run.rank_source,
        "steps_analyzed": min((r["steps_analyzed"] or 0) for r in ranks) if ranks else 0,
        "step_skew_ratio": (max(medians) - min(medians)) / min(medians) if len(medians) >= 2 else None,
    }
    # devices shared by the ranks of one node: sum what every rank reserved on each device
    reserved = devices.assign(used=devices["peak_reserved_bytes"].fillna(devices["peak_allocated_bytes"]))
    per_device = reserved.groupby("device")["used"].sum(min_count=1) if len(reserved) else pd.Series(dtype=float)
    gpu0 = per_device.get("cuda:0")
    others = per_device[[d for d in per_device.index if d.startswith("cuda:") and d != "cuda:0"]].dropna()
    capacity = devices.loc[devices["device"] == "cuda:0", "capacity_bytes"].dropna()
    out["gpu0_peak_reserved_bytes"] = int(gpu0) if gpu0 is not None and not np.isnan(gpu0) else None
    out["gpu0_capacity_bytes"] = int(capacity.iloc[0]) if len(capacity) else None
    out["gpu0_headroom_ratio"] = (
        1.0 - out["gpu0_peak_reserved_bytes"] / out["gpu0_capacity_bytes"]
        if out["gpu0_peak_reserved_bytes"] is not None and out["gpu0_capacity_bytes"]
        else None
    )
    out["others_max_peak_reserved_bytes"] = int(others.max()) if len(others) else None
    out["gpu0_vs_others_ratio"] = (
        out["gpu0_peak_reserved_bytes"] / out["others_max_peak_reserved_bytes"]
        if out["gpu0_peak_reserved_bytes"] and out["others_max_peak_reserved_bytes"]
        else None
    )
    out["straggler_rank"] = None
    out["straggler_wait_ms"] = None
    out["straggler_late_share"] = None
    return out
