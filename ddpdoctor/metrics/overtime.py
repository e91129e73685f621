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
                _join(clusters, rank, w)
    return sorted((c["first"], c["last"]) for c in clusters)


def summarized_windows(captures: Mapping[int, Mapping[str, Any]]) -> list[tuple[int, int, dict[int, str]]]:
    """The windows ``--keep`` removed whose ranks summarised them first (``capture.window_summary``), matched
    across ranks as ``kept_windows`` matches them: [(first_step, last_step, {rank: summary file name})]."""
    clusters: list[dict[str, Any]] = []
    for rank, cap in captures.items():
        for d in (cap.get("schedule") or {}).get("dropped") or []:
            if not isinstance(d, dict) or not isinstance(d.get("summary"), str):
                continue
            a, b = d.get("first_step"), d.get("last_step")
            if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool) and not isinstance(b, bool):
                _join(clusters, rank, (a, b), d["summary"])
    return sorted((c["first"], c["last"], c["files"]) for c in clusters)


def _join(clusters: list[dict[str, Any]], rank: int, w: tuple[int, int], file: str | None = None) -> None:
    """Put rank ``rank``'s window ``w`` in the cluster of the windows that began within one step of it, or a new
    one."""
    near = [c for c in clusters if abs(c["first0"] - w[0]) <= 1 and rank not in c["ranks"]]
    if near:
        c = min(near, key=lambda c: abs(c["first0"] - w[0]))
        c["ranks"].add(rank)
        c["first"], c["last"] = min(c["first"], w[0]), max(c["last"], w[1])
    else:
        c = {"first0": w[0], "first": w[0], "last": w[1], "ranks": {rank}, "files": {}}
        clusters.append(c)
    if file is not None:
        c["files"][rank] = file


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
    from ddpdoctor.metrics.arrivals import arrivals  # it reads this module's _time_of

    clean = _clean_steps(series, captures)
    return {
        "step_time": _drift(series, clean),
        "memory": _memory(series, clean),
        "arrivals": arrivals(series, captures),  # metrics/arrivals.py
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
    summarized = summarized_windows(captures)  # windows --keep removed, from the summaries the ranks made of them
    if not series and len(windows) + len(summarized) < 2:
        return None
    per_window = None
    reason = None
    if len(windows) + len(summarized) >= MIN_WINDOWS:
        try:
            windows, per_window = _diagnose_windows(path, windows, rules, summarized)
        except Exception as exc:  # the run's own diagnosis stands; this section says why it has no windows
            reason = f"the windows could not be read one by one: {type(exc).__name__}: {exc}"
    return over_time(windows, per_window, series, captures, world_size=world_size, window_reason=reason)


def _diagnose_windows(
    path: Path,
    windows: Sequence[tuple[int, int]],
    rules: Sequence[Any],
    summarized: Sequence[tuple[int, int, Mapping[int, str]]] = (),
) -> tuple[list[tuple[int, int]], list[list[dict]]]:
    """The windows with steps in their traces (or in the summaries of the windows ``--keep`` removed), in step
    order, and each one's findings (a window none of whose steps could be analysed, or a removed one that a rank
    has no summary of, is left out, not counted as one without findings)."""
    from ddpdoctor.diagnosis import evaluate
    from ddpdoctor.load import load
    from ddpdoctor.metrics.analysis import analyze

    run = load(path, use_summaries=False, summarize=False)  # every kept window's events, decoded once
    done: list[tuple[tuple[int, int], list[dict]]] = []
    for lo, hi in windows:
        metrics = analyze(run, steps=(lo, hi))
        if metrics.run.get("steps_analyzed"):
            done.append(((lo, hi), [f.to_json() for f in evaluate(rules, metrics).findings]))
    for lo, hi, files in summarized:
        window = _summarized_window(path, run, files)
        if window is None:
            continue
        metrics = analyze(window)
        if metrics.run.get("steps_analyzed"):
            done.append(((lo, hi), [f.to_json() for f in evaluate(rules, metrics).findings]))
    done.sort(key=lambda d: d[0])
    return [w for w, _ in done], [found for _, found in done]


def _summarized_window(path: Path, run: Any, files: Mapping[int, str]) -> Any:
    """The Run of a removed window from its ranks' summaries; None unless every rank of ``run`` has one this
    version of ddpdoctor wrote (a window seen by some ranks only says nothing of the others)."""
    from ddpdoctor import rundir, runfiles
    from ddpdoctor._version import __version__
    from ddpdoctor.load.loader import window_from_summaries

    summaries = {}
    for rank in {rt.rank for rt in run.ranks} | set(run.capture):
        name = files.get(rank)
        if name is None or "/" in name or not rundir.WINDOW_SUMMARY_RE.match(name):
            return None
        data, _ = runfiles.read_summary_again(str(path / rundir.RANKS_DIR / name))
        if data is None or data.get("ddpdoctor_version") != __version__ or data.get("rank") != rank:
            return None
        summaries[rank] = data
    return window_from_summaries(run, summaries)
