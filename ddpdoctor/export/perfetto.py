"""One clock-aligned trace of every rank, for the Perfetto UI (ui.perfetto.dev) and ``chrome://tracing``.

The Chrome trace-event JSON that both open: a process per rank (``rank N on HOST``), its CPU threads and GPU streams
as threads, the events the loader read from its traces (with the args the analysis reads back: a kernel's device,
stream and correlation, a collective's sizes and group), and ddpdoctor's findings as instant events where they happen
in each exported step, as the reports' timeline marks them (the straggler's late arrival and the wait it causes, the
exposed communication after backward, DataParallel's gather); a finding with no such place is one mark at the
export's start that says it applies to the exported window as a whole.

Clocks: each rank's timestamps are shifted by its offset to the lowest rank's clock, found as the cross-rank
analysis finds it: a collective ends at about the same moment on every rank, so a rank's offset is the median of
(its end - the reference rank's end) over the collectives both ran. Ranks without a matched collective keep their
own clock (offset 0), and the file says so.

Size: at most ``max_events`` events (default 1,000,000: about 150 MB of JSON), metadata aside, in every case. When
the chosen steps hold more, the steps closest to the median step time are kept (whole steps, every rank the same
steps) and the file's ``otherData.note`` says which; ``--steps N..M`` chooses them. Where that is still more (one
step alone over the cap, or no step common to every rank: the profiled window), the events that start first on the
common clock are kept up to the cap: ``otherData.cut`` says where it cut and which steps are whole or in part.

Read back: ``otherData.producer`` (``load.exported.PRODUCER``) and ``otherData.ranks`` (per rank its process id,
host, ``distributedInfo`` and window) let ``ddpdoctor.load`` and ``diagnose FILE`` read the file as the ranks it
holds.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ddpdoctor._version import __version__
from ddpdoctor.errors import UsageError
from ddpdoctor.load.exported import PRODUCER

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
    cut: str | None = None  # what the cap cut inside the chosen steps or window (also in ``notes``)


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
            shown = step_ranges(have) or "none"
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
    if kept == steps:  # one step over the cap alone: the cut inside it says so
        return kept, None
    note = (
        f"{'step' if len(kept) == 1 else 'steps'} {step_ranges(kept)} of {step_ranges(steps)} exported: those hold "
        f"{sum(cost.values()):,} events in all, over the cap of {max_events:,} (--max-events); kept the steps "
        f"closest to the median step time ({median / 1e3:.1f} ms)"
    )
    return kept, note


def step_ranges(steps: Iterable[int]) -> str:
    """``4-6, 9``: steps as ranges (also the CLI's summary line)."""
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
    traced = sorted((rt for rt in run.ranks if rt.tables is not None), key=lambda rt: rt.rank)
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
        notes.append("no step common to every rank: the profiled window of each rank is exported, not whole steps")

    # each rank's rows in the chosen steps (or its whole window), and the span's start on the common clock (0)
    spans: dict[int, list[tuple[float, float]]] = {}
    picked: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for rt in traced:
        windows = [per_rank_steps[rt.rank][s] for s in chosen] if chosen else list(rt.windows)
        spans[rt.rank] = windows or [(-math.inf, math.inf)]  # a trace without its profiler window: all of it
        ops, kernels = rt.tables.ops, rt.tables.kernels
        picked[rt.rank] = (
            _in_windows(ops["ts_us"], ops["end_us"], spans[rt.rank]),
            _in_windows(kernels["ts_us"], kernels["end_us"], spans[rt.rank]),
        )
    if chosen:
        base = min(per_rank_steps[r][chosen[0]][0] - offsets.get(r, 0.0) for r in per_rank_steps)
    else:
        firsts = [_starts(rt, picked[rt.rank], offsets.get(rt.rank, 0.0)) for rt in traced]  # before the base
        base = min((float(a.min()) for a in firsts if len(a)), default=0.0)

    analysis = analyze_run(run_path, rules=rules, traces_optional=True)
    findings = list(analysis.diagnosis.findings) if analysis.diagnosis is not None else []
    main_tids = {rt.rank: _main_tid(rt) for rt in traced}
    marks = _finding_marks(findings, summaries, chosen, offsets, base, main_tids)

    # the cap, in every case: the events that start first on the common clock, up to the cap
    timed = sum(int(a.sum() + b.sum()) for a, b in picked.values())
    budget = max(max_events - len(marks), max_events // 2)
    cut_us: float | None = None
    if timed > budget:
        starts = np.concatenate([_starts(rt, picked[rt.rank], offsets.get(rt.rank, 0.0) + base) for rt in traced])
        cut_us = float(np.partition(starts, budget)[budget])  # fewer than ``budget`` events start before it
        for rt in traced:
            shift = offsets.get(rt.rank, 0.0) + base
            ops_rows, kernel_rows = picked[rt.rank]
            ops_rows &= rt.tables.ops["ts_us"] - shift < cut_us
            kernel_rows &= rt.tables.kernels["ts_us"] - shift < cut_us
        marks = [m for m in marks if m["ts"] < cut_us]
    kept = sum(int(a.sum() + b.sum()) for a, b in picked.values())
    marks = marks[: max(max_events - kept, 0)]
    exported_steps = chosen
    cut: str | None = None
    cut_data: dict[str, Any] | None = None
    if cut_us is not None:
        exported_steps, cut, cut_data = _cut_note(
            chosen, per_rank_steps, offsets, base, cut_us, max_events, timed, kept, traced, picked, spans
        )
        notes.append(cut)

    events: list[dict[str, Any]] = []
    ranks_meta: list[dict[str, Any]] = []
    for rt in traced:
        rank = rt.rank
        shift = offsets.get(rank, 0.0) + base
        host = (run.capture.get(rank) or {}).get("hostname") or (rt.summary or {}).get("hostname")
        label = f"rank {rank}" + (f" on {host}" if host else "")
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        ops_rows, kernel_rows = picked[rank]
        for (pid, tid), name in rt.thread_names.items():
            if tid >= 0 and pid in rt.process_labels and rt.process_labels[pid] == "CPU":
                events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": int(tid), "args": {"name": name}})
        ops = rt.tables.ops[ops_rows]
        events += _complete(ops, rank, shift, ops["tid"], _op_args(ops, rt.tables.comm_ops))
        k = rt.tables.kernels[kernel_rows]
        if len(k):
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
            events += _complete(k, rank, shift, tids, _kernel_args(k))
        lo = min(a for a, _ in spans[rank]) - shift
        hi = max(b for _, b in spans[rank]) - shift
        if not (math.isfinite(lo) and math.isfinite(hi)):  # no profiler window: the events exported
            ts = np.concatenate([ops["ts_us"], k["ts_us"]]) - shift
            ends = np.concatenate([ops["end_us"], k["end_us"]]) - shift
            lo, hi = (float(ts.min()), float(ends.max())) if len(ts) else (0.0, 0.0)
        if cut_us is not None:
            hi = max(lo, min(hi, cut_us))
        ranks_meta.append(
            {
                "rank": rank,
                "pid": rank,
                "host": host,
                "distributed_info": rt.distributed_info or {"rank": rank},
                "window_us": [round(lo, 3), round(hi, 3)],
            }
        )
    events += marks
    payload = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": PRODUCER,
            "ddpdoctor_version": __version__,
            "run": str(run_path),
            "world_size": run.world_size,
            "ranks": ranks_meta,
            "steps": exported_steps,
            "max_events": max_events,
            "cut": cut_data,
            "clock_offsets_us": {str(r): round(v, 3) for r, v in sorted(offsets.items())},
            "note": " ".join(notes),
        },
    }
    out = Path(out)
    tmp = out.with_name(out.name + ".part")
    tmp.write_bytes(msgspec.json.encode(payload))
    os.replace(tmp, out)
    n = sum(1 for e in events if e["ph"] != "M")
    assert n <= max_events, (n, max_events)
    return Exported(out, sorted(by_rank), exported_steps, n, offsets, notes, cut)


def _starts(rt: Any, picked: tuple[np.ndarray, np.ndarray], shift: float) -> np.ndarray:
    """The start (µs) of the rank's picked ops and kernels less ``shift``: computed as the cut compares them."""
    ops_rows, kernel_rows = picked
    return np.concatenate([rt.tables.ops["ts_us"][ops_rows] - shift, rt.tables.kernels["ts_us"][kernel_rows] - shift])


def _cut_note(
    chosen: list[int],
    per_rank_steps: dict[int, dict[int, tuple[float, float]]],
    offsets: dict[int, float],
    base: float,
    cut_us: float,
    max_events: int,
    timed: int,
    kept: int,
    traced: list[Any],
    picked: dict[int, tuple[np.ndarray, np.ndarray]],
    spans: dict[int, list[tuple[float, float]]],
) -> tuple[list[int], str, dict[str, Any]]:
    """The steps left (whole or in part), the note saying what the cap cut, and the same for ``otherData.cut``."""

    def on_clock(rank: int, step: int) -> tuple[float, float]:
        lo, hi = per_rank_steps[rank][step]
        off = offsets.get(rank, 0.0) + base
        return lo - off, hi - off

    whole = [s for s in chosen if all(on_clock(r, s)[1] < cut_us for r in per_rank_steps)]
    part = [s for s in chosen if s not in whole and any(on_clock(r, s)[0] < cut_us for r in per_rank_steps)]
    if chosen:
        what = f"step {chosen[0]}" if len(chosen) == 1 else f"steps {step_ranges(chosen)}"
        end = max(on_clock(r, chosen[-1])[1] for r in per_rank_steps)
    else:
        what = "the profiled window"
        end = max(
            (
                float((rt.tables.ops["end_us"] - offsets.get(rt.rank, 0.0) - base).max())
                for rt in traced
                if len(rt.tables.ops)
            ),
            default=cut_us,
        )
    parts = []
    if whole:
        parts.append(f"whole: step(s) {step_ranges(whole)}")
    if part:
        parts.append(f"in part: step(s) {step_ranges(part)}")
    left = [s for s in chosen if s not in whole and s not in part]
    if left:
        parts.append(f"left out: step(s) {step_ranges(left)}")
    note = (
        f"the cap of {max_events:,} events (--max-events) cut {what}: kept the {kept:,} of its {timed:,} events "
        f"that start in its first {cut_us / 1e3:,.1f} ms (of {end / 1e3:,.1f} ms)"
        + (f"; {'; '.join(parts)}" if parts else "")
        + "; --steps N..M or a larger --max-events exports more"
    )
    data = {
        "max_events": max_events,
        "events_in_span": timed,
        "events_kept": kept,
        "kept_until_us": round(cut_us, 3),
        "span_end_us": round(end, 3),
        "steps_whole": whole,
        "steps_in_part": part,
    }
    return whole + part, note, data


def _main_tid(rt: Any) -> int:
    steps = rt.tables.steps
    if len(steps):
        return int(steps["tid"][0])
    tids = rt.tables.ops["tid"]
    return int(np.bincount(tids[tids >= 0]).argmax()) if np.any(tids >= 0) else 0


def _complete(table: Any, pid: int, shift: float, tids: np.ndarray, args: list[dict[str, Any] | None]) -> list[dict]:
    names = _names(table["name"])
    cats = _names(table["cat"])
    ts = (table["ts_us"] - shift).round(3).tolist()
    dur = np.maximum(table["dur_us"], 0.0).round(3).tolist()
    out = [
        {"ph": "X", "name": n, "cat": c, "pid": pid, "tid": t, "ts": a, "dur": d}
        for n, c, t, a, d in zip(names, cats, tids.tolist(), ts, dur, strict=True)
    ]
    for e, a in zip(out, args, strict=True):
        if a:
            e["args"] = a
    return out


# the collective call's arguments as Kineto names them (what the loader reads back: ``load.schema.Args``)
_COMM_ARGS = {
    "in_nelems": "In msg nelems",
    "out_nelems": "Out msg nelems",
    "group_size": "Group size",
    "dtype": "dtype",
    "collective_name": "Collective name",
    "pg_name": "Process Group Name",
    "seq": "Seq",
    "input_dims": "Input Dims",
    "input_type": "Input type",
}


def _op_args(ops: Any, comm_ops: Any) -> list[dict[str, Any] | None]:
    """Per op, the args the analysis reads back: ``correlation`` (a runtime call's link to its kernel) and a
    collective call's arguments (sizes, process group, sequence number)."""
    out: list[dict[str, Any] | None] = [{"correlation": c} if c >= 0 else None for c in ops["correlation"].tolist()]
    if not len(comm_ops) or not len(ops):
        return out
    where = {
        key: i
        for i, key in enumerate(zip(ops["ts_us"].tolist(), ops["tid"].tolist(), _names(ops["name"]), strict=True))
    }
    cols = {key: comm_ops[key].tolist() for key in _COMM_ARGS if key in comm_ops.columns}
    keys = zip(comm_ops["ts_us"].tolist(), comm_ops["tid"].tolist(), _names(comm_ops["name"]), strict=True)
    for j, key in enumerate(keys):
        i = where.get(key)
        if i is None:
            continue
        args = out[i] or {}
        for col, name in _COMM_ARGS.items():
            value = cols[col][j] if col in cols else None
            if value is not None and value != -1:
                args[name] = value
        out[i] = args
    return out


def _kernel_args(kernels: Any) -> list[dict[str, Any] | None]:
    """Per kernel, its device, stream and correlation (the launch it belongs to), as Kineto writes them."""
    return [
        {"device": d, "stream": s, **({"correlation": c} if c >= 0 else {})}
        for d, s, c in zip(
            kernels["device"].tolist(), kernels["stream"].tolist(), kernels["correlation"].tolist(), strict=True
        )
    ]


def _finding_marks(
    findings: list[Any],
    summaries: list[dict[str, Any]],
    chosen: list[int],
    offsets: dict[int, float],
    base: float,
    main_tids: dict[int, int],
) -> list[dict[str, Any]]:
    """The findings as instant events, where they happen in each exported step, as the reports' timeline marks
    them (``report.timeline``): the straggler's late arrival and the wait it causes on the others, the longest
    communication left exposed after backward, DataParallel's gather. A finding with no such place in the
    exported steps is one mark at the start of the export on each rank it names (on the lowest rank, global,
    for a run-wide one), saying that it applies to the exported window as a whole."""
    from ddpdoctor.metrics.timeline import step_rows

    rows_of = {s: step_rows(summaries, s, offsets) for s in chosen}
    ranks = sorted(main_tids)
    out: list[dict[str, Any]] = []
    for f in findings:
        args = {"severity": f.severity, "message": f.message, "recommendation": f.recommendation}
        placed = [(s, *p) for s in chosen if rows_of[s] for p in _places(f, s, rows_of[s])]
        for step, rank, t, part, where in placed:
            out.append(
                {
                    "ph": "i",
                    "s": "p",
                    "name": f"{f.id} {f.name}",
                    "cat": "ddpdoctor",
                    "pid": rank,
                    "tid": main_tids[rank],
                    "ts": round(t - base, 3),
                    "args": {**args, "step": step, "part": part, "where": where},
                }
            )
        if placed:
            continue
        where = "applies to the exported window as a whole (no one step or moment to mark)"
        for rank in [r for r in ranks if r in f.ranks] if f.ranks else ranks[:1]:
            out.append(
                {
                    "ph": "i",
                    "s": "p" if f.ranks else "g",
                    "name": f"{f.id} {f.name}",
                    "cat": "ddpdoctor",
                    "pid": rank,
                    "tid": main_tids[rank],
                    "ts": 0.0,
                    "args": {**args, "where": where},
                }
            )
    return sorted(out, key=lambda e: e["ts"])


def _places(f: Any, step: int, rows: list[dict[str, Any]]) -> list[tuple[int, float, str, str]]:
    """``(rank, time µs on the common clock, part, words)`` of each place ``f`` happens in ``step``."""
    from ddpdoctor.metrics.timeline import exposed_after_backward, latest_arrival
    from ddpdoctor.report.timeline import DP_RULES, OVERLAP, STRAGGLER

    def applies(rank: int) -> bool:
        return not f.ranks or rank in f.ranks

    out: list[tuple[int, float, str, str]] = []
    if f.name == STRAGGLER and f.ranks:
        late = {row["rank"]: latest_arrival(row) for row in rows if row["rank"] in f.ranks}
        culprit = next((c for c in late.values() if c is not None), None)
        names = ", ".join(map(str, f.ranks))
        for row in rows:
            rank = row["rank"]
            if rank in f.ranks and late.get(rank) is not None:
                kind, index, a, late_us = late[rank]  # type: ignore[misc]
                words = f"rank {rank} arrives {late_us / 1e3:,.1f} ms late at {kind} #{index} (step {step})"
                out.append((rank, a, "late-arrival", words))
            elif rank not in f.ranks and culprit is not None:
                for kind, index, part, a, b, _ in row["comm"]:
                    if part == "wait" and (kind, index) == culprit[:2]:
                        words = f"rank {rank} waits {(b - a) / 1e3:,.1f} ms for rank(s) {names} at {kind} #{index}"
                        out.append((rank, a, "wait-caused", f"{words} (step {step})"))
                        break
    elif f.name == OVERLAP:
        for row in rows:
            exposed = exposed_after_backward(row) if applies(row["rank"]) else []
            if exposed:
                a, b = max(exposed, key=lambda seg: seg[1] - seg[0])
                words = f"{(b - a) / 1e3:,.1f} ms of communication exposed after backward started (step {step})"
                out.append((row["rank"], a, "exposed-comm", words))
    elif f.name in DP_RULES:
        for row in rows:
            if row["gather"] and applies(row["rank"]):
                total = sum(b - a for a, b in row["gather"])
                words = f"DataParallel gathers the outputs on GPU 0: {total / 1e3:,.1f} ms (step {step})"
                out.append((row["rank"], row["gather"][0][0], "gather", words))
    return out
