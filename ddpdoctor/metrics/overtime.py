"""Over time: each finding with when and how often it held across the profiled windows of a long run
(``trace --every``), and trends of the always-on per-step series (``ranks/rank<R>.series.jsonl``,
``ddpdoctor.capture.series``): memory growth per 1,000 steps with the step at which it would run out, step time
drift.

The pure part (:func:`findings_over_time`, :func:`trends`, :func:`over_time`) takes what was read;
:func:`analyze_over_time` reads a run directory (every window's traces, once) and runs the rules over each window
(the same rules and thresholds as the whole run's diagnosis).

Nothing is said from too little data: fewer than :data:`MIN_WINDOWS` windows, or fewer than
:data:`MIN_TREND_STEPS` steps of the series outside the profiled windows, is "not evaluated" with the reason.
Windows are matched across ranks by their first step (a rank whose time-based window began a step later has the
same window). Steps inside a profiled window, the step that exports it and the first step are left out of the trends
(the profiler's own cost, ``metrics.profiled_steps.disturbed_steps``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from numbers import Real
from pathlib import Path
from typing import Any

import numpy as np

from ddpdoctor.metrics.slow_ranks import binomial_sf

MIN_WINDOWS = 3  # findings over time: at least this many windows
MIN_TREND_STEPS = 20  # trends: at least this many clean steps of the series
DRIFT_MIN_SHARE = 0.2  # step time: a change of 20% or more between the first and the last quarter of the run
DRIFT_MIN_MS = 1.0
LEAK_MIN_BYTES = 16 * 2**20  # memory: growth of 16 MiB or more between the first and the last quarter
LEAK_MIN_SHARE = 0.02  # ... and 2% of the first quarter's


# ---- windows ---------------------------------------------------------------------------------------------------
def kept_windows(captures: Mapping[int, Mapping[str, Any]]) -> list[tuple[int, int]]:
    """The profiled windows whose traces are kept, matched across ranks: [(first_step, last_step)], the earliest
    first and the latest last step of the ranks' windows that began within one step of each other (a DDP rank is
    at most a step ahead of another: a time-based window may begin a step later on one rank)."""
    clusters: list[dict[str, Any]] = []
    for rank, cap in captures.items():
        sched = cap.get("schedule") or {}
        active = int(sched.get("active") or 0) or None
        dropped = {(d.get("first_step"), d.get("last_step")) for d in sched.get("dropped") or [] if isinstance(d, dict)}
        for rng in (cap.get("steps") or {}).get("profiled") or []:
            if not (isinstance(rng, (list, tuple)) and len(rng) == 2):
                continue
            a, b = int(rng[0]), int(rng[1])
            step = active or (b - a + 1)
            for lo in range(a, b + 1, step):  # windows back to back are one range: cut it into windows
                w = (lo, min(lo + step - 1, b))
                if w in dropped:
                    continue
                near = [c for c in clusters if abs(c["first0"] - w[0]) <= 1 and rank not in c["ranks"]]
                if near:
                    c = min(near, key=lambda c: abs(c["first0"] - w[0]))
                    c["ranks"].add(rank)
                    c["first"], c["last"] = min(c["first"], w[0]), max(c["last"], w[1])
                else:
                    clusters.append({"first0": w[0], "first": w[0], "last": w[1], "ranks": {rank}})
    return sorted((c["first"], c["last"]) for c in clusters)


def findings_over_time(
    windows: Sequence[tuple[int, int]],
    per_window: Sequence[Sequence[Mapping[str, Any]]],
    *,
    world_size: int | None,
    when: Mapping[int, float] | None = None,
) -> dict[str, Any]:
    """Each finding's record over the windows. ``per_window[i]``: the findings (``Finding.to_json()``) of window
    ``i``; ``when``: step -> unix time its step ended (for "since HH:MM"), where known."""
    n = len(windows)
    if n < MIN_WINDOWS:
        return {"evaluated": False, "windows": n, "reason": f"{n} profiled window(s) kept; {MIN_WINDOWS} are needed"}
    names: dict[str, dict[str, Any]] = {}
    for i, found in enumerate(per_window):
        for f in found:
            rec = names.setdefault(f["name"], {"name": f["name"], "id": f.get("id"), "held": [], "ranks": []})
            rec["held"].append(i)
            rec["ranks"].append(sorted(int(r) for r in f.get("ranks") or []))
    out = []
    for rec in names.values():
        out.append(_finding_record(rec, windows, world_size, when or {}))
    order = {"moved": 0, "started": 1, "stopped": 2, "intermittent": 3, "every window": 4}
    out.sort(key=lambda r: (order.get(r["pattern"], 9), -r["held_count"], r["name"]))
    return {
        "evaluated": True,
        "windows": n,
        "window_steps": [list(w) for w in windows],
        "window_times": [_time_of(when or {}, w[0]) for w in windows],
        "findings": out,
    }


def _finding_record(
    rec: dict[str, Any], windows: Sequence[tuple[int, int]], world_size: int | None, when: Mapping[int, float]
) -> dict[str, Any]:
    """One finding's record. A finding about some ranks (not all) follows its culprit: a rank named in more than
    half of the windows it held (two at least) is the culprit, and "when" is that rank's; with no such rank, and
    different ranks named, the culprit moves."""
    n = len(windows)
    ranks_sets = [tuple(r) for r in rec["ranks"]]
    everyone = tuple(range(world_size)) if world_size else None
    specific = all(r and r != everyone for r in ranks_sets)
    held: list[int] = rec["held"]
    culprit: int | None = None
    others: list[tuple[int, tuple[int, ...]]] = []
    moved = False
    if specific:
        counts: dict[int, int] = {}
        for r in ranks_sets:
            for k in r:
                counts[k] = counts.get(k, 0) + 1
        top = max(counts, key=lambda k: (counts[k], -k))
        if counts[top] >= 2 and counts[top] * 2 > len(held):
            culprit = top
            others = [(w, r) for w, r in zip(held, ranks_sets, strict=True) if top not in r]
            held = [w for w, r in zip(held, ranks_sets, strict=True) if top in r]
        elif len(held) >= 2 and len(counts) >= 2:
            moved = True
        elif len(held) == 1 and len(ranks_sets[0]) == 1:  # one window, one rank: that rank, once
            culprit = ranks_sets[0][0]
    first, last = held[0], held[-1]
    contiguous = held == list(range(first, last + 1))
    if moved:
        pattern = "moved"
    elif len(held) == n:
        pattern = "every window"
    elif contiguous and last == n - 1 and first > 0:
        pattern = "started"
    elif contiguous and first == 0:
        pattern = "stopped"
    else:
        pattern = "intermittent"
    out: dict[str, Any] = {
        "name": rec["name"],
        "id": rec["id"],
        "held_count": len(held),
        "windows": n,
        "held_windows": [i + 1 for i in held],
        "ranks_by_window": [list(r) for r in ranks_sets],
        "culprit": culprit,
        "same_ranks": (culprit is not None and not others) or (not specific and len(set(ranks_sets)) == 1),
        "pattern": pattern,
        "since_step": windows[first][0],
        "since_time": _time_of(when, windows[first][0]),
    }
    if others:
        out["other_ranks"] = [{"window": w + 1, "ranks": list(r)} for w, r in others]
    if pattern == "started":  # it began between the last window without it and the first with it
        out["absent_until_step"] = windows[first - 1][1]
    if pattern == "stopped":
        out["gone_by_step"] = windows[last + 1][0]
    out["text"] = _finding_text(out, rec["held"])
    return out


def _finding_text(r: dict[str, Any], all_held: list[int]) -> str:
    n = r["windows"]
    who = f"rank {r['culprit']} " if r.get("culprit") is not None else ""
    held = f"{who}in {r['held_count']} of {n} windows"
    since = f" since step {r['since_step']}" + (f" ({r['since_time']})" if r.get("since_time") else "")
    if r["pattern"] == "every window":
        text = held
    elif r["pattern"] == "started":
        text = f"{held}{since}; not in the {r['held_windows'][0] - 1} window(s) before"
        text += f": it began between step {r['absent_until_step'] + 1} and step {r['since_step']}"
    elif r["pattern"] == "stopped":
        text = f"{held}, from the start; gone by step {r['gone_by_step']}"
    elif r["pattern"] == "moved":
        seq = ", ".join(f"window {w + 1}: {_ranks(rk)}" for w, rk in zip(all_held, r["ranks_by_window"], strict=True))
        text = (
            f"in {r['held_count']} of {n} windows, not one rank: the rank changes between windows ({seq}): "
            "look at the data (what each rank's batches held in those steps), not at a node"
        )
    else:
        text = f"{held} (windows {', '.join(map(str, r['held_windows']))}){since}"
    if r.get("culprit") is not None and r["pattern"] != "moved":
        if r.get("other_ranks"):
            text += "; also " + ", ".join(f"{_ranks(o['ranks'])} in window {o['window']}" for o in r["other_ranks"])
        elif r["held_count"] > 1:
            text += ", the same rank each time"
    return text


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _time_of(when: Mapping[int, float], step: int) -> str | None:
    t = when.get(step)
    if t is None:
        return None
    return time.strftime("%H:%M:%S UTC", time.gmtime(t))


# ---- trends of the always-on series -------------------------------------------------------------------------------
def trends(
    series: Mapping[int, Any], captures: Mapping[int, Mapping[str, Any]], *, step_jump: bool = True
) -> dict[str, Any]:
    """Step time drift and memory growth from the series (``{rank: RankSeries}``: ``.header``, ``.rows``)."""
    if not series:
        why = "no always-on series in this run (ranks/rank<R>.series.jsonl: traced by a version without it)"
        off = {"evaluated": False, "reason": why}
        return {"step_time": off, "memory": dict(off), "arrivals": dict(off)}
    clean = _clean_steps(series, captures)
    return {
        "step_time": _drift(series, clean),
        "memory": _memory(series, clean),
        "arrivals": arrivals(series, captures),
    }


def _clean_steps(series: Mapping[int, Any], captures: Mapping[int, Mapping[str, Any]]) -> set[int]:
    """Steps of the series that every rank has, outside the profiler's windows and the first step."""
    from ddpdoctor.metrics.profiled_steps import disturbed_steps

    steps: set[int] | None = None
    for s in series.values():
        mine = {int(r["step"]) for r in s.rows if r.get("step") is not None}
        steps = mine if steps is None else steps & mine
    steps = steps or set()
    for cap in captures.values():
        steps -= disturbed_steps(cap)
    steps.discard(0)
    return steps


def _job_values(series: Mapping[int, Any], clean: set[int], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, the slowest rank's value at each) over ``clean``."""
    by_step: dict[int, float] = {}
    for s in series.values():
        for r in s.rows:
            v = r.get(key)
            if r.get("step") in clean and isinstance(v, Real) and math.isfinite(v):
                by_step[r["step"]] = max(by_step.get(r["step"], -math.inf), float(v))
    steps = np.array(sorted(by_step), dtype=np.int64)
    return steps, np.array([by_step[int(k)] for k in steps], dtype=np.float64)


def _quarters(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    q = max(len(x) // 4, 1)
    return x[:q], x[-q:]


def _drift(series: Mapping[int, Any], clean: set[int]) -> dict[str, Any]:
    steps, wall = _job_values(series, clean, "wall_s")
    if len(steps) < MIN_TREND_STEPS:
        return {
            "evaluated": False,
            "reason": f"{len(steps)} steps outside the profiled windows; {MIN_TREND_STEPS} are needed",
        }
    ms = wall * 1000.0
    head, tail = _quarters(ms)
    before, after = float(np.median(head)), float(np.median(tail))
    slope = float(np.polyfit(steps.astype(np.float64), ms, 1)[0]) * 1000.0
    change = after - before
    # a drift: the medians differ by the share and the ms, and the quarters do not overlap in the middle half
    up = change > 0 and np.percentile(tail, 25) > np.percentile(head, 75)
    down = change < 0 and np.percentile(tail, 75) < np.percentile(head, 25)
    drift = (up or down) and abs(change) >= max(DRIFT_MIN_MS, DRIFT_MIN_SHARE * before)
    out: dict[str, Any] = {
        "evaluated": True,
        "steps": len(steps),
        "first_step": int(steps[0]),
        "last_step": int(steps[-1]),
        "start_ms": round(before, 3),
        "end_ms": round(after, 3),
        "ms_per_1000_steps": round(slope, 3),
        "drift": bool(drift),
    }
    if drift:
        jump = _jump(steps, ms)
        if jump is not None:
            out["jump_step"] = jump
        how = f"a jump at step {jump}" if jump is not None else f"{slope:+.1f} ms per 1,000 steps"
        word = "rose" if change > 0 else "fell"
        out["text"] = (
            f"step time {word} from {before:.1f} ms to {after:.1f} ms ({after / before:.2f}x; steps "
            f"{int(steps[0])}-{int(steps[-1])}): {how}"
        )
    else:
        out["text"] = (
            f"step time steady: {before:.1f} ms in the first quarter of steps {int(steps[0])}-{int(steps[-1])}, "
            f"{after:.1f} ms in the last (no drift of {DRIFT_MIN_SHARE:.0%} or more)"
        )
    return out


def _jump(steps: np.ndarray, y: np.ndarray) -> int | None:
    """The step where a two-level fit beats a straight line: a jump, not a gradual drift (None: gradual)."""
    n = len(y)
    line = np.polyval(np.polyfit(steps.astype(np.float64), y, 1), steps)
    line_err = float(np.abs(y - line).sum())
    best, best_err = None, math.inf
    for i in range(3, n - 2):
        err = float(np.abs(y[:i] - np.median(y[:i])).sum() + np.abs(y[i:] - np.median(y[i:])).sum())
        if err < best_err:
            best, best_err = i, err
    if best is None or best_err >= 0.7 * line_err:
        return None
    return int(steps[best])


def _memory(series: Mapping[int, Any], clean: set[int]) -> dict[str, Any]:
    """Per device (a node's host memory on CPU: its ranks' RSS summed), growth per 1,000 steps and the step at
    which it reaches the capacity."""
    groups: dict[str, dict[str, Any]] = {}
    for rank, s in series.items():
        h = s.header or {}
        cpu = str(h.get("device") or "cpu") == "cpu"
        key = f"host {h.get('node') or '?'}" if cpu else f"{h.get('node') or '?'} {h.get('device')}"
        g = groups.setdefault(key, {"ranks": [], "cpu": cpu, "capacity": h.get("mem_capacity_bytes"), "rows": []})
        g["ranks"].append(rank)
        g["rows"].append(s.rows)
    devices = []
    for key, g in groups.items():
        devices.append(_device_memory(key, g, clean))
    evaluated = [d for d in devices if d["evaluated"]]
    if not evaluated:
        reasons = "; ".join(f"{d['device']}: {d['reason']}" for d in devices) or "no memory in the series"
        return {"evaluated": False, "reason": reasons, "devices": devices}
    leaks = [d for d in evaluated if d["leak"]]
    first_out = min((d for d in leaks if d.get("oom_step") is not None), key=lambda d: d["oom_step"], default=None)
    out: dict[str, Any] = {"evaluated": True, "devices": devices, "leak": bool(leaks)}
    if first_out is not None:
        out["oom_step"] = first_out["oom_step"]
        out["oom_device"] = first_out["device"]
    return out


def _device_memory(key: str, g: dict[str, Any], clean: set[int]) -> dict[str, Any]:
    # The RSS is read at most every 50 ms (capture/series.py): a step without it has its rank's last reading
    # (from a clean step), so the ranks of a host add up at every step.
    total: dict[int, float] = {}
    count: dict[int, int] = {}
    for rows in g["rows"]:
        last: float | None = None
        for r in rows:
            if r.get("step") not in clean:
                continue
            v = r.get("mem_reserved_bytes") if not g["cpu"] and r.get("mem_reserved_bytes") is not None else None
            v = r.get("mem_bytes") if v is None else v
            if isinstance(v, Real) and math.isfinite(v):
                last = float(v)
            if last is not None:
                total[r["step"]] = total.get(r["step"], 0.0) + last
                count[r["step"]] = count.get(r["step"], 0) + 1
    n_ranks = len(g["rows"])
    steps = np.array(sorted(k for k in total if count[k] == n_ranks), dtype=np.int64)
    what = "process RSS" + (f" of ranks {', '.join(map(str, sorted(g['ranks'])))}" if n_ranks > 1 else "")
    base = {"device": key, "ranks": sorted(g["ranks"]), "measure": what if g["cpu"] else "CUDA reserved bytes"}
    if len(steps) < MIN_TREND_STEPS:
        return {
            **base,
            "evaluated": False,
            "reason": f"{len(steps)} steps with memory outside the profiled windows; {MIN_TREND_STEPS} are needed",
        }
    y = np.array([total[int(k)] for k in steps])
    head, tail = _quarters(y)
    before, after = float(np.median(head)), float(np.median(tail))
    q = np.array_split(y, 4)
    medians = [float(np.median(p)) for p in q]
    rising = all(b > a for a, b in zip(medians, medians[1:], strict=False))
    slope = float(np.polyfit(steps.astype(np.float64), y, 1)[0])  # bytes per step
    growth = after - before
    leak = rising and slope > 0 and growth >= max(LEAK_MIN_BYTES, LEAK_MIN_SHARE * before)
    out: dict[str, Any] = {
        **base,
        "evaluated": True,
        "steps": len(steps),
        "first_step": int(steps[0]),
        "last_step": int(steps[-1]),
        "start_bytes": before,
        "end_bytes": after,
        "bytes_per_1000_steps": slope * 1000.0,
        "leak": bool(leak),
        "capacity_bytes": g["capacity"],
    }
    cap = g["capacity"]
    limit = (
        "the host's total memory (MemTotal; other processes' memory is not counted, so it runs out sooner)"
        if g["cpu"]
        else "the device's total memory"
    )
    if leak:
        text = (
            f"{key}: memory grows {_mib(slope * 1000)} per 1,000 steps ({what}: {_mib(before)} at the start, "
            f"{_mib(after)} at the end of steps {int(steps[0])}-{int(steps[-1])})"
        )
        if isinstance(cap, (int, float)) and cap > 0:
            last = float(y[-1])
            oom = int(steps[-1] + max(cap - last, 0.0) / slope)
            out["oom_step"] = oom
            out["limit"] = limit
            text += f"; at this rate it reaches {_mib(cap)}, {limit}, at step ~{oom:,}"
        else:
            text += "; its capacity is not known, so no out-of-memory step is projected"
        out["text"] = text
    else:
        out["text"] = (
            f"{key}: memory steady ({what}: {_mib(before)} in the first quarter of steps {int(steps[0])}-"
            f"{int(steps[-1])}, {_mib(after)} in the last; no steady growth)"
        )
    return out


# ---- who reached the step's all-reduce last, step by step (the always-on series) ------------------------------
ARRIVAL_MIN_STEPS = 20  # steps every rank has, with the phases of the step and of the step before
ARRIVAL_MIN_MS = 5.0  # a step counts as one with a late rank when the last arrived this much after the others
ARRIVAL_MIN_SHARE = 0.05  # ... and this share of the median step
ARRIVAL_ALPHA = 1e-3  # the chance that a late rank (or its persistence) is luck, at most (over every rank)
# the late ranks of steps this far apart are compared, in steps and in time: neighbouring steps share a hiccup (a
# rank off its CPU for a while delays every step it spans)
ARRIVAL_LAG_STEPS = 3
ARRIVAL_LAG_S = 0.2
ARRIVAL_MIN_RUN = 5  # a stretch of steps with the same late rank is said from this many steps on
ARRIVAL_MERGE_GAP = 2  # ... across gaps of this many steps without a late rank (or with another one)


def arrival_skipped(captures: Mapping[int, Mapping[str, Any]]) -> set[int]:
    """Steps whose time to the backward a profiled window may have made uneven between ranks: the first step, and
    at each window the steps the profiler starts in and the last one with the two after it (its trace is written
    there, longer on a rank with more events). The window's other steps stay: each rank records the same ops, so
    the profiler's cost adds alike to every rank's arrival."""
    out: set[int] = set()
    for cap in captures.values():
        steps = cap.get("steps") or {}
        schedule = cap.get("schedule")
        warmup = int(schedule.get("warmup") or 0) if isinstance(schedule, dict) else 0
        first = steps.get("first") if isinstance(steps.get("first"), int) else 1
        out.add(first)
        for w in steps.get("profiled") or []:
            if isinstance(w, (list, tuple)) and len(w) == 2 and all(isinstance(v, int) for v in w):
                lo, hi = w[0] - warmup, w[1]
                out.update((lo - 1, lo, hi, hi + 1, hi + 2))
    return out


def arrivals(series: Mapping[int, Any], captures: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Which rank reached its backward (where DDP's first all-reduce of the step starts) last, at every step of the
    series, and for how long the same rank kept being the late one.

    A DDP step's collectives end together on every rank (the last bucket's all-reduce), so each rank's time from
    that point to its next backward is its arrival: the optimizer's step after it, then the next step's data and
    forward (``optimizer_s`` of the step before + ``data_s`` + ``forward_s`` of the series). No clock is shared:
    each rank measures its own span. Whether a late rank is a pattern is decided from steps ``lag`` apart (at least
    ARRIVAL_LAG_STEPS, and ARRIVAL_LAG_S of median steps)
    (issue 25: steps, not collectives, are the trials; neighbouring steps share a hiccup): in a job with no
    straggler the late rank of one step says nothing of a later one's (the same rank with chance 1/world size), a
    straggler is late step after step. Two tests, either may decide: one rank late more often than 1 in the world
    size at steps ``lag`` apart (binomial, times the ranks), and the same rank at both ends of pairs of late steps
    ``lag`` apart more often than the ranks' own shares of the late steps make likely (a straggler that moves from
    rank to rank over the run). Only DDP jobs
    (every rank built a DistributedDataParallel module): FSDP's all-gathers in the forward make every rank wait
    there, a pipeline's stages reach their backward at different times by design."""
    if len(series) < 2:
        return {"evaluated": False, "reason": "one rank's series: nothing to compare"}
    if not captures or not all((cap or {}).get("ddp") for cap in captures.values()):
        return {
            "evaluated": False,
            "reason": "not every rank built a DistributedDataParallel module: the time to the backward is when a "
            "rank reaches DDP's all-reduce only in a DDP job",
        }
    ranks = sorted(series)
    skipped = arrival_skipped(captures)
    arrive: dict[int, dict[int, float]] = {}
    cpu: dict[int, dict[int, float]] = {}
    wall: list[float] = []
    for rank in ranks:
        rows = {int(r["step"]): r for r in series[rank].rows if isinstance(r.get("step"), int)}
        mine = arrive[rank] = {}
        cpu[rank] = {}
        for step, r in rows.items():
            prev = rows.get(step - 1)
            if step in skipped or prev is None or (step - 1) in skipped or step < 1:
                continue
            parts = (prev.get("optimizer_s"), r.get("data_s"), r.get("forward_s"))
            if all(isinstance(v, Real) and math.isfinite(v) for v in parts):
                mine[step] = float(sum(parts))  # type: ignore[arg-type]
                if isinstance(r.get("cpu_s"), Real):
                    cpu[rank][step] = float(r["cpu_s"])
            if isinstance(r.get("wall_s"), Real):
                wall.append(float(r["wall_s"]))
    steps = sorted(set.intersection(*(set(a) for a in arrive.values())))
    if len(steps) < ARRIVAL_MIN_STEPS:
        return {
            "evaluated": False,
            "reason": f"{len(steps)} steps with every rank's phases (the profiler's start and export left out); "
            f"{ARRIVAL_MIN_STEPS} are needed",
        }
    a = np.array([[arrive[r][s] for r in ranks] for s in steps]) * 1000.0  # ms, steps x ranks
    order = np.argsort(a, axis=1)
    last = order[:, -1]
    rest = np.sort(a, axis=1)[:, :-1]
    late_ms = a[np.arange(len(steps)), last] - np.median(rest, axis=1)  # the last one after the others' median
    step_ms = float(np.median(wall)) * 1000.0 if wall else 0.0
    floor = max(ARRIVAL_MIN_MS, ARRIVAL_MIN_SHARE * step_ms)
    late = late_ms >= floor
    who = np.where(late, last, -1)  # the late rank's index per step, -1: no rank late
    # pairs of late steps ``lag`` steps apart: a hiccup shorter than that (a rank off its CPU for a few steps)
    # makes no pair of its own, a straggler's steps pair up all along
    lag = max(ARRIVAL_LAG_STEPS, math.ceil(ARRIVAL_LAG_S * 1000.0 / step_ms) if step_ms > 0 else 0)
    pos = {step: i for i, step in enumerate(steps)}
    later = [(i, pos[st + lag]) for i, st in enumerate(steps) if st + lag in pos]
    pairs = sum(1 for i, j in later if late[i] and late[j])
    same = sum(1 for i, j in later if late[i] and late[j] and who[i] == who[j])
    w = len(ranks)
    # 1. one rank late more often than chance, counted at steps ``lag`` apart (independent trials)
    first = steps[0]
    thinned = [who[i] for i, st in enumerate(steps) if (st - first) % lag == 0 and who[i] >= 0]
    counts = [sum(1 for k in thinned if k == r) for r in range(w)]
    top = max(range(w), key=lambda r: counts[r])
    p_rank = min(1.0, w * binomial_sf(counts[top], len(thinned), 1.0 / w))
    # 2. the late rank persists (a straggler that moves from rank to rank keeps each rank for a while): the same
    # rank at both ends of a pair more often than the ranks' own shares of the late steps make likely
    shares = [float(np.sum(who == r)) / max(int(late.sum()), 1) for r in range(w)]
    p_same = binomial_sf(same, pairs, min(1.0, sum(q * q for q in shares))) if pairs else 1.0
    p = min(p_rank, p_same)
    out: dict[str, Any] = {
        "evaluated": True,
        "steps": len(steps),
        "first_step": steps[0],
        "last_step": steps[-1],
        "late_steps": int(late.sum()),
        "threshold_ms": round(floor, 3),
        "lag_steps": lag,
        "sampled_late_steps": len(thinned),
        "most_late_rank": ranks[top],
        "most_late_count": counts[top],
        "late_pairs": pairs,
        "same_rank_pairs": same,
        "p_value": float(f"{p:.3g}"),
        "stretches": [],
    }
    if p > ARRIVAL_ALPHA:
        out["text"] = (
            f"no rank shown to keep arriving last (p = {p:.2g}; under {ARRIVAL_ALPHA:g} is needed): "
            f"{int(late.sum())} of {len(steps)} steps had a rank reach its backward {floor:.1f} ms or more after the "
            f"others; at steps {lag} apart the most often late was rank {ranks[top]}, {counts[top]} of "
            f"{len(thinned)} (chance alone: 1 in {w}), and the same rank was late at both ends of {same} of {pairs} "
            "pairs"
        )
        return out
    stretches = _stretches(steps, who)
    for s in stretches:
        rank = ranks[s["index"]]
        idx = [i for i, st in enumerate(steps) if s["first"] <= st <= s["last"] and who[i] == s["index"]]
        s.update(rank=rank, late_ms=round(float(np.median(late_ms[idx])), 3))
        s["since_time"] = _time_of({int(r["step"]): float(r["t"]) for r in series[rank].rows if r.get("t")}, s["first"])
        mine = [cpu[rank].get(steps[i]) for i in idx]
        theirs = [cpu[o].get(steps[i]) for i in idx for o in ranks if o != rank]
        mine_v = [v for v in mine if v is not None]
        theirs_v = [v for v in theirs if v is not None]
        if len(mine_v) >= len(idx) // 2 and theirs_v:
            s["cpu_ms"] = round(1000.0 * float(np.median(mine_v)), 3)
            s["others_cpu_ms"] = round(1000.0 * float(np.median(theirs_v)), 3)
        del s["index"]
    out["stretches"] = stretches
    out["ranks"] = sorted({s["rank"] for s in stretches})
    if not stretches:  # late far more often than chance, but never ARRIVAL_MIN_RUN times in a row
        out["ranks"] = [ranks[top]]
        out["pattern"] = "intermittent"
        out["text"] = (
            f"rank {ranks[top]} arrived last at the backward's all-reduce more often than chance, on and off: at "
            f"steps {lag} apart late in {counts[top]} of {len(thinned)} (chance alone 1 in {w}, p = {p:.2g}), never "
            f"{ARRIVAL_MIN_RUN} late steps in a row"
        )
        return out
    if len(out["ranks"]) > 1:
        out["pattern"] = "moved"
    elif _covers(stretches, steps):
        out["pattern"] = "throughout"
    elif stretches and stretches[-1]["last"] >= steps[-1] - ARRIVAL_MERGE_GAP:
        out["pattern"] = "started"
    else:
        out["pattern"] = "stretch"
    out["text"] = _arrivals_text(out, w)
    return out


def _stretches(steps: Sequence[int], who: np.ndarray) -> list[dict[str, Any]]:
    """Runs of steps with the same late rank, at least ARRIVAL_MIN_RUN late steps each. Gaps of up to
    ARRIVAL_MERGE_GAP observed steps (no rank late, or another) are bridged; steps not observed (a profiled
    window's, left out of the series analysis) are no gap."""
    runs: list[dict[str, Any]] = []
    for pos, (step, k) in enumerate(zip(steps, who, strict=True)):
        if k < 0:
            continue
        # the same rank's run, unless the gap since it is too long (another rank's short run inside it is bridged)
        cur = next((r for r in reversed(runs[-2:]) if r["index"] == int(k)), None)
        if cur is not None and pos - cur["last_pos"] <= ARRIVAL_MERGE_GAP + 1:
            cur["last"], cur["last_pos"] = step, pos
            cur["late"] += 1
        else:
            runs.append({"index": int(k), "first": step, "last": step, "first_pos": pos, "last_pos": pos, "late": 1})
    kept = [r for r in runs if r["late"] >= ARRIVAL_MIN_RUN]
    for r in kept:
        r["steps"] = r.pop("last_pos") - r.pop("first_pos") + 1  # observed steps in the stretch
    return kept


def _covers(stretches: Sequence[Mapping[str, Any]], steps: Sequence[int]) -> bool:
    return (
        len(stretches) == 1
        and stretches[0]["first"] <= steps[0] + ARRIVAL_MERGE_GAP
        and (stretches[0]["last"] >= steps[-1] - ARRIVAL_MERGE_GAP)
    )


def _arrivals_text(out: Mapping[str, Any], world: int) -> str:
    parts = []
    for s in out["stretches"]:
        span = f"steps {s['first']}-{s['last']}"
        if out["pattern"] == "started" and s is out["stretches"][-1]:
            span = f"since step {s['first']}" + (f" ({s['since_time']})" if s.get("since_time") else "")
        text = f"rank {s['rank']} in {s['late']} of {s['steps']} steps {span}, {s['late_ms']:.1f} ms after the others"
        if "cpu_ms" in s:
            more = s["cpu_ms"] - s["others_cpu_ms"]
            if more >= 0.5 * s["late_ms"]:
                text += (
                    f" (its process used {s['cpu_ms']:.1f} ms of CPU a step, the others {s['others_cpu_ms']:.1f}: "
                    "more work on that rank)"
                )
            elif abs(more) < 0.25 * s["late_ms"]:
                text += (
                    f" (its process used as much CPU a step as the others, {s['cpu_ms']:.1f} vs "
                    f"{s['others_cpu_ms']:.1f} ms: it waited for something rather than working more - a CPU on a "
                    "busy host, I/O, a sleep, or its GPU)"
                )
        parts.append(text)
    head = (
        f"arrived last at the backward's all-reduce, step after step (at steps {out['lag_steps']} apart: rank "
        f"{out['most_late_rank']} late in {out['most_late_count']} of {out['sampled_late_steps']}, the same rank at "
        f"both ends of {out['same_rank_pairs']} of {out['late_pairs']} pairs; chance alone 1 in {world}, "
        f"p = {out['p_value']:.2g}): "
    )
    tail = ""
    if out["pattern"] == "moved":
        tail = ": the rank changes over the run: look at the data (what each rank's batches held), not at a node"
    elif out["pattern"] == "started":
        tail = "; before, no rank kept arriving last"
    return head + "; ".join(parts) + tail


def _mib(b: float) -> str:
    return f"{b / 2**30:.1f} GiB" if abs(b) >= 2**30 else f"{b / 2**20:.1f} MiB"


# ---- the whole section -------------------------------------------------------------------------------------------
def over_time(
    windows: Sequence[tuple[int, int]],
    per_window: Sequence[Sequence[Mapping[str, Any]]] | None,
    series: Mapping[int, Any],
    captures: Mapping[int, Mapping[str, Any]],
    *,
    world_size: int | None,
    window_reason: str | None = None,
) -> dict[str, Any]:
    """The report's "Over time" section (a JSON-able dict)."""
    when = {int(r["step"]): float(r["t"]) for s in series.values() for r in s.rows if r.get("t") is not None}
    if per_window is None:
        found: dict[str, Any] = {
            "evaluated": False,
            "windows": len(windows),
            "reason": window_reason or f"{len(windows)} profiled window(s) kept; {MIN_WINDOWS} are needed",
        }
    else:
        found = findings_over_time(windows, per_window, world_size=world_size, when=when)
    trend = trends(series, captures)
    drift = trend["step_time"]
    jump = drift.get("jump_step")
    if jump is not None and found.get("evaluated"):
        for rec in found["findings"]:  # a finding that began in the gap where the step time jumped: say when
            lo, hi = rec.get("absent_until_step"), rec.get("since_step")
            if rec["pattern"] == "started" and lo is not None and lo < jump <= hi:
                rec["started_step"] = jump
                rec["started_time"] = _time_of(when, jump)
                at = f" ({rec['started_time']})" if rec.get("started_time") else ""
                rec["text"] += f"; the step time jumped at step {jump}{at}"
    return {
        "findings": found,
        "step_time": drift,
        "memory": trend["memory"],
        "arrivals": trend["arrivals"],
        "series_ranks": sorted(series),
    }


def analyze_over_time(
    path: Path, rules: Sequence[Any], captures: Mapping[int, Mapping[str, Any]], world_size: int | None
) -> dict[str, Any] | None:
    """Read ``path``'s series and (with :data:`MIN_WINDOWS` windows or more) every window's traces, run ``rules``
    over each window, and build the section; None for a run with neither a series nor two windows (nothing to
    say over time)."""
    from ddpdoctor.capture.series import read_series

    try:
        series = read_series(path)
    except Exception:  # not a run directory: a folder of traces has no series
        series = {}
    series = {k: v for k, v in series.items() if v.rows}
    windows = kept_windows(captures)
    if not series and len(windows) < 2:
        return None
    per_window = None
    reason = None
    if len(windows) >= MIN_WINDOWS:
        try:
            windows, per_window = _diagnose_windows(path, windows, rules)
        except Exception as exc:  # the run's own diagnosis stands; this section says why it has no windows
            reason = f"the windows could not be read one by one: {type(exc).__name__}: {exc}"
    return over_time(windows, per_window, series, captures, world_size=world_size, window_reason=reason)


def _diagnose_windows(
    path: Path, windows: Sequence[tuple[int, int]], rules: Sequence[Any]
) -> tuple[list[tuple[int, int]], list[list[dict]]]:
    """The windows with steps in their traces, and each one's findings (a window none of whose steps could be
    analysed is left out, not counted as one without findings)."""
    from ddpdoctor.diagnosis import evaluate
    from ddpdoctor.load import load
    from ddpdoctor.metrics.analysis import analyze

    run = load(path, use_summaries=False, summarize=False)  # every window's events, decoded once
    kept, out = [], []
    for lo, hi in windows:
        metrics = analyze(run, steps=(lo, hi))
        if not metrics.run.get("steps_analyzed"):
            continue
        kept.append((lo, hi))
        out.append([f.to_json() for f in evaluate(rules, metrics).findings])
    return kept, out
