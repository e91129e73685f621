"""A run that failed, hung or crashed is diagnosed from how it ended (issue 24): the health metrics
(``ddpdoctor.metrics.health``) from hand-made manifests, rank files and ``HealthVerdict``s, and the error-level
rules over them (rank-crashed, job-failed-at-startup, collective-hang, collective-mismatch, rank-died)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from ddpdoctor.diagnosis import evaluate, load_rules
from ddpdoctor.diagnosis.expr import ExprError, compile_expr
from ddpdoctor.diagnosis.template import compile_template
from ddpdoctor.flight.verdict import CollectiveRef, HealthVerdict, Mismatch, RankState
from ddpdoctor.metrics.health import HEALTH_METRICS, health_metrics
from ddpdoctor.metrics.result import RunMetrics
from ddpdoctor.report.document import build, health_lines
from ddpdoctor.runfile_types import Frame
from ddpdoctor.table import Table

HEALTH_RULES = {"rank-crashed", "job-failed-at-startup", "collective-hang", "collective-mismatch", "rank-died"}
PEER = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by"
    " peer [127.0.0.1]:43136. This is typically caused by a remote worker crashing. GLHF!"
)
KILLED = "the rank process died without finishing (killed, or stopped by torchrun)"


def _manifest(*ranks: tuple[int, str, str | None, int]) -> dict:
    return {
        "world_size": len(ranks),
        "exit_code": 0 if all(s == "ok" for _, s, _, _ in ranks) else 1,
        "ranks": [{"rank": r, "status": s, "reason": why, "steps": n} for r, s, why, n in ranks],
    }


def _diagnose(manifest: dict, verdict=None, captures=None):
    health, doc = health_metrics(manifest, captures or {}, verdict)
    run = {"mode": "ddp", "world_size": manifest.get("world_size"), "backend": "gloo", "steps_analyzed": 5, **health}
    if doc is not None:
        run["health"] = doc
    ranks = [{"rank": e["rank"]} for e in manifest.get("ranks", [])] or [{"rank": 0}, {"rank": 1}]
    metrics = RunMetrics(run=run, ranks=ranks, per_step=Table(), collectives=Table(), devices=Table())
    return health, doc, evaluate(load_rules(), metrics)


def _health_findings(diagnosis):
    return [f for f in diagnosis.findings if f.name in HEALTH_RULES]


def test_a_crash_names_the_rank_that_raised_and_its_peer_as_a_consequence():
    health, doc, diagnosis = _diagnose(
        _manifest((0, "failed", PEER, 12), (1, "failed", "RuntimeError: bad batch at step 11", 12))
    )
    assert health["rank_crashed"] and health["culprit_rank"] == 1 and health["consequence_ranks"] == 1
    first = diagnosis.findings[0]
    assert (first.name, first.severity, first.ranks) == ("rank-crashed", "error", (1,))
    assert first.message.startswith("rank 1 crashed after 12 steps: RuntimeError: bad batch at step 11")
    assert "rank 0 failed as a consequence" in first.message and "pair.cc" not in first.message
    assert [f.name for f in _health_findings(diagnosis)] == ["rank-crashed"]
    assert diagnosis.fails("error")
    assert {e["rank"]: e["state"] for e in doc["ranks"]} == {0: "consequence", 1: "crashed"}


def test_a_crash_dump_gives_the_user_code_frames():
    verdict = HealthVerdict(
        kind="crash",
        culprits=(1,),
        waiting=(),
        collective=None,
        mismatches=(),
        ranks={
            1: RankState(
                1,
                "crashed",
                11,
                "optimizer",
                0.1,
                None,
                (Frame("/job/train.py", 9, "train_step"), Frame("/job/train.py", 17, "main")),
                "RuntimeError: bad batch at step 11",
            ),
            0: RankState(0, "consequence", 12, "backward", 0.5, None, (), PEER),
        },
        summary="rank 1 crashed",
    )
    _, _, diagnosis = _diagnose(
        _manifest((0, "failed", PEER, 12), (1, "failed", "RuntimeError: bad batch at step 11", 12)), verdict
    )
    assert "in train_step (train.py:9) ← main (train.py:17)" in diagnosis.findings[0].message


def test_a_one_process_run_that_failed_at_start_up_is_an_error_not_no_findings():
    why = (
        "ValueError: Error initializing torch.distributed using env:// rendezvous: environment variable RANK"
        " expected, but not set"
    )
    health, _, diagnosis = _diagnose(_manifest((0, "failed", why, 0)))
    assert health["startup_failed"] and not health["rank_crashed"]
    first = diagnosis.findings[0]
    assert first.name == "job-failed-at-startup" and first.severity == "error"
    assert "RANK expected, but not set" in first.message and "--nproc-per-node" in first.recommendation
    assert diagnosis.fails("info")


def test_a_killed_rank_is_the_cause_and_the_reset_connection_a_consequence():
    reset = "RuntimeError: [/x/pair.cc:537] Read error [127.0.0.1]:23964: Connection reset by peer."
    health, _, diagnosis = _diagnose(_manifest((0, "failed", reset, 133), (1, "failed", KILLED, 7)))
    assert health["rank_died"] and health["culprit_rank"] == 1
    first = diagnosis.findings[0]
    assert (first.name, first.ranks) == ("rank-died", (1,))
    assert "rank 1 died without an exception of its own" in first.message


def _hang_verdict() -> HealthVerdict:
    coll = CollectiveRef(
        "default_pg", 25, "all_reduce", "gloo", ((1,),), ("Float",), Frame("/job/train.py", 20, "main")
    )
    return HealthVerdict(
        kind="hang",
        culprits=(1,),
        waiting=(0,),
        collective=coll,
        mismatches=(),
        ranks={
            0: RankState(0, "in_collective", 6, "backward", 16.0, coll, (Frame("/job/train.py", 20, "main"),), None),
            1: RankState(
                1,
                "outside",
                6,
                "data",
                16.2,
                None,
                (Frame("/job/train.py", 14, "read_shard"), Frame("/job/train.py", 19, "main")),
                None,
            ),
        },
        summary=(
            "rank 1 is stuck in read_shard (train.py:14) at step 6 (data), outside any collective; rank 0 waits in"
            " all_reduce #25 (default_pg) for 16 s"
        ),
        evidence=("rank 0: all_reduce #25 (default_pg) [1] Float started, issued at main (train.py:20)",),
    )


def test_a_hang_from_the_dumps_leads_with_the_stuck_rank_and_the_collective():
    health, doc, diagnosis = _diagnose(_manifest((0, "hung", "no step", 6), (1, "hung", "no step", 6)), _hang_verdict())
    assert health["hang_detected"] and health["culprit_rank"] == 1 and health["hang_wait_ms"] == 16000.0
    first = diagnosis.findings[0]
    assert (first.name, first.severity, first.ranks) == ("collective-hang", "error", (1,))
    assert "read_shard (train.py:14)" in first.message and "all_reduce #25 (default_pg)" in first.message
    assert "waited 16 s" in first.message and "read_shard (train.py:14)" in first.recommendation
    assert doc["collective"]["text"] == "all_reduce #25 (default_pg) [1] Float"
    assert doc["collective"]["issued_at"] == "main (train.py:20)"
    assert [f.name for f in _health_findings(diagnosis)] == ["collective-hang"]


def test_a_mismatch_names_both_sides():
    m = Mismatch("default_pg", 6, "op", {0: "all_reduce [1] Float", 1: "broadcast [4] Float"})
    verdict = HealthVerdict("desync", (1,), (0,), None, (m,), {}, "ranks 0 and 1 issued different collectives at #6")
    health, _, diagnosis = _diagnose(_manifest((0, "hung", "no step", 3), (1, "hung", "no step", 3)), verdict)
    assert health["collective_mismatches"] == 1 and not health["hang_detected"]
    first = diagnosis.findings[0]
    assert first.name == "collective-mismatch"
    assert "rank 0: all_reduce [1] Float" in first.message and "rank 1: broadcast [4] Float" in first.message


def test_a_healthy_run_passes_every_health_rule():
    health, doc, diagnosis = _diagnose(_manifest((0, "ok", None, 20), (1, "ok", None, 20)))
    assert health["job_failed"] is False and doc is None
    assert not _health_findings(diagnosis)
    assert HEALTH_RULES <= set(diagnosis.passed)


def test_without_any_record_the_health_rules_are_not_evaluated_and_say_why():
    health, doc, diagnosis = _diagnose({})
    assert all(health[m] is None for m in HEALTH_METRICS) and doc is None
    reasons = {n.name: n.reason for n in diagnosis.not_evaluated if n.name in HEALTH_RULES}
    assert set(reasons) == HEALTH_RULES and all("no record of how the job ended" in r for r in reasons.values())


def test_a_run_still_running_is_no_failure():
    health, doc, diagnosis = _diagnose(_manifest((0, "running", None, 5), (1, "running", None, 5)))
    assert health["job_failed"] is False and not _health_findings(diagnosis)
    assert any("still running" in n for n in doc["notes"])


def test_a_text_metric_may_be_a_template_field_but_never_computed_with():
    assert compile_template("{health_summary}.", scope="run").metrics == {"health_summary"}
    with pytest.raises(ExprError, match="is text"):
        compile_expr("health_summary", scope="run")
    with pytest.raises(ExprError, match="is text"):
        compile_template("{health_summary + 1}", scope="run")


def _failed_run_without_trace(path, *, reason="RuntimeError: bad batch", steps=5):
    """A run directory as `ddpdoctor trace` leaves a job that failed before its profiled window: no trace."""
    import json

    (path / "ranks").mkdir(parents=True)
    ranks = [(0, "failed", PEER), (1, "failed", reason)]
    for rank, status, why in ranks:
        recorded = {"source": "optimizer", "count": steps, "wall_ms": [10.0] * steps, "profiled": []}
        capture = {"rank": rank, "world_size": 2, "status": status, "error": why, "backend": "gloo", "steps": recorded}
        (path / "ranks" / f"rank{rank}.json").write_text(json.dumps(capture))
    manifest = {
        "schema_version": 1,
        "world_size": 2,
        "exit_code": 1,
        "notes": ["the run ended before the profiled window (it starts at step 12): no trace was recorded"],
        "ranks": [{"rank": r, "status": s, "reason": w, "steps": steps, "trace_files": []} for r, s, w in ranks],
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def test_a_run_without_any_trace_is_diagnosed_from_how_it_ended(tmp_path):
    from ddpdoctor.pipeline import analyze_run

    analysis = analyze_run(_failed_run_without_trace(tmp_path / "run"))
    first = analysis.diagnosis.findings[0]
    assert (first.name, first.ranks) == ("rank-crashed", (1,))
    assert "rank 1 crashed after 5 steps: RuntimeError: bad batch" in first.message
    reasons = {n.name: n.reason for n in analysis.diagnosis.not_evaluated}
    assert "no trace was recorded" in reasons["poor-comm-compute-overlap"]
    assert "profiled window" in reasons["rank-straggler"]


def test_the_dashboard_of_a_run_without_trace_shows_the_failure(tmp_path):
    from ddpdoctor.tensorboard.report import build_report

    doc = build_report(_failed_run_without_trace(tmp_path / "run"), name="failed")
    assert doc["findings"][0]["name"] == "rank-crashed" and doc["source"] == "capture"
    assert any(line.startswith("rank 1: crashed (the cause)") for line in doc["health_lines"])
    assert str(tmp_path) not in json.dumps(doc)


def test_a_healthy_run_has_no_health_section_in_any_format():
    from ddpdoctor.pipeline import analyze_run
    from ddpdoctor.report import render

    result = analyze_run(Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank").diagnosis
    assert "health" not in build(result)["run"] and not health_lines(build(result))
    for fmt in ("text", "markdown", "html"):
        out = io.StringIO()
        render(result, fmt, out)
        assert "How the job ended" not in out.getvalue()


def test_several_ranks_that_raised_are_named_together_none_called_the_first():
    """Two ranks that raised the same exception before their first step (a traced job, 2026-12-07: ranks 0 and 1
    about 0.2 ms apart; torchrun named rank 1 the first to fail): the records hold no time of the failure, so no
    rank is called the first; the lowest one's error speaks for them."""
    error = 'RuntimeError: expect_autograd_hooks_ INTERNAL ASSERT FAILED at "reducer.cpp":1732'
    health, _, diagnosis = _diagnose(_manifest((0, "failed", error, 0), (1, "failed", error, 0)))
    assert health["startup_failed"] and "(first:" not in health["health_summary"], health["health_summary"]
    assert health["health_summary"].startswith("ranks 0, 1 failed; rank 0 before its first step: RuntimeError")
    # crashed after some steps: the advice is for both exceptions
    health, _, diagnosis = _diagnose(
        _manifest((0, "failed", "ValueError: a", 7), (1, "failed", "KeyError: b", 7), (2, "failed", PEER, 7))
    )
    assert health["rank_crashed"] and "(first:" not in health["health_summary"], health["health_summary"]
    assert health["health_summary"].startswith("ranks 0, 1 crashed; rank 0 after 7 steps: ValueError: a")
    assert health["health_advice"].startswith("Fix the exceptions of ranks 0, 1 (their tracebacks are in the job's")
