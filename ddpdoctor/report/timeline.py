"""The step timeline as inline SVG (no script, nothing loaded): one step, every rank on one clock, for the HTML
report and the dashboard (``metrics.timeline`` builds the data).

Per rank two rows: what the rank's main thread did (data wait, forward, backward, optimizer, exposed communication;
the rest of its step is idle or other work) and its collectives (waiting for late peers, then the transfer), or
DataParallel's gather on GPU 0. Findings are marked where they happen, inside the lane of the rank they concern
(``<g class="tl-mark" data-rule=... data-rank=... data-step=...>``): the straggler's late arrival and the wait it
causes on the others; the communication left exposed once backward has started; the gather of a DataParallel run.
The median and the worst step are two panels; two radio buttons choose one (CSS only).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from itertools import count
from typing import Any

from ddpdoctor.metrics.timeline import exposed_after_backward, latest_arrival
from ddpdoctor.report import palette
from ddpdoctor.report.fmt import esc

WIDTH = 900
LABEL_W = 64
RIGHT = 16
TOP = 30
ROW_H = 16
COMM_H = 10
RANK_H = ROW_H + COMM_H + 22  # room under the comm row for a mark's label
LANE_LABELS = {
    "dataloader": "data wait",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "exposed_comm": "exposed comm",
    "idle": "idle / other",
    "wait": "comm: waiting for peers",
    "transfer": "comm: transfer",
    "dp_gather": "DataParallel gather",
}
STRAGGLER = "rank-straggler"
OVERLAP = "poor-comm-compute-overlap"
DP_RULES = frozenset({"use-ddp-instead-of-dp", "dp-gathers-large-outputs", "gpu0-oom-risk"})
PLACED = frozenset({STRAGGLER, OVERLAP}) | DP_RULES
_IDS = count()
_CODE = re.compile(r"`([^`\n]+)`")
_TICKS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
STYLE = (
    ".tl-panel{display:none}.tl>input{margin-left:1em}"
    ".tl>input:nth-of-type(1):checked~.tl-panel:nth-of-type(1),"
    ".tl>input:nth-of-type(2):checked~.tl-panel:nth-of-type(2){display:block}"
    ".tl svg text{font:11px sans-serif;fill:#333}.tl .tl-grid{stroke:#e4e4e4}.tl svg text.tl-label{font-weight:bold}"
)


PERFETTO_COMMAND = "ddpdoctor export RUN --perfetto FILE"
TITLE = "Step timeline"


def perfetto_pointer(result: Any, code: Any = str) -> str | None:
    """What the text and Markdown reports say where the HTML report draws the step timeline: the Perfetto export
    holds every event of every rank, with the command that writes it (``code`` marks it up: backticks in Markdown).
    None where the HTML report draws no timeline either (a result without metrics) or no step was analysed (a run
    without a trace: nothing to export)."""
    metrics = getattr(result, "metrics", None)
    if getattr(metrics, "timeline", None) is None or not (getattr(metrics, "run", None) or {}).get("steps_analyzed"):
        return None
    return (
        f"Every event of every rank on one clock, the findings marked: {code(PERFETTO_COMMAND)}, then open FILE in "
        "ui.perfetto.dev (the HTML report draws one step of it: --format html)."
    )


def _ms(us: float) -> str:
    return f"{us / 1e3:,.1f} ms"


def render(timeline: dict[str, Any], findings: Sequence[Any] = ()) -> str:
    """The timeline as an HTML fragment (a ``<div class="tl">`` with its own small stylesheet)."""
    if not timeline.get("recorded") or not timeline.get("steps"):
        reason = _CODE.sub(r"<code>\1</code>", esc(timeline.get("reason") or "no step to draw"))
        return f'<p class="note tl-none">Step timeline: {reason}.</p>'
    uid = f"tl{next(_IDS)}"
    steps = timeline["steps"]
    out = [f'<div class="tl"><style>{STYLE}</style>']
    for i, step in enumerate(steps):
        checked = " checked" if i == 0 else ""
        out.append(
            f'<input type="radio" name="{uid}" id="{uid}-{i}"{checked}>'
            f'<label for="{uid}-{i}">{esc(choice(step))}</label>'
        )
    for step in steps:
        out.append(f'<div class="tl-panel" data-step="{step["step"]}">{svg(step, findings)}</div>')
    out.append(f'<p class="note">{esc(caption(timeline, findings))}</p></div>')
    return "".join(out)


def choice(step: dict[str, Any]) -> str:
    """The words of a step's radio button: ``median step (step 8, 79.8 ms)``."""
    return f"{step['label']} (step {step['step']}, {_ms(step['t1_us'] - step['t0_us'])})"


def tree(timeline: dict[str, Any], findings: Sequence[Any] = ()) -> dict[str, Any]:
    """The timeline for the dashboard, which never parses markup: ``{"note"}`` when there is none to draw, else
    ``{"steps": [{"label", "step", "svg"}], "caption"}`` where ``svg`` is the element tree of ``svg()`` as
    ``[tag, {attribute: value}, [child, ...]]`` with text as plain strings (the dashboard makes text nodes)."""
    import xml.etree.ElementTree as ET

    if not timeline.get("recorded") or not timeline.get("steps"):
        return {"note": f"Step timeline: {timeline.get('reason') or 'no step to draw'}."}

    def node(e: ET.Element) -> list[Any]:
        children: list[Any] = [e.text] if e.text else []
        for child in e:
            children.append(node(child))
            if child.tail:
                children.append(child.tail)
        return [e.tag.rpartition("}")[2], dict(e.attrib), children]

    return {
        "steps": [
            {"label": choice(step), "step": step["step"], "svg": node(ET.fromstring(svg(step, findings)))}
            for step in timeline["steps"]
        ],
        "caption": caption(timeline, findings),
    }


def caption(timeline: dict[str, Any], findings: Sequence[Any]) -> str:
    offsets = {int(r): v for r, v in (timeline.get("offsets_us") or {}).items()}
    shown = [r["rank"] for r in timeline["steps"][0]["ranks"]]
    parts = []
    if len(shown) > 1:
        moved = [f"rank {r} {offsets[r] / 1e3:+.3f} ms" for r in shown if offsets.get(r)]
        parts.append(
            f"Clocks aligned on the collectives to rank {min(shown)}'s"
            + (f" (offsets: {', '.join(moved)})" if moved else "")
            + "."
        )
    if timeline.get("unaligned"):
        parts.append(f"Not aligned (no common collective): rank(s) {', '.join(map(str, timeline['unaligned']))}.")
    n = timeline.get("ranks_of") or len(shown)
    if n > len(shown):
        parts.append(f"{len(shown)} of {n} ranks shown (those the findings name first).")
    walls = timeline.get("step_walls_ms")
    if walls:
        parts.append(
            f"Median and worst of {walls['steps']} recorded step(s): {walls['median']:,.1f} and "
            f"{walls['worst']:,.1f} ms from the first rank's start to the last rank's end."
        )
    unplaced = [f.name for f in findings if f.name not in PLACED]
    if unplaced:
        parts.append(f"Not marked on the timeline (no one place in a step): {', '.join(unplaced)}.")
    return " ".join(parts)


def svg(step: dict[str, Any], findings: Sequence[Any] = ()) -> str:
    """One step's SVG: a lane group (``<g class="tl-rank" data-rank=R>``) per rank, marks inside."""
    t0, t1 = step["t0_us"], step["t1_us"]
    plot_w = WIDTH - LABEL_W - RIGHT
    span = (t1 - t0) or 1.0

    def x(t: float) -> float:
        return LABEL_W + (t - t0) / span * plot_w

    rows = step["ranks"]
    legend_y = TOP + len(rows) * RANK_H + 4
    height = legend_y + 36
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" role="img" class="tl-svg">']
    out += _axis(span, x, t0, len(rows))
    lanes_seen: set[str] = set()
    for i, row in enumerate(rows):
        y = TOP + i * RANK_H
        out.append(f'<g class="tl-rank" data-rank="{row["rank"]}" data-y="{y}" data-h="{ROW_H + 2 + COMM_H}">')
        out.append(f'<text x="{LABEL_W - 6}" y="{y + 12}" text-anchor="end">rank {row["rank"]}</text>')
        out.append(_rect(x(row["start_us"]), y, x(row["end_us"]) - x(row["start_us"]), ROW_H, "idle", "idle / other"))
        lanes_seen.add("idle")
        for lane, a, b in row["compute"]:
            lanes_seen.add(lane)
            tip = f"rank {row['rank']} {LANE_LABELS[lane]}: {_ms(b - a)}"
            out.append(_rect(x(a), y, x(b) - x(a), ROW_H, lane, tip))
        cy = y + ROW_H + 2
        for kind, index, part, a, b, _late in row["comm"]:
            lanes_seen.add(part)
            what = "waiting for late peers" if part == "wait" else "transfer"
            tip = f"rank {row['rank']} {kind} #{index} {what}: {_ms(b - a)}"
            out.append(_rect(x(a), cy, x(b) - x(a), COMM_H, part, tip))
        for a, b in row["gather"]:
            lanes_seen.add("dp_gather")
            out.append(_rect(x(a), cy, x(b) - x(a), COMM_H, "dp_gather", f"gather on GPU 0: {_ms(b - a)}"))
        out += _marks(row, rows, step["step"], findings, x, y)
        out.append("</g>")
    out += _legend([k for k in LANE_LABELS if k in lanes_seen], legend_y)
    out.append("</svg>")
    return "".join(out)


def _rect(x: float, y: float, w: float, h: int, lane: str, tip: str) -> str:
    return (
        f'<rect x="{x:.1f}" y="{y}" width="{max(w, 0.5):.1f}" height="{h}" fill="{palette.color(lane)}" '
        f'data-lane="{lane}"><title>{esc(tip)}</title></rect>'
    )


def _axis(span: float, x: Any, t0: float, n_ranks: int) -> list[str]:
    step_ms = span / 1e3
    out: list[str] = []
    if math.isfinite(step_ms) and step_ms > 0:
        # at most 10 ticks (and a grid line at 0), however long the step: a 100 s step or a trace's absurd clock
        tick = next((t for t in _TICKS if step_ms / t <= 10), None) or 10.0 ** math.ceil(math.log10(step_ms / 10))
    else:
        tick, step_ms = 1.0, 0.0
    bottom = TOP + n_ranks * RANK_H - 8
    k = 0
    while k * tick <= step_ms + 1e-9:
        px = x(t0 + k * tick * 1e3)
        out.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{TOP - 4}" y2="{bottom}" class="tl-grid"/>')
        out.append(f'<text x="{px:.1f}" y="{TOP - 8}" text-anchor="middle">{k * tick:g}</text>')
        k += 1
    out.append(f'<text x="{LABEL_W - 6}" y="{TOP - 8}" text-anchor="end">ms</text>')
    return out


def _legend(lanes: Iterable[str], y: int) -> list[str]:
    out, px = [], LABEL_W
    for lane in lanes:
        label = LANE_LABELS[lane]
        out.append(f'<rect x="{px}" y="{y}" width="10" height="10" fill="{palette.color(lane)}"/>')
        out.append(f'<text x="{px + 14}" y="{y + 9}">{esc(label)}</text>')
        px += 26 + 6 * len(label)
    out.append(
        f'<path d="M{LABEL_W} {y + 18} l5 8 l5 -8 z" fill="#000"/>'
        f'<text x="{LABEL_W + 14}" y="{y + 27}">a finding, where it happens (hover for what)</text>'
    )
    return out


def _finding_ranks(f: Any, rank: int) -> bool:
    return not f.ranks or rank in f.ranks


def _marks(
    row: dict[str, Any], rows: list[dict[str, Any]], step: int, findings: Sequence[Any], x: Any, y: int
) -> list[str]:
    out: list[str] = []
    rank = row["rank"]
    cy = y + ROW_H + 2
    for f in findings:
        attrs = f'class="tl-mark" data-rule="{esc(f.name)}" data-rank="{rank}" data-step="{step}"'
        if f.name == STRAGGLER and f.ranks:
            late = latest_arrival(row) if rank in f.ranks else None
            if late is not None:
                kind, index, a, late_us = late
                px = x(a)
                tip = f"{f.id} {f.name}: rank {rank} arrives {_ms(late_us)} late at {kind} #{index}"
                out.append(
                    f'<g {attrs} data-part="late-arrival"><title>{esc(tip)}</title>'
                    f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{y - 3}" y2="{cy + COMM_H + 2}" stroke="#000" '
                    'stroke-width="2"/>'
                    f'<path d="M{px - 5:.1f} {y - 9} l5 8 l5 -8 z" fill="#000"/>'
                    + _label(px, cy + COMM_H + 13, f"rank {rank} arrives {_ms(late_us)} late")
                    + "</g>"
                )
            elif rank not in f.ranks:
                culprit = next((latest_arrival(r) for r in rows if r["rank"] in f.ranks), None)
                waits = [
                    (a, b)
                    for kind, index, part, a, b, _ in row["comm"]
                    if culprit is not None and part == "wait" and (kind, index) == culprit[:2]
                ]
                culprits = ", ".join(map(str, f.ranks))
                for a, b in waits[:1]:
                    tip = f"{f.id} {f.name}: rank {rank} waits {_ms(b - a)} for rank(s) {culprits}"
                    out.append(
                        f'<g {attrs} data-part="wait-caused"><title>{esc(tip)}</title>'
                        f'<rect x="{x(a):.1f}" y="{cy - 1}" width="{max(x(b) - x(a), 1):.1f}" height="{COMM_H + 2}" '
                        'fill="none" stroke="#000" stroke-width="1.5" stroke-dasharray="3 2"/>'
                        + _label(x(a), cy + COMM_H + 13, f"waits {_ms(b - a)} for rank(s) {culprits}")
                        + "</g>"
                    )
        elif f.name == OVERLAP and _finding_ranks(f, rank):
            exposed = exposed_after_backward(row)
            if exposed:
                total = sum(b - a for a, b in exposed)
                a, b = max(exposed, key=lambda s: s[1] - s[0])  # the longest: where the all-reduce waits
                # the rules count data transfer only: say how much of the exposed time is waiting for peers
                waiting = _overlap((a, b), [(w0, w1) for _k, _i, part, w0, w1, _l in row["comm"] if part == "wait"])
                words = f"{_ms(b - a)} of communication exposed" + (
                    f", {_ms(waiting)} of it waiting for peers" if waiting >= 0.05 * (b - a) else ""
                )
                tip = (
                    f"{f.id} {f.name}: rank {rank}: {words}; {_ms(total)} exposed from the start of backward to "
                    "the step's end"
                )
                out.append(
                    f'<g {attrs} data-part="exposed-comm"><title>{esc(tip)}</title>'
                    f'<rect x="{x(a):.1f}" y="{y - 2}" width="{max(x(b) - x(a), 1):.1f}" height="{ROW_H + 4}" '
                    'fill="none" stroke="#000" stroke-width="1.5"/>'
                    f'<path d="M{x(a) - 5:.1f} {y - 9} l5 8 l5 -8 z" fill="#000"/>'
                    + _label(x(a), cy + COMM_H + 13, words)
                    + "</g>"
                )
        elif f.name in DP_RULES and row["gather"] and _finding_ranks(f, rank):
            a, b = row["gather"][0][0], row["gather"][-1][1]
            total = sum(e - s for s, e in row["gather"])
            tip = f"{f.id} {f.name}: DataParallel gathers the outputs on GPU 0: {_ms(total)}"
            out.append(
                f'<g {attrs} data-part="gather"><title>{esc(tip)}</title>'
                f'<rect x="{x(a):.1f}" y="{cy - 1}" width="{max(x(b) - x(a), 1):.1f}" height="{COMM_H + 2}" '
                'fill="none" stroke="#000" stroke-width="1.5"/>'
                f'<path d="M{x(a) - 5:.1f} {cy + COMM_H + 9} l5 -8 l5 8 z" fill="#000"/>'
                + _label(x(a) + 6, cy + COMM_H + 13, f"gather on GPU 0: {_ms(total)}")
                + "</g>"
            )
    return out


def _label(px: float, y: float, text: str) -> str:
    """A mark's words under its rank's rows, beside the mark (left of it in the right half of the plot)."""
    anchor = "end" if px > LABEL_W + (WIDTH - LABEL_W - RIGHT) / 2 else "start"
    dx = -4 if anchor == "end" else 4
    return f'<text x="{px + dx:.1f}" y="{y:.1f}" text-anchor="{anchor}" class="tl-label">{esc(text)}</text>'


def _overlap(span: tuple[float, float], parts: list[tuple[float, float]]) -> float:
    """Time of ``span`` covered by ``parts`` (which may overlap one another: unioned first)."""
    covered, reach = 0.0, span[0]
    for a, b in sorted(parts):
        a, b = max(a, reach), min(b, span[1])
        if b > a:
            covered += b - a
            reach = b
    return covered
