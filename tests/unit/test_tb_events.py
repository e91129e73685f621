"""Event files and the dashboard report, on a recorded 2-rank gloo DDP run (tests/fixtures/ddp_gloo_2rank)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ddpdoctor.tensorboard.events import has_events, write_events
from ddpdoctor.tensorboard.report import build_report

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "ddp_gloo_2rank"
pytestmark = pytest.mark.skipif(not FIXTURE.is_dir(), reason="recorded fixture ddp_gloo_2rank is missing")


@pytest.fixture
def run_dir(tmp_path):
    return Path(shutil.copytree(FIXTURE, tmp_path / "run"))


def _capture(run_dir, rank):
    return json.loads((run_dir / "ranks" / f"rank{rank}.json").read_text())


def _events(run_dir, rank):
    acc = EventAccumulator(
        str(run_dir / "tensorboard" / f"rank{rank}"), size_guidance={"scalars": 0, "tensors": 0}
    )
    acc.Reload()
    return acc


def test_one_event_folder_per_rank_with_every_step_time(run_dir):
    assert not has_events(run_dir)
    report = build_report(run_dir)
    assert write_events(run_dir) == run_dir / "tensorboard"
    assert has_events(run_dir)
    for rank in (0, 1):
        acc = _events(run_dir, rank)
        steps = _capture(run_dir, rank)["steps"]
        points = acc.Scalars("time/step_ms")
        assert [p.step for p in points] == list(range(steps["first"], steps["first"] + len(steps["wall_ms"])))
        assert [p.value for p in points] == pytest.approx(steps["wall_ms"], rel=1e-6)
        tags = set(acc.Tags()["scalars"])
        assert {"time/forward_ms", "time/backward_ms", "comm/exposed_comm_ms", "comm/overlap_ratio"} <= tags
        # breakdown scalars exist for the analysed (profiled) steps only: two windows of 3
        analysed = [r["step"] for r in report["per_step"] if r["rank"] == rank]
        assert [p.step for p in acc.Scalars("time/forward_ms")] == analysed and len(analysed) == 6
        assert "ddpdoctor/findings" in acc.Tags()["tensors"]


def test_writing_again_replaces_the_event_files(run_dir):
    write_events(run_dir)
    write_events(run_dir)
    for rank in (0, 1):
        folder = run_dir / "tensorboard" / f"rank{rank}"
        assert len(list(folder.glob("events.out.tfevents.*"))) == 1
        assert len(_events(run_dir, rank).Scalars("time/step_ms")) == len(
            _capture(run_dir, rank)["steps"]["wall_ms"]
        )
    assert sorted(p.name for p in (run_dir / "tensorboard").iterdir()) == ["rank0", "rank1"]  # no leftovers


def test_findings_text_names_the_rank_it_is_about(run_dir):
    report = build_report(run_dir)
    write_events(run_dir)
    for rank in (0, 1):
        (event,) = _events(run_dir, rank).Tensors("ddpdoctor/findings")
        text = event.tensor_proto.string_val[0].decode()
        assert text.startswith(f"**ddpdoctor findings for rank {rank}**")
        for finding in report["findings"]:
            assert (finding["name"] in text) == (rank in finding["ranks"])


def test_report_with_trace_metrics_has_the_chart_tables(run_dir):
    report = build_report(run_dir, name="exp/run")
    json.dumps(report, allow_nan=False)  # strict JSON
    assert report["source"] == "trace" and report["notes"] == []
    assert report["run"]["path"] == "exp/run" and str(run_dir) not in json.dumps(report)
    assert {r["rank"] for r in report["per_step"]} == {0, 1}
    assert all(
        0.0 <= r["overlap_ratio"] <= 1.0 for r in report["per_step"] if r.get("overlap_ratio") is not None
    )
    assert (
        report["components"][:2] == ["dataloader_ms", "forward_ms"] and report["components"][-1] == "other_ms"
    )
    assert {(c["rank"], c["kind"]) for c in report["collectives"]} >= {(0, "all_reduce"), (1, "all_reduce")}


def test_report_when_the_traces_cannot_be_read_shows_the_recorded_steps(run_dir):
    for trace in run_dir.glob("*.pt.trace.json.gz"):
        trace.unlink()
    report = build_report(run_dir)
    json.dumps(report, allow_nan=False)
    assert report["source"] == "capture"
    assert len(report["notes"]) == 1 and report["notes"][0].startswith("trace metrics and findings are missing")
    # no metrics, so no verdicts: nothing is claimed from the capture files alone
    assert report["per_step"] == [] and report["collectives"] == [] and report["findings"] == []
    assert report["rank_metrics"] == [] and report["passed"] == []
    for rank in (0, 1):
        capture = _capture(run_dir, rank)
        rows = [r for r in report["steps"] if r["rank"] == rank]
        assert [r["step_ms"] for r in rows] == pytest.approx(capture["steps"]["wall_ms"])
        assert sum(r["profiled"] for r in rows) == 6
    assert {r["rank"] for r in report["ranks"]} == {0, 1} and report["run"]["world_size"] == 2


def test_ddp_breakdown_is_ddps_own_logging(run_dir):
    report = build_report(run_dir)
    for row in report["ddp_breakdown"]:
        logged = _capture(run_dir, row["rank"])["ddp"][0]["logging_data"]
        assert row["ddp_forward_ms"] == pytest.approx(logged["avg_forward_compute_time"] / 1e6)
        assert row["ddp_backward_comm_ms"] == pytest.approx(logged["avg_backward_comm_time"] / 1e6)
    assert {r["rank"] for r in report["ddp_breakdown"]} == {0, 1}
