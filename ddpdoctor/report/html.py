"""One self-contained HTML file: inline CSS and inline SVG charts, no scripts, no external requests.

Everything that comes from a trace, a rule file or the file system is escaped with ``fmt.esc``.
"""

from __future__ import annotations

import math
from typing import Any, TextIO

from ddpdoctor.diagnosis.findings import Diagnosis, format_ranks
from ddpdoctor.metrics import catalog
from ddpdoctor.report import fmt, fsdp_units, over_time, palette, svg, timeline
from ddpdoctor.report.document import (
    RANK_STATUS_TITLE,
    Listed,
    build,
    frame,
    frame_records,
    grouped_not_evaluated,
    health_lines,
    health_title,
    listed_ranks,
    override_lines,
    rank_table,
)
from ddpdoctor.report.page import write_page
from ddpdoctor.values import clean_value

_BREAKDOWN = (
    ("data wait", "dataloader_ms"),
    ("forward", "forward_ms"),
    ("backward", "backward_ms"),
    ("optimizer", "optimizer_ms"),
    ("exposed comm", "exposed_comm_ms"),
    ("other", "other_ms"),
)


# Collective table columns: heading, and the tooltip for the ones a heading alone does not explain.
_COLLECTIVE_COLUMNS = {
    "rank": ("rank", None),
    "kind": ("kind", None),
    "count": ("calls", "calls of this kind over the analysed steps"),
    "bytes": ("bytes", "bytes sent by these calls over the analysed steps"),
    "ms": ("time (ms)", "device time in these calls over the analysed steps, waiting for other ranks included"),
    "algbw_gbps": ("algbw (GB/s)", None),
    "busbw_gbps": ("busbw (GB/s)", None),
}


def _text(value: Any) -> str:
    """``value`` escaped for HTML, with the `code spans` that rule messages and reasons use shown as code."""
    return fmt.esc_code(value)


def _finding_html(i: int, f: Any) -> str:
    evidence = "".join(
        f'<tr><td class="l">{fmt.esc(k)}</td><td>{fmt.esc(fmt.evidence_value(v))}</td></tr>'
        for k, v in f.evidence.items()
    )
    gain = f'<span class="gain">{fmt.esc(fmt.gain(f.estimated_gain_ms))}</span>' if f.estimated_gain_ms else ""
    return (
        f'<div class="finding {fmt.esc(f.severity)}">{gain}'
        f'<div><span class="sev">{fmt.esc(f.severity)}</span> {i}. <b>{fmt.esc(f.id)} {fmt.esc(f.name)}</b> '
        f"({fmt.esc(format_ranks(f.ranks))})</div>"
        f'<p>{_text(f.message)}</p><p class="rec">&rarr; {_text(f.recommendation)}</p>'
        '<p class="note">the numbers the rule checked (<code>params.*</code>: its thresholds)</p>'
        '<table class="ev">'
        f"{evidence}</table></div>"
    )


def _overlap_series(metrics: Any) -> dict[str, list[tuple[float, float]]]:
    df = frame(metrics, "per_step")
    if df is None or not {"rank", "step"} <= set(df.columns):
        return {}
    series: dict[str, list[tuple[float, float]]] = {}
    for row in frame_records(metrics, "per_step"):
        value = clean_value(row.get("overlap_ratio"))
        if value is None:
            comm, exposed = clean_value(row.get("comm_ms")), clean_value(row.get("exposed_comm_ms"))
            if comm and exposed is not None:
                value = 1.0 - exposed / comm
        step = clean_value(row.get("step"))
        if value is not None and step is not None:
            series.setdefault(f"rank {clean_value(row['rank'])}", []).append((float(step), float(value)))
    return {k: sorted(v) for k, v in series.items()}


def _collectives_table(metrics: Any) -> str:
    df = frame(metrics, "collectives")
    if df is None:
        return '<p class="note">No collectives in this run.</p>'
    cols = [c for c in ("rank", "kind", "count", "bytes", "ms", "algbw_gbps", "busbw_gbps") if c in df.columns]
    head = "".join(_collective_heading(c) for c in cols)
    body = []
    for row in frame_records(metrics, "collectives"):
        cells = []
        for c in cols:
            v = clean_value(row[c])
            if c == "bytes":
                text = fmt.size(v)
            elif isinstance(v, float):
                text = f"{v:,.2f}"
            else:
                text = "—" if v is None else str(v)
            cells.append(f'<td class="{"l" if c == "kind" else ""}">{fmt.esc(text)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    note = (
        '<p class="note">Per rank and kind, summed over the analysed steps. algbw = bytes / time; busbw scales it '
        "by nccl-tests' factor for the collective (all_reduce: 2(n-1)/n) so it compares with the link's speed. "
        "Time includes waiting for late ranks, so a rank that waits shows a low bandwidth.</p>"
    )
    return f"{note}<table><tr>{head}</tr>{''.join(body)}</table>"


def _collective_heading(column: str) -> str:
    label, tip = _COLLECTIVE_COLUMNS.get(column, (column, None))
    if tip is None and (metric := catalog.describe(column)) is not None:
        tip = metric.description
    title = f' title="{fmt.esc(tip)}"' if tip else ""
    return f'<th class="{"l" if column == "kind" else ""}"{title}>{fmt.esc(label)}</th>'


def _rank_table(columns: list[tuple[str, str]], rows: list[list[str]], left: frozenset[str] = frozenset()) -> str:
    def cls(column: str) -> str:
        return ' class="l"' if column in left else ""

    head = "".join(f"<th{cls(long)}>{fmt.esc(long)}</th>" for long, _ in columns)
    body = [
        "<tr>"
        + "".join(f"<td{cls(col)}>{fmt.esc(c)}</td>" for (col, _), c in zip(columns, cells, strict=True))
        + "</tr>"
        for cells in rows
    ]
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _body(result: Diagnosis) -> list[str]:
    doc = build(result)
    run = doc["run"]
    facts = (
        f"mode {run['mode'] or '?'} · "
        + (f"parallelism {run['parallelism']} · " if run.get("parallelism") else "")
        + f"world size {run['world_size'] if run['world_size'] is not None else '?'} · "
        f"backend {run['backend'] or 'none'} · "
        f"{fmt.steps_analysed(run['steps_analyzed'])}"
        + (f" · comm hook {run['ddp_comm_hook']}" if run.get("ddp_comm_hook") else "")
    )
    overrides = override_lines(doc)
    shown_overrides = f"<br>thresholds from a config file: {fmt.esc('; '.join(overrides))}" if overrides else ""
    out = [
        f'<h1>ddpdoctor diagnosis</h1><div class="facts">{fmt.esc(run["path"] or "unknown run")}<br>'
        f"{fmt.esc(facts)}{shown_overrides}</div>",
    ]
    if run["skipped"]:
        out.append(f"<h2>Skipped ({len(run['skipped'])})</h2><ul>")
        out += [f"<li>{_text(line)}</li>" for line in run["skipped"]]
        out.append("</ul>")
    if run["notes"]:
        out.append("<h2>Notes</h2><ul>")
        out += [f"<li>{_text(line)}</li>" for line in run["notes"]]
        out.append("</ul>")
    out.append(f"<h2>Findings ({len(result.findings)})</h2>")
    out += [_finding_html(i, f) for i, f in enumerate(result.findings, 1)] or ["<p>No findings.</p>"]
    out += _not_evaluated_html(result)
    out += _timeline_html(result)
    health = health_lines(doc)
    if health:
        out.append(f"<h2>{health_title(doc)}</h2><ul>")
        out += [f"<li>{_text(line)}</li>" for line in health]
        out.append("</ul>")
    out += _trials_html(doc)
    listed = listed_ranks(doc)  # once: the rank table's, the breakdown bars' and the memory bars' ranks
    table = rank_table(doc, listed)
    if table is not None and table.kind == "status":
        out.append(f"<h2>{fmt.esc(RANK_STATUS_TITLE)}</h2>")
        out.append(_rank_table(table.columns, table.rows, left=frozenset(("state", "last phase"))))
    elif table is not None:
        out += _breakdown_html(listed[0], *_with_gpu_util(result, table.columns, table.rows))
    if table is not None and table.note:
        out.append(f'<p class="note">{fmt.esc(table.note)}</p>')
    out += fsdp_units.html_parts(doc)
    over = over_time.html_items(doc)
    if over:
        out.append(over)
    out += _after_breakdown(result, doc, listed)
    return out


def _with_gpu_util(
    result: Diagnosis, columns: list[tuple[str, str]], rows: list[list[str]]
) -> tuple[list[tuple[str, str]], list[list[str]]]:
    """The rank table with a GPU utilisation column (kernel time / step time) where a rank recorded kernels."""
    util = {r.get("rank"): clean_value(r.get("gpu_util_ratio")) for r in getattr(result.metrics, "ranks", None) or []}
    if not any(v is not None for v in util.values()):
        return columns, rows
    cells = [fmt.ratio_pct(util.get(int(row[0])) if row[0].isdigit() else None) for row in rows]
    return [*columns, ("GPU util", "gpu")], [[*row, cell] for row, cell in zip(rows, cells, strict=True)]


def _breakdown_html(ranks: list[dict[str, Any]], columns: list[tuple[str, str]], rows: list[list[str]]) -> list[str]:
    out = ["<h2>Step breakdown per rank</h2>"]
    bars = [(f"rank {r['rank']}", [(label, r[key]) for label, key in _BREAKDOWN]) for r in ranks]
    if any(v for _, parts in bars for _, v in parts):
        colors = {label: palette.color(key) for label, key in _BREAKDOWN}
        out.append(svg.stacked_bars(bars, unit="ms mean", colors=colors))
        out.append(
            '<p class="note">Each bar: the mean time per step of each component, in ms, and at its end their sum, '
            "the mean step. exposed comm is communication not hidden behind computation. In the table, step p50 "
            "and p90 are the median and 90th percentile of the step time (so p50 differs from the bar's mean); "
            "the other columns are the same per-step means, comm is all communication (hidden or not), wait the "
            "time in collectives waiting for late ranks (part of comm, not data transfer), overlap "
            "the share of it hidden behind computation, GIL the share of time threads wait for the GIL"
            + (
                ", GPU util the share of the step the GPU ran kernels (shown where kernels were recorded)"
                if any(long == "GPU util" for long, _ in columns)
                else ""
            )
            + ".</p>"
        )
    out.append(_rank_table(columns, rows))
    return out


def _after_breakdown(result: Diagnosis, doc: dict[str, Any], listed: Listed) -> list[str]:
    out: list[str] = []
    times, shade = _step_time_series(result.metrics)
    out.append("<h2>Step time</h2>")
    if times:
        top = max(y for s in times.values() for _, y in s) * 1.05 or 1.0
        magnitude = 10 ** math.floor(math.log10(top))
        top = math.ceil(top / magnitude * 2) * magnitude / 2  # a round axis: 200 ms, not 170.8
        out.append(svg.line_chart(times, y_max=top, percent=False, unit="ms", shade=shade))
        out.append(
            '<p class="note">Wall time of every step each rank recorded, in ms; the shaded steps were profiled '
            "(the ones analysed above).</p>"
            if shade
            else '<p class="note">Wall time of the profiled steps, in ms (the capture recorded no step clock '
            "for the others).</p>"
        )
    else:
        out.append('<p class="note">No step times recorded.</p>')
    series = _overlap_series(result.metrics)
    out.append("<h2>Communication / computation overlap per step</h2>")
    out.append(svg.line_chart(series) if series else '<p class="note">No per-step communication measured.</p>')
    devices = [
        (
            f"r{r['rank']} {d['device'] if d['device'] is not None else 'device unknown'}",
            d["peak_allocated_bytes"],
            d["peak_reserved_bytes"],
            d["capacity_bytes"],
        )
        for r in listed[0]
        for d in r["devices"]
    ]
    out.append("<h2>Memory per device</h2>")
    out.append(svg.capacity_bars(devices) if devices else '<p class="note">No device memory recorded.</p>')
    if devices and listed[1]:
        out.append(f'<p class="note">{fmt.esc(listed[1])}</p>')
    out.append("<h2>Collectives</h2>")
    out.append(_collectives_table(result.metrics))
    if doc["passed_reasons"]:
        out.append(f"<h2>Passed ({len(doc['passed_reasons'])})</h2><ul>")
        out += [
            f"<li><b>{fmt.esc(p['name'])}</b>" + (f": {_text(p['reason'])}" if p["reason"] else "") + "</li>"
            for p in doc["passed_reasons"]
        ]
        out.append("</ul>")
    return out


def _not_evaluated_html(result: Diagnosis) -> list[str]:
    """The rules the data could not decide, folded (``<details>``) below the findings."""
    if not result.not_evaluated:
        return []
    items = "".join(
        f"<li><b>{fmt.esc(', '.join(names))}</b>: {_text(reason)}</li>"
        for reason, names in grouped_not_evaluated(result).items()
    )
    return [
        f'<details class="not-evaluated"><summary>Not evaluated ({len(result.not_evaluated)}): rules the data of '
        f"this run cannot decide, and why</summary><ul>{items}</ul></details>"
    ]


def _timeline_html(result: Diagnosis) -> list[str]:
    """One step of every rank on one clock (``report.timeline``), the findings marked where they happen."""
    lazy = getattr(result.metrics, "timeline", None)
    if lazy is None:
        return []
    data = lazy.get([r for f in result.findings for r in f.ranks or []])
    if not data.get("recorded") and not data.get("reason"):
        return []
    return [
        f"<h2>{timeline.TITLE}</h2>",
        '<p class="note">One step of every rank on one clock: the upper row of a rank is its training loop (data '
        "wait, forward, backward, optimizer, communication it waited for; the rest of its step is idle or other "
        "work), the lower row its collectives: first waiting for the ranks not there yet, then the transfer. "
        "Hover a part for its time. For every event, open the Perfetto export "
        f"(<code>{timeline.PERFETTO_COMMAND}</code>) in ui.perfetto.dev.</p>",
        timeline.render(data, result.findings),
    ]


def _step_time_series(metrics: Any) -> tuple[dict[str, list[tuple[float, float]]], tuple[float, float] | None]:
    """Wall time of every step per rank (the capture's step clock; else the analysed steps of the traces) and the
    range of the profiled steps."""
    rows = frame_records(metrics, "step_times") if frame(metrics, "step_times") is not None else []
    rows = [r for r in rows if clean_value(r.get("step_ms")) is not None]
    if not rows:  # profiled, all of them: nothing to shade
        rows = [
            {"rank": r.get("rank"), "step": r.get("step"), "step_ms": r.get("step_ms"), "profiled": False}
            for r in frame_records(metrics, "per_step")
            if clean_value(r.get("step_ms")) is not None and r.get("analyzed") is not False
        ]
    series: dict[str, list[tuple[float, float]]] = {}
    profiled = []
    for r in rows:
        step = clean_value(r.get("step"))
        if step is None:
            continue
        series.setdefault(f"rank {clean_value(r['rank'])}", []).append((float(step), float(r["step_ms"])))
        if r.get("profiled"):
            profiled.append(float(step))
    shade = (min(profiled), max(profiled)) if profiled else None
    return {k: sorted(v) for k, v in series.items()}, shade


def _trials_html(doc: dict[str, Any]) -> list[str]:
    """The trials `ddpdoctor try` ran of this run: setting, verdict, B/A of the median step, measured gain with
    its interval, the rules' estimates, findings gone or new."""
    trials = doc["run"].get("trials") or []
    if not trials:
        return []
    head = ["setting", "verdict", "median step B/A", "measured gain (ms/step)", "estimated", "findings"]
    rows = []
    for t in trials:
        interval = t.get("gain_interval_ms")
        gain = "" if t.get("gain_ms") is None else f"{t['gain_ms']:+.1f}"
        if gain and interval and None not in interval:
            gain += f" [{interval[0]:+.1f}, {interval[1]:+.1f}]"
        estimates = "; ".join(
            f"{e['rule']} {e['estimated_gain_ms']:.1f}"
            for e in t.get("estimates") or []
            if e.get("estimated_gain_ms") is not None
        )
        changes = [f"gone: {', '.join(t['went_away'])}"] if t.get("went_away") else []
        changes += [f"new: {', '.join(t['appeared'])}"] if t.get("appeared") else []
        cells = [
            t["settings"],
            f"failed: {t['error']}" if t.get("error") else t["verdict"],
            "" if t.get("step_ratio") is None else f"{t['step_ratio']:.2f}",
            gain,
            estimates,
            "; ".join(changes),
        ]
        rows.append("<tr>" + "".join(f'<td class="l">{fmt.esc(c)}</td>' for c in cells) + "</tr>")
    return [
        f"<h2>Trials of this run ({len(trials)})</h2>",
        '<p class="note">Knobs <code>ddpdoctor try</code> applied, each measured against control runs of the same '
        "steps; the interval is the bootstrap interval of the gain (it contains 0: no measurable effect).</p>",
        "<table><tr>"
        + "".join(f'<th class="l">{fmt.esc(h)}</th>' for h in head)
        + "</tr>"
        + "".join(rows)
        + "</table>",
    ]


def render(result: Diagnosis, stream: TextIO) -> None:
    """Write the HTML report of ``result`` to ``stream`` as one self-contained document."""
    title = f"ddpdoctor: {(getattr(result.metrics, 'run', {}) or {}).get('path') or 'diagnosis'}"
    write_page(stream, title, _body(result))
