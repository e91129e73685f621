"""The dashboard's data for one run: ``build_report(run_dir) -> dict`` (strict JSON: no NaN).

It is the ``ddpdoctor diagnose RUN --format json`` document (``schema_version, run, ranks, findings,
not_evaluated, passed``) of the same pipeline (``ddpdoctor.pipeline.analyze_run``, so the same findings), with
the tables the charts draw added:

- ``source``: ``"trace"`` (the run's metrics) or ``"capture"`` (the traces could not be read: only the step
  times the ranks recorded); ``notes``: why, in words.
- ``rank_metrics`` / ``run_metrics``: every per-rank / run-level metric (``ddpdoctor.metrics.catalog`` names).
- ``steps``: wall time of every step per rank, from the capture files (``rank, step, step_ms, profiled,
  gil_contention, threads``).
- ``per_step``: ``RunMetrics.per_step`` (the breakdown of each analysed step); ``components``: its columns
  that add up to the step time, in stacking order.
- ``collectives``: ``RunMetrics.collectives`` (``rank, kind, count, bytes, ms, algbw_gbps, busbw_gbps``).
- ``devices``: peak memory per rank and device with the device's capacity (bytes).
- ``ddp_breakdown``: per rank, DDP's own forward / backward / communication / overlap averages (ms).
- ``rank_table``: the per-rank table of the text report as cells (``kind`` "breakdown" or, for a run without
  trace, "status"; ``title``, ``columns``, ``rows``), or null; ``override_lines``: the thresholds a config file
  changed, as the reports say them.
- ``timeline``: the step timeline of the HTML report (``ddpdoctor.report.timeline.tree``: ``{"note"}``, or
  ``{"steps": [{"label", "step", "svg"}], "caption"}`` with each SVG as an element tree, text as strings), or
  null; ``phase_colors``: the colour of each step part (``ddpdoctor.report.palette``), the same in every chart.
- ``health_title``, ``health_lines``: how a job that failed, hung or crashed ended (or, after an on-demand dump,
  where its ranks were), one line each as the text report shows them, then the run's notes; no lines for a run
  that ended well.
- ``series``: the always-on step series (``capture/series.py``) as written so far, or null for a run without one:
  ``ranks`` (per rank: ``steps`` recorded, ``last_step``, ``last_step_ms``, ``memory_bytes`` as last read,
  ``stride``) and ``rows`` (``rank, step, step_ms, data_wait_ms, memory_bytes``): every step, or for a long run the
  slowest step of each ``stride`` consecutive ones with the largest memory read among them (at most
  ``SERIES_POINTS`` + 1 per rank, the last step always in).
- ``running``: a rank of the run is still running (the dashboard then reloads the report by itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddpdoctor.errors import TraceError
from ddpdoctor.metrics import catalog
from ddpdoctor.pipeline import Analysis, RuleOptions, analyze_run
from ddpdoctor.report import palette
from ddpdoctor.values import jsonable

SCHEMA_VERSION = 1
# The rules of the dashboard when a caller names none: ``ddpdoctor view`` sets its own rule options here, since
# TensorBoard serves the dashboard from its process. None: the built-in rules and the nearest pyproject.toml.
DEFAULT_RULES: RuleOptions | Sequence[Any] | None = None
# Parts of a step that do not overlap one another, in the order they are stacked (DataParallel's stages
# before "other", which is what is left).
STACK_ORDER = catalog.group("breakdown")[:-1] + catalog.group("dp_stages") + catalog.group("breakdown")[-1:]
# The step-time chart of a long run's series: at most this many points per rank (a 2-rank run of a million steps
# would otherwise send 2 million rows at each reload).
SERIES_POINTS = 600


def records(frame: Any) -> list[dict[str, Any]]:
    """The rows of a ``RunMetrics`` table (``ddpdoctor.table.Table`` or a DataFrame) as JSON-ready dicts."""
    from ddpdoctor.metrics.result import records as table_records

    if frame is None or not hasattr(frame, "columns") or len(frame) == 0:
        return []
    return jsonable(table_records(frame))


def _document(analysis: Analysis) -> dict[str, Any]:
    """The ``diagnose --format json`` document, or the run as the capture files describe it."""
    from ddpdoctor.report.document import build

    if analysis.diagnosis is not None:
        return jsonable(build(analysis.diagnosis))
    first = next(iter(analysis.captures.values()), {})
    return {
        "schema_version": SCHEMA_VERSION,
        "run": {
            "path": str(analysis.path),
            "mode": None,
            "world_size": analysis.manifest.get("world_size") or first.get("world_size") or len(analysis.captures),
            "backend": first.get("backend"),
            "steps_analyzed": 0,
            "skipped": [],
            "notes": list(analysis.notes),
        },
        "ranks": [{"rank": rank} for rank in analysis.captures],
        "findings": [],
        "not_evaluated": [],
        "passed": [],
        "passed_reasons": [],
        "overrides": [],
    }


def _rank_table(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The per-rank table the text report shows (``report.document.rank_table``): the step breakdown, or each
    rank's state for a run without trace; None where there is nothing per rank to show."""
    from ddpdoctor.report.document import RANK_STATUS_TITLE, rank_table

    table = rank_table(doc)
    if table is None:
        return None
    title = RANK_STATUS_TITLE if table.kind == "status" else "Per-rank step breakdown (ms per step)"
    columns = [long for long, _ in table.columns]
    return {"kind": table.kind, "title": title, "columns": columns, "rows": table.rows, "note": table.note}


def _timeline(analysis: Analysis) -> dict[str, Any] | None:
    """The step timeline the HTML report draws, as data the dashboard builds with text nodes
    (``report.timeline.tree``), or None for a run without metrics."""
    lazy = getattr(analysis.metrics, "timeline", None)
    if lazy is None or analysis.diagnosis is None:
        return None
    from ddpdoctor.report import timeline

    findings = analysis.diagnosis.findings
    return timeline.tree(lazy.get([r for f in findings for r in f.ranks or []]), findings)


def _ms(seconds: Any) -> float | None:
    return seconds * 1e3 if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else None


def _series(run_dir: Path) -> dict[str, Any] | None:
    """The always-on series of ``run_dir`` as the dashboard draws it (module docstring), None without one."""
    from ddpdoctor.capture.series import read_series
    from ddpdoctor.errors import DDPDoctorError

    try:
        series = read_series(run_dir)
    except (DDPDoctorError, OSError):
        return None
    if not series:
        return None
    ranks, rows = [], []
    for rank, s in series.items():
        measured = [r["mem_bytes"] for r in s.rows if r["mem_bytes"] is not None]
        last = s.rows[-1] if s.rows else {}
        stride = max(1, -(-len(s.rows) // SERIES_POINTS))
        ranks.append(
            {
                "rank": rank,
                "steps": len(s.rows),
                "last_step": last.get("step"),
                "last_step_ms": _ms(last.get("wall_s")),
                "memory_bytes": measured[-1] if measured else None,
                "stride": stride,
            }
        )
        body = s.rows[:-1]  # the last step is a point of its own: where the rank is now
        for chunk in [body[i : i + stride] for i in range(0, len(body), stride)] + [s.rows[-1:]]:
            if not chunk:
                continue
            slowest = max(chunk, key=lambda r: r["wall_s"] if r["wall_s"] is not None else -1.0)
            mems = [r["mem_bytes"] for r in chunk if r["mem_bytes"] is not None]
            rows.append(
                {
                    "rank": rank,
                    "step": slowest["step"],
                    "step_ms": _ms(slowest["wall_s"]),
                    "data_wait_ms": _ms(slowest["data_s"]),
                    "memory_bytes": max(mems) if mems else None,
                }
            )
    return jsonable({"ranks": ranks, "rows": rows})


def _running(doc: dict[str, Any]) -> bool:
    """A rank of the run is still running (``run.health``: its rank file says so and its process is alive)."""
    health = doc["run"].get("health")
    entries = health.get("ranks") if isinstance(health, dict) else None
    return any(isinstance(e, dict) and e.get("state") == "running" for e in entries or [])


def analyze_for_dashboard(run_dir: Path, rules: RuleOptions | Sequence[Any] | None = None) -> Analysis:
    """The run through the one pipeline, traces optional; a run with nothing to read yet is an Analysis that says
    so (the dashboard still shows why it is empty)."""
    try:
        chosen = rules if rules is not None else DEFAULT_RULES
        # with the "Over time" section diagnose shows (a long run traced with --every: findings per window, the
        # series' trends): the windows are read one by one, as diagnose reads them
        return analyze_run(Path(run_dir), rules=chosen, traces_optional=True, over_time=True)
    except TraceError as exc:
        return Analysis(Path(run_dir), None, None, notes=[f"nothing to show yet: {exc}"])


def build_report(
    run_dir: Path,
    *,
    name: str | None = None,
    rules: RuleOptions | Sequence[Any] | None = None,
    analysis: Analysis | None = None,
) -> dict[str, Any]:
    """The dashboard document of ``run_dir`` (module docstring); ``name`` replaces the absolute path.
    ``analysis``: the run already through ``analyze_for_dashboard`` (not read again)."""
    from ddpdoctor.metrics.capture import device_rows, step_rows

    analysis = analysis if analysis is not None else analyze_for_dashboard(Path(run_dir), rules)
    metrics = analysis.metrics
    doc = _document(analysis)
    steps = [row for rank, capture in analysis.captures.items() for row in step_rows(rank, capture)]
    per_step = [r for r in records(getattr(metrics, "per_step", None)) if r.get("analyzed") is not False]
    present = {k for row in per_step for k, v in row.items() if v}  # parts that took time somewhere
    rank_metrics = jsonable([dict(r) for r in getattr(metrics, "ranks", None) or []])
    timers = catalog.group("ddp_timers")
    doc.update(
        {
            # a run diagnosed from how it ended alone (no trace) has metrics but no rank's trace or summary
            "source": "trace" if metrics is not None and metrics.run.get("ranks_loaded") else "capture",
            "notes": list(analysis.notes) if metrics is None else [],
            "run_metrics": jsonable(dict(getattr(metrics, "run", None) or {})),
            "rank_metrics": rank_metrics,
            "steps": jsonable(steps),
            "per_step": per_step,
            "components": [k for k in STACK_ORDER if k in present],
            "collectives": records(getattr(metrics, "collectives", None)),
            "devices": records(getattr(metrics, "devices", None))
            or jsonable([row for rank, capture in analysis.captures.items() for row in device_rows(rank, capture)]),
            "ddp_breakdown": [
                {"rank": r["rank"], **{k: r.get(k) for k in timers}}
                for r in rank_metrics
                if any(r.get(k) is not None for k in timers)
            ],
        }
    )
    # how a failed, hung or crashed job ended (issue 24), in the lines the text report shows, with the run's notes
    # (e.g. the steps left out of the timing metrics)
    from ddpdoctor.report.document import health_lines, health_title, override_lines

    doc["timeline"] = _timeline(analysis)
    doc["series"] = _series(Path(run_dir))
    doc["running"] = _running(doc)
    doc["phase_colors"] = dict(palette.PHASES)
    doc["rank_table"] = _rank_table(doc)
    doc["override_lines"] = override_lines(doc)
    doc["health_title"] = health_title(doc)
    doc["health_lines"] = health_lines(doc) + (list(doc["run"]["notes"]) if doc["run"].get("health") else [])
    from ddpdoctor.report import over_time

    doc["over_time_title"] = over_time.TITLE
    doc["over_time_lines"] = over_time.lines(doc)  # the text report's lines (none for a run without the section)
    if name is not None:  # a dashboard shows run names, never this machine's paths
        for notes in (
            doc["notes"], doc["run"]["notes"], doc["run"]["skipped"], doc["health_lines"], doc["over_time_lines"]
        ):  # fmt: skip
            notes[:] = [str(n).replace(str(run_dir), name) for n in notes]
        doc["run"]["path"] = name
        doc["run"]["name"] = name
        doc["run_metrics"]["path"] = name
    return doc
