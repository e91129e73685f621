"""Pure functions from loaded frames to metrics: ``analyze(run) -> RunMetrics``,
``summarize_rank(rank_trace)``."""

from __future__ import annotations

from ddpdoctor.metrics.analyze import analyze
from ddpdoctor.metrics.result import RunMetrics
from ddpdoctor.metrics.summary import summarize_rank

__all__ = ["analyze", "RunMetrics", "summarize_rank"]
