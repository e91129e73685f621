"""Numbers of the compare/gate metrics as text, in each metric's unit (no I/O)."""

from __future__ import annotations

import math

from ddpdoctor.compare import catalog
from ddpdoctor.report import fmt


def value(metric: str, v: float | None) -> str:
    """``31.20 ms``, ``1.5 GiB``, ``0.351``, ``1.37x``, ``0.41 GB/s``, ``1.13 CPUs``; ``n/a`` when not measured."""
    unit = catalog.spec(metric).unit
    if v is None:
        return "n/a"
    if unit == "bytes":
        return fmt.size(v)
    if unit == "ms":
        return f"{v:,.2f} ms"
    if unit == "GB/s":
        return f"{v:,.3g} GB/s"
    if unit == "x":
        return f"{v:.2f}x"
    if unit == "CPUs":
        return f"{v:.2f} CPUs"
    return f"{v:.3f}"


def change(metric: str, c: float | None, relative: bool) -> str:
    """A change: ``+12.5%`` (relative, a fraction in) or ``+2.1 ms`` / ``+64 MiB`` / ``-0.12`` (absolute)."""
    if c is None:
        return "n/a"
    if relative:
        return ("+inf%" if c > 0 else "-inf%") if math.isinf(c) else f"{c * 100:+.1f}%"
    unit = catalog.spec(metric).unit
    if unit == "bytes":
        return ("+" if c >= 0 else "-") + fmt.size(abs(c))
    return f"{c:+.3g}" + (" ms" if unit == "ms" else " GB/s" if unit == "GB/s" else "")


def ratio(r: float | None) -> str:
    return "—" if r is None else f"{r:.2f}x"
