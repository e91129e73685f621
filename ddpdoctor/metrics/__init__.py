"""Pure functions from loaded frames to metrics: ``analyze(run) -> RunMetrics``, ``summarize_rank(rank_trace)``;
the metric catalog (``ddpdoctor.metrics.catalog``).

The names below are imported on first use, so the catalog (read by the rule engine and the CLI at start-up)
does not pull in pandas.
"""

from __future__ import annotations

from typing import Any

__all__ = ["analyze", "RunMetrics", "summarize_rank"]


def __getattr__(name: str) -> Any:
    if name == "analyze":
        from ddpdoctor.metrics.analysis import analyze

        return analyze
    if name == "RunMetrics":
        from ddpdoctor.metrics.result import RunMetrics

        return RunMetrics
    if name == "summarize_rank":
        from ddpdoctor.metrics.summary import summarize_rank

        return summarize_rank
    raise AttributeError(f"module 'ddpdoctor.metrics' has no attribute {name!r}")
