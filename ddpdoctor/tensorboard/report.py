"""The dashboard's data for one run: ``build_report(run_dir) -> dict`` (strict JSON: no NaN).

It is the ``ddpdoctor diagnose RUN --format json`` document (``schema_version, run, ranks, findings,
not_evaluated, passed``) with the tables the charts draw added:

- ``source``: ``"trace"`` (trace metrics, ``ddpdoctor.metrics.analyze``) or ``"capture"`` (capture files);
  ``notes``: why the trace metrics are missing, in words.
- ``rank_metrics`` / ``run_metrics``: every per-rank / run-level metric (CONTRACTS names).
- ``steps``: wall time of every step per rank, from the capture files (``rank, step, step_ms, profiled,
  gil_contention, threads``).
- ``per_step``: ``RunMetrics.per_step`` (the breakdown of each profiled step; empty without trace metrics);
  ``components``: its columns that add up to the step time, in stacking order.
- ``collectives``: ``RunMetrics.collectives`` (``rank, kind, count, bytes, ms, algbw_gbps, busbw_gbps``).
- ``devices``: peak memory per rank and device with the device's capacity (bytes).
- ``ddp_breakdown``: per rank, DDP's own forward / backward / communication / overlap averages (ms).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ddpdoctor.tensorboard.capture_metrics import CaptureMetrics, capture_metrics

SCHEMA_VERSION = 1
# Parts of a step that do not overlap one another, in the order they are stacked.
STACK_ORDER = (
    "dataloader_ms",
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "exposed_comm_ms",
    "dp_scatter_ms",
    "dp_replicate_ms",
    "dp_parallel_apply_ms",
    "dp_gather_ms",
    "dp_backward_reduce_ms",
    "other_ms",
)
_DDP_BREAKDOWN = ("ddp_forward_ms", "ddp_backward_ms", "ddp_backward_comm_ms", "ddp_overlap_ms")


def plain(value: Any) -> Any:
    """JSON-ready: numpy/pandas scalars to Python, NaN/inf/NA to None, tuples to lists, recursively."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (ValueError, TypeError):
            pass
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    try:
        import pandas as pd

        if pd.isna(value):
            return None
    except (TypeError, ValueError, ImportError):
        pass
    return str(value)


def records(frame: Any) -> list[dict[str, Any]]:
    if frame is None or not hasattr(frame, "to_dict") or len(frame) == 0:
        return []
    return plain(frame.to_dict("records"))


def step_rows(metrics: Any) -> list[dict[str, Any]]:
    """``RunMetrics.per_step`` rows of the analysed steps, with ``overlap_ratio`` (0-1) added when the metrics
    give communication and exposed communication but no overlap of their own."""
    rows = [r for r in records(getattr(metrics, "per_step", None)) if r.get("analyzed") is not False]
    for row in rows:
        comm, exposed = row.get("comm_ms"), row.get("exposed_comm_ms")
        if (
            row.get("overlap_ratio") is None
            and isinstance(comm, (int, float))
            and comm > 0
            and isinstance(exposed, (int, float))
        ):
            row["overlap_ratio"] = min(1.0, max(0.0, 1.0 - exposed / comm))
    return rows


def trace_metrics(run_dir: Path) -> tuple[Any | None, str | None]:
    """``(RunMetrics, None)``, or ``(None, why not)`` when the trace metrics are unavailable or fail."""
    try:
        from ddpdoctor.load import load
        from ddpdoctor.metrics import analyze
    except ImportError as exc:
        return (
            None,
            f"trace metrics are not available in this ddpdoctor ({exc}); figures come from the capture files",
        )
    try:
        return analyze(load(run_dir)), None
    except Exception as exc:  # a dashboard shows what it can: the capture files still say a lot
        return (
            None,
            f"trace metrics failed ({type(exc).__name__}: {exc}); figures come from the capture files",
        )


def diagnose(metrics: Any) -> tuple[dict[str, Any], str | None]:
    """The ``diagnose --format json`` document of ``metrics`` (built-in rules), or a minimal one and why."""
    try:
        from ddpdoctor.diagnosis import evaluate, load_rules
    except ImportError as exc:
        return _bare_document(metrics), f"the diagnosis engine is not available ({exc})"
    result = evaluate(load_rules(), metrics)
    try:
        from ddpdoctor.report.document import build
    except ImportError:
        doc = _bare_document(metrics)
        doc["findings"] = [f.to_json() for f in result.findings]
        doc["not_evaluated"] = [n.to_json() for n in result.not_evaluated]
        doc["passed"] = list(result.passed)
        return plain(doc), None
    return plain(build(result)), None


def _bare_document(metrics: Any) -> dict[str, Any]:
    run = dict(getattr(metrics, "run", {}) or {})
    return {
        "schema_version": SCHEMA_VERSION,
        "run": {k: plain(run.get(k)) for k in ("path", "mode", "world_size", "backend", "steps_analyzed")},
        "ranks": [{"rank": r.get("rank")} for r in getattr(metrics, "ranks", []) or []],
        "findings": [],
        "not_evaluated": [],
        "passed": [],
    }


def build_report(run_dir: Path, *, name: str | None = None) -> dict[str, Any]:
    """The dashboard document of ``run_dir`` (module docstring); ``name`` replaces the absolute path."""
    run_dir = Path(run_dir)
    captured: CaptureMetrics = capture_metrics(run_dir)
    metrics, why = trace_metrics(run_dir)
    notes = [why] if why else []
    source = "trace" if metrics is not None else "capture"
    used = metrics if metrics is not None else captured
    doc, why_not = diagnose(used)
    if why_not:
        notes.append(why_not)
    per_step = step_rows(metrics) if metrics is not None else []
    present = {k for row in per_step for k, v in row.items() if v}  # parts that took time somewhere
    devices = records(getattr(metrics, "devices", None)) if metrics is not None else []
    doc.update(
        {
            "source": source,
            "notes": notes,
            "run_metrics": plain(dict(getattr(used, "run", {}) or {})),
            "rank_metrics": plain([dict(r) for r in getattr(used, "ranks", []) or []]),
            "steps": records(captured.per_step),
            "per_step": per_step,
            "components": [k for k in STACK_ORDER if k in present],
            "collectives": records(getattr(metrics, "collectives", None)) if metrics is not None else [],
            "devices": devices or records(captured.devices),
            "ddp_breakdown": [
                {"rank": r["rank"], **{k: r.get(k) for k in _DDP_BREAKDOWN}}
                for r in plain(captured.ranks)
                if any(r.get(k) is not None for k in _DDP_BREAKDOWN)
            ],
        }
    )
    doc["schema_version"] = doc.get("schema_version", SCHEMA_VERSION)
    if name is not None:
        doc["run"]["path"] = name
        doc["run"]["name"] = name
        doc["run_metrics"]["path"] = name
    return doc
