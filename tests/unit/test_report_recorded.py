"""Golden reports of real recorded runs, every document in every format.

The inputs are runs recorded on this project's CPU machine (torchrun + gloo, 2 ranks): the test fixture
``tests/fixtures/ddp_gloo_2rank`` (traces only: decoded here) and the sample ``samples/recorded/ddp_straggler``
(with the ranks' own summaries). Each goes through the one pipeline (``analyze_run``) as ``diagnose`` runs it; a
comparison of the two and a gate of one against the other are rendered too. Paths are relative to the
repository, so the golden files hold no machine path. Regenerate after an intended change with:

    DDPDOCTOR_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_report_recorded.py -q

and review ``git diff tests/golden/recorded``.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from ddpdoctor.pipeline import RuleOptions, analyze_run
from ddpdoctor.report import Document, OutputFormat, renderer

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "recorded"
UPDATE = os.environ.get("DDPDOCTOR_UPDATE_GOLDEN") == "1"
RUNS = {"ddp_gloo_2rank": "tests/fixtures/ddp_gloo_2rank", "ddp_straggler": "samples/recorded/ddp_straggler"}
SUFFIX = {OutputFormat.TEXT: "txt", OutputFormat.JSON: "json", OutputFormat.MARKDOWN: "md", OutputFormat.HTML: "html"}
# built-in rules only: a pyproject.toml of whoever runs the tests must not change the golden files
RULES = RuleOptions(config=str(ROOT / "tests" / "golden" / "no-overrides.toml"))
pytestmark = pytest.mark.skipif(not all((ROOT / p).is_dir() for p in RUNS.values()), reason="recorded runs are missing")


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # paths in the reports are the repository's relative paths


def _render(document: Document, fmt: OutputFormat, result) -> str:
    out = io.StringIO()
    renderer(document, fmt)(result, out)
    return out.getvalue()


def _check(name: str, actual: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
    assert path.exists(), f"{path} missing: run with DDPDOCTOR_UPDATE_GOLDEN=1"
    assert actual == path.read_text(), f"{path} differs: inspect, then regenerate with DDPDOCTOR_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("run", sorted(RUNS))
@pytest.mark.parametrize("fmt", [OutputFormat.TEXT, OutputFormat.JSON, OutputFormat.MARKDOWN])
def test_diagnosis_of_a_recorded_run(run, fmt):
    result = analyze_run(RUNS[run], rules=RULES).diagnosis
    _check(f"{run}.diagnosis.{SUFFIX[fmt]}", _render(Document.DIAGNOSIS, fmt, result))


def _snapshots():
    from ddpdoctor.compare import read_input

    return read_input(RUNS["ddp_gloo_2rank"], rules=RULES), read_input(RUNS["ddp_straggler"], rules=RULES)


@pytest.mark.parametrize("fmt", [OutputFormat.TEXT, OutputFormat.JSON, OutputFormat.MARKDOWN])
def test_comparison_of_two_recorded_runs(fmt):
    from ddpdoctor.compare import compare

    a, b = _snapshots()
    _check(f"compare.{SUFFIX[fmt]}", _render(Document.COMPARISON, fmt, compare(a, b)))


def test_gate_of_one_recorded_run_against_the_other():
    from ddpdoctor.compare import gate, load_config

    baseline, current = _snapshots()
    result = gate(current, baseline, load_config(cwd="/"))
    doc = json.loads(_render(Document.GATE, OutputFormat.JSON, result))
    # the straggler run is slower than the healthy fixture: the step median regresses beyond noise
    step = next(m for m in doc["metrics"] if m["metric"] == "step_ms.median")
    assert step["verdict"] == "regression" and step["interval"]["low"] > 0, step
    assert doc["result"] == "fail" and doc["exit_code"] == 1
    _check("gate.md", _render(Document.GATE, OutputFormat.MARKDOWN, result))


@pytest.mark.parametrize("document", list(Document))
def test_every_document_renders_in_every_format(document):
    from ddpdoctor.compare import compare, gate, load_config

    a, b = _snapshots()
    results = {
        Document.DIAGNOSIS: analyze_run(RUNS["ddp_straggler"], rules=RULES).diagnosis,
        Document.COMPARISON: compare(a, b),
        Document.GATE: gate(b, a, load_config(cwd="/")),
    }
    for fmt in OutputFormat:
        text = _render(document, fmt, results[document])
        # about the run it was given (Markdown escapes _ in text, not in code spans)
        assert "samples/recorded/ddp_straggler" in text.replace("\\_", "_"), (document, fmt)
        if fmt is OutputFormat.JSON:
            json.loads(text)
        if fmt is OutputFormat.HTML:
            assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
            assert "<script" not in text


@pytest.mark.parametrize("fmt", [OutputFormat.TEXT, OutputFormat.MARKDOWN, OutputFormat.HTML])
def test_every_report_points_to_the_perfetto_export_where_the_html_draws_the_timeline(fmt):
    result = analyze_run(RUNS["ddp_straggler"], rules=RULES).diagnosis
    text = _render(Document.DIAGNOSIS, fmt, result)
    assert "ddpdoctor export RUN --perfetto FILE" in text and "ui.perfetto.dev" in text
    # under the findings, as the HTML report's step timeline, before the per-rank breakdown
    title = "<h2>Step timeline</h2>" if fmt is OutputFormat.HTML else "Step timeline"
    assert text.index("Findings (") < text.index(title) < text.index("ddpdoctor export RUN --perfetto FILE")
