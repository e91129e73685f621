"""Cross-rank collective metrics: match each collective across ranks, then split its time into transfer and
wait.

A collective is identified by (step, kind, index of that kind within the step). Clocks of different hosts are
aligned on matched collectives, not raw timestamps: a collective ends at about the same moment on every rank,
so a rank's clock offset is the median of (its end − the reference rank's end). Then, per collective:
transfer = the shortest duration over the ranks; wait = own duration − transfer; lateness = own aligned
start − earliest aligned start. Per step: ``collective_wait_ms`` = wall time (union) spent waiting,
``late_arrival_ms`` = mean lateness over the step's collectives. ``straggler_late_share`` = the fraction of
matched collectives in which the straggler arrived last (about 1/world_size when only noise makes ranks late).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ddpdoctor.metrics import intervals as iv

KEY = ["step", "kind", "index"]


def cross_rank(summaries: list[dict[str, Any]]) -> tuple[dict[int, dict[str, float | None]], dict[str, Any]]:
    """Per rank {collective_wait_ms, late_arrival_ms} and run-level {straggler_rank, straggler_wait_ms}."""
    frames = []
    for s in summaries:
        c = pd.DataFrame(s.get("collectives") or {})
        if len(c):
            frames.append(c.assign(rank=s["rank"]))
    per_rank: dict[int, dict[str, float | None]] = {}
    run = {"straggler_rank": None, "straggler_wait_ms": None, "straggler_late_share": None}
    if len(frames) < 2:
        return per_rank, run
    colls = pd.concat(frames, ignore_index=True)
    colls = colls[colls["step"] >= 0]
    counts = colls.groupby(KEY)["rank"].transform("nunique")
    colls = colls[counts >= 2].copy()
    if len(colls) == 0:
        return per_rank, run
    ref = colls["rank"].min()
    ref_end = colls[colls["rank"] == ref].set_index(KEY)["end_us"]
    offsets = {}
    for rank, g in colls.groupby("rank"):
        shared = g.set_index(KEY)["end_us"]
        diff = (shared - ref_end.reindex(shared.index)).dropna()
        offsets[rank] = float(diff.median()) if len(diff) else 0.0
    colls["aligned_start"] = colls["start_us"] - colls["rank"].map(offsets)
    grouped = colls.groupby(KEY)
    colls["wait_us"] = colls["dur_us"] - grouped["dur_us"].transform("min")
    colls["late_us"] = colls["aligned_start"] - grouped["aligned_start"].transform("min")
    typical_wait: dict[int, float] = {}
    for s in summaries:
        steps = pd.DataFrame(s["per_step"])
        steps = steps[steps["analyzed"]]
        mine = colls[(colls["rank"] == s["rank"]) & colls["step"].isin(steps["step"])]
        if len(mine) == 0 or len(steps) == 0:
            continue
        waits = iv.union(mine["start_us"].to_numpy(), (mine["start_us"] + mine["wait_us"]).to_numpy())
        wait_ms = iv.coverage(waits, steps["start_us"].to_numpy(), steps["end_us"].to_numpy()) / 1e3
        late = mine.groupby("step")["late_us"].mean().reindex(steps["step"]).fillna(0.0) / 1e3
        per_rank[s["rank"]] = {
            "collective_wait_ms": float(np.mean(wait_ms)),
            "late_arrival_ms": float(late.mean()),
        }
        typical_wait[s["rank"]] = float(np.median(wait_ms))
    if len(per_rank) >= 2:
        straggler = max(per_rank, key=lambda r: per_rank[r]["late_arrival_ms"] or 0.0)
        if (per_rank[straggler]["late_arrival_ms"] or 0.0) > 0:
            # The median step's wait, not the mean: one step in which the host descheduled a rank must not
            # make it a straggler; a straggler makes the others wait in most steps.
            others = [typical_wait[r] for r in per_rank if r != straggler]
            # A real straggler is last nearly every time; with noise alone each rank is last about 1/n
            # of the time.
            analysed = colls[colls["step"].isin(_analysed_steps(summaries))]
            last = analysed.loc[analysed.groupby(KEY)["aligned_start"].idxmax(), "rank"]
            run = {
                "straggler_rank": int(straggler),
                "straggler_wait_ms": float(np.mean(others)),
                "straggler_late_share": float((last == straggler).mean()) if len(last) else None,
            }
    return per_rank, run


def _analysed_steps(summaries: list[dict[str, Any]]) -> set[int]:
    steps: set[int] = set()
    for s in summaries:
        per_step = pd.DataFrame(s["per_step"])
        steps.update(int(x) for x in per_step.loc[per_step["analyzed"], "step"])
    return steps


def transfer_bandwidth(summaries: list[dict[str, Any]]) -> pd.DataFrame:
    """Per rank and kind: ``count, bytes, ms, algbw_gbps, busbw_gbps`` over the analysed steps (ms = own
    time)."""
    from ddpdoctor.metrics.comm import bus_factor

    rows = []
    for s in summaries:
        c = pd.DataFrame(s.get("collectives") or {})
        if len(c) == 0:
            continue
        steps = pd.DataFrame(s["per_step"])
        c = c[c["step"].isin(steps.loc[steps["analyzed"], "step"])]
        world = s.get("world_size") or 1
        for kind, g in c.groupby("kind"):
            sized = g[g["bytes"].notna() & (g["bytes"] > 0)]
            seconds = sized["dur_us"].sum() / 1e6
            n = int(sized["group_size"].max()) if len(sized) and sized["group_size"].max() > 0 else int(world)
            algbw = float(sized["bytes"].sum() / seconds / 1e9) if seconds > 0 else None
            rows.append(
                {
                    "rank": s["rank"],
                    "kind": kind,
                    "count": len(g),
                    "bytes": float(g["bytes"].sum()) if g["bytes"].notna().any() else None,
                    "ms": float(g["dur_us"].sum() / 1e3),
                    "algbw_gbps": algbw,
                    "busbw_gbps": algbw * bus_factor(str(kind), n) if algbw is not None else None,
                }
            )
    return pd.DataFrame(rows, columns=["rank", "kind", "count", "bytes", "ms", "algbw_gbps", "busbw_gbps"])
