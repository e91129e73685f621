"""The gate weighs a timing regression against the host's load the runs recorded: where the current run's training
loop waited for a CPU at least half the regression longer per step than the baseline's, and other processes used
more of the host's CPUs too, a shared CI runner's neighbours can explain it, so it warns ("host busier") and never
fails; a regression the wait cannot explain, or a wait on the job's own threads, fails as before."""

from __future__ import annotations

import numpy as np

from ddpdoctor.compare.baseline_file import dumps, from_json
from ddpdoctor.compare.gate import gate
from ddpdoctor.compare.snapshot import Snapshot
from ddpdoctor.compare.thresholds import load_config

ENV = {"mode": "ddp", "world_size": 2, "backend": "gloo", "devices": ["cpu"], "torch_version": "2.13.0"}


def _run(median: float, seed: int, cpu_wait_ms: float | None, others: float | None = None) -> Snapshot:
    steps = (median * (1 + np.random.default_rng(seed).normal(0, 0.01, 40))).tolist()
    metrics = {"step_ms.median": float(np.median(steps)), "step_ms.p90": float(np.percentile(steps, 90))}
    if cpu_wait_ms is not None:
        metrics["cpu_wait_ms"] = cpu_wait_ms
        metrics["other_cpu_cores"] = (0.1 if cpu_wait_ms < 5 else 1.4) if others is None else others
    return Snapshot(f"runs/r{seed}", dict(ENV), metrics, {"step_ms": steps}, findings=[], rules_evaluated=[])


def _step(result):
    return next(c for c in result.metrics if c.metric == "step_ms.median")


def test_a_slowdown_the_loops_wait_for_a_cpu_explains_warns_and_says_why():
    # 100 -> 130 ms a step; the loop waited 2 ms a step for a CPU in the baseline and 27 ms now
    result = gate(_run(130, 2, 27.0), _run(100, 1, 2.0), load_config(cwd="/"))
    check = _step(result)
    assert check.verdict == "host busier" and check.outcome == "warn" and not result.failed
    assert "waited 25.0 ms more per step for a CPU than in the baseline (2.0 -> 27.0 ms)" in check.message
    assert "while other processes used 1.40 CPUs (baseline 0.10)" in check.message
    assert "the host's load can explain the" in check.message and "rerun on a quiet machine" in check.message


def test_a_slowdown_the_wait_cannot_explain_still_fails():
    # 100 -> 130 ms with 10 ms more wait: less than half of the 30 ms
    check = _step(gate(_run(130, 2, 12.0), _run(100, 1, 2.0), load_config(cwd="/")))
    assert check.verdict == "regression" and check.outcome == "fail"
    # a quiet current run (less wait than the baseline) explains nothing either
    check = _step(gate(_run(130, 2, 0.0), _run(100, 1, 40.0), load_config(cwd="/")))
    assert check.verdict == "regression" and check.outcome == "fail"


def test_a_loop_that_waits_on_the_jobs_own_threads_still_fails():
    # the code now runs more threads than the host has CPUs: its loop waits, no other process is busier
    check = _step(gate(_run(130, 2, 27.0, others=0.1), _run(100, 1, 2.0, others=0.1), load_config(cwd="/")))
    assert check.verdict == "regression" and check.outcome == "fail"


def test_without_the_wait_on_either_side_the_regression_stands():
    for base_wait, cur_wait in ((None, 50.0), (2.0, None), (None, None)):  # foreign traces, an older baseline
        check = _step(gate(_run(130, 2, cur_wait), _run(100, 1, base_wait), load_config(cwd="/")))
        assert check.verdict == "regression" and check.outcome == "fail", (base_wait, cur_wait)


def test_the_wait_travels_in_the_baseline_file():
    base = from_json(__import__("json").loads(dumps(_run(100, 1, 2.0))), "baseline.json")
    assert base.value("cpu_wait_ms") == 2.0 and base.value("other_cpu_cores") == 0.1
    assert _step(gate(_run(130, 2, 27.0), base, load_config(cwd="/"))).verdict == "host busier"


def test_the_reports_say_the_numbers_behind_host_busier():
    import io

    from ddpdoctor.report import gate_text

    result = gate(_run(130, 2, 27.0), _run(100, 1, 2.0), load_config(cwd="/"))
    text = io.StringIO()
    gate_text.render(result, text)
    said = " ".join(text.getvalue().split())
    assert "host busier" in said and "warning: step_ms.median: " in said and "waited 25.0 ms more per step" in said
    markdown = "\n".join(gate_text.markdown_lines(result))
    assert "- ⚠️ step\\_ms.median: " in markdown and "waited 25.0 ms more per step" in markdown
