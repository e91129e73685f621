"""The GPU checks' judgement: ddpdoctor's numbers against the workload's own measurements. Pure functions of
already-read data (the ``diagnose --format json`` document, ``ranks/rank<R>.summary.json``, the workload's
``rank<R>.json``, counts from the trace files); no I/O, no torch, so every comparison and threshold is
unit-tested on CPU with recorded inputs (``tests/gpu/test_evaluate.py``).

Every check returns a list of *items*, one per comparison::

    {"what": "...", "status": "pass" | "fail" | "n/a", "ddpdoctor": <number or text>,
     "independent": <number or text>, "expect": "<the threshold, in words>", "note": "..."}

``n/a`` is for what one GPU cannot show (a second device, DataParallel's replicas); it never hides a failure.
A check passes when none of its items fails.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PASS, FAIL, NA = "pass", "fail", "n/a"

# Tolerances, in one place. Why each is what it is:
# - memory peaks are the same allocator counters read at the last step boundary vs at the end of the script,
#   with no allocation in between: equal up to 1 %.
MEMORY_REL_TOL = 0.01
# - GPU-busy time vs CUDA events around the step's work: the events also span the gaps between kernels
#   (launch latency after the per-step loss.item()), and CUPTI's timestamps are not the events' clock.
BUSY_VS_EVENTS = (0.90, 1.05)
# - kernel time alone: the step also copies its batch (memcpy), so it can be a little below the events.
KERNEL_VS_EVENTS = (0.80, 1.05)
# - each step alone (the workload makes steps differ by up to 70 %): a step matched to the wrong
#   ProfilerStep falls outside this.
STEP_VS_EVENTS = (0.85, 1.10)
# - host sync: ddpdoctor counts the blocking CUDA runtime calls inside .item(); the workload times the whole
#   .item() call (Python, dispatcher, the copy), so ddpdoctor's share is lower, but most of it.
HOST_SYNC_VS_ITEM = (0.30, 1.10)
# - capture overhead outside the profiled window (the CPU benchmark's target, benchmarks/capture_overhead.py).
MAX_OUTSIDE_WINDOW_RATIO = 1.02
# The rules' own thresholds (gpu0-oom-risk's min_headroom, host-sync-stalls' min_ms) are not copied here: the
# checks pass them in, read from rules/*.toml (gpu_checks.rule_param).
HEADROOM_ABS_TOL = 0.01


# ---------------------------------------------------------------------------------------------- items
def item(
    what: str,
    ok: bool | None,
    *,
    ddpdoctor: Any = None,
    independent: Any = None,
    expect: str = "",
    note: str | None = None,
) -> dict[str, Any]:
    """One comparison; ``ok=None`` means not applicable here (``n/a``)."""
    out: dict[str, Any] = {
        "what": what,
        "status": NA if ok is None else PASS if ok else FAIL,
        "ddpdoctor": _round(ddpdoctor),
        "independent": _round(independent),
        "expect": expect,
    }
    if note:
        out["note"] = note
    return out


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [_round(v) for v in value]
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def ratio_item(what: str, ddpdoctor: Any, independent: Any, bounds: tuple[float, float], note: str | None = None):
    """Pass when ``lo <= ddpdoctor / independent <= hi``; fail when either is missing or the independent is 0."""
    d, i = _number(ddpdoctor), _number(independent)
    ratio = d / i if d is not None and i else None
    lo, hi = bounds
    out = item(
        what,
        ratio is not None and lo <= ratio <= hi,
        ddpdoctor=d,
        independent=i,
        expect=f"ddpdoctor / independent in [{lo}, {hi}]",
        note=note,
    )
    out["ratio"] = _round(ratio)
    return out


def close_item(what: str, ddpdoctor: Any, independent: Any, rel_tol: float, note: str | None = None):
    d, i = _number(ddpdoctor), _number(independent)
    ok = d is not None and i is not None and abs(d - i) <= rel_tol * max(abs(i), 1.0)
    return item(what, ok, ddpdoctor=d, independent=i, expect=f"equal within {100 * rel_tol:g} %", note=note)


def status_of(items: Iterable[Mapping[str, Any]]) -> str:
    """``fail`` when any item failed, else ``pass`` (n/a items are listed, never failing)."""
    items = list(items)
    if not items:
        return FAIL  # a check that compared nothing has shown nothing
    return FAIL if any(i["status"] == FAIL for i in items) else PASS


# ------------------------------------------------------------------------------------ ddpdoctor's outputs
def rule_state(doc: Mapping[str, Any], name: str) -> str:
    """``fired``, ``passed``, ``not evaluated: <reason>`` or ``absent`` for rule ``name`` in a diagnose document."""
    if any(f.get("name") == name for f in doc.get("findings") or []):
        return "fired"
    if name in (doc.get("passed") or []):
        return "passed"
    for entry in doc.get("not_evaluated") or []:
        if entry.get("name") == name:
            return f"not evaluated: {entry.get('reason')}"
    return "absent"


def finding(doc: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    return next((f for f in doc.get("findings") or [] if f.get("name") == name), None)


def evidence_values(found: Mapping[str, Any] | None, metric: str) -> list[float]:
    """The evidence numbers of a finding for ``metric``: under ``x``, ``max(x)``, ``mean(x)``..., one number
    (run-scope rules) or one per rank (``{"0": 2, "1": 2}``, rank-scope rules)."""
    for key, value in ((found or {}).get("evidence") or {}).items():
        if key == metric or key.endswith(f"({metric})"):
            values = value.values() if isinstance(value, Mapping) else [value]
            return [v for v in (_number(x) for x in values) if v is not None]
    return []


def device_row(doc: Mapping[str, Any], rank: int, device: str) -> dict[str, Any] | None:
    """The ``devices`` entry of ``rank`` for ``device`` (e.g. ``cuda:0``) in a diagnose document."""
    for r in doc.get("ranks") or []:
        if r.get("rank") == rank:
            return next((d for d in r.get("devices") or [] if d.get("device") == device), None)
    return None


def analysed_steps(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The analysed rows of a per-rank summary's ``per_step`` columns, one dict per step."""
    cols = summary.get("per_step") or {}
    n = len(cols.get("step") or [])
    rows = [{k: v[i] for k, v in cols.items()} for i in range(n)]
    return [r for r in rows if r.get("analyzed")]


def column_sum(rows: Sequence[Mapping[str, Any]], column: str) -> float | None:
    values = [_number(r.get(column)) for r in rows]
    values = [v for v in values if v is not None]
    return sum(values) if values else None


def collective_bytes_per_step(summary: Mapping[str, Any], kind: str = "all_reduce") -> float | None:
    """Bytes of ``kind`` collectives per analysed step, from a per-rank summary (None without steps)."""
    steps = {r["step"] for r in analysed_steps(summary)}
    if not steps:
        return None
    cols = summary.get("collectives") or {}
    total = sum(
        float(b or 0)
        for s, k, b in zip(cols.get("step") or [], cols.get("kind") or [], cols.get("bytes") or [], strict=False)
        if k == kind and s in steps
    )
    return total / len(steps)


def count_trace_events(events: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What a Kineto trace holds, counted straight from its events (no ddpdoctor code): device kernels,
    copies, NCCL kernels and DataParallel's ranges by name."""
    counts: dict[str, Any] = {"kernel": 0, "gpu_memcpy": 0, "gpu_memset": 0, "nccl_kernel": 0, "ranges": {}}
    for ev in events:
        cat = str(ev.get("cat", "")).lower()
        name = str(ev.get("name", ""))
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            counts[cat] += 1
            if cat == "kernel" and "nccl" in name.lower():
                counts["nccl_kernel"] += 1
        elif cat == "memcpy":  # torch 1.9's category names
            counts["gpu_memcpy"] += 1
        elif name.startswith("DataParallel.") and ev.get("ph") == "X" and cat != "gpu_user_annotation":
            counts["ranges"][name] = counts["ranges"].get(name, 0) + 1
    return counts


def outside_window(wall_ms: Sequence[float], wait: int, warmup: int, active: int) -> list[float]:
    """Step times (ms) of the loop's steps that the profiler neither records nor exports in: step ``i`` is
    ddpdoctor's iteration ``i``; iterations ``1+wait+warmup`` .. ``+active-1`` are recorded, the warm-up before
    them and one step after are disturbed, and steps 0-1 are start-up (as in benchmarks/capture_overhead.py)."""
    first = 1 + wait + warmup
    window = range(first - warmup, first + active + 1)
    return [float(ms) for i, ms in enumerate(wall_ms) if i >= 2 and i not in window]


# ------------------------------------------------------------------------------------------------ checks
def evaluate_single(
    doc: Mapping[str, Any],
    summary: Mapping[str, Any],
    measure: Mapping[str, Any],
    trace_counts: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """Check 1: one-process CUDA training. Trace contents, kernel time per step against CUDA events, memory
    peaks against the allocator's, and the devices touched."""
    items = [
        item(
            "kernels in the trace",
            trace_counts.get("kernel", 0) > 0,
            independent=trace_counts.get("kernel"),
            expect="> 0 kernel events",
        ),
        item(
            "memcpy in the trace",
            trace_counts.get("gpu_memcpy", 0) > 0,
            independent=trace_counts.get("gpu_memcpy"),
            expect="> 0 gpu_memcpy events",
        ),
    ]
    rows = analysed_steps(summary)
    events = measure.get("event_ms") or []
    pairs = [(r, events[r["step"]]) for r in rows if isinstance(r.get("step"), int) and r["step"] < len(events)]
    items.append(
        item(
            "analysed steps matched to the workload's steps",
            len(pairs) >= 3,
            ddpdoctor=len(rows),
            independent=len(pairs),
            expect=">= 3 steps",
        )
    )
    if pairs:
        ev_total = sum(e for _, e in pairs)
        items.append(
            ratio_item(
                "GPU busy time per step vs CUDA events",
                column_sum([r for r, _ in pairs], "gpu_busy_ms"),
                ev_total,
                BUSY_VS_EVENTS,
                note="sums over the matched steps, ms",
            )
        )
        items.append(
            ratio_item(
                "kernel time per step vs CUDA events",
                column_sum([r for r, _ in pairs], "kernel_ms"),
                ev_total,
                KERNEL_VS_EVENTS,
                note="sums over the matched steps, ms",
            )
        )
        ratios = [(_number(r.get("gpu_busy_ms")) or 0.0) / e for r, e in pairs if e > 0]
        worst = max(ratios, key=lambda x: abs(x - 1.0)) if ratios else None
        lo, hi = STEP_VS_EVENTS
        items.append(
            item(
                "each step's GPU busy time vs its own CUDA events",
                worst is not None and lo <= worst <= hi,
                ddpdoctor=worst,
                independent=[round(e, 3) for _, e in pairs],
                expect=f"worst per-step ratio in [{lo}, {hi}]",
                note="the workload's steps differ (--vary): a step matched to the wrong ProfilerStep shows here",
            )
        )
    row = device_row(doc, 0, "cuda:0") or {}
    items.append(
        close_item(
            "peak allocated on cuda:0",
            row.get("peak_allocated_bytes"),
            measure.get("max_memory_allocated"),
            MEMORY_REL_TOL,
            note="independent: torch.cuda.max_memory_allocated()",
        )
    )
    items.append(
        close_item(
            "peak reserved on cuda:0",
            row.get("peak_reserved_bytes"),
            measure.get("max_memory_reserved"),
            MEMORY_REL_TOL,
            note="independent: torch.cuda.max_memory_reserved()",
        )
    )
    total = (measure.get("total_memory") or [None])[0]
    items.append(close_item("capacity of cuda:0", row.get("capacity_bytes"), total, 0.001))
    recorded = sorted(d.get("device") for r in doc.get("ranks") or [] for d in r.get("devices") or [])
    touched = [f"cuda:{i}" for i in measure.get("initialized_devices") or []]
    items.append(
        item(
            "devices with memory recorded",
            recorded == touched,
            ddpdoctor=recorded,
            independent=touched,
            expect="the devices the workload allocated on",
        )
    )
    count = int(measure.get("device_count") or 0)
    contexts = measure.get("nvml_context_devices")
    if count <= 1:
        items.append(
            item(
                "no CUDA context on another device",
                None,
                independent=f"{count} GPU(s)",
                note="one GPU: there is no other device to stay off",
            )
        )
    elif contexts is None:
        items.append(
            item(
                "no CUDA context on another device",
                None,
                independent="NVML lists no processes here",
                note="NVML cannot list this process's contexts on this machine",
            )
        )
    else:
        items.append(
            item(
                "no CUDA context on another device",
                contexts == [0],
                independent=contexts,
                expect="NVML lists the process on GPU 0 only",
            )
        )
    return items


def evaluate_ddp_nccl(
    doc: Mapping[str, Any],
    summary: Mapping[str, Any],
    measure: Mapping[str, Any],
    trace_counts: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """Check 2a: DDP with NCCL, one rank that calls set_device. Collective bytes against the model's gradient
    bytes, NCCL kernels and overlap, and ranks-share-cuda0 silent."""
    run = doc.get("run") or {}
    items = [
        item(
            "mode, backend, world size",
            (run.get("mode"), run.get("backend"), run.get("world_size")) == ("ddp", "nccl", 1),
            ddpdoctor=[run.get("mode"), run.get("backend"), run.get("world_size")],
            independent=["ddp", measure.get("backend"), measure.get("world_size")],
        ),
        close_item(
            "all-reduce bytes per step",
            collective_bytes_per_step(summary),
            measure.get("gradient_bytes_per_step"),
            0.01,
            note="independent: the bytes of every parameter's gradient",
        ),
    ]
    metrics = summary.get("metrics") or {}
    comm_ms, overlap = _number(metrics.get("comm_ms")), _number(metrics.get("overlap_ratio"))
    nccl = int(trace_counts.get("nccl_kernel") or 0)
    if nccl:
        items.append(
            item(
                "NCCL kernels: communication time on the device",
                comm_ms is not None and comm_ms > 0,
                ddpdoctor=comm_ms,
                independent=nccl,
                expect="comm_ms > 0 when the trace has NCCL kernels",
            )
        )
        items.append(
            item(
                "overlap on the device timeline",
                overlap is not None and 0.0 <= overlap <= 1.0,
                ddpdoctor=overlap,
                independent=nccl,
                expect="a ratio in [0, 1]",
            )
        )
    else:
        items.append(
            item(
                "NCCL kernels",
                None,
                ddpdoctor=comm_ms,
                independent=0,
                note="NCCL launched no kernel (one rank: an in-place all-reduce is a no-op); "
                "overlap cannot be measured without a second GPU",
            )
        )
    state = rule_state(doc, "ranks-share-cuda0")
    items.append(
        item(
            "ranks-share-cuda0 stays silent",
            state == "passed",
            ddpdoctor=state,
            independent=f"set_device called; current device {measure.get('current_device')}, model on "
            f"cuda:{measure.get('model_device_index')}",
            expect="passed (evaluated, not fired)",
        )
    )
    return items


def evaluate_ddp_shared(doc: Mapping[str, Any], measures: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Check 2b: DDP with gloo, two ranks that never call set_device, both on the one GPU: ranks-share-cuda0
    fires for both."""
    run = doc.get("run") or {}
    uuids = {m.get("model_device_uuid") for m in measures}
    shared = len(measures) if len(uuids) == 1 and len(measures) > 1 else 1
    items = [
        item(
            "world size and backend",
            (run.get("world_size"), run.get("backend")) == (2, "gloo"),
            ddpdoctor=[run.get("world_size"), run.get("backend")],
            independent=[len(measures), "gloo"],
        ),
        item(
            "both ranks compute on the same GPU (the workload's own view)",
            shared == 2,
            independent=sorted(uuids),
            expect="one GPU UUID for both ranks",
            note="a precondition of the check, not ddpdoctor's number",
        ),
    ]
    found = finding(doc, "ranks-share-cuda0")
    fired_ranks = sorted((found or {}).get("ranks") or [])
    expected_ranks = sorted(int(m.get("rank", 0)) for m in measures)
    items.append(
        item(
            "ranks-share-cuda0 fires for both ranks",
            fired_ranks == expected_ranks and found is not None,
            ddpdoctor=fired_ranks or rule_state(doc, "ranks-share-cuda0"),
            independent=expected_ranks,
        )
    )
    values = evidence_values(found, "gpu_shared_ranks")
    if values:
        items.append(
            item(
                "ranks sharing the GPU, in the finding",
                all(v == shared for v in values),
                ddpdoctor=values,
                independent=shared,
                expect="the number of ranks on the one GPU, for every rank",
            )
        )
    return items


def evaluate_oom(
    runs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]], min_headroom: float
) -> list[dict[str, Any]]:
    """Check 3: gpu0-oom-risk fires exactly for the runs whose own peak reserved memory leaves less than 10 %
    of the GPU. ``runs``: (diagnose document, workload record) per run; ``min_headroom``: the rule's (0-1)."""
    items = []
    for doc, measure in runs:
        label = f"reserve {measure.get('args', {}).get('reserve')}"
        total = _number((measure.get("total_memory") or [None])[0])
        reserved = _number(measure.get("max_memory_reserved"))
        headroom = 1 - reserved / total if total and reserved is not None else None
        row = device_row(doc, 0, "cuda:0") or {}
        items.append(
            close_item(
                f"{label}: peak reserved on cuda:0",
                row.get("peak_reserved_bytes"),
                reserved,
                MEMORY_REL_TOL,
                note="independent: torch.cuda.max_memory_reserved()",
            )
        )
        want = "fired" if headroom is not None and headroom < min_headroom else "passed"
        state = rule_state(doc, "gpu0-oom-risk")
        items.append(
            item(
                f"{label}: gpu0-oom-risk",
                state == want,
                ddpdoctor=state,
                independent=headroom,
                expect=f"{want} (independent: headroom 1 - max_memory_reserved/total_memory, fires "
                f"below {min_headroom})",
            )
        )
        if state == "fired":
            values = evidence_values(finding(doc, "gpu0-oom-risk"), "gpu0_headroom_ratio")
            value = values[0] if len(values) == 1 else None
            ok = value is not None and headroom is not None and abs(value - headroom) <= HEADROOM_ABS_TOL
            items.append(
                item(
                    f"{label}: headroom in the finding",
                    ok,
                    ddpdoctor=value,
                    independent=headroom,
                    expect=f"within {HEADROOM_ABS_TOL}",
                )
            )
    fractions = sorted(_number(m.get("args", {}).get("reserve")) or 0.0 for _, m in runs)
    items.append(
        item(
            "the runs straddle the threshold",
            len(runs) >= 2 and _straddles(runs, min_headroom),
            independent=fractions,
            expect=f"one run below {min_headroom} headroom, one above twice that",
            note="a precondition of the check: the workloads reserved what they were asked to",
        )
    )
    return items


def _straddles(runs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]], min_headroom: float) -> bool:
    headrooms = []
    for _, m in runs:
        total = _number((m.get("total_memory") or [None])[0])
        reserved = _number(m.get("max_memory_reserved"))
        if total and reserved is not None:
            headrooms.append(1 - reserved / total)
    return bool(headrooms) and min(headrooms) < min_headroom and max(headrooms) > 2 * min_headroom


def evaluate_host_sync(
    with_sync: tuple[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]],
    without: tuple[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]],
    min_ms: float,
) -> list[dict[str, Any]]:
    """Check 4: host-sync-stalls fires for the loop that calls .item() every few layers and not for the same
    loop without. Each run: (diagnose document, rank-0 summary, workload record); ``min_ms``: the rule's."""
    items = []
    doc, summary, measure = with_sync
    rows = analysed_steps(summary)
    item_ms = measure.get("item_ms") or []
    steps = [r["step"] for r in rows if isinstance(r.get("step"), int) and r["step"] < len(item_ms)]
    blocked = column_sum([r for r in rows if r.get("step") in steps], "host_sync_ms")
    timed = sum(item_ms[s] for s in steps) if steps else None
    items.append(
        ratio_item(
            "with .item(): host sync time vs the workload's time inside .item()",
            blocked,
            timed,
            HOST_SYNC_VS_ITEM,
            note=f"sums over {len(steps)} analysed steps, ms",
        )
    )
    state = rule_state(doc, "host-sync-stalls")
    metrics = summary.get("metrics") or {}
    items.append(
        item(
            "with .item(): host-sync-stalls fires",
            state == "fired",
            ddpdoctor=state,
            independent=f"{measure.get('item_calls_per_step')} .item() calls per step",
            note=f"gpu_util_ratio {metrics.get('gpu_util_ratio')}, host_sync_ms {metrics.get('host_sync_ms')}",
        )
    )
    doc, summary, measure = without
    metrics = summary.get("metrics") or {}
    host_sync = _number(metrics.get("host_sync_ms"))
    items.append(
        item(
            "without: host sync time per step",
            host_sync is not None and host_sync <= min_ms,
            ddpdoctor=host_sync,
            independent=f"{measure.get('item_calls_per_step')} .item() calls per step",
            expect=f"<= {min_ms} ms (the rule's min_ms)",
        )
    )
    state = rule_state(doc, "host-sync-stalls")
    items.append(
        item(
            "without: host-sync-stalls stays silent",
            state == "passed",
            ddpdoctor=state,
            expect="passed (evaluated, not fired)",
            note=f"gpu_util_ratio {metrics.get('gpu_util_ratio')}",
        )
    )
    return items


DP_STAGES_ONE_GPU_SKIPS = ("DataParallel.replicate", "DataParallel.parallel_apply", "DataParallel.gather")


def evaluate_dp(
    doc: Mapping[str, Any],
    summary: Mapping[str, Any],
    capture: Mapping[str, Any],
    measure: Mapping[str, Any],
    trace_counts: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """Check 5: DataParallel with device_ids=[0]. ddpdoctor records the module's devices, the scatter range is
    in the trace and measured; what one GPU cannot show (replicate, parallel_apply, gather: with one device
    DataParallel calls the module directly, so there are no replicas to count) is n/a, and
    use-ddp-instead-of-dp does not fire. ``capture``: ddpdoctor's ``ranks/rank0.json``."""
    run = doc.get("run") or {}
    metrics = summary.get("metrics") or {}
    ranges = trace_counts.get("ranges") or {}
    steps = len(analysed_steps(summary))
    device_ids = list(measure.get("device_ids") or [])
    recorded = [list(m.get("device_ids") or []) for m in capture.get("dp") or [] if isinstance(m, dict)]
    items = [
        item("mode", run.get("mode") == "dp", ddpdoctor=run.get("mode"), independent="nn.DataParallel"),
        item(
            "DataParallel's devices in the capture",
            recorded == [device_ids],
            ddpdoctor=recorded,
            independent=device_ids,
            expect="the module's device_ids, once",
        ),
        item(
            "DataParallel.scatter ranges in the trace",
            ranges.get("DataParallel.scatter", 0) >= steps > 0,
            ddpdoctor=steps,
            independent=ranges.get("DataParallel.scatter", 0),
            expect="at least one range (counted in the trace) per step ddpdoctor analysed",
        ),
        item(
            "scatter time per step",
            (_number(metrics.get("dp_scatter_ms")) or 0) > 0,
            ddpdoctor=metrics.get("dp_scatter_ms"),
            expect="> 0 ms",
        ),
    ]
    replicas = _number(metrics.get("dp_replicas"))
    if any(r.startswith("DataParallel.replica[") for r in ranges):
        items.append(
            item(
                "replicas",
                replicas == len(device_ids),
                ddpdoctor=replicas,
                independent=device_ids,
                expect="len(DataParallel.device_ids)",
            )
        )
    else:
        items.append(
            item(
                "replicas",
                None if replicas is None else False,
                ddpdoctor=replicas,
                independent=device_ids,
                expect="none counted without replica ranges",
                note="one GPU cannot show it: no replica runs in a thread of its own",
            )
        )
    for stage in DP_STAGES_ONE_GPU_SKIPS:
        metric = "dp_" + stage.split(".")[1] + "_ms"
        if ranges.get(stage):
            items.append(
                item(
                    f"{stage} time",
                    (_number(metrics.get(metric)) or 0) > 0,
                    ddpdoctor=metrics.get(metric),
                    independent=ranges[stage],
                    expect="> 0 ms",
                )
            )
        else:
            items.append(
                item(
                    stage,
                    None,
                    ddpdoctor=metrics.get(metric),
                    independent=0,
                    note="one GPU cannot show it: with one device DataParallel calls the module directly",
                )
            )
    state = rule_state(doc, "use-ddp-instead-of-dp")
    items.append(
        item(
            "use-ddp-instead-of-dp does not fire for one device",
            state != "fired" and state != "absent",
            ddpdoctor=state,
            independent=device_ids,
            expect="passed or not evaluated (the rule is about several GPUs)",
        )
    )
    return items


def evaluate_overhead(
    bare: Sequence[Sequence[float]],
    traced: Sequence[Sequence[float]],
    schedule: tuple[int, int, int],
) -> list[dict[str, Any]]:
    """Check 6: median step time outside the profiled window, traced vs bare (the workload's own clock), the
    median over interleaved rounds of each. ``schedule``: ddpdoctor's (wait, warmup, active)."""
    wait, warmup, active = schedule
    bare_ms = [statistics.median(o) for o in (outside_window(w, wait, warmup, active) for w in bare) if o]
    traced_ms = [statistics.median(o) for o in (outside_window(w, wait, warmup, active) for w in traced) if o]
    b = statistics.median(bare_ms) if bare_ms else None
    t = statistics.median(traced_ms) if traced_ms else None
    out = ratio_item(
        "steps outside the profiled window, traced vs bare",
        t,
        b,
        (0.0, MAX_OUTSIDE_WINDOW_RATIO),
        note=f"median ms per step over {len(bare_ms)} bare and {len(traced_ms)} traced runs "
        f"(per run: {[round(x, 3) for x in bare_ms]} bare, {[round(x, 3) for x in traced_ms]} traced); "
        "target from benchmarks/capture_overhead.py",
    )
    return [out]
