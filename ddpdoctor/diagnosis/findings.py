"""What a diagnosis produces: findings, the rules that could not be evaluated, the metrics they came from."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

SEVERITIES = ("info", "warning", "error")  # ascending
SEVERITY_RANK = {name: i for i, name in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class Finding:
    """One rule that fired.

    ``ranks``: the ranks it is about (for a run-level rule without ``ranks_where``: every rank).
    ``evidence``: the numbers that made it fire, keyed by the sub-expression (``"mean(overlap_ratio)"``,
    ``"params.min_overlap"``); a per-rank term of a per-rank rule maps rank (as a string) to value.
    ``estimated_gain_ms``: step time the fix could save per step (ms), None when the rule cannot estimate it.
    """

    id: str
    name: str
    severity: str
    ranks: tuple[int, ...]
    message: str
    recommendation: str
    evidence: dict[str, Any] = field(default_factory=dict)
    estimated_gain_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "severity": self.severity,
            "ranks": list(self.ranks),
            "message": self.message,
            "recommendation": self.recommendation,
            "evidence": self.evidence,
            "estimated_gain_ms": self.estimated_gain_ms,
        }


@dataclass(frozen=True)
class NotEvaluated:
    """A selected rule that could not be decided on this run, and why (never a silent pass)."""

    name: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "reason": self.reason}


@dataclass(frozen=True)
class Passed:
    """A rule that was evaluated and did not fire, and why: the values it tested against its thresholds (or the
    rule's own ``passed`` sentence), with any threshold a config file changed."""

    name: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "reason": self.reason}


@dataclass(frozen=True)
class Override:
    """A rule parameter a config file set: ``rule.param = value`` (its built-in default) from ``source``."""

    rule: str
    param: str
    value: Any
    default: Any
    source: str

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "param": self.param,
            "value": self.value,
            "default": self.default,
            "source": self.source,
        }

    def text(self) -> str:
        """``rank-straggler.min_wait_ms = 100 (default 2) from pyproject.toml``."""
        return f"{self.rule}.{self.param} = {_number(self.value)} (default {_number(self.default)}) from " + (
            shown_source(self.source)
        )


def _number(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def shown_source(source: str) -> str:
    """A config file as a report names it: relative to the current directory when it lies below it."""
    import os

    try:
        rel = os.path.relpath(source)
    except ValueError:  # another drive (Windows)
        return source
    return source if rel.startswith("..") else rel


@dataclass(frozen=True)
class Diagnosis:
    """The result of ``ddpdoctor.diagnosis.evaluate``: what renderers take.

    ``metrics`` is the ``RunMetrics`` the rules ran on; ``findings`` are sorted most costly first;
    ``passed`` names the rules that were evaluated and did not fire, ``passed_reasons`` says why for each (same
    order); ``overrides``: the parameters of the evaluated rules that a config file changed.
    """

    metrics: Any
    findings: tuple[Finding, ...]
    not_evaluated: tuple[NotEvaluated, ...]
    passed: tuple[str, ...] = ()
    passed_reasons: tuple[Passed, ...] = ()
    overrides: tuple[Override, ...] = ()

    def worst_severity(self) -> str | None:
        if not self.findings:
            return None
        return max((f.severity for f in self.findings), key=SEVERITY_RANK.__getitem__)

    def fails(self, fail_on: str | None) -> bool:
        """True when a finding is at or above ``fail_on`` (``None``: never)."""
        if fail_on is None:
            return False
        threshold = SEVERITY_RANK[fail_on]
        return any(SEVERITY_RANK[f.severity] >= threshold for f in self.findings)


def sort_findings(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """Errors first (a broken job leads the report), then most costly first: by estimated gain (unknown last),
    then severity, then id."""
    return tuple(
        sorted(
            findings,
            key=lambda f: (
                f.severity != "error",
                f.estimated_gain_ms is None,
                -(f.estimated_gain_ms or 0.0),
                -SEVERITY_RANK[f.severity],
                f.id,
            ),
        )
    )


_SPANS_SHOWN = 12  # of a rank list in text; more are elided, with the count (JSON's `ranks` keeps every rank)


def format_ranks(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"ranks 0-2, 5"``; ``[3]`` -> ``"rank 3"``; ``[]`` -> ``"no rank"``. Over 12 spans
    (every other rank of a large job), the first and last few and the count: ``"ranks 0, 2, ..., 16382 (8,192
    ranks)"``, so that a line of a report stays a line at any world size."""
    ordered = sorted(set(ranks))
    if not ordered:
        return "no rank"
    spans: list[str] = []
    start = prev = ordered[0]
    for r in ordered[1:] + [None]:  # type: ignore[list-item]
        if r is not None and r == prev + 1:
            prev = r
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    if len(spans) > _SPANS_SHOWN:
        return f"ranks {', '.join(spans[:8])}, ..., {', '.join(spans[-2:])} ({len(ordered):,} ranks)"
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(spans)
