"""Terminal output of ``ddpdoctor compare``: headline, what is not comparable, metrics side by side with B/A,
memory per device, findings only one run has."""

from __future__ import annotations

from typing import TextIO

from rich import box
from rich.table import Table
from rich.text import Text

from ddpdoctor.compare import units
from ddpdoctor.compare.catalog import SECTIONS
from ddpdoctor.compare.diff import Comparison
from ddpdoctor.report import fmt
from ddpdoctor.report.console import WIDE, console
from ddpdoctor.report.console import text as t


def _metrics_table(c: Comparison) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title="Side by side (per step; B/A < 1 means B is lower)", title_justify="left")
    for col, justify in (
        ("metric", "left"),
        ("A", "right"),
        ("B", "right"),
        ("B/A", "right"),
        ("better", "left"),
    ):
        table.add_column(col, justify=justify, no_wrap=col != "metric")  # type: ignore[arg-type]
    for section in SECTIONS:
        rows = [r for r in c.rows if r.spec.section == section]
        if not rows:
            continue
        table.add_row(Text(section, style="bold"), "", "", "", "")
        for r in rows:
            table.add_row(
                t("  " + r.spec.label),
                t(units.value(r.spec.name, r.a)),
                t(units.value(r.spec.name, r.b)),
                t(units.ratio(r.ratio)),
                t(r.better or ""),
            )
    return table


def _devices_table(c: Comparison) -> Table | None:
    rows = [("A", d) for d in c.a.devices] + [("B", d) for d in c.b.devices]
    if not rows:
        return None
    table = Table(box=box.SIMPLE_HEAD, title="Memory per device (peak)", title_justify="left")
    for col in ("run", "rank", "device", "allocated", "reserved", "capacity"):
        table.add_column(col, justify="left" if col in ("run", "device") else "right")
    for label, d in rows:
        table.add_row(
            t(label),
            t(d.get("rank")),
            t(f"{d.get('device')} {d.get('name') or ''}".strip()),
            t(fmt.size(d.get("peak_allocated_bytes"))),
            t(fmt.size(d.get("peak_reserved_bytes"))),
            t(fmt.size(d.get("capacity_bytes"))),
        )
    return table


def render(c: Comparison, stream: TextIO) -> None:
    """Write the comparison of A and B to ``stream``."""
    out = console(stream, WIDE)
    head = Text("ddpdoctor compare", style="bold")
    out.print(head)
    out.print(Text("A: ", style="bold") + t(c.a.label))
    out.print(Text("B: ", style="bold") + t(c.b.label))
    out.print()
    for line in c.headline:
        out.print(t(line, "bold"))
    if c.not_comparable:
        out.print()
        out.print(Text("Not comparable / caveats", style="bold underline"))
        for line in c.not_comparable:
            out.print(Text("- ") + t(line), overflow="fold")
    out.print()
    out.print(_metrics_table(c))
    devices = _devices_table(c)
    if devices is not None:
        out.print(devices)
    for label, findings in (("only in A", c.only_a), ("only in B", c.only_b)):
        if findings:
            out.print(Text(f"Findings {label}", style="bold underline"))
            for f in findings:
                out.print(t(f"- {f['severity']} {f['id']} {f['name']}: {f['message']}"), overflow="fold")
    if c.both:
        out.print(Text("Findings in both: ", style="bold") + t(", ".join(c.both)))
