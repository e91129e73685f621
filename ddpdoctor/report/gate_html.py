"""One self-contained HTML page for ``ddpdoctor gate``: the verdict, why a run that did not complete fails, the
environment, every gated metric with its change and interval, the rules that fired. Everything from a run or a
baseline is escaped with ``fmt.esc``."""

from __future__ import annotations

from typing import TextIO

from ddpdoctor.compare import stats, units
from ddpdoctor.compare.gate import FAIL, WARN, GateResult, format_change, format_interval
from ddpdoctor.report import fmt
from ddpdoctor.report.gate_text import env_lines, incomplete_lines, verdict_line
from ddpdoctor.report.page import write_page

_CLASS = {FAIL: "fail", WARN: "warn"}


def _metrics_table(result: GateResult) -> str:
    head = ["metric", "baseline", "current", "change", f"{stats.CONFIDENCE * 100:.0f}% interval", "threshold"]
    rows = [
        "<tr>"
        + f'<td class="l">{fmt.esc(m.metric)}</td>'
        + "".join(
            f"<td>{fmt.esc(cell)}</td>"
            for cell in (
                units.value(m.metric, m.baseline),
                units.value(m.metric, m.current),
                format_change(m.threshold, m.change),
                format_interval(m.threshold, m.interval, False),
                m.threshold.text(),
            )
        )
        + f'<td class="l {_CLASS.get(m.outcome, "ok")}">{fmt.esc(m.verdict)}</td></tr>'
        for m in result.metrics
    ]
    header = "".join(f'<th class="{"l" if h == "metric" else ""}">{fmt.esc(h)}</th>' for h in head)
    return f'<table><tr>{header}<th class="l">verdict</th></tr>{"".join(rows)}</table>'


def render(result: GateResult, stream: TextIO) -> None:
    """Write the gate result as one self-contained HTML document."""
    parts = [
        "<h1>ddpdoctor gate</h1>",
        f'<p class="headline {"fail" if result.failed else "ok"}">{fmt.esc(verdict_line(result))}</p>',
        f'<p class="facts">current: {fmt.esc(result.current.label)}<br>baseline: '
        f"{fmt.esc(result.baseline.label)} ({fmt.esc(result.baseline.created_at or 'undated')})</p>",
    ]
    problems = incomplete_lines(result) + env_lines(result)
    if problems:
        parts.append("<ul>" + "".join(f'<li class="caveat">{fmt.esc(line)}</li>' for line in problems) + "</ul>")
    parts += ["<h2>Metrics</h2>", _metrics_table(result) if result.metrics else '<p class="note">None gated.</p>']
    flagged = [r for r in result.rules if r.outcome in (FAIL, WARN)]
    if flagged:
        parts.append("<h2>Rules</h2><ul>")
        parts += [f'<li class="{_CLASS[r.outcome]}">{fmt.esc(r.message)}</li>' for r in flagged]
        parts.append("</ul>")
    parts += [f'<p class="note">{fmt.esc(note)}</p>' for note in result.notes]
    write_page(stream, f"ddpdoctor gate: {result.current.label}", parts)
