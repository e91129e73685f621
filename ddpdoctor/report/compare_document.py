"""Comparison and gate results as plain data: the ``--format json`` documents, which the other renderers read.

Comparison (``ddpdoctor compare --format json``, schema_version 1)::

    {"schema_version": 1, "kind": "ddpdoctor-compare",
     "a": {"source", "origin", "environment", "sample_notes"}, "b": {...},   # origin: a baseline's run
     "headline": ["Speed: ... B is 1.25x faster per step.", ...],
     "not_comparable": ["..."],
     "metrics": [{"name", "label", "section", "unit", "a", "b", "ratio", "better"}],   # ratio = B / A
     "devices": {"a": [{"rank", "device", "name", "peak_allocated_bytes", ...}], "b": [...]},
     "findings": {"only_a": [{"id", "name", "severity", "ranks", "message"}], "only_b": [...], "both":
     [names]}}

Gate (``ddpdoctor gate --format json``, schema_version 1)::

    {"schema_version": 1, "kind": "ddpdoctor-gate", "result": "pass" | "fail", "exit_code": 0 | 1,
     "current": {"source", "environment"}, "baseline": {"source", "origin", "environment", "created_at"},
     "environment": {"matches": bool, "strict": bool, "differences": [{"key", "baseline", "current"}]},
     "statistics": "bootstrap (...)",
     "metrics": [{"metric", "unit", "baseline", "current", "change", "change_kind": "relative" | "absolute",
                  "threshold", "interval": {"low", "high", "confidence"} | null, "verdict", "outcome",
                  "message"}],
     "rules": [{"rule", "id", "severity", "verdict", "outcome", "message"}],
     "fail_on": "error" | ..., "notes": [...]}
"""

from __future__ import annotations

from typing import Any

from ddpdoctor.compare import stats
from ddpdoctor.compare.catalog import spec
from ddpdoctor.compare.diff import Comparison
from ddpdoctor.compare.gate import GateResult
from ddpdoctor.values import jsonable

SCHEMA_VERSION = 1


def _side(s: Any) -> dict[str, Any]:
    return {
        "source": s.source,
        "origin": s.origin,
        "environment": s.environment,
        "sample_notes": s.sample_notes,
    }


def comparison(c: Comparison) -> dict[str, Any]:
    return jsonable(
        {
            "schema_version": SCHEMA_VERSION,
            "kind": "ddpdoctor-compare",
            "a": _side(c.a),
            "b": _side(c.b),
            "headline": list(c.headline),
            "not_comparable": list(c.not_comparable),
            "metrics": [
                {
                    "name": r.spec.name,
                    "label": r.spec.label,
                    "section": r.spec.section,
                    "unit": r.spec.unit,
                    "a": r.a,
                    "b": r.b,
                    "ratio": r.ratio,
                    "better": r.better,
                }
                for r in c.rows
            ],
            "devices": {"a": c.a.devices, "b": c.b.devices},
            "findings": {"only_a": list(c.only_a), "only_b": list(c.only_b), "both": list(c.both)},
        }
    )


def gate(result: GateResult) -> dict[str, Any]:
    return jsonable(
        {
            "schema_version": SCHEMA_VERSION,
            "kind": "ddpdoctor-gate",
            "result": "fail" if result.failed else "pass",
            "exit_code": result.exit_code,
            "current": {"source": result.current.source, "environment": result.current.environment},
            "baseline": {
                "source": result.baseline.source,
                "origin": result.baseline.origin,
                "environment": result.baseline.environment,
                "created_at": result.baseline.created_at,
            },
            "environment": {
                "matches": not result.env_diffs,
                "strict": result.config.strict_env,
                "differences": [{"key": d.key, "baseline": d.baseline, "current": d.current} for d in result.env_diffs],
            },
            "statistics": stats.METHOD,
            "metrics": [
                {
                    "metric": m.metric,
                    "unit": spec(m.metric).unit,
                    "baseline": m.baseline,
                    "current": m.current,
                    "change": m.change,
                    "change_kind": "relative" if m.threshold.relative else "absolute",
                    "threshold": m.threshold.text(),
                    "interval": None
                    if m.interval is None
                    else {
                        "low": m.interval.low,
                        "high": m.interval.high,
                        "confidence": m.interval.confidence,
                    },
                    "verdict": m.verdict,
                    "outcome": m.outcome,
                    "message": m.message,
                }
                for m in result.metrics
            ],
            "rules": [
                {
                    "rule": r.rule,
                    "id": r.rule_id,
                    "severity": r.severity,
                    "verdict": r.verdict,
                    "outcome": r.outcome,
                    "message": r.message,
                }
                for r in result.rules
            ],
            "fail_on": result.config.fail_on,
            "incomplete": list(result.incomplete),
            "notes": list(result.notes),
        }
    )
