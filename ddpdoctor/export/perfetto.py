"""One clock-aligned trace of every rank, for the Perfetto UI (ui.perfetto.dev) and ``chrome://tracing``.

The Chrome trace-event JSON that both open: a process per rank (``rank N on HOST``), its CPU threads and GPU streams
as threads, the events the loader read from its traces, and ddpdoctor's findings as instant events on the ranks they
name (a run-wide finding on every rank).

Clocks: each rank's timestamps are shifted by its offset to the lowest rank's clock, found as the cross-rank
analysis finds it: a collective ends at about the same moment on every rank, so a rank's offset is the median of
(its end - the reference rank's end) over the collectives both ran. Ranks without a matched collective keep their
own clock (offset 0), and the file says so.

Size: at most ``max_events`` events (default 1,000,000: about 150 MB of JSON). When the chosen steps hold more, the
steps closest to the median step time are kept (whole steps, every rank the same steps) and the file's
``otherData.note`` says which; ``--steps N..M`` chooses them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ddpdoctor._version import __version__
from ddpdoctor.errors import UsageError

DEFAULT_MAX_EVENTS = 1_000_000
GPU_TID_BASE = 1_000_000  # GPU streams become threads of the rank's process from here on (CPU tids are below)


@dataclass
class Exported:
    path: Path
    ranks: list[int]
    steps: list[int]
    events: int
    offsets_us: dict[int, float]
    notes: list[str] = field(default_factory=list)


def clock_offsets(summaries: list[dict[str, Any]]) -> tuple[dict[int, float], list[int]]:
    """Per rank, its clock minus the lowest rank's (µs), and the ranks that matched none (offset 0: their own
    clock): the cross-rank analysis's alignment (``metrics.cross_rank.clock_offsets``), the one of every report."""
    from ddpdoctor.metrics.cross_rank import clock_offsets as aligned

    return aligned(summaries)


def _steps_of(summary: dict[str, Any]) -> dict[int, tuple[float, float]]:
    ps = summary.get("per_step") or {}
    return {
        int(step): (float(lo), float(hi))
        for step, lo, hi in zip(ps.get("step") or [], ps.get("start_us") or [], ps.get("end_us") or [], strict=False)
        if step is not None and lo is not None and hi is not None
    }


def _choose_steps(
    per_rank_steps: dict[int, dict[int, tuple[float, float]]],
    wanted: tuple[int, int | None] | None,
    counts: dict[int, Any],
    max_events: int,
) -> tuple[list[int], str | None]:
    """The steps every rank has (in ``wanted``), cut to fit ``max_events`` around the median step."""
    common = set.intersection(*(set(s) for s in per_rank_steps.values())) if per_rank_steps else set()
    if wanted is not None:
        first, last = wanted
        common = {s for s in common if s >= first and (last is None or s <= last)}
        if not common:
            have = sorted(set().union(*(set(s) for s in per_rank_steps.values())))
            shown = _ranges(have) or "none"
            raise UsageError(f"--steps {first}..{'' if last is None else last}: the run has steps {shown}")
    steps = sorted(common)
    if not steps:
        return [], None
    cost = {s: sum(counts[r](s) for r in per_rank_steps) for s in steps}
    if sum(cost.values()) <= max_events:
        return steps, None
    durs = {
        s: float(np.median([per_rank_steps[r][s][1] - per_rank_steps[r][s][0] for r in per_rank_steps])) for s in steps
    }
    median = float(np.median(list(durs.values())))
    kept: list[int] = []
    total = 0
    for s in sorted(steps, key=lambda s: (abs(durs[s] - median), s)):
        if total + cost[s] > max_events and kept:
            break
        kept.append(s)
        total += cost[s]
    kept.sort()
    note = (
        f"steps {_ranges(kept)} of {_ranges(steps)} exported: all of them hold {sum(cost.values()):,} events, over "
        f"the cap of {max_events:,} (--max-events); kept the steps closest to the median step time "
        f"({median / 1e3:.1f} ms)"
    )
    return kept, note


def _ranges(steps: Iterable[int]) -> str:
    out: list[str] = []
    run: list[int] = []
    for s in sorted(steps):
        if run and s == run[-1] + 1:
            run.append(s)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [s]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


def _in_windows(ts: np.ndarray, end: np.ndarray, windows: list[tuple[float, float]]) -> np.ndarray:
    keep = np.zeros(len(ts), dtype=bool)
    for lo, hi in windows:
        keep |= (end >= lo) & (ts <= hi)
    return keep


def _names(codes: Any) -> list[str]:
    cats = codes.categories
    return [cats[c] if c >= 0 else "" for c in codes.codes.tolist()]


def export_perfetto(
    run_path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    steps: tuple[int, int | None] | None = None,
    max_events: int = DEFAULT_MAX_EVENTS,
    rules: Any = None,
) -> Exported:
    """Write ``out`` (Chrome trace JSON) for the run at ``run_path``; see the module docstring."""
    import msgspec

    from ddpdoctor.load import load
    from ddpdoctor.metrics.summary import summarize_rank
    from ddpdoctor.pipeline import analyze_run

    run = load(run_path)
    traced = [rt for rt in run.ranks if rt.tables is not None]
    if not traced:
        raise UsageError(f"{run_path}: no trace to export")
    summaries = [summarize_rank(rt, run.capture.get(rt.rank)) for rt in traced]
    offsets, unmatched = clock_offsets(summaries)
    per_rank_steps = {s["rank"]: _steps_of(s) for s in summaries}
    by_rank = {rt.rank: rt for rt in traced}

    def counter(rank: int):
        t = by_rank[rank].tables
        starts = np.concatenate([t.ops["ts_us"], t.kernels["ts_us"]])

        def count(step: int) -> int:
            lo, hi = per_rank_steps[rank][step]
            return int(np.count_nonzero((starts >= lo) & (starts <= hi)))

        return count

    chosen, cut_note = _choose_steps(per_rank_steps, steps, {r: counter(r) for r in per_rank_steps}, max_events)
    notes = [cut_note] if cut_note else []
    if unmatched:
        notes.append(
            f"rank(s) {', '.join(map(str, unmatched))} matched no collective of the lowest rank: shown on their own "
            "clock, not aligned"
        )
    if not chosen:
        notes.append("no step common to every rank: the whole profiled window of each rank is exported")

    analysis = analyze_run(run_path, rules=rules, traces_optional=True)
    findings = list(analysis.diagnosis.findings) if analysis.diagnosis is not None else []
    base = min(
        (per_rank_steps[r][chosen[0]][0] - offsets.get(r, 0.0) for r in per_rank_steps)
        if chosen
        else (w[0] - offsets.get(rt.rank, 0.0) for rt in traced for w in rt.windows[:1]),
        default=0.0,
    )

    events: list[dict[str, Any]] = []
    for rt in sorted(traced, key=lambda rt: rt.rank):
        rank = rt.rank
        shift = offsets.get(rank, 0.0) + base
        windows = [per_rank_steps[rank][s] for s in chosen] if chosen else list(rt.windows)
        host = (run.capture.get(rank) or {}).get("hostname") or (rt.summary or {}).get("hostname")
        label = f"rank {rank}" + (f" on {host}" if host else "")
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        ops = rt.tables.ops
        keep = _in_windows(ops["ts_us"], ops["end_us"], windows)
        main_tid = _main_tid(rt)
        for (pid, tid), name in rt.thread_names.items():
            if tid >= 0 and pid in rt.process_labels and rt.process_labels[pid] == "CPU":
                events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": int(tid), "args": {"name": name}})
        events += _complete(ops[keep], rank, shift, lambda tids: tids)
        kernels = rt.tables.kernels
        if len(kernels):
            kkeep = _in_windows(kernels["ts_us"], kernels["end_us"], windows)
            k = kernels[kkeep]
            lanes: dict[tuple[int, int], int] = {}
            for dev, stream in zip(k["device"].tolist(), k["stream"].tolist(), strict=True):
                lanes.setdefault((int(dev), int(stream)), GPU_TID_BASE + len(lanes))
            for (dev, stream), tid in lanes.items():
                events.append(
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": rank,
                        "tid": tid,
                        "args": {"name": f"GPU {dev} stream {stream}"},
                    }
                )
            tids = np.array(
                [lanes[(int(d), int(s))] for d, s in zip(k["device"].tolist(), k["stream"].tolist(), strict=True)],
                dtype=np.int64,
            )
            events += _complete(k, rank, shift, lambda _t, tids=tids: tids)
        start = min((lo for lo, _ in windows), default=None)
        if start is not None:
            for f in findings:
                if f.ranks and rank not in f.ranks:
                    continue
                events.append(
                    {
                        "ph": "i",
                        "s": "p" if f.ranks else "g",
                        "name": f"{f.id} {f.name}",
                        "cat": "ddpdoctor",
                        "pid": rank,
                        "tid": main_tid,
                        "ts": round(start - shift, 3),
                        "args": {"severity": f.severity, "message": f.message, "recommendation": f.recommendation},
                    }
                )
    payload = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "ddpdoctor_version": __version__,
            "run": str(run_path),
            "steps": chosen,
            "clock_offsets_us": {str(r): round(v, 3) for r, v in sorted(offsets.items())},
            "note": " ".join(notes),
        },
    }
    out = Path(out)
    tmp = out.with_name(out.name + ".part")
    tmp.write_bytes(msgspec.json.encode(payload))
    os.replace(tmp, out)
    n = sum(1 for e in events if e["ph"] != "M")
    return Exported(out, sorted(by_rank), chosen, n, offsets, notes)


def _main_tid(rt: Any) -> int:
    steps = rt.tables.steps
    if len(steps):
        return int(steps["tid"][0])
    tids = rt.tables.ops["tid"]
    return int(np.bincount(tids[tids >= 0]).argmax()) if np.any(tids >= 0) else 0


def _complete(table: Any, pid: int, shift: float, tids_of: Any) -> list[dict[str, Any]]:
    names = _names(table["name"])
    cats = _names(table["cat"])
    tids = tids_of(table["tid"]).tolist()
    ts = (table["ts_us"] - shift).round(3).tolist()
    dur = np.maximum(table["dur_us"], 0.0).round(3).tolist()
    return [
        {"ph": "X", "name": n, "cat": c, "pid": pid, "tid": t, "ts": a, "dur": d}
        for n, c, t, a, d in zip(names, cats, tids, ts, dur, strict=True)
    ]
