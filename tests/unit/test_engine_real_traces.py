"""Rules on recorded GPU traces (../shared/traces, skipped when absent): a rule that must fire and one that
must stay silent, through the real CLI (load -> analyze -> evaluate -> render) in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
WORKERS_0 = TRACES / "tb-profiler" / "resnet50_num_workers_0"
WORKERS_4 = TRACES / "tb-profiler" / "resnet50_num_workers_4"
ONE_RANK_OF_TWO = TRACES / "hta" / "nccl_parser_config"

GLOO_2RANK = Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank"  # rank 1 sleeps every step
needs_shared = pytest.mark.skipif(not WORKERS_0.is_dir(), reason="recorded traces not available")
pytestmark = pytest.mark.real_traces


def diagnose(*args: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "diagnose", "--format", "json", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@needs_shared
def test_dataloader_bound_fires_with_num_workers_0():
    code, doc = diagnose(str(WORKERS_0), "--fail-on", "warning")
    assert code == 1
    (finding,) = [f for f in doc["findings"] if f["name"] == "dataloader-bound"]
    assert finding["ranks"] == [0]
    # torch-tb-profiler puts the DataLoader at 59 and 35 ms per step (two spans): same order of magnitude
    assert 25.0 < finding["evidence"]["dataloader_ms"]["0"] < 70.0
    # every step waits (no workers): without its longest step the wait is nearly the same, and that is the gain
    trimmed = finding["evidence"]["dataloader_ms_trimmed"]["0"]
    assert 0.8 * finding["evidence"]["dataloader_ms"]["0"] < trimmed <= finding["evidence"]["dataloader_ms"]["0"]
    assert finding["estimated_gain_ms"] == pytest.approx(trimmed, abs=0.01)


@needs_shared
def test_dataloader_bound_stays_silent_with_num_workers_4():
    code, doc = diagnose(str(WORKERS_4), "--fail-on", "warning", "--select", "dataloader-bound")
    assert code == 0 and doc["findings"] == [] and doc["passed"] == ["dataloader-bound"]


@needs_shared
def test_cross_rank_rule_on_one_rank_of_a_ddp_job_is_not_evaluated():
    if not ONE_RANK_OF_TWO.is_dir():
        pytest.skip("hta traces not available")
    _, doc = diagnose(str(ONE_RANK_OF_TWO), "--select", "rank-straggler")
    (item,) = doc["not_evaluated"]
    assert item["name"] == "rank-straggler" and "only one rank's trace was loaded" in item["reason"]


@needs_shared
def test_html_report_of_a_real_trace_is_self_contained(tmp_path):
    out = tmp_path / "report.html"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddpdoctor",
            "diagnose",
            str(WORKERS_0),
            "--format",
            "html",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    assert "dataloader-bound" in page and "<script" not in page and page.count("<svg") >= 2


@pytest.mark.skipif(not GLOO_2RANK.is_dir(), reason="fixture not generated")
def test_recorded_gloo_ddp_run_straggler_undecided_and_ddp_config_rules_decide():
    from ddpdoctor.diagnosis import evaluate, load_rules
    from ddpdoctor.load import load
    from ddpdoctor.metrics import analyze

    result = evaluate(load_rules(), analyze(load(GLOO_2RANK)))
    found = {f.name: f for f in result.findings}
    # the fixture's rank 1 sleeps in every step, but 6 profiled steps of 2 ranks cannot tell it from chance (the
    # all-reduces of a step share its lateness: 6 observations, not 12)
    assert "rank-straggler" not in found
    assert "6 independent block(s)" in {n.name: n.reason for n in result.not_evaluated}["rank-straggler"]
    # evaluated on DDP's real logging data (find_unused_parameters=False) and silent
    assert "find-unused-parameters-cost" in result.passed
    reasons = {n.name: n.reason for n in result.not_evaluated}
    assert reasons["low-collective-bandwidth"] == "applies to nccl runs; this run uses gloo"
    assert "no CUDA device" in reasons["host-sync-stalls"]
