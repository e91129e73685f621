"""Markdown report (for PR comments, CI summaries). Every dynamic string is escaped with ``fmt.md``."""

from __future__ import annotations

from typing import Any, TextIO

from ddpdoctor.diagnosis.findings import Diagnosis, format_ranks
from ddpdoctor.report import fmt, fsdp_units, over_time
from ddpdoctor.report import timeline as step_timeline
from ddpdoctor.report.document import (
    RANK_STATUS_TITLE,
    build,
    grouped_not_evaluated,
    health_lines,
    health_title,
    listed_ranks,
    override_lines,
    rank_table,
    status_justify,
    trial_lines,
)

_ICON = {"error": "🛑", "warning": "⚠️", "info": "ℹ️"}


def _table(header: list[str], rows: list[list[str]], align: str) -> list[str]:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---:" if a == "r" else ":---" for a in align) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _lines(result: Diagnosis) -> list[str]:
    doc: dict[str, Any] = build(result)
    run = doc["run"]
    out = [
        "# ddpdoctor diagnosis",
        "",
        f"**Run:** {fmt.md(run['path'] or 'unknown')} — mode {fmt.md(run['mode'] or '?')}, "
        + (f"parallelism {fmt.md(run['parallelism'])}, " if run.get("parallelism") else "")
        + f"world size {fmt.md(run['world_size'] if run['world_size'] is not None else '?')}, "
        f"backend {fmt.md(run['backend'] or 'none')}, "
        f"{fmt.md(fmt.steps_analysed(run['steps_analyzed']))}"
        + (f", comm hook {fmt.md(run['ddp_comm_hook'])}" if run.get("ddp_comm_hook") else ""),
        "",
    ]
    overrides = override_lines(doc)
    if overrides:
        out += ["**Thresholds from a config file:** " + "; ".join(fmt.md(o) for o in overrides), ""]
    if run["skipped"]:
        out += [f"## Skipped ({len(run['skipped'])})", ""]
        out += [f"- {fmt.md(line)}" for line in run["skipped"]] + [""]
    if run["notes"]:
        out += ["## Notes", ""] + [f"- {fmt.md(line)}" for line in run["notes"]] + [""]
    out += [f"## Findings ({len(result.findings)})", ""]
    if not result.findings:
        out += ["No findings.", ""]
    for i, f in enumerate(result.findings, 1):
        gain = f", est. gain {fmt.gain(f.estimated_gain_ms)}" if f.estimated_gain_ms is not None else ""
        out += [
            f"### {i}. {_ICON.get(f.severity, '')} {f.severity} — {fmt.md(f.id)} {fmt.md(f.name)} "
            f"({fmt.md(format_ranks(f.ranks))}{gain})",
            "",
            fmt.md(f.message),
            "",
            f"**Recommendation:** {fmt.md(f.recommendation)}",
            "",
            "Evidence: " + "; ".join(f"{fmt.md(k)} = {fmt.md(fmt.evidence_value(v))}" for k, v in f.evidence.items()),
            "",
        ]
    pointer = step_timeline.perfetto_pointer(result, lambda command: f"`{command}`")
    if pointer:  # where the HTML report draws its step timeline
        out += [f"## {step_timeline.TITLE}", "", pointer, ""]
    health = health_lines(doc)
    if health:
        out += [f"## {health_title(doc)}", ""] + [f"- {fmt.md(line)}" for line in health] + [""]
    trials = trial_lines(doc)
    if trials:
        out += [f"## Trials of this run ({len(trials)}, `ddpdoctor try`)", ""]
        out += [f"- {fmt.md(line)}" for line in trials] + [""]
    listed = listed_ranks(doc)  # once: the rank table's and the memory table's rows
    table = rank_table(doc, listed)
    if table is not None:
        header = [long for long, _ in table.columns]
        if table.kind == "status":
            out += [f"## {RANK_STATUS_TITLE}", ""] + _table(header, table.rows, status_justify(table.columns)) + [""]
        else:
            out += ["## Per-rank step breakdown (ms per step; wait: in collectives for late ranks)", ""]
            out += _table(header, table.rows, "r" * len(header)) + [""]
        if table.note:
            out += [f"_{fmt.md(table.note)}_", ""]
    out += fsdp_units.markdown_lines(doc)
    out += over_time.markdown_lines(doc)
    devices = [(r["rank"], d) for r in listed[0] for d in r["devices"]]
    if devices:
        out += ["## Memory per device (peak)", ""]
        rows = [
            [
                str(rank),
                fmt.md(d["device"] if d["device"] is not None else "?"),
                fmt.size(d["peak_allocated_bytes"]),
                fmt.size(d["peak_reserved_bytes"]),
                fmt.size(d["capacity_bytes"]),
            ]
            for rank, d in devices
        ]
        out += _table(["rank", "device", "allocated", "reserved", "capacity"], rows, "rlrrr") + [""]
        if listed[1]:
            out += [f"_{fmt.md(listed[1])}_", ""]
    if result.not_evaluated:
        out += [f"## Not evaluated ({len(result.not_evaluated)})", ""]
        out += [
            f"- **{', '.join(fmt.md(n) for n in names)}**: {fmt.md(reason)}"
            for reason, names in grouped_not_evaluated(result).items()
        ] + [""]
    if doc["passed_reasons"]:
        out += [f"## Passed ({len(doc['passed_reasons'])})", ""]
        out += [
            f"- **{fmt.md(p['name'])}**" + (f": {fmt.md(p['reason'])}" if p["reason"] else "")
            for p in doc["passed_reasons"]
        ] + [""]
    return out


def render(result: Diagnosis, stream: TextIO) -> None:
    """Write the Markdown report of ``result`` to ``stream``."""
    stream.write("\n".join(_lines(result)))
