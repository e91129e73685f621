"""The HTML report's charts (issue 27, timeline item 3): a step-time chart over every step, per-step charts that
say something with one step, a GPU utilisation column only where kernels were recorded, memory that names what was
not recorded (no "?"), "Not evaluated" folded right below the findings, and one colour per step part whatever
parts a run has."""

from __future__ import annotations

import io
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from ddpdoctor.diagnosis import evaluate, load_rules
from ddpdoctor.report import palette, render, svg

INPUTS = Path(__file__).resolve().parents[1] / "golden" / "inputs"


def _metrics(name: str, **extra) -> SimpleNamespace:
    data = json.loads((INPUTS / f"{name}.json").read_text())
    frames = {k: pd.DataFrame(data[k]) for k in ("per_step", "collectives", "devices")}
    return SimpleNamespace(run=data["run"], ranks=data["ranks"], **frames, **extra)


def _html(metrics: SimpleNamespace) -> str:
    out = io.StringIO()
    render(evaluate(load_rules(), metrics), "html", out)
    return out.getvalue()


def _section(page: str, title: str) -> str:
    start = page.index(f"<h2>{title}</h2>")
    end = page.find("<h2>", start + 5)
    return page[start : end if end >= 0 else len(page)]


def test_step_time_over_every_step_with_the_profiled_ones_shaded():
    times = pd.DataFrame(
        [
            {"rank": r, "step": s, "step_ms": 80.0 + s + 10 * r, "profiled": 4 <= s <= 6}
            for r in (0, 1)
            for s in range(1, 11)
        ]
    )
    part = _section(_html(_metrics("ddp_4ranks", step_times=times)), "Step time")
    root = ET.fromstring(part[part.index("<svg") : part.index("</svg>") + 6])
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}polyline")) == 2  # a line per rank
    assert len(root.findall(f"{ns}circle")) == 20  # every step, not only the profiled ones
    assert [t.text for t in root.iter(f"{ns}title") if t.text.startswith("profiled")] == ["profiled steps 4-6"]
    assert "rank 1 step 10: 100.0 ms" in part and "the shaded steps were profiled" in part


def test_step_time_falls_back_to_the_analysed_steps_without_a_step_clock():
    part = _section(_html(_metrics("ddp_4ranks")), "Step time")
    assert "<svg" in part and "<title>profiled steps" not in part  # nothing shaded: every step drawn was profiled
    assert "Wall time of the profiled steps" in part and "rank 0 step 1: " in part


def test_a_chart_of_one_step_shows_that_step_and_its_values():
    chart = svg.line_chart({"rank 0": [(3.0, 0.5)], "rank 1": [(3.0, 0.25)]})
    root = ET.fromstring(chart)
    ns = "{http://www.w3.org/2000/svg}"
    texts = [t.text for t in root.iter(f"{ns}text")]
    assert texts.count("step 3") == 1 and "rank 0: 50%" in texts and "rank 1: 25%" in texts
    xs = {c.get("cx") for c in root.iter(f"{ns}circle")}
    assert xs == {f"{svg.LABEL_W + (svg.WIDTH - svg.LABEL_W - 20) / 2:.1f}"}  # in the middle, not on the axis
    assert not root.findall(f"{ns}polyline")  # no line of one point
    two = ET.fromstring(svg.line_chart({"rank 0": [(3.0, 0.5), (4.0, 0.6)]}))
    assert [t.text for t in two.iter(f"{ns}text") if t.text.startswith("step")] == ["step 3", "step 4"]


def test_gpu_utilisation_column_only_where_kernels_were_recorded():
    page = _html(_metrics("ddp_4ranks"))  # gpu_util_ratio 0.6 on every rank
    table = _section(page, "Step breakdown per rank")
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", table)
    assert heads[-1] == "GPU util"
    rows = re.findall(r"<tr>(<td.*?)</tr>", table)
    assert rows and all(re.findall(r"<td[^>]*>([^<]*)</td>", r)[-1] == "60%" for r in rows)
    cpu = _section(_html(_metrics("cpu_single")), "Step breakdown per rank")
    assert "GPU util" not in cpu


def test_memory_names_what_was_not_recorded():
    chart = svg.capacity_bars([("r0 cuda:0", 2**30, None, None), ("r1 cuda:1", 2**30, 2 * 2**30, 4 * 2**30)])
    assert "?" not in chart
    assert "1.00 GiB (allocated); reserved, capacity not recorded" in chart
    assert "1.00 / 2.00 / 4.00 GiB (allocated / reserved / capacity)" in chart
    metrics = _metrics("ddp_4ranks")
    metrics.devices.loc[0, "device"] = None
    assert "r0 device unknown" in _section(_html(metrics), "Memory per device")


def test_not_evaluated_is_folded_right_below_the_findings():
    page = _html(_metrics("ddp_4ranks"))
    findings = page.index("<h2>Findings")
    folded = page.index('<details class="not-evaluated"><summary>Not evaluated (')
    assert findings < page.rindex('<div class="finding') < folded < page.index("<h2>Step breakdown per rank</h2>")
    assert "<h2>Not evaluated" not in page


def _fills(page: str) -> dict[str, str]:
    """Breakdown bar part -> its fill, from the bars' tooltips (``rank 0 forward: 12.0 ms mean``)."""
    chart = _section(page, "Step breakdown per rank")
    return dict(
        (part, fill)
        for fill, part in re.findall(r'<rect [^>]*fill="(#[0-9a-f]{6})"><title>rank \d+ ([a-z ]+): ', chart)
    )


def test_each_step_part_has_one_colour_whichever_parts_a_run_has():
    full = _fills(_html(_metrics("ddp_4ranks")))
    metrics = _metrics("ddp_4ranks")
    for r in metrics.ranks:  # the same job without data loading: the other parts keep their colours
        r["dataloader_ms"] = None
    fewer = _fills(_html(metrics))
    assert "data wait" in full and "data wait" not in fewer
    assert full["exposed comm"] == fewer["exposed comm"] == palette.PHASES["exposed_comm_ms"]
    assert full["forward"] == fewer["forward"] == palette.PHASES["forward_ms"]
    assert len(set(palette.PHASES.values())) == len(palette.PHASES)  # no two parts share a colour


def test_dashboard_report_carries_the_palette_and_the_timeline():
    from ddpdoctor.tensorboard.report import build_report

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank"
    doc = build_report(fixture, name="run")
    assert doc["phase_colors"] == palette.PHASES
    steps = doc["timeline"]["steps"]
    assert [s["label"].split(" (")[0] for s in steps] == ["median step", "worst step"]

    def marks(node):  # the finding marks of an element tree, as (rule, rank)
        if isinstance(node, str):
            return []
        tag, attrs, children = node
        own = [(attrs["data-rule"], attrs["data-rank"])] if attrs.get("class") == "tl-mark" else []
        return own + [m for c in children for m in marks(c)]

    assert {m for s in steps for m in marks(s["svg"])} == {
        ("poor-comm-compute-overlap", "0"),
        ("poor-comm-compute-overlap", "1"),
    }
    assert "timeline_html" not in doc
    static = Path(palette.__file__).parents[1] / "tensorboard" / "static"
    assert "report.phase_colors" in (static / "sections.js").read_text()  # drawn: tests/integration/test_tensorboard
    assert "sections.timeline(report)" in (static / "index.js").read_text()


def test_the_comparison_page_uses_the_same_colours():
    from ddpdoctor.compare import compare, read_input
    from ddpdoctor.pipeline import RuleOptions
    from ddpdoctor.report import Document, OutputFormat, renderer

    root = Path(__file__).resolve().parents[2]
    rules = RuleOptions(config=str(root / "tests" / "golden" / "no-overrides.toml"))
    a = read_input(str(root / "tests" / "fixtures" / "ddp_gloo_2rank"), rules=rules)
    b = read_input(str(root / "samples" / "recorded" / "ddp_straggler"), rules=rules)
    out = io.StringIO()
    renderer(Document.COMPARISON, OutputFormat.HTML)(compare(a, b), out)
    page = out.getvalue()
    chart = page[page.index("Where a step goes") :]
    fills = dict((p, f) for f, p in re.findall(r'fill="(#[0-9a-f]{6})"><title>[AB] ([a-z ]+): ', chart))
    assert fills["exposed comm"] == palette.PHASES["exposed_comm_ms"]
    assert fills["backward"] == palette.PHASES["backward_ms"]
