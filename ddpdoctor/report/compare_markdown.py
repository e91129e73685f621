"""Markdown of ``ddpdoctor compare`` (PR comments). Every dynamic string is escaped with ``fmt.md``."""

from __future__ import annotations

from typing import TextIO

from ddpdoctor.compare import units
from ddpdoctor.compare.catalog import SECTIONS
from ddpdoctor.compare.diff import Comparison
from ddpdoctor.report import fmt


def table(header: list[str], rows: list[list[str]], align: str) -> list[str]:
    """A Markdown table; ``align`` has one ``l`` or ``r`` per column."""
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---:" if a == "r" else ":---" for a in align) + "|",
    ]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def lines(c: Comparison) -> list[str]:
    out = ["# ddpdoctor compare", "", f"- **A:** {fmt.md(c.a.label)}", f"- **B:** {fmt.md(c.b.label)}", ""]
    out += [f"**{fmt.md(line)}**" + "  " for line in c.headline] + [""]
    if c.not_comparable:
        out += ["## Not comparable / caveats", ""] + [f"- {fmt.md(line)}" for line in c.not_comparable] + [""]
    out += ["## Side by side (per step)", ""]
    rows = []
    for section in SECTIONS:
        for r in (r for r in c.rows if r.spec.section == section):
            rows.append(
                [
                    fmt.md(section),
                    fmt.md(r.spec.label),
                    fmt.md(units.value(r.spec.name, r.a)),
                    fmt.md(units.value(r.spec.name, r.b)),
                    fmt.md(units.ratio(r.ratio)),
                    r.better or "",
                ]
            )
    out += table(["section", "metric", "A", "B", "B/A", "better"], rows, "llrrrl") + [""]
    devices = [("A", d) for d in c.a.devices] + [("B", d) for d in c.b.devices]
    if devices:
        out += ["## Memory per device (peak)", ""]
        out += table(
            ["run", "rank", "device", "allocated", "reserved", "capacity"],
            [
                [
                    label,
                    fmt.md(d.get("rank")),
                    fmt.md(f"{d.get('device')} {d.get('name') or ''}".strip()),
                    fmt.size(d.get("peak_allocated_bytes")),
                    fmt.size(d.get("peak_reserved_bytes")),
                    fmt.size(d.get("capacity_bytes")),
                ]
                for label, d in devices
            ],
            "lrlrrr",
        ) + [""]
    for label, findings in (("only in A", c.only_a), ("only in B", c.only_b)):
        if findings:
            out += [f"## Findings {label}", ""]
            out += [
                f"- **{fmt.md(f['severity'])} {fmt.md(f['id'])} {fmt.md(f['name'])}**: {fmt.md(f['message'])}"
                for f in findings
            ] + [""]
    if c.both:
        out += [f"Findings in both: {', '.join(fmt.md(n) for n in c.both)}", ""]
    return out


def render(c: Comparison, stream: TextIO) -> None:
    """Write the comparison as Markdown to ``stream``."""
    stream.write("\n".join(lines(c)))
