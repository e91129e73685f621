"""``analyze(run) -> RunMetrics``: per-rank summaries (from traces, or the capture's summary files), then the
cross-rank and run-level metrics."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

import numpy as np

from ddpdoctor.load.model import Run
from ddpdoctor.metrics import catalog
from ddpdoctor.metrics.capture import ddp_noop_hook, ddp_timers
from ddpdoctor.metrics.compile import compile_note
from ddpdoctor.metrics.cross_rank import Windows, all_collectives, analysed_step_ranges, cross_rank, unmatched_ranks
from ddpdoctor.metrics.evidence import run_evidence
from ddpdoctor.metrics.fsdp import run_units
from ddpdoctor.metrics.health import health_metrics
from ddpdoctor.metrics.hostload import hostload_metrics
from ddpdoctor.metrics.profiled_steps import cut_short_note
from ddpdoctor.metrics.result import RANK_METRICS, LazyTable, RunMetrics
from ddpdoctor.metrics.setup import NO_STEP_NOTE, SETUP_RANK_METRICS, setup_metrics
from ddpdoctor.metrics.slow_ranks import slow_by_own_work
from ddpdoctor.metrics.timeline import LazyTimeline
from ddpdoctor.metrics.transfer import transfer_bandwidth, transfer_metrics, transfer_times
from ddpdoctor.table import Table, column

# a rank's row starts as every rank metric, None (``rank`` first): a summary's metrics are copied into it
_ROW_TEMPLATE: dict[str, Any] = dict.fromkeys(("rank", *RANK_METRICS))
_ROW_KEYS = frozenset(_ROW_TEMPLATE)


def analyze(run: Run, steps: tuple[int, int | None] | None = None, verdict: Any = None) -> RunMetrics:
    """All metrics of a loaded run. Pure: no I/O, no printing.

    ``verdict``: ``ddpdoctor.flight.HealthVerdict`` of the ranks' dumps, when they dumped (the health metrics
    come from it, the manifest and the rank files: ``ddpdoctor.metrics.health``).

    ``steps``: analyse only ProfilerStep#N..M (inclusive; M None = to the end). Needs the traces, or summaries
    the loader computed from them over the same steps (``load(summarize=True, steps=...)``), not the ranks'
    summary files.
    """
    summaries = []
    for rt in run.ranks:
        if rt.summary is not None and not rt.has_trace:
            if steps is not None and (rt.facts is None or rt.facts.steps != steps):
                raise ValueError("a step range needs the traces; load the run without use_summaries")
            summaries.append(rt.summary)
        else:
            from ddpdoctor.metrics.summary import summarize_rank  # the trace metrics: only for ranks with traces

            summaries.append(summarize_rank(rt, run.capture.get(rt.rank), steps))
    colls = all_collectives(summaries)
    windows = Windows(summaries)  # every rank's analysed steps, for the three below
    waits, straggler = cross_rank(summaries, colls, windows)
    transfer_us = transfer_times(summaries, colls)
    transfer = transfer_metrics(summaries, colls, transfer_us, windows)
    hosts = Counter(c.get("hostname") for c in run.capture.values() if c.get("hostname"))
    node_cpus = _node_cpus(run.capture)
    setup_ranks, setup_run = setup_metrics(run.capture)  # the set-up checklist: from the capture, not traces
    ranks = []
    no_transfer, no_setup, no_waits = dict.fromkeys(catalog.group("transfer")), dict.fromkeys(SETUP_RANK_METRICS), {}
    for s in summaries:
        rank = s["rank"]
        capture = run.capture.get(rank)
        metrics = s["metrics"]
        if metrics.keys() <= _ROW_KEYS:  # the usual summary: the row's template, then its values (same order)
            m = _ROW_TEMPLATE.copy()
            m.update(metrics)
            m["rank"] = rank
        else:
            m = {"rank": rank, **dict(zip(RANK_METRICS, map(metrics.get, RANK_METRICS), strict=True))}
        m.update(waits.get(rank, no_waits))
        m.update(transfer.get(rank) or no_transfer)
        host = (capture or {}).get("hostname")
        m["local_world_size"] = hosts.get(host) if host else None
        if host in node_cpus:  # the CPUs of all the job's ranks on its host, not its own alone
            m["cpu_count"] = node_cpus[host]
        m.update(setup_ranks.get(rank) or no_setup)
        m.update(ddp_timers(capture))
        m["ddp_noop_hook"] = ddp_noop_hook(capture)
        ranks.append(m)
    health, health_doc = health_metrics(run.manifest or {}, run.capture, verdict)
    why_no_count = _why_no_collective_count(run.capture, health, setup_run.get("steps_detected"))
    if why_no_count:  # the window cannot show whether the ranks synchronise: no count, not a count of 0
        for m in ranks:
            m.update(dict.fromkeys(_COLLECTIVE_COUNTS))
    per_step = LazyTable(lambda: _per_step_frame(summaries))  # made when a report or compare reads it
    devices = Table.from_records(
        [{"rank": s["rank"], **d} for s in summaries for d in s["devices"]],
        ["rank", "device", *catalog.group("device_memory")],
    )
    run_metrics = _run_level(run, ranks, devices, summaries)
    undecidable = straggler.pop("slow_rank_undecidable", None)
    run_metrics.update(straggler)
    unmatched = None  # every rank has its waits: every rank matched (the usual case, read at no cost)
    if len(summaries) >= 2:
        unmatched = [] if len(waits) == len(summaries) else unmatched_ranks(colls, summaries, windows)
    run_metrics.update(run_evidence(run_metrics, ranks, devices, summaries, undecidable, unmatched))
    why_setup = setup_run.pop("not_measured", {})
    setup_notes = setup_run.pop("notes", [])
    if health.get("startup_failed"):  # no step because the job failed first: no advice to mark steps
        setup_notes = [n for n in setup_notes if n != NO_STEP_NOTE]
    if setup_notes:  # (the pipeline adds the loader's notes only where analyze gave none)
        run_metrics["notes"] = [*run.notes, *setup_notes]
    run_metrics.update(setup_run)
    run_metrics["optimizer_steps_per_step"] = run.optimizer_steps_per_step
    compiled = compile_note(ranks)  # torch.compile's facts: regions, graphs per call, recompiles (metrics/compile.py)
    if compiled:
        run_metrics["notes"] = [*run_metrics.get("notes", run.notes), compiled]
    if unmatched:  # ranks profiled at other steps than the rest: nothing across ranks is measured for them
        run_metrics["notes"] = [*run_metrics.get("notes", run.notes), _unmatched_note(unmatched, windows)]
    cut = cut_short_note(run.capture, summaries)  # no complete step: the run ended in the window's first
    if cut:
        run_metrics["notes"] = [*run_metrics.get("notes", run.notes), cut]
    work = {s["rank"]: s.get("op_work") for s in summaries}  # the same ops as the others? (metrics/same_work.py)
    host_run, why_host = hostload_metrics(run.capture, ranks, work)  # after the waits: it weighs them (hostload.py)
    run_metrics.update(host_run)
    run_metrics["not_measured"] = {**run_metrics.get("not_measured", {}), **why_setup, **why_host}
    # after the ops are compared (extra_ops_ms): metrics/slow_ranks.py
    slow_by_own_work(ranks, run_metrics, lambda rank: _outside_by_step(summaries, rank))
    units = run_units(summaries)  # FSDP2: the per-unit table, shown by the reports (not a metric)
    if units:
        run_metrics["fsdp_units"] = units
    run_metrics.update(health)
    if health_doc is not None:
        run_metrics["health"] = health_doc
    if any("exposed_comm" not in s for s in summaries) and any(r.get("comm_ms") for r in ranks):
        why = (
            "the ranks' summary files predate the exposed-transfer measurement"
            " (`diagnose --steps 0..` reads the traces)"
        )
        run_metrics["not_measured"] = {
            **run_metrics.get("not_measured", {}),
            "exposed_transfer_ms": why,
            "ddp_exposed_transfer_ms": why,  # DDP's share of it
        }
    if why_no_count:
        said = run_metrics.get("not_measured", {})
        run_metrics["not_measured"] = {**said, **{k: why_no_count for k in _COLLECTIVE_COUNTS if k not in said}}
    why_loop = _why_no_loop_transfer(ranks, run_metrics.get("not_measured", {}))
    if why_loop:
        run_metrics["not_measured"] = {**run_metrics.get("not_measured", {}), "loop_exposed_transfer_ms": why_loop}
    return RunMetrics(
        run=run_metrics,
        ranks=ranks,
        per_step=per_step,
        collectives=transfer_bandwidth(summaries, colls, transfer_us, windows),
        devices=devices,
        timeline=LazyTimeline(summaries, colls),
        step_times=LazyTable(lambda: _step_times(run)),
    )


# The per-step collective counts (metrics/parallelism.py): what says whether and how the ranks synchronise.
_COLLECTIVE_COUNTS = tuple(k for k in catalog.group("parallelism") if k.endswith("_per_step"))


def _why_no_collective_count(captures: Any, health: dict[str, Any], steps_detected: bool | None) -> str | None:
    """Why the recorded window cannot show how often the ranks synchronise (so no count is given, not 0): a job that
    failed before its first step recorded its start-up only; where no training step was detected, the window is the
    run's start, which holds its training only if it lasted to the end of the run."""
    if health.get("startup_failed"):
        return (
            "the job failed before its first step: its trace holds the start-up, not training, so it cannot show"
            " whether the ranks synchronise"
        )
    if steps_detected is not False:
        return None
    ends = {
        (c.get("fallback_window") or {}).get("ended_by") if isinstance(c.get("fallback_window"), dict) else None
        for c in captures.values()
        if isinstance(c, dict)
    }
    if ends and ends <= {"end of run"}:
        return None  # the recording holds the whole run
    return (
        "no training step was detected, and the recording of the run's start (--no-step-limit) ended before the"
        " run did, so it may hold no training and cannot show whether the ranks synchronise; call"
        " ddpdoctor.step() at the end of every training step and trace again"
    )


def _unmatched_note(unmatched: list[int], windows: Windows) -> str:
    """What the report says of ranks whose collectives matched no other rank's (``cross_rank.unmatched_ranks``)."""
    from ddpdoctor.diagnosis.findings import format_ranks

    analysed = sorted({int(r) for r in windows.rank.tolist()})  # every rank with analysed steps
    return (
        f"{format_ranks(unmatched)}: no collective of their analysed steps was recorded by another rank in the"
        f" same step (analysed: {analysed_step_ranges(windows, analysed)}): the ranks were profiled at different"
        " steps, so the time they wait for each other, which rank is late, and transfer apart from waiting are"
        " not measured for them; profile the same steps on every rank (one schedule, stepped once an iteration)"
    )


def _why_no_loop_transfer(ranks: list[dict[str, Any]], said: dict[str, str]) -> str | None:
    """Why no rank has ``loop_exposed_transfer_ms`` (None where one has it, or the run has no collective: the
    catalog says that)."""
    if any(r.get("loop_exposed_transfer_ms") is not None for r in ranks):
        return None
    if any(r.get("exposed_transfer_ms") is not None for r in ranks):
        return (
            "which code issued each collective cannot be told: no rank's gradient all-reduce was seen issued in the"
            " backward pass (no DistributedDataParallel.forward range in the trace, gradients all-reduced by hand"
            " after backward, or summary files from an older ddpdoctor: `diagnose --steps 0..` reads the traces)"
        )
    if said.get("exposed_transfer_ms"):
        return str(said["exposed_transfer_ms"])
    if any(r.get("comm_ms") for r in ranks):
        return (
            "no collective was matched with all of its peers in the data, so its transfer cannot be told from"
            " waiting for them"
        )
    return None


def _step_times(run: Run) -> Table:
    """Every step's wall time per rank, from the capture files (``metrics.capture.step_rows``)."""
    from ddpdoctor.metrics.capture import step_rows

    rows = [
        {k: row.get(k) for k in ("rank", "step", "step_ms", "profiled")}
        for rank, capture in sorted(run.capture.items())
        for row in step_rows(rank, capture)
    ]
    return Table.from_records(rows, ["rank", "step", "step_ms", "profiled"])


def _outside_by_step(summaries: list[dict[str, Any]], rank: int) -> dict[int, float]:
    """The rank's time outside forward, backward and the optimizer (``other_ms``) in each analysed step."""
    for s in summaries:
        if s["rank"] == rank:
            table = s.get("per_step") or {}
            steps, other = table.get("step") or [], table.get("other_ms") or []
            analysed = table.get("analyzed") or [True] * len(steps)
            return {
                int(t): float(v)
                for t, v, a in zip(steps, other, analysed, strict=False)
                if a and v is not None and v == v
            }
    return {}


def _per_step_frame(summaries: list[dict[str, Any]]) -> Table:
    """The ``per_step`` rows of every rank, ``rank`` first: each column is every rank's list joined (None where
    a rank lacks the column) and made one array, as a DataFrame would make it."""
    if not summaries:
        return Table()
    columns: list[str] = []
    seen: set[str] = set()
    for s in summaries:
        for c in s["per_step"]:
            if c not in seen:
                seen.add(c)
                columns.append(c)
    tables = [s["per_step"] for s in summaries]
    lengths = [len(next(iter(t.values()))) if t else 0 for t in tables]
    joined: dict[str, list[Any]] = {
        "rank": list(chain.from_iterable(map(repeat, (s["rank"] for s in summaries), lengths)))
    }
    every = set(columns)
    if all(t.keys() == every for t in tables):  # the usual case: every rank has every column
        joined.update((c, list(chain.from_iterable(map(itemgetter(c), tables)))) for c in columns if c != "rank")
    else:
        joined.update(
            (c, list(chain.from_iterable(t.get(c) or [None] * n for t, n in zip(tables, lengths, strict=True))))
            for c in columns
            if c != "rank"
        )
    per_step = Table({c: column(v) for c, v in joined.items()})
    if len(per_step) and "overlap_ratio" not in per_step and {"comm_ms", "exposed_comm_ms"} <= set(per_step.columns):
        # each step's share of communication hidden behind computation (0-1; None without communication)
        comm = np.asarray(per_step["comm_ms"], dtype=np.float64)
        exposed = np.asarray(per_step["exposed_comm_ms"], dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            hidden = 1.0 - exposed / np.where(comm > 0, comm, np.nan)
        per_step["overlap_ratio"] = np.clip(hidden, 0.0, 1.0)
    return per_step


_MAX_CPU = 1 << 16  # CPU numbers above this are no CPU set a host has


def _node_cpus(captures: Mapping[int, Mapping[str, Any]]) -> dict[Any, int]:
    """host -> how many CPUs the job's ranks on it may run on between them (the union of their affinities), for the
    hosts where every rank recorded its CPUs: ranks pinned each to its own CPUs (an HPC launcher's binding, a
    script's ``os.sched_setaffinity``) have their sum, ranks that share every CPU their count. The rank-level
    ``cpu_count`` (its own affinity) compared with all the host's ranks' threads would call the pinned ones
    oversubscribed."""
    seen: dict[Any, set[tuple[tuple[int, int], ...]] | None] = {}  # host -> its ranks' distinct CPU ranges
    for capture in captures.values():
        host = (capture or {}).get("hostname")
        if not host or (host in seen and seen[host] is None):
            continue
        ranges = ((capture or {}).get("threads") or {}).get("affinity")
        key: tuple[tuple[int, int], ...] = ()
        if isinstance(ranges, list):
            try:
                key = tuple((int(first), int(last)) for first, last in ranges)
            except (TypeError, ValueError):
                key = ()
        if not key or any(not 0 <= a <= b < _MAX_CPU for a, b in key):
            seen[host] = None  # a rank without its CPUs: the host's union is unknown
        else:
            seen.setdefault(host, set()).add(key)
    out = {}
    for host, keys in seen.items():
        if keys:
            out[host] = len({c for key in keys for a, b in key for c in range(a, b + 1)})
    return out


def _run_level(
    run: Run, ranks: list[dict[str, Any]], devices: Table, summaries: list[dict[str, Any]]
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
    per_device: dict[str, float] = {}
    capacity = None
    if len(devices):
        names = [str(d) for d in devices["device"].tolist()]
        reserved = np.asarray(devices["peak_reserved_bytes"], dtype=np.float64)
        used = np.where(np.isnan(reserved), np.asarray(devices["peak_allocated_bytes"], dtype=np.float64), reserved)
        per_device = _sum_by_name(names, used)
        caps = np.asarray(devices["capacity_bytes"], dtype=np.float64)
        capacity = next((c for name, c in zip(names, caps.tolist(), strict=True) if name == "cuda:0" and c == c), None)
    gpu0 = per_device.get("cuda:0")
    others = [v for d, v in per_device.items() if d.startswith("cuda:") and d != "cuda:0" and v == v]
    out["gpu0_peak_reserved_bytes"] = int(gpu0) if gpu0 is not None and not np.isnan(gpu0) else None
    out["gpu0_capacity_bytes"] = int(capacity) if capacity is not None else None
    out["gpu0_headroom_ratio"] = (
        1.0 - out["gpu0_peak_reserved_bytes"] / out["gpu0_capacity_bytes"]
        if out["gpu0_peak_reserved_bytes"] is not None and out["gpu0_capacity_bytes"]
        else None
    )
    out["others_max_peak_reserved_bytes"] = int(max(others)) if others else None
    out["gpu0_vs_others_ratio"] = (
        out["gpu0_peak_reserved_bytes"] / out["others_max_peak_reserved_bytes"]
        if out["gpu0_peak_reserved_bytes"] and out["others_max_peak_reserved_bytes"]
        else None
    )
    out["straggler_rank"] = None
    out["straggler_wait_ms"] = None
    out["straggler_late_share"] = None
    return out


def _sum_by_name(names: list[str], values: np.ndarray) -> dict[str, float]:
    """Per device name: the sum of its values as pandas' group sum makes it (NaN skipped; NaN when all are)."""
    from ddpdoctor.metrics.group_sums import pandas_group_sum

    uniq = sorted(set(names))
    index = {n: i for i, n in enumerate(uniq)}
    ids = np.array([index[n] for n in names], dtype=np.int64)
    sums = pandas_group_sum(values, ids, len(uniq))
    seen = np.bincount(ids[~np.isnan(values)], minlength=len(uniq))
    return {n: (float(sums[i]) if seen[i] else float("nan")) for n, i in index.items()}
