"""Renderers: every output format has one, the JSON shape is stable, text output matches the golden files, and
nothing from a trace can inject markup (rich, Markdown, HTML) or terminal escapes.

Inputs are the hand-written engine-logic dicts in tests/golden/inputs/ (see tests/golden/README.md).
Regenerate the golden files after an intended change with:

    DDPDOCTOR_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_report.py -q
"""

from __future__ import annotations

import io
import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from ddpdoctor.cli import build_parser
from ddpdoctor.diagnosis import evaluate, load_rules
from ddpdoctor.report import RENDERERS, Document, OutputFormat, render, renderer

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
UPDATE = os.environ.get("DDPDOCTOR_UPDATE_GOLDEN") == "1"
INPUTS = ("ddp_4ranks", "cpu_single", "dp_2gpu")


def fake_metrics(name: str) -> SimpleNamespace:
    """A RunMetrics-like object from tests/golden/inputs/<name>.json (hand-made engine-logic input)."""
    data = json.loads((GOLDEN / "inputs" / f"{name}.json").read_text())
    frames = {k: pd.DataFrame(data[k]) for k in ("per_step", "collectives", "devices")}
    return SimpleNamespace(run=data["run"], ranks=data["ranks"], **frames)


def diagnose(name: str):
    return evaluate(load_rules(), fake_metrics(name))


def rendered(name: str, fmt: str) -> str:
    buf = io.StringIO()
    render(diagnose(name), fmt, buf)
    return buf.getvalue()


def check_golden(path: Path, actual: str) -> None:
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
    assert path.exists(), f"{path} missing: run with DDPDOCTOR_UPDATE_GOLDEN=1"
    assert actual == path.read_text(), f"{path} differs: inspect, then regenerate with DDPDOCTOR_UPDATE_GOLDEN=1"


def test_every_output_format_has_a_renderer_and_a_cli_choice():
    assert set(RENDERERS) == set(Document)
    assert all(set(formats) == set(OutputFormat) for formats in RENDERERS.values())
    assert all(callable(renderer(d, f)) for d in Document for f in OutputFormat)
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    fmt = next(a for a in sub.choices["diagnose"]._actions if a.dest == "format")
    assert sorted(fmt.choices) == sorted(f.value for f in OutputFormat)


@pytest.mark.parametrize("fmt", list(OutputFormat), ids=lambda f: f.value)
@pytest.mark.parametrize("name", INPUTS)
def test_every_format_renders_every_input(fmt, name):
    text = rendered(name, fmt)
    assert len(text) > 200
    if fmt is OutputFormat.JSON:
        json.loads(text)


@pytest.mark.parametrize("name", INPUTS)
def test_text_report_matches_golden(name):
    check_golden(GOLDEN / "text" / f"{name}.txt", rendered(name, "text"))


@pytest.mark.parametrize("name", ["ddp_4ranks", "cpu_single"])
def test_json_report_matches_golden(name):
    check_golden(GOLDEN / "json" / f"{name}.json", rendered(name, "json"))


def test_json_schema_keys():
    doc = json.loads(rendered("ddp_4ranks", "json"))
    assert doc["schema_version"] == 1
    assert set(doc) >= {"schema_version", "run", "ranks", "findings", "not_evaluated"}
    assert set(doc["run"]) >= {"path", "mode", "world_size", "backend", "steps_analyzed"}
    assert doc["run"]["mode"] == "ddp" and doc["run"]["world_size"] == 4
    for rank in doc["ranks"]:
        assert set(rank) >= {
            "rank",
            "step_ms",
            "comm_ms",
            "exposed_comm_ms",
            "overlap_ratio",
            "dataloader_ms",
            "gil_contention",
            "devices",
        }
        assert set(rank["step_ms"]) == {"median", "p90"}
        for device in rank["devices"]:
            assert set(device) >= {"device", "peak_allocated_bytes", "peak_reserved_bytes", "capacity_bytes"}
    assert [len(r["devices"]) for r in doc["ranks"]] == [1, 2, 2, 2]
    for finding in doc["findings"]:
        assert set(finding) == {
            "id",
            "name",
            "severity",
            "ranks",
            "message",
            "recommendation",
            "evidence",
            "estimated_gain_ms",
        }
    assert doc["not_evaluated"][0] == {
        "name": "use-ddp-instead-of-dp",
        "reason": "applies to DataParallel (dp) runs; this run is ddp",
    }
    assert all(set(item) == {"name", "reason"} for item in doc["not_evaluated"])
    single = json.loads(rendered("cpu_single", "json"))
    assert single["ranks"][0]["comm_ms"] is None and single["ranks"][0]["devices"] == []


def test_text_is_findings_first_then_ranks_then_memory():
    text = rendered("ddp_4ranks", "text")
    order = [
        text.index(s)
        for s in (
            "Findings (10)",
            "2. WARNING  DDP001 dataloader-bound",
            "Per-rank step breakdown",
            "Memory per device",
            "Not evaluated",
        )
    ]
    assert order == sorted(order)


def test_trace_strings_cannot_inject_rich_markup_or_terminal_escapes():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stream in (io.StringIO(), Terminal()):
        render(diagnose("ddp_4ranks"), "text", stream)
        out = stream.getvalue()
        assert "NVIDIA[/bold red]" in out  # shown literally (a narrow table may fold the cell), not markup
        assert "[bold]resnet</title>" in out
        assert "\\x1b[31m" in out  # the trace's escape sequence is shown, not sent to the terminal
        assert "\x1b[31m[bold" not in out


def test_markdown_escapes_trace_strings():
    md = rendered("ddp_4ranks", "markdown")
    assert "<script>" not in md and "&lt;script&gt;" in md
    assert "\\[bold red\\]NVIDIA" in md and "\x1b" not in md


def test_html_is_self_contained_and_escapes_everything_from_the_trace():
    page = rendered("ddp_4ranks", "html")
    assert page.startswith("<!DOCTYPE html>")
    for forbidden in ("<script", "<img", "<link", "<iframe", 'src="', 'href="', "@import", "url("):
        assert forbidden not in page, forbidden
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert page.count("<svg") == 4  # step breakdown, step time, overlap per step, memory per device
    for svg in page.split("<svg")[1:]:
        ET.fromstring("<svg" + svg.split("</svg>")[0] + "</svg>")  # well-formed inline SVG
    assert "nccl:all_reduce" in page  # collectives table
    assert "<title>ddpdoctor: /runs/[bold]resnet&lt;/title&gt;" in page


def test_html_without_devices_or_communication_still_renders():
    page = rendered("cpu_single", "html")
    assert "No device memory recorded." in page and "No collectives in this run." in page
    assert page.count("<svg") == 2  # step breakdown, step time
