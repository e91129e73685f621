"""What the data can decide, and why not where it cannot: run-level facts every rule reads before a verdict.

``run_evidence`` adds to the run-level metrics the parallelism of the job (``ddpdoctor.metrics.parallelism``),
how many ranks of the world are absent, and ``not_measured``: for a metric that is None, the reason true for this
input (the rule engine says it in "not evaluated"). With ranks absent, a collective's time includes waiting for
ranks that are not in the data, so neither bandwidth nor "exposed transfer" (exposed time less waiting) can be
told apart from waiting: they are withdrawn here, with the reason.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ddpdoctor.metrics import catalog
from ddpdoctor.metrics.capture import gil_reasons
from ddpdoctor.metrics.parallelism import detect_parallelism

# Per-rank metrics that need every peer: a rank's own collective time mixes transfer and waiting otherwise.
NEED_ALL_PEERS = catalog.group("need_all_peers")
# What matching collectives across ranks gives (cross_rank, transfer): nothing where none matched.
CROSS_RANK = tuple(m.name for m in (*catalog.RANK.values(), *catalog.RUN.values()) if m.source == "cross_rank")


def run_evidence(
    run_metrics: dict[str, Any],
    ranks: list[dict[str, Any]],
    devices: Any,
    summaries: list[dict[str, Any]],
    undecidable_straggler: str | None,
    unmatched: list[int] | None = None,
) -> dict[str, Any]:
    """Run-level additions (``parallelism``, ``parallelism_evidence``, ``ranks_missing``, ``ranks_unmatched``,
    ``not_measured``); withdraws the ``NEED_ALL_PEERS`` metrics of ``ranks`` (in place) when ranks are absent.
    ``unmatched``: the ranks whose collectives matched no other rank's (``cross_rank.unmatched_ranks``; None where
    fewer than two ranks were loaded)."""
    world = run_metrics.get("world_size")
    loaded = len(ranks)
    missing = max(0, int(world) - loaded) if isinstance(world, int) and world > 0 else None
    parallelism, why = detect_parallelism(ranks, run_metrics.get("mode"), world)
    reasons: dict[str, str] = {}
    if missing:
        text = (
            f"only {loaded} of the {world} ranks {'is' if loaded == 1 else 'are'} in the data: a collective's time "
            f"includes waiting for the {missing} absent rank(s), so transfer cannot be told from waiting"
        )
        for r in ranks:
            for name in NEED_ALL_PEERS:
                r[name] = None
        reasons.update(dict.fromkeys(NEED_ALL_PEERS, text))
    if unmatched and len(unmatched) == sum(1 for r in ranks if r.get("comm_ms")):  # no collective matched at all
        text = (
            "no collective was recorded by two ranks in the same step: the ranks were profiled at different steps,"
            " so waiting for one another cannot be told from transfer, nor a late rank found; profile the same steps"
            " on every rank"
        )
        for name in CROSS_RANK:
            if all(r.get(name) is None for r in ranks) and run_metrics.get(name) is None:
                reasons[name] = text
    if undecidable_straggler:
        for name in (*catalog.group("slow_ranks"), "slow_rank_count", "straggler_p_value"):
            reasons[name] = undecidable_straggler
    reasons.update(_memory_reasons(run_metrics, devices, summaries))
    reasons.update(_older_summaries(summaries))
    reasons.update(gil_reasons(ranks))  # the host starved the GIL probe (metrics/capture.py)
    calls = max((r.get("collectives_per_step") or 0.0 for r in ranks), default=0.0)
    if calls > 0 and all(r.get("overlap_ratio") is None for r in ranks):
        untimed = (
            f"the trace records {calls:.0f} collective call(s) per step but no communication kernels or ranges that"
            " time them (no device activity for them was recorded)"
        )
        for name in catalog.group("timed_comm"):
            if all(r.get(name) is None for r in ranks):
                reasons.setdefault(name, untimed)
    return {
        "parallelism": parallelism,
        "parallelism_evidence": why,
        "ranks_missing": missing,
        "ranks_unmatched": None if unmatched is None else len(unmatched),
        "not_measured": reasons,
    }


def _older_summaries(summaries: list[dict[str, Any]]) -> dict[str, str]:
    """Metrics absent from every rank's summary because an older ddpdoctor wrote it."""
    out: dict[str, str] = {}
    if not summaries:
        return out
    versions = ", ".join(sorted({str(s.get("ddpdoctor_version") or "?") for s in summaries}))
    for name in (*catalog.group("parallelism"), *catalog.group("gil_threads")):
        if all(name not in (s.get("metrics") or {}) for s in summaries):
            where = "the capture" if name in catalog.group("gil_threads") else "the per-rank summaries"
            hint = "" if where == "the capture" else "; `ddpdoctor diagnose --steps 0..` reads the traces instead"
            out[name] = f"{where} of this run (ddpdoctor {versions}) did not record it{hint}"
    return out


def _memory_reasons(run_metrics: dict[str, Any], devices: Any, summaries: list[dict[str, Any]]) -> dict[str, str]:
    """Why the cuda:0 memory metrics are None, in terms of this input."""
    out: dict[str, str] = {}
    own = {s["rank"]: s.get("own_device") for s in summaries}
    on_gpu = {r: d for r, d in own.items() if isinstance(d, str) and d.startswith("cuda")}
    measured = _measured_devices(devices)
    if not on_gpu and not len(measured):
        text = "no rank ran on a GPU in the data (a CPU run: no CUDA kernels and no device memory)"
    elif not len(measured):
        text = (
            "the traces record no device memory: no [memory] events (profile with profile_memory=True, or run under "
            "`ddpdoctor trace`)"
        )
    elif "cuda:0" not in {d for d, _ in measured}:
        seen = ", ".join(sorted({d for d, _ in measured}))
        ranks = ", ".join(str(r) for r in sorted({r for _, r in measured}))
        text = f"cuda:0 is not in the data: the loaded rank(s) {ranks} recorded memory on {seen} only"
    elif run_metrics.get("gpu0_capacity_bytes") is None:
        text = "the capacity of cuda:0 is unknown (no deviceProperties in the trace)"
    else:
        text = ""
    if text:
        for name in catalog.group("gpu0_memory"):
            if run_metrics.get(name) is None:
                out[name] = text
    if run_metrics.get("gpu0_vs_others_ratio") is None and "gpu0_vs_others_ratio" not in out:
        out["gpu0_vs_others_ratio"] = "only cuda:0's memory is in the data: no other GPU to compare it with"
    if run_metrics.get("others_max_peak_reserved_bytes") is None:
        out["others_max_peak_reserved_bytes"] = out["gpu0_vs_others_ratio"]
    return out


def _measured_devices(devices: Any) -> list[tuple[Any, Any]]:
    """(device, rank) of the rows of ``devices`` (a ``Table``) with a peak allocated or reserved size."""
    if devices is None or not len(devices):
        return []
    peaks = [np.asarray(devices[c], dtype=np.float64) for c in ("peak_allocated_bytes", "peak_reserved_bytes")]
    keep = ~(np.isnan(peaks[0]) & np.isnan(peaks[1]))
    names, ranks = list(devices["device"]), list(devices["rank"])
    return [(names[i], ranks[i].item() if hasattr(ranks[i], "item") else ranks[i]) for i in np.flatnonzero(keep)]
