"""Read Kineto (torch.profiler) Chrome traces: ``load(path) -> Run``.

Each rank's events are numpy tables (``RankTrace.tables``, read by the metrics without pandas) and pandas frames
on request: ``run.ranks[0].ops``, ``.kernels``, ``.memory``, ``.steps``, ``.comm_ops`` (built on first use).
"""

from __future__ import annotations

import sys

from ddpdoctor.load.loader import load
from ddpdoctor.load.model import EventTables, RankTrace, Run

__all__ = ["load", "Run", "RankTrace", "EventTables"]


class _CallableModule(sys.modules[__name__].__class__):
    """``ddpdoctor.load(path)`` is the documented API, but importing this subpackage rebinds the attribute
    ``ddpdoctor.load`` to the module; calling the module calls ``load``, so both spellings work."""

    def __call__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return load(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
