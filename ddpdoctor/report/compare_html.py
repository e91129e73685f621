"""One self-contained HTML page for ``ddpdoctor compare``: the speed and memory-balance difference as charts
(inline SVG from ``ddpdoctor.report.svg``), then every metric side by side. No scripts, no external requests;
everything from a run is escaped with ``fmt.esc``."""

from __future__ import annotations

import math
from typing import Any, TextIO

from ddpdoctor.compare import units
from ddpdoctor.compare.catalog import SECTIONS
from ddpdoctor.compare.diff import Comparison
from ddpdoctor.report import fmt, palette, svg
from ddpdoctor.report.page import write_page

_BREAKDOWN = (
    ("data wait", "dataloader_ms"),
    ("forward", "forward_ms"),
    ("backward", "backward_ms"),
    ("optimizer", "optimizer_ms"),
    ("exposed comm", "exposed_comm_ms"),
    ("other", "other_ms"),
)


def _step_charts(c: Comparison) -> list[str]:
    out = []
    median = [(f"{label} median", [("step time", s.value("step_ms.median"))]) for label, s in (("A", c.a), ("B", c.b))]
    if any(v for _, parts in median for _, v in parts):
        out.append(svg.stacked_bars(median))
    bars = [(label, [(name, s.value(key)) for name, key in _BREAKDOWN]) for label, s in (("A", c.a), ("B", c.b))]
    if any(v for _, parts in bars for _, v in parts):
        out.append("<h3>Where a step goes (profiled steps)</h3>")
        out.append(svg.stacked_bars(bars, colors={name: palette.color(key) for name, key in _BREAKDOWN}))
    series = {
        label: [(float(i), v) for i, v in enumerate(s.samples.get("step_ms", []))]
        for label, s in (("A", c.a), ("B", c.b))
        if s.samples.get("step_ms")
    }
    if series:
        top = max(v for pts in series.values() for _, v in pts) * 1.05 or 1.0
        magnitude = 10 ** math.floor(math.log10(top))
        top = math.ceil(top / magnitude * 2) * magnitude / 2  # a round axis: 60 ms, not 59.7167
        out.append("<h3>Step time, sampled step by sampled step (ms)</h3>")
        out.append(svg.line_chart(series, y_max=top, percent=False))
        notes = "; ".join(
            f"{label}: {s.sample_notes['step_ms']}"
            for label, s in (("A", c.a), ("B", c.b))
            if s.sample_notes.get("step_ms")
        )
        out.append(f'<p class="note">{fmt.esc(notes)}</p>')
    return out


def _memory_chart(c: Comparison) -> str:
    devices = [
        (
            f"{label} r{d.get('rank')} {d.get('device') if d.get('device') is not None else 'device unknown'}",
            d.get("peak_allocated_bytes"),
            d.get("peak_reserved_bytes"),
            d.get("capacity_bytes"),
        )
        for label, s in (("A", c.a), ("B", c.b))
        for d in s.devices
    ]
    if not devices:
        return '<p class="note">No device memory peaks in either run (CPU runs, or traces without memory).</p>'
    return svg.capacity_bars(devices)


def _metrics_table(c: Comparison) -> str:
    head = "".join(
        f'<th class="{"l" if h in ("metric",) else ""}">{h}</th>' for h in ("metric", "A", "B", "B/A", "better")
    )
    body = []
    for section in SECTIONS:
        rows = [r for r in c.rows if r.spec.section == section]
        if rows:
            body.append(f'<tr><th class="l" colspan="5">{fmt.esc(section)}</th></tr>')
        for r in rows:
            cells = [units.value(r.spec.name, r.a), units.value(r.spec.name, r.b), units.ratio(r.ratio)]
            body.append(
                f'<tr><td class="l">{fmt.esc(r.spec.label)}</td>'
                + "".join(f"<td>{fmt.esc(x)}</td>" for x in cells)
                + f'<td class="l">{fmt.esc(r.better or "")}</td></tr>'
            )
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _finding(f: dict) -> str:
    sev = fmt.esc(f["severity"])
    return (
        f'<div class="finding {sev}"><span class="sev">{sev}</span> '
        f"<b>{fmt.esc(f['id'])} {fmt.esc(f['name'])}</b><p>{fmt.esc(f['message'])}</p></div>"
    )


def _findings(c: Comparison) -> list[str]:
    out = []
    for label, findings in (("only in A", c.only_a), ("only in B", c.only_b)):
        if findings:
            out.append(f"<h2>Findings {label}</h2>")
            out += [_finding(f) for f in findings]
    if c.both:
        out.append(f'<p class="note">Findings in both: {fmt.esc(", ".join(c.both))}</p>')
    return out


def _env(label: str, s: Any) -> str:
    env = s.environment
    facts = (
        f"{env.get('mode') or '?'} · world size {env.get('world_size', '?')} · backend "
        f"{env.get('backend') or 'none'} · {', '.join(env.get('devices') or []) or '?'} · "
        f"torch {env.get('torch_version') or '?'}"
    )
    return f'<b>{label}</b>: {fmt.esc(s.label)}<br><span class="facts">{fmt.esc(facts)}</span>'


def render(c: Comparison, stream: TextIO) -> None:
    """Write the comparison as one self-contained HTML document."""
    parts = [f"<h1>ddpdoctor compare</h1><p>{_env('A', c.a)}<br>{_env('B', c.b)}</p>"]
    parts += [f'<p class="headline">{fmt.esc(line)}</p>' for line in c.headline]
    if c.not_comparable:
        parts.append("<h2>Not comparable / caveats</h2><ul>")
        parts += [f'<li class="caveat">{fmt.esc(line)}</li>' for line in c.not_comparable]
        parts.append("</ul>")
    parts.append("<h2>Step time</h2>")
    parts += _step_charts(c)
    parts.append("<h2>Memory per device: GPU 0 vs the rest</h2>")
    parts.append(_memory_chart(c))
    parts.append("<h2>Side by side</h2>")
    parts.append(_metrics_table(c))
    parts += _findings(c)
    write_page(stream, f"ddpdoctor compare: {c.a.source} vs {c.b.label}", parts)
