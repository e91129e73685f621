"""A run's trials (`ddpdoctor try` results beside it, in RUN.trials/<n>/results.json) are shown next to it: in
every diagnosis format and in the TensorBoard dashboard's document. The results file is real output of
`ddpdoctor try RUN --set ddp.bucket_cap_mb=1` on samples/ddp_train.py (paths made relative)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from ddpdoctor.pipeline import RuleOptions, analyze_run
from ddpdoctor.report import Document, OutputFormat, renderer

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "samples" / "recorded" / "ddp_straggler"
RESULTS = ROOT / "tests" / "fixtures" / "try_results" / "results.json"
RULES = RuleOptions(config=str(ROOT / "tests" / "golden" / "no-overrides.toml"))


@pytest.fixture
def run_with_trials(tmp_path):
    run = Path(shutil.copytree(RECORDED, tmp_path / "run"))
    (tmp_path / "run.trials" / "1").mkdir(parents=True)
    shutil.copy(RESULTS, tmp_path / "run.trials" / "1" / "results.json")
    return run


def _render(result, fmt: OutputFormat) -> str:
    out = io.StringIO()
    renderer(Document.DIAGNOSIS, fmt)(result, out)
    return out.getvalue()


def test_trials_are_in_every_diagnosis_format(run_with_trials):
    result = analyze_run(run_with_trials, rules=RULES).diagnosis
    trial = json.loads(RESULTS.read_text())["trials"][0]
    doc = json.loads(_render(result, OutputFormat.JSON))
    (row,) = doc["run"]["trials"]
    assert row["settings"] == "ddp.bucket_cap_mb=1" and row["verdict"] == trial["verdict"]
    assert row["gain_ms"] == pytest.approx(trial["measurement"]["measured_gain_ms"])
    assert row["appeared"] == trial["measurement"]["findings_appeared"]
    for fmt in (OutputFormat.TEXT, OutputFormat.MARKDOWN, OutputFormat.HTML):
        text = _render(result, fmt)
        assert "Trials of this run" in text and "ddp.bucket" in text and trial["verdict"] in text, fmt


def test_a_run_without_trials_has_no_trials_section(tmp_path):
    run = Path(shutil.copytree(RECORDED, tmp_path / "run"))
    result = analyze_run(run, rules=RULES).diagnosis
    assert "trials" not in json.loads(_render(result, OutputFormat.JSON))["run"]
    assert "Trials of this run" not in _render(result, OutputFormat.TEXT)


def test_the_dashboard_document_carries_the_trials(run_with_trials):
    from ddpdoctor.tensorboard.report import build_report

    report = build_report(run_with_trials, name="exp", rules=RULES)
    assert [t["settings"] for t in report["run"]["trials"]] == ["ddp.bucket_cap_mb=1"]


def test_an_unreadable_results_file_is_a_note_not_an_error(run_with_trials):
    broken = run_with_trials.parent / "run.trials" / "2"
    broken.mkdir()
    (broken / "results.json").write_text("{not json")
    doc = json.loads(_render(analyze_run(run_with_trials, rules=RULES).diagnosis, OutputFormat.JSON))
    assert len(doc["run"]["trials"]) == 1
    assert any(line.startswith("run.trials/2/results.json: skipped:") for line in doc["run"]["skipped"])
