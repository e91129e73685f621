"""Gate decisions on Snapshots: threshold AND noise test, memory without samples, rules, environment; the
baseline file round trip; JUnit XML; GitHub Actions output. (End-to-end runs:
tests/integration/test_gate_*.)"""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from ddpdoctor.compare import gate, load_config
from ddpdoctor.compare.baseline_file import dumps, from_json
from ddpdoctor.compare.snapshot import Snapshot
from ddpdoctor.report import RENDERERS, Document, OutputFormat, github, junit, renderer

ENV = {
    "ddpdoctor_version": "0.1.0",
    "torch_version": "2.13.0+cpu",
    "python": "3.11",
    "mode": "ddp",
    "world_size": 2,
    "backend": "gloo",
    "devices": ["cpu"],
    "batch_size_per_rank": 64,
}


def _snap(
    step_median: float,
    *,
    seed: int,
    exposed: float = 1.0,
    memory: float | None = None,
    findings: list[dict] | None = None,
    env: dict | None = None,
    samples: bool = True,
) -> Snapshot:
    rng = np.random.default_rng(seed)
    steps = (step_median + rng.gamma(2.0, 0.5, 25) - 1.0).tolist()
    exposed_s = (exposed + rng.normal(0, 0.2, 10)).tolist()
    return Snapshot(
        source=f"run-{seed}",
        environment=dict(env or ENV),
        metrics={
            "step_ms.median": float(np.median(steps)),
            "step_ms.p90": float(np.percentile(steps, 90)),
            "exposed_comm_ms": float(np.mean(exposed_s)),
            "gpu0_peak_reserved_bytes": memory,
            "overlap_ratio": None,
        },
        samples={"step_ms": steps, "exposed_comm_ms": exposed_s} if samples else {},
        findings=findings if findings is not None else [],
        rules_evaluated=["rank-straggler", "gpu0-oom-risk"],
    )


def _finding(name: str, severity: str) -> dict:
    return {"id": "X", "name": name, "severity": severity, "ranks": [0], "message": f"{name} fired"}


def _check(result, metric):
    return next(c for c in result.metrics if c.metric == metric)


def test_same_performance_passes():
    result = gate(_snap(30, seed=2), _snap(30, seed=1), load_config(cwd="/"))
    assert not result.failed and result.exit_code == 0
    assert _check(result, "step_ms.median").verdict in ("ok", "within noise")


def test_slowdown_is_a_regression_with_its_interval():
    result = gate(_snap(70, seed=2, exposed=5.0), _snap(30, seed=1), load_config(cwd="/"))
    assert result.failed and result.exit_code == 1
    step = _check(result, "step_ms.median")
    assert step.verdict == "regression" and step.interval is not None and step.interval.low > 0.5
    assert "step_ms.median" in step.message and "interval" in step.message
    assert _check(result, "exposed_comm_ms").verdict == "regression"


def test_past_threshold_but_noise_only_warns():
    # a +15 % median from 6 wildly varying samples: past +10 %, but the interval contains no change
    base = Snapshot("a", ENV, {"step_ms.median": 30.0}, {"step_ms": [20.0, 30, 40, 25, 35, 50]}, findings=[])
    cur = Snapshot("b", ENV, {"step_ms.median": 34.5}, {"step_ms": [21.0, 34.5, 45, 26, 38, 51]}, findings=[])
    check = _check(gate(cur, base, load_config(cwd="/")), "step_ms.median")
    assert check.verdict == "within noise" and check.outcome == "warn"


def test_timing_without_samples_cannot_fail():
    result = gate(_snap(70, seed=2, samples=False), _snap(30, seed=1, samples=False), load_config(cwd="/"))
    assert _check(result, "step_ms.median").verdict == "no samples" and not result.failed


def test_memory_fails_on_the_threshold_alone():
    result = gate(_snap(30, seed=2, memory=12e9), _snap(30, seed=1, memory=10e9), load_config(cwd="/"))
    check = _check(result, "gpu0_peak_reserved_bytes")
    assert check.verdict == "regression" and result.failed
    ok = gate(_snap(30, seed=2, memory=10.5e9), _snap(30, seed=1, memory=10e9), load_config(cwd="/"))
    assert _check(ok, "gpu0_peak_reserved_bytes").verdict == "ok"


def test_improvement_is_not_a_failure():
    result = gate(_snap(15, seed=2), _snap(30, seed=1), load_config(cwd="/"))
    assert _check(result, "step_ms.median").verdict == "improved" and not result.failed


def test_new_findings_fail_from_fail_on():
    base = _snap(30, seed=1, findings=[_finding("rank-straggler", "warning")])
    cur = _snap(30, seed=2, findings=[_finding("rank-straggler", "warning"), _finding("gpu0-oom-risk", "error")])
    result = gate(cur, base, load_config(cwd="/"))
    by_rule = {r.rule: r for r in result.rules}
    assert by_rule["gpu0-oom-risk"].verdict == "new finding" and result.failed
    assert by_rule["rank-straggler"].verdict == "already in baseline"
    lenient = gate(cur, base, load_config(fail_on="off", cwd="/"))
    assert not lenient.failed and {r.rule: r for r in lenient.rules}["gpu0-oom-risk"].outcome == "warn"


def test_new_warning_fails_with_fail_on_warning():
    cur = _snap(30, seed=2, findings=[_finding("rank-straggler", "warning")])
    assert not gate(cur, _snap(30, seed=1), load_config(cwd="/")).failed  # default: error
    assert gate(cur, _snap(30, seed=1), load_config(fail_on="warning", cwd="/")).failed


def test_environment_difference_warns_and_fails_only_strict():
    other = {**ENV, "world_size": 4, "torch_version": "2.12.0+cu121"}
    result = gate(_snap(30, seed=2, env=other), _snap(30, seed=1), load_config(cwd="/"))
    assert {d.key for d in result.env_diffs} == {"world_size", "torch_version"} and not result.failed
    text = io.StringIO()
    renderer(Document.GATE, OutputFormat.TEXT)(result, text)
    assert "environment differs from the baseline: world_size was 2, now 4" in text.getvalue()
    assert gate(_snap(30, seed=2, env=other), _snap(30, seed=1), load_config(strict_env=True, cwd="/")).failed


def test_steps_of_different_work_are_an_environment_difference():
    """Plain traces whose profiler marked steps of two iterations against one: said, as any set-up difference;
    unknown on either side (a baseline from before it was recorded), or about equal, nothing."""
    one, two = {**ENV, "optimizer_steps_per_step": 1.0}, {**ENV, "optimizer_steps_per_step": 2.0}
    result = gate(_snap(60, seed=2, env=two), _snap(30, seed=1, env=one), load_config(cwd="/"))
    assert [(d.key, d.baseline, d.current) for d in result.env_diffs] == [("optimizer_steps_per_step", 1.0, 2.0)]
    for baseline, current in ((ENV, two), (one, {**ENV, "optimizer_steps_per_step": 1.1})):
        assert (
            gate(_snap(30, seed=2, env=current), _snap(30, seed=1, env=baseline), load_config(cwd="/")).env_diffs == ()
        )


def test_baseline_round_trip():
    snap = _snap(30, seed=1, memory=1e9, findings=[_finding("rank-straggler", "warning")])
    text = dumps(snap)
    assert '"step_ms": [' in text and text.count("\n") < 60  # samples on one line each: reviewable
    back = from_json(json.loads(text), "baseline.json")
    assert back.is_baseline and back.environment == snap.environment
    assert back.samples["step_ms"] == pytest.approx(snap.samples["step_ms"], rel=1e-4)
    assert back.value("gpu0_peak_reserved_bytes") == 1e9 and back.findings == snap.findings
    with pytest.raises(ValueError, match="not a ddpdoctor baseline"):
        from_json({"metrics": {}}, "x.json")
    with pytest.raises(ValueError, match="newer"):
        from_json({**json.loads(text), "schema_version": 99}, "x.json")


def test_every_gate_format_has_a_renderer():
    assert set(RENDERERS[Document.GATE]) == set(OutputFormat)
    result = gate(_snap(70, seed=2), _snap(30, seed=1), load_config(cwd="/"))
    for fmt in OutputFormat:
        out = io.StringIO()
        renderer(Document.GATE, fmt)(result, out)
        name = "step\\_ms.median" if fmt is OutputFormat.MARKDOWN else "step_ms.median"  # Markdown escapes _
        assert name in out.getvalue(), fmt
    doc = json.loads(_render(result, OutputFormat.JSON))
    assert doc["result"] == "fail" and doc["exit_code"] == 1
    step = next(m for m in doc["metrics"] if m["metric"] == "step_ms.median")
    assert step["verdict"] == "regression" and step["interval"]["low"] > 0 and step["change_kind"] == "relative"


def _render(result, fmt) -> str:
    out = io.StringIO()
    renderer(Document.GATE, fmt)(result, out)
    return out.getvalue()


def test_junit_has_a_testcase_per_metric_rule_and_environment():
    cur = _snap(70, seed=2, findings=[_finding("gpu0-oom-risk", "error")])
    result = gate(cur, _snap(30, seed=1), load_config(cwd="/"))
    root = ET.fromstring(junit.to_bytes(result))
    cases = {(c.get("classname"), c.get("name")): c for c in root.iter("testcase")}
    assert ("ddpdoctor.gate.metrics", "step_ms.median") in cases
    assert ("ddpdoctor.gate.rules", "gpu0-oom-risk") in cases and (
        "ddpdoctor.gate.rules",
        "rank-straggler",
    ) in cases
    assert ("ddpdoctor.gate.environment", "environment") in cases
    failed = {name for (_, name), c in cases.items() if c.find("failure") is not None}
    assert {"step_ms.median", "gpu0-oom-risk"} <= failed
    assert int(root.get("failures")) == len(failed) and int(root.get("tests")) == len(cases)
    skipped = {name for (_, name), c in cases.items() if c.find("skipped") is not None}
    assert "overlap_ratio" in skipped  # measured in neither run


def test_github_annotations_are_escaped():
    result = gate(_snap(70, seed=2), _snap(30, seed=1), load_config(cwd="/"))
    lines = github.annotations(result)
    step = next(line for line in lines if "step_ms.median" in line)
    assert step.startswith("::error title=ddpdoctor gate%3A step_ms.median::step_ms.median: ")
    assert "%25" in step and "%" not in step.replace("%25", "").replace("%3A", "").replace("%2C", "")
    assert all("\n" not in line for line in lines)


def test_step_summary_is_appended(tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    result = gate(_snap(70, seed=2), _snap(30, seed=1), load_config(cwd="/"))
    github.append_step_summary(result, str(summary))
    text = summary.read_text()
    assert text.startswith("earlier step\n") and "| ❌ | step\\_ms.median |" in text and "FAIL" in text
