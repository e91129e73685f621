"""Tiny inline-SVG charts for the HTML report (no JavaScript, no external assets). Labels are HTML-escaped."""

from __future__ import annotations

from collections.abc import Sequence

from ddpdoctor.report.fmt import esc

PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
WIDTH = 760
LABEL_W = 90


def _label(text: str, y: int) -> str:
    """A row label at the left, shortened to fit (the full text is in the tooltip)."""
    short = text if len(text) <= 14 else text[:13] + "…"
    return f'<text x="{LABEL_W - 6}" y="{y + 13}" text-anchor="end"><title>{esc(text)}</title>{esc(short)}</text>'


def _legend(items: Sequence[tuple[str, str]], y: int) -> list[str]:
    out, x = [], LABEL_W
    for label, color in items:
        out.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{x + 14}" y="{y + 9}" class="lg">{esc(label)}</text>')
        x += 24 + 7 * len(label)
    return out


def _pct(value: float) -> str:
    return f"{100 * value:.0f}%"


def stacked_bars(
    rows: Sequence[tuple[str, Sequence[tuple[str, float | None]]]],
    unit: str = "ms",
    colors: dict[str, str] | None = None,
) -> str:
    """One horizontal bar per row, stacked by component; missing components are skipped. ``colors``: a fixed
    colour per component (``report.palette``), else the palette in order."""
    components = list(dict.fromkeys(name for _, parts in rows for name, _ in parts))
    colors = {name: (colors or {}).get(name) or PALETTE[i % len(PALETTE)] for i, name in enumerate(components)}
    totals = [sum(v for _, v in parts if v) for _, parts in rows]
    scale = (WIDTH - LABEL_W - 90) / (max(totals) or 1.0)
    bar_h, gap, top = 18, 8, 26
    height = top + len(rows) * (bar_h + gap) + 4
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" role="img">']
    out += _legend([(c, colors[c]) for c in components], 4)
    for i, ((label, parts), total) in enumerate(zip(rows, totals, strict=True)):
        y = top + i * (bar_h + gap)
        out.append(_label(label, y))
        x = float(LABEL_W)
        for name, value in parts:
            if not value or value <= 0:
                continue
            w = value * scale
            out.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{colors[name]}">'
                f"<title>{esc(label)} {esc(name)}: {value:,.1f} {esc(unit)}</title></rect>"
            )
            x += w
        out.append(f'<text x="{x + 4:.1f}" y="{y + 13}">{total:,.1f} {esc(unit)}</text>')
    out.append("</svg>")
    return "".join(out)


def line_chart(
    series: dict[str, Sequence[tuple[float, float]]],
    y_max: float = 1.0,
    percent: bool = True,
    unit: str = "",
    shade: tuple[float, float] | None = None,
) -> str:
    """Lines over steps (x) with y in [0, y_max]; one line per series (e.g. per rank). One step alone is a point
    in the middle with its step number under it. ``shade``: a range of steps drawn behind (e.g. the profiled
    ones)."""
    points = [p for s in series.values() for p in s]
    if not points:
        return ""
    x_min, x_max = min(p[0] for p in points), max(p[0] for p in points)
    plot_w, plot_h, top = WIDTH - LABEL_W - 20, 160, 26
    height = top + plot_h + 26

    def sx(x: float) -> float:
        return LABEL_W + (plot_w / 2 if x_max == x_min else (x - x_min) / (x_max - x_min) * plot_w)

    def sy(y: float) -> float:
        return top + plot_h - max(0.0, min(y, y_max)) / y_max * plot_h

    def value(y: float) -> str:
        return _pct(y) if percent else f"{y:,.1f}{(' ' + unit) if unit else ''}"

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" role="img">']
    names = list(series)
    out += _legend([(n, PALETTE[i % len(PALETTE)]) for i, n in enumerate(names)], 4)
    if shade is not None and x_max > x_min:
        a, b = sx(shade[0]), sx(shade[1])
        out.append(
            f'<rect x="{a:.1f}" y="{top}" width="{max(b - a, 2):.1f}" height="{plot_h}" fill="#e3f2fd">'
            f"<title>profiled steps {shade[0]:g}-{shade[1]:g}</title></rect>"
        )
    for frac in (0.0, 0.5, 1.0):
        y = sy(frac * y_max)
        label = f"{frac * y_max * 100:.0f}%" if percent else f"{frac * y_max:,.4g}"
        if unit and not percent and frac == 1.0:
            label += f" {unit}"
        out.append(f'<line x1="{LABEL_W}" x2="{LABEL_W + plot_w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(f'<text x="{LABEL_W - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    if x_max == x_min:
        out.append(f'<text x="{sx(x_min):.1f}" y="{height - 6}" text-anchor="middle">step {x_min:g}</text>')
    else:
        out.append(f'<text x="{LABEL_W}" y="{height - 6}">step {x_min:g}</text>')
        out.append(f'<text x="{LABEL_W + plot_w}" y="{height - 6}" text-anchor="end">step {x_max:g}</text>')
    radius = 4 if x_max == x_min else 2.5
    for i, name in enumerate(names):
        color = PALETTE[i % len(PALETTE)]
        pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in series[name])
        if len(series[name]) > 1:
            out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in series[name]:
            out.append(
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="{radius}" fill="{color}">'
                f"<title>{esc(name)} step {x:g}: {value(y)}</title>"
                "</circle>"
            )
    if x_max == x_min:  # one step: its values written out, not left to a lone dot
        for i, name in enumerate(names):
            y = series[name][0][1]
            out.append(f'<text x="{sx(x_min) + 10:.1f}" y="{sy(y) + 4 + 12 * i:.1f}">{esc(name)}: {value(y)}</text>')
    out.append("</svg>")
    return "".join(out)


def capacity_bars(devices: Sequence[tuple[str, float | None, float | None, float | None]]) -> str:
    """Per device: capacity (outline), peak reserved and peak allocated (filled), all on one byte scale."""
    scale_max = max((max(v for v in d[1:] if v) for d in devices if any(d[1:])), default=0) or 1.0
    scale = (WIDTH - LABEL_W - 130) / scale_max
    bar_h, gap, top = 18, 10, 26
    height = top + len(devices) * (bar_h + gap) + 4
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" role="img">']
    out += _legend([("peak allocated", PALETTE[0]), ("peak reserved", "#a0cbe8"), ("capacity", "#888")], 4)
    for i, (label, allocated, reserved, capacity) in enumerate(devices):
        y = top + i * (bar_h + gap)
        out.append(_label(label, y))
        if reserved:
            out.append(f'<rect x="{LABEL_W}" y="{y}" width="{reserved * scale:.1f}" height="{bar_h}" fill="#a0cbe8"/>')
        if allocated:
            out.append(
                f'<rect x="{LABEL_W}" y="{y + 4}" width="{allocated * scale:.1f}" height="{bar_h - 8}" '
                f'fill="{PALETTE[0]}"/>'
            )
        if capacity:
            out.append(
                f'<rect x="{LABEL_W}" y="{y - 2}" width="{capacity * scale:.1f}" height="{bar_h + 4}" '
                'fill="none" stroke="#888" stroke-dasharray="4 2"/>'
            )
        right = LABEL_W + max(v or 0 for v in (allocated, reserved, capacity)) * scale
        out.append(f'<text x="{right + 6:.1f}" y="{y + 13}">{esc(memory_text(allocated, reserved, capacity))}</text>')
    out.append("</svg>")
    return "".join(out)


def memory_text(allocated: float | None, reserved: float | None, capacity: float | None) -> str:
    """``0.50 / 0.62 / 80.00 GiB`` (allocated / reserved / capacity), and in words what was not recorded."""
    values = (("allocated", allocated), ("reserved", reserved), ("capacity", capacity))
    known = [(name, v) for name, v in values if v is not None]
    missing = [name for name, v in values if v is None]
    text = " / ".join(f"{v / 2**30:.2f}" for _, v in known)
    text = f"{text} GiB ({' / '.join(name for name, _ in known)})" if known else "nothing"
    return text + (f"; {', '.join(missing)} not recorded" if missing else "")
