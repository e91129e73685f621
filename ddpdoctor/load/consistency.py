"""Do the trace files found form one run? Copies, duplicate ranks, ranks of different runs, missing ranks.

- Two files of one worker whose profiled windows overlap in time are one recording twice (a copy, or
  ``trace.json`` beside ``trace.json.gz``): the later file is skipped.
- Two workers that report the same rank at the same time: the later one is skipped. At different times they
  are spans of one rank (a restarted process) and the loader merges them.
- Workers that disagree on the world size, or whose recordings lie more than ``RUN_GAP_MINUTES`` apart in
  wall-clock time, come from different runs: ``TraceError`` names them (which run is wanted cannot be
  guessed).
- What the report should say about the rest (``run_notes``): ranks missing from the world size, ranks numbered
  by file order, ranks without ``ProfilerStep`` ranges.

Times compared are absolute µs: ``baseTimeNanoseconds`` / 1000 + ``ts`` (older traces write epoch µs in
``ts``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ddpdoctor.errors import TraceError
from ddpdoctor.load.columns import FileColumns
from ddpdoctor.load.discover import shown
from ddpdoctor.load.frames import optimizer_steps_per_step, repeated_steps, steps_told_by_optimizer
from ddpdoctor.load.model import RankTrace
from ddpdoctor.load.schema import valid_world_size

RUN_GAP_MINUTES = 10  # ranks of one job record together; clocks of its hosts differ by far less than this
_RUN_GAP_US = RUN_GAP_MINUTES * 60e6
# below this a time is not wall-clock (a trace with ts from 0 and no base time): not compared
_EPOCH_2001_US = 978_307_200e6


def _base_us(base_time_ns: int | None) -> float:
    return base_time_ns / 1000 if base_time_ns else 0.0


def file_range(f: FileColumns) -> tuple[float, float] | None:
    """The absolute time span (µs) one file recorded: its profiler window, else its first and last event."""
    base = _base_us(f.base_time_ns)
    if f.window is not None:
        return base + f.window[0], base + f.window[1]
    ts = f.column("x", "ts", float)
    if not len(ts):
        return None
    return base + float(ts.min()), base + float((ts + f.column("x", "dur", float)).max())


def rank_range(rt: RankTrace) -> tuple[float, float] | None:
    """The absolute time span (µs) a worker's trace covers, from its CPU-side events."""
    if rt.tables is None and rt.facts is not None:
        return rt.facts.range_us
    ops = rt.tables.ops if rt.tables is not None else None
    if ops is None or not len(ops):
        return None
    base = _base_us(rt.base_time_ns)
    return base + _nan_extreme(ops["ts_us"], np.nanmin), base + _nan_extreme(ops["end_us"], np.nanmax)


def _nan_extreme(values: np.ndarray, fn: Any) -> float:
    """min/max over the values that are not NaN (NaN when none), as pandas' ``Series.min``/``max``."""
    return float(fn(values)) if not np.isnan(values).all() else float("nan")


def overlap(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    return a is not None and b is not None and a[0] < b[1] and b[0] < a[1]


def drop_copies(files: list[FileColumns]) -> tuple[list[FileColumns], list[str]]:
    """The files of one worker less those recording a window another file already covers (+ why skipped)."""
    kept: list[tuple[FileColumns, tuple[float, float] | None]] = []
    skipped = []
    for f in files:
        span = file_range(f)
        twin = next((k for k, k_span in kept if overlap(span, k_span)), None)
        if twin is None:
            kept.append((f, span))
        else:
            skipped.append(
                f"{shown(f.path)}: skipped: it records the same time as {shown(Path(twin.path).name)} "
                "(a copy, or one rank recorded twice)"
            )
    return [f for f, _ in kept], skipped


def recorded_together(a: RankTrace, b: RankTrace) -> bool:
    """Whether two workers' traces overlap in time (two copies of a rank, not a rank's successive spans)."""
    return overlap(rank_range(a), rank_range(b))


def duplicate_rank_reason(rank: int, kept: RankTrace, extra: RankTrace) -> str:
    """Why ``extra``, a second worker reporting ``rank`` at the same time as ``kept``, is skipped."""
    return (
        f"{_names(extra.files)}: skipped: rank {rank} again, recorded at the same time as "
        f"{_names(kept.files)} (a copy, or two processes that both report rank {rank})"
    )


def check_one_run(root: Path, workers: list[RankTrace]) -> None:
    """Raise ``TraceError`` when the workers come from different runs (world sizes or times differ)."""
    by_size: dict[int, list[str]] = {}
    for rt in workers:
        size = valid_world_size((rt.distributed_info or {}).get("world_size"))
        if size is not None:
            by_size.setdefault(size, []).extend(rt.files)
    if len(by_size) > 1:
        parts = "; ".join(f"world size {size} in {_names(files)}" for size, files in sorted(by_size.items()))
        raise TraceError(f"{shown(root)}: traces of different runs: {parts}; {_ADVICE}")
    timed = sorted(
        ((span, rt) for rt in workers if (span := rank_range(rt)) is not None and span[0] > _EPOCH_2001_US),
        key=lambda item: item[0],
    )
    runs: list[tuple[float, float, list[str]]] = []
    for (lo, hi), rt in timed:
        if runs and lo - runs[-1][1] <= _RUN_GAP_US:
            runs[-1] = (runs[-1][0], max(runs[-1][1], hi), runs[-1][2] + rt.files)
        else:
            runs.append((lo, hi, list(rt.files)))
    if len(runs) > 1:
        parts = "; ".join(f"{_names(files)} recorded at {_utc(lo)}" for lo, _, files in runs)
        raise TraceError(
            f"{shown(root)}: traces of different runs (recorded more than {RUN_GAP_MINUTES} minutes apart): "
            f"{parts}; {_ADVICE}"
        )


_ADVICE = "put each run's traces in a folder of its own"


def run_notes(
    ranks: list[RankTrace], world_size: int, source: str, per_step: Mapping[int, float] | None = None
) -> list[str]:
    """What a report should say about the ranks that were loaded (one line each). ``per_step``: the optimizer
    steps per step of the ranks whose own profiler marked their steps (``optimizer_steps_per_step_by_rank``)."""
    notes = []
    have = [rt.rank for rt in ranks]
    if source == "order" and len(ranks) > 1:
        notes.append(
            "no rank in the traces (distributedInfo) or in their file names: ranks are numbered 0-"
            f"{len(ranks) - 1} in file-name order"
        )
    missing = _missing_text(have, world_size)
    if missing and source != "order":
        notes.append(
            f"world size {world_size}, but no traces of rank(s) {missing}: the metrics and findings cover "
            f"rank(s) {_ranks_text(have)} only"
        )
    beyond = [r for r in have if r >= world_size]
    if beyond:
        notes.append(f"rank(s) {_ranks_text(beyond)} lie outside the world size {world_size} the traces state")
    no_steps = [
        rt.rank
        for rt in ranks
        if (rt.tables is not None and len(rt.tables.steps) == 0) or (rt.facts is not None and not rt.facts.has_steps)
    ]
    if no_steps:
        notes.append(
            f"rank(s) {_ranks_text(no_steps)}: no ProfilerStep#N ranges in the trace (the profiler was not "
            "stepped), so each profiled window is analysed as one step"
        )
    by_optimizer = [
        rt.rank
        for rt in ranks
        if (rt.tables is not None and steps_told_by_optimizer(rt.tables.steps))
        or (rt.tables is None and rt.facts is not None and rt.facts.optimizer_steps)
    ]
    if by_optimizer:
        notes.append(
            f"rank(s) {_ranks_text(by_optimizer)}: the profiler was not stepped (no ProfilerStep#N ranges in the "
            "trace, or only #0 over the whole window): each step is taken from the end of one optimizer step "
            "(Optimizer.step#...) to the end of the next (of one GradScaler update to the next, where the scaler "
            "skipped optimizer steps), what prof.step() called after optimizer.step() would have cut; call "
            "prof.step() once per step (or use `ddpdoctor trace`) to mark the steps yourself"
        )
    notes += _stepped_unlike_the_optimizer(per_step or {})
    notes += _recorded_again(ranks)
    return notes


def optimizer_steps_per_step_by_rank(
    ranks: list[RankTrace], captured: frozenset[int]
) -> tuple[dict[int, float], float | None]:
    """How many optimizer steps each step holds (``frames.optimizer_steps_per_step``), per rank whose own profiler
    marked its steps and where it is known (its tables, or the facts kept of them; not the ranks ``ddpdoctor
    trace`` recorded, ``captured``: it marks one step an iteration), and for the run: their median, 1.0 where
    ``ddpdoctor trace`` recorded every rank, None where it is not known."""
    if ranks and all(rt.rank in captured for rt in ranks):
        return {}, 1.0
    out: dict[int, float] = {}
    for rt in ranks:
        if rt.rank in captured:
            continue
        if rt.tables is not None:
            ratio = optimizer_steps_per_step(rt.tables.ops, rt.tables.steps)
        else:
            ratio = rt.facts.optimizer_steps_per_step if rt.facts is not None else None
        if ratio is not None:
            out[rt.rank] = ratio
    found = sorted(out.values())
    if not found:
        return out, None
    middle = len(found) // 2
    return out, found[middle] if len(found) % 2 else (found[middle - 1] + found[middle]) / 2


def _recorded_again(ranks: list[RankTrace]) -> list[str]:
    """A note for the ranks whose recordings (spans) number the same steps again: each profiler counts from 0, so
    the script made two profilers, the job was restarted, or the folder holds the traces of two runs
    (``tensorboard_trace_handler`` adds files to its folder run after run). All are analysed as one run, which
    for two runs mixes their numbers."""
    by_steps: dict[tuple[int, int], list[int]] = {}
    for rt in ranks:
        if rt.tables is not None:
            again = repeated_steps(rt.tables.steps)
        else:
            again = rt.facts.repeated_steps if rt.facts is not None else None
        if again is not None:
            by_steps.setdefault(again, []).append(rt.rank)
    return [
        f"rank(s) {_ranks_text(have)}: recorded ProfilerStep#{lo}"
        + (f"-{hi}" if hi > lo else "")
        + " more than once (each profiler counts its steps from 0): two profilers in the script, a restarted job,"
        " or the traces of two runs in one folder (tensorboard_trace_handler adds files to its folder run after "
        "run); they are analysed together as one run, so if they are two runs, put each run's traces in a folder "
        "of its own"
        for (lo, hi), have in sorted(by_steps.items())
    ]


def _stepped_unlike_the_optimizer(per_step: Mapping[int, float]) -> list[str]:
    """A note for the ranks whose own profiler's ProfilerStep#N ranges are not one iteration each (``per_step``:
    their optimizer steps per step): each holds two or more optimizer steps (``prof.step()`` every few
    iterations), or two or more of them hold one (``prof.step()`` twice an iteration, or once per micro-batch):
    every per-step figure is then of that span, not of an iteration."""
    many: dict[int, list[int]] = {}
    parts: dict[int, list[int]] = {}
    for rank, ratio in per_step.items():
        if ratio >= 1.5:
            many.setdefault(round(ratio), []).append(rank)
        elif ratio <= 1 / 1.5:
            parts.setdefault(round(1 / ratio), []).append(rank)
    notes = [
        f"rank(s) {_ranks_text(have)}: each ProfilerStep#N holds about {n} optimizer steps (Optimizer.step#...): "
        f"prof.step() is called once every {n} iterations (or {n} optimizers of one class step in each), so every "
        f"per-step figure covers {n} of them"
        for n, have in sorted(many.items())
    ]
    notes += [
        f"rank(s) {_ranks_text(have)}: about {n} ProfilerStep#N ranges to one optimizer step (Optimizer.step#...): "
        f"prof.step() is called {n} times an iteration (or once per micro-batch), so each step is part of an "
        "iteration and the per-step figures are of those parts; call prof.step() once, after optimizer.step()"
        for n, have in sorted(parts.items())
    ]
    return notes


def _names(files: list[str], limit: int = 3) -> str:
    names = [shown(Path(f).name) for f in files]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _utc(us: float) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(us / 1e6))
    except (OverflowError, OSError, ValueError):
        return f"{us / 1e6:.0f} s after 1970"


def _missing_text(have: list[int], world_size: int) -> str:
    """The ranks below ``world_size`` not in ``have``, as ranges (``"2-5, 7"``); "" when none is missing."""
    parts, previous = [], -1
    for r in sorted({r for r in have if r < world_size}) + [world_size]:
        if r - previous > 1:
            lo, hi = previous + 1, r - 1
            parts.append(str(lo) if lo == hi else f"{lo}-{hi}")
        previous = r
    return ", ".join(parts)


def _ranks_text(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    out: list[str] = []
    for r in sorted(ranks):
        if out and r == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ", ".join(out)
