"""The metrics ``compare`` shows and ``gate`` can gate, by snapshot name (``step_ms.median``, ``exposed_comm_ms``,
...). They are ``ddpdoctor.metrics.catalog.COMPARED``: unit, meaning and which way is worse come from the metric
catalog, the label, section, default threshold and per-step samples from the ``Compared`` entry there.
"""

from __future__ import annotations

from ddpdoctor.metrics.catalog import COMPARED, SECTIONS, Compared

MetricSpec = Compared
METRICS: tuple[Compared, ...] = COMPARED
BY_NAME: dict[str, Compared] = {m.name: m for m in METRICS}
_ALIASES: dict[str, str] = {alias: m.name for m in METRICS for alias in m.aliases}

__all__ = ["BY_NAME", "METRICS", "SECTIONS", "MetricSpec", "canonical", "spec"]


def canonical(name: str) -> str | None:
    """The catalog name of ``name`` or one of its aliases (``gpu0_peak_reserved``), None when unknown."""
    name = name.strip()
    if name in BY_NAME:
        return name
    return _ALIASES.get(name)


def spec(name: str) -> Compared:
    return BY_NAME[name]
