"""``RunMetrics``: what ``analyze`` returns (see docs/CONTRACTS.md for every name and unit)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ddpdoctor.metrics import catalog
from ddpdoctor.table import Table
from ddpdoctor.values import jsonable

# The per-rank metrics a rank's summary and the cross-rank matching give, and the run-level ones ``analyze``
# always sets (catalog order).
RANK_METRICS = tuple(n for n in catalog.names("rank", "summary", "cross_rank") if n != "rank")
RUN_METRICS = catalog.names("run", "run", "cross_rank")


@dataclass(frozen=True)
class RunMetrics:
    """Run-level dict, one flat dict per rank, and tables for charts and gating (``ddpdoctor.table.Table``:
    named numpy columns; ``.to_pandas()`` gives a DataFrame)."""

    run: dict[str, Any]
    ranks: list[dict[str, Any]]
    per_step: Table
    collectives: Table
    devices: Table
    # the step timeline the reports draw (``metrics.timeline.LazyTimeline``: built on first ``get()``), or None
    timeline: Any = None
    # wall time of every step each rank recorded, profiled or not (``rank, step, step_ms, profiled``): the capture's
    # own step clock (``metrics.capture.step_rows``), for the step-time chart; None where not known
    step_times: Any = None

    def rank(self, rank: int) -> dict[str, Any]:
        return next(r for r in self.ranks if r["rank"] == rank)

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict (NaN becomes None)."""
        return {
            "run": jsonable(self.run),
            "ranks": jsonable(self.ranks),
            "per_step": jsonable(records(self.per_step)),
            "collectives": jsonable(records(self.collectives)),
            "devices": jsonable(records(self.devices)),
        }


class LazyTable(Table):
    """A ``Table`` made on first use by ``make()``: ``RunMetrics.per_step`` of a large run is millions of values
    that ``diagnose`` (rules, text and JSON reports) never reads; charts, ``compare`` and ``to_json`` do."""

    __slots__ = ("_make", "_made")

    def __init__(self, make: Callable[[], Table]) -> None:  # no super().__init__: the columns come later
        self._make: Callable[[], Table] | None = make
        self._made: dict[str, Any] | None = None

    @property  # type: ignore[override]
    def _cols(self) -> dict[str, Any]:
        if self._made is None:
            assert self._make is not None
            self._made, self._make = self._make()._cols, None
        return self._made

    def __reduce__(self) -> tuple[Any, ...]:  # pickled or copied as the plain Table it stands for
        return (Table, (self._cols,))


def records(table: Any) -> list[dict[str, Any]]:
    """The rows of a ``Table`` (or of a pandas DataFrame a caller built) as dicts of Python values."""
    if table is None:
        return []
    if isinstance(table, Table):
        return table.records()
    return table.to_dict(orient="records")
