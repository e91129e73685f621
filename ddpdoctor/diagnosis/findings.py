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
class Diagnosis:
    """The result of ``ddpdoctor.diagnosis.evaluate``: what renderers take.

    ``metrics`` is the ``RunMetrics`` the rules ran on; ``findings`` are sorted most costly first;
    ``passed`` names the rules that were evaluated and did not fire.
    """

    metrics: Any
    findings: tuple[Finding, ...]
    not_evaluated: tuple[NotEvaluated, ...]
    passed: tuple[str, ...] = ()

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


def format_ranks(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"ranks 0-2, 5"``; ``[3]`` -> ``"rank 3"``; ``[]`` -> ``"no rank"``."""
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
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(spans)
