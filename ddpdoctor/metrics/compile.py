"""torch.compile as one rank's trace shows it (catalog group ``compile``), over the analysed steps.

- ``Torch-Compiled Region: F/C``: one call of compiled frame F in its C-th compiled version (dynamo's compile id).
  ``compiled_regions``: the distinct F/C called in the analysed steps; ``compiled_region_calls``: calls per step.
- ``CompiledFunction``: one call of an AOT-compiled graph (aot_eager, inductor; the eager backend has none).
  DDPOptimizer splits a DDP model's graph at DDP's buckets, so that a bucket's all-reduce can start before the whole
  backward is done: ``compiled_graphs_per_region`` is graphs per compiled-region call (the splits; 1 = not split).
- Compiling shows as ``... (dynamo_timed)`` ranges (``_compile.compile_inner`` for a frame, ``backward._backward_impl``
  for its lazy backward). ``compile_ms``: the union of those ranges per step; ``compile_recompiles``: compiles in the
  analysed steps (``_compile.compile_inner``), or where torch records no such range, the analysed steps after the
  first that call a region id no earlier analysed step called (a frame compiled again: a guard failed).

All None for a rank without compiled regions in its analysed steps.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ddpdoctor.load.model import RankTrace
from ddpdoctor.metrics import catalog
from ddpdoctor.metrics import intervals as iv
from ddpdoctor.metrics.phases import names_matching
from ddpdoctor.table import Table

COMPILE_METRICS = catalog.group("compile")
_REGION = re.compile(r"^Torch-Compiled Region: \d+/\d+")
_GRAPH = re.compile(r"^CompiledFunction$")
_COMPILING = re.compile(r" \(dynamo_timed\)$")
_FRAME_COMPILE = re.compile(r"^_compile\.compile_inner \(dynamo_timed\)$")


def _step_of(t: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Index of the analysed step window holding each time (-1: none)."""
    if len(lo) == 0 or len(t) == 0:
        return np.full(len(t), -1)
    order = np.argsort(lo, kind="stable")
    slo, shi = lo[order], hi[order]
    pos = np.clip(np.searchsorted(slo, t, side="right") - 1, 0, None)
    ok = (t >= slo[pos]) & (t < shi[pos])
    return np.where(ok, order[pos], -1)


def compile_rank(rt: RankTrace, analysed: Table) -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(COMPILE_METRICS)
    ops = rt.tables.ops if rt.tables is not None else None
    if ops is None or len(ops) == 0 or len(analysed) == 0:
        return out
    lo = np.asarray(analysed["start_us"], dtype=float)
    hi = np.asarray(analysed["end_us"], dtype=float)
    regions = ops[names_matching(ops, _REGION)]
    region_step = _step_of(np.asarray(regions["ts_us"], dtype=float), lo, hi)
    regions = regions[region_step >= 0]
    region_step = region_step[region_step >= 0]
    if len(regions) == 0:
        return out
    n_steps = len(analysed)
    ids = regions["name"].values()
    out["compiled_regions"] = len(set(ids.tolist()))
    out["compiled_region_calls"] = len(regions) / n_steps

    compiling = ops[names_matching(ops, _COMPILING)]
    spans = iv.union(np.asarray(compiling["ts_us"], dtype=float), np.asarray(compiling["end_us"], dtype=float))
    compile_us = float(np.sum(iv.coverage(spans, lo, hi)))
    out["compile_ms"] = compile_us / 1e3 / n_steps

    graphs = ops[names_matching(ops, _GRAPH)]
    if len(graphs):
        start = np.asarray(graphs["ts_us"], dtype=float)
        in_window = _step_of(start, lo, hi) >= 0
        if len(spans[0]):  # graphs called while compiling (tracing them) are not calls of the compiled program
            k = np.searchsorted(spans[0], start, side="right") - 1
            inside = (k >= 0) & (start < spans[1][np.clip(k, 0, None)])
            in_window &= ~inside
        count = int(in_window.sum())
        out["compiled_graphs_per_region"] = count / len(regions) if count else None

    frame_compiles = ops[names_matching(ops, _FRAME_COMPILE)]
    compiles = int(np.sum(_step_of(np.asarray(frame_compiles["ts_us"], dtype=float), lo, hi) >= 0))
    seen: set[str] = set()
    new_id_steps = 0
    order = np.argsort(lo, kind="stable")
    for rank_in_order, step_index in enumerate(order):
        names = set(ids[region_step == step_index].tolist())
        if rank_in_order > 0 and names - seen:
            new_id_steps += 1
        seen |= names
    out["compile_recompiles"] = max(compiles, new_id_steps)
    return out


def compile_note(ranks: list[dict[str, Any]], ddp_buckets: int | None = None) -> str | None:
    """One line of facts for the report: compiled regions, calls and graphs per step, recompiles (rank 0's, or the
    first rank with compiled regions)."""
    rank = next((r for r in ranks if r.get("compiled_regions")), None)
    if rank is None:
        return None
    text = (
        f"torch.compile: {rank['compiled_regions']} compiled region(s) called {rank['compiled_region_calls']:.3g} "
        f"time(s) per step on rank {rank.get('rank')}"
    )
    graphs = rank.get("compiled_graphs_per_region")
    if graphs:
        text += f", {graphs:.3g} compiled graph(s) per call"
        buckets = rank.get("ddp_bucket_count")
        if graphs > 1 and buckets:
            text += f" (DDPOptimizer's split of the graph at bucket_cap_mb boundaries; DDP has {buckets} bucket(s))"
    recompiles = rank.get("compile_recompiles") or 0
    if recompiles:
        compiling = rank.get("compile_ms") or 0
        text += f"; {recompiles} recompile(s) in the analysed steps, {compiling:.1f} ms per step compiling"
    else:
        text += "; no recompile in the analysed steps"
    return text
