"""Terminal and Markdown output of ``ddpdoctor gate``: the verdict first, then every gated metric with its
baseline, current value, change, interval and threshold, then the rules and the environment."""

from __future__ import annotations

from typing import TextIO

from rich import box
from rich.table import Table
from rich.text import Text

from ddpdoctor import escape
from ddpdoctor.compare import stats, units
from ddpdoctor.compare.gate import FAIL, HOST_BUSIER, NOT_MATERIAL, WARN, GateResult, format_change, format_interval
from ddpdoctor.report.compare_markdown import table as md_table
from ddpdoctor.report.console import WIDE, console


def t(value: object, style: str = "") -> Text:
    """One line of terminal text from anything that may come from a trace or a baseline file."""
    return Text(escape.terminal(value), style=style)


_STYLE = {FAIL: "bold red", WARN: "yellow"}
_ICON = {FAIL: "❌", WARN: "⚠️", "ok": "✅"}


def verdict_line(result: GateResult) -> str:
    n_fail, n_warn = len(result.failures()), len(result.warnings())
    word = "FAIL" if result.failed else "PASS"
    parts = ["run incomplete"] if result.incomplete else []
    parts.append(f"{n_fail} regression(s)" if n_fail else "no regression")
    if n_warn:
        parts.append(f"{n_warn} warning(s)")
    if result.env_diffs:
        parts.append("environment differs" + (" (--strict-env: fails)" if result.config.strict_env else ""))
    return f"ddpdoctor gate: {word}: " + ", ".join(parts)


def env_lines(result: GateResult) -> list[str]:
    return [
        f"environment differs from the baseline: {d.key} was {d.baseline}, now {d.current}"
        + ("" if result.config.strict_env else " (numbers may not be comparable; --strict-env makes this fail)")
        for d in result.env_diffs
    ]


def incomplete_lines(result: GateResult) -> list[str]:
    return [f"{line}: a run that did not complete cannot pass the gate" for line in result.incomplete]


def render(result: GateResult, stream: TextIO) -> None:
    """Write the gate result for a terminal or a CI log."""
    out = console(stream, WIDE)
    out.print(t(verdict_line(result), "bold red" if result.failed else "bold green"))
    out.print(t(f"current:  {result.current.label}", "dim"))
    out.print(t(f"baseline: {result.baseline.label} ({result.baseline.created_at or 'undated'})", "dim"))
    for line in incomplete_lines(result):
        out.print(t("FAIL " + line, _STYLE[FAIL]), soft_wrap=True)
    for line in env_lines(result):
        out.print(t("warning: " + line, "yellow"), soft_wrap=True)
    table = Table(box=box.SIMPLE_HEAD)
    interval_col = f"{stats.CONFIDENCE * 100:.0f}% interval"
    for col in ("metric", "baseline", "current", "change", interval_col, "threshold", "verdict"):
        table.add_column(col, justify="left" if col in ("metric", "verdict") else "right", no_wrap=col != "verdict")
    for m in result.metrics:
        table.add_row(
            t(m.metric),
            t(units.value(m.metric, m.baseline)),
            t(units.value(m.metric, m.current)),
            t(format_change(m.threshold, m.change)),
            t(format_interval(m.threshold, m.interval, False)),
            t(m.threshold.text()),
            t(m.verdict, _STYLE.get(m.outcome, "")),
        )
    out.print(table)
    for m in result.metrics:
        if m.verdict in (HOST_BUSIER, NOT_MATERIAL):  # the table's verdict, with the numbers behind it
            out.print(t("warning: " + m.message, "yellow"), soft_wrap=True)
    for r in result.rules:
        if r.outcome in (FAIL, WARN):
            out.print(
                t(("FAIL " if r.outcome == FAIL else "warning ") + r.message, _STYLE[r.outcome]),
                soft_wrap=True,
            )
    if result.rules:
        quiet = [r.rule for r in result.rules if r.outcome not in (FAIL, WARN)]
        out.print(t(f"rules without a new finding ({len(quiet)}): {', '.join(quiet)}", "dim"), soft_wrap=True)
    for note in result.notes:
        out.print(t("note: " + note, "dim"), soft_wrap=True)
    out.print(
        t(
            f"regression = past the threshold and outside noise: {stats.METHOD} interval of the change must exclude 0.",
            "dim",
        ),
        soft_wrap=True,
    )


def markdown_lines(result: GateResult) -> list[str]:
    out = [
        f"### {_ICON['ok'] if not result.failed else _ICON[FAIL]} {escape.markdown(verdict_line(result))}",
        "",
        f"Current {escape.markdown_code(result.current.label)} vs baseline "
        f"{escape.markdown_code(result.baseline.label)}",
        "",
    ]
    out += [f"- {_ICON[FAIL]} {escape.markdown(line)}" for line in incomplete_lines(result)]
    out += [""] if result.incomplete else []
    out += [f"- ⚠️ {escape.markdown(line)}" for line in env_lines(result)] + ([""] if result.env_diffs else [])
    rows = [
        [
            _ICON.get(m.outcome, ""),
            escape.markdown(m.metric),
            escape.markdown(units.value(m.metric, m.baseline)),
            escape.markdown(units.value(m.metric, m.current)),
            escape.markdown(format_change(m.threshold, m.change)),
            escape.markdown(format_interval(m.threshold, m.interval, False)),
            escape.markdown(m.threshold.text()),
            escape.markdown(m.verdict),
        ]
        for m in result.metrics
    ]
    interval_col = f"{stats.CONFIDENCE * 100:.0f}% interval"
    out += md_table(
        ["", "metric", "baseline", "current", "change", interval_col, "threshold", "verdict"],
        rows,
        "llrrrrrl",
    ) + [""]
    # with its numbers
    flagged = [(_ICON[WARN], m.message) for m in result.metrics if m.verdict in (HOST_BUSIER, NOT_MATERIAL)]
    flagged += [(_ICON[r.outcome], r.message) for r in result.rules if r.outcome in (FAIL, WARN)]
    out += [f"- {icon} {escape.markdown(text)}" for icon, text in flagged] + ([""] if flagged else [])
    out += [f"_{escape.markdown(note)}_" + "  " for note in result.notes]
    return out + [""]


def render_markdown(result: GateResult, stream: TextIO) -> None:
    """Write the gate result as Markdown (the GitHub step summary uses the same)."""
    stream.write("\n".join(markdown_lines(result)))
