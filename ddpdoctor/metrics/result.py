"""``RunMetrics``: what ``analyze`` returns (see docs/CONTRACTS.md for every name and unit)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from ddpdoctor.metrics import catalog
from ddpdoctor.values import jsonable

# The per-rank metrics a rank's summary and the cross-rank matching give, and the run-level ones ``analyze``
# always sets (catalog order).
RANK_METRICS = tuple(n for n in catalog.names("rank", "summary", "cross_rank") if n != "rank")
RUN_METRICS = catalog.names("run", "run", "cross_rank")


@dataclass(frozen=True)
class RunMetrics:
    """Run-level dict, one flat dict per rank, and frames for charts and gating."""

    run: dict[str, Any]
    ranks: list[dict[str, Any]]
    per_step: pd.DataFrame
    collectives: pd.DataFrame
    devices: pd.DataFrame

    def rank(self, rank: int) -> dict[str, Any]:
        return next(r for r in self.ranks if r["rank"] == rank)

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict (NaN becomes None)."""
        return {
            "run": jsonable(self.run),
            "ranks": jsonable(self.ranks),
            "per_step": jsonable(self.per_step.to_dict(orient="records")),
            "collectives": jsonable(self.collectives.to_dict(orient="records")),
            "devices": jsonable(self.devices.to_dict(orient="records")),
        }
