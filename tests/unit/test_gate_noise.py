"""Run-to-run noise (issue 13, item 9): per-step samples of one run cannot see the spread between runs (machine
load, clocks, placement), so a rerun of the same job can move the step median by more than the threshold with a
bootstrap interval that excludes 0. A baseline made of several runs measures that spread, and the gate fails a
timing only when the current run is also outside the range of the baseline runs' values (issue 25: was a t
prediction interval, which one wild run of three blew up)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ddpdoctor.compare.baseline_file import dumps, from_json
from ddpdoctor.compare.gate import gate
from ddpdoctor.compare.snapshot import Snapshot, combine
from ddpdoctor.compare.thresholds import load_config

ENV = {"mode": "ddp", "world_size": 2, "backend": "gloo", "devices": ["cpu"], "torch_version": "2.13.0"}


def _run(median: float, seed: int, name: str | None = None, env: dict | None = None) -> Snapshot:
    """A run whose 40 steps sit tightly (±1 %) around ``median`` ms: within one run, very little noise."""
    steps = (median * (1 + np.random.default_rng(seed).normal(0, 0.01, 40))).tolist()
    return Snapshot(
        source=name or f"runs/r{seed}",
        environment=dict(env or ENV),
        metrics={"step_ms.median": float(np.median(steps)), "step_ms.p90": float(np.percentile(steps, 90))},
        samples={"step_ms": steps},
        findings=[],
        rules_evaluated=[],
    )


# three baseline runs of the same job on a busy machine: medians 100, 113, 92 ms (run-to-run spread ~10 %)
BASE_RUNS = [_run(100, 1), _run(113, 2), _run(92, 3)]


def _step(result):
    return next(c for c in result.metrics if c.metric == "step_ms.median")


def test_a_single_run_baseline_calls_a_rerun_in_its_own_noise_a_regression():
    # what the issue saw: +12 % with a per-step interval far from 0 fails against one run
    result = gate(_run(112, 4), BASE_RUNS[0], load_config(cwd="/"))
    assert _step(result).verdict == "regression"
    assert any("run-to-run" in n for n in result.notes)  # and it says that one run cannot measure it


def test_a_rerun_within_the_baseline_runs_spread_is_not_a_regression():
    base = combine(BASE_RUNS)
    result = gate(_run(112, 4), base, load_config(cwd="/"))
    check = _step(result)
    assert check.verdict == "within run-to-run noise" and check.outcome == "warn" and not result.failed
    assert check.run_spread is not None and check.run_spread > 0.1
    assert "3 baseline runs" in check.message
    # the margin is twice the range of the runs' medians (92 to 113 ms: 21% of the pooled median), said as such
    assert "run-to-run range 42.7% over 3 baseline runs" in check.message


def test_a_real_slowdown_still_fails_against_several_runs():
    check = _step(gate(_run(190, 5), combine(BASE_RUNS), load_config(cwd="/")))
    assert check.verdict == "regression" and check.outcome == "fail"
    assert "3 baseline runs" in check.message


def test_combined_baseline_pools_samples_and_keeps_each_runs_metrics_through_the_file():
    base = combine(BASE_RUNS)
    assert len(base.runs) == 3 and len(base.samples["step_ms"]) == 120
    assert base.origin == "runs/r1, runs/r2, runs/r3"
    again = from_json(json.loads(dumps(base)), "perf/baseline.json")
    assert [r["step_ms.median"] for r in again.runs] == pytest.approx([r["step_ms.median"] for r in base.runs], 1e-5)
    check = _step(gate(_run(112, 4), again, load_config(cwd="/")))
    assert check.verdict == "within run-to-run noise"


def test_baseline_runs_of_different_jobs_are_refused():
    with pytest.raises(ValueError, match="world_size"):
        combine([BASE_RUNS[0], _run(100, 9, env={**ENV, "world_size": 4})])


def test_baseline_command_takes_several_runs(tmp_path, capsys):
    import shutil
    from pathlib import Path

    from ddpdoctor.cli import main

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank"
    runs = []
    for name in ("a", "b", "c"):
        shutil.copytree(fixture, tmp_path / name)
        runs.append(str(tmp_path / name))
    out = tmp_path / "baseline.json"
    assert main(["baseline", *runs, "--output", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert len(doc["runs"]) == 3 and doc["run"] == ", ".join(runs)
    assert "3 runs" in capsys.readouterr().err
    # one run of another job among them: one line, exit 2
    other = tmp_path / "d"
    other.mkdir()
    shutil.copy(next(fixture.glob("rank0.*")), other)
    capsys.readouterr()
    assert main(["baseline", *runs[:2], str(other)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not runs of the same job" in err


def test_several_current_runs_are_compared_as_a_set_with_both_spreads():
    # three baseline runs that happen to sit within 0.5 % of each other: one rerun 12 % slower looks like a
    # regression, but three current runs that spread as widely as this machine does are within noise
    tight = combine([_run(100, 11), _run(100.5, 12), _run(99.6, 13)])
    assert _step(gate(_run(112, 14), tight, load_config(cwd="/"))).verdict == "regression"
    current = combine([_run(112, 15, "runs/c1"), _run(90, 16, "runs/c2"), _run(134, 17, "runs/c3")])
    check = _step(gate(current, tight, load_config(cwd="/")))
    assert check.verdict == "within run-to-run noise", check.message
    assert "3 baseline and 3 current runs" in check.message
    # and a slowdown every current run shows fails
    slow = combine([_run(180, 18, "runs/s1"), _run(185, 19, "runs/s2"), _run(178, 20, "runs/s3")])
    assert _step(gate(slow, combine(BASE_RUNS), load_config(cwd="/"))).verdict == "regression"


def test_gate_command_takes_several_current_runs(tmp_path, capsys):
    import shutil
    from pathlib import Path

    from ddpdoctor.cli import main

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank"
    runs = []
    for name in ("a", "b", "c", "d"):
        shutil.copytree(fixture, tmp_path / name)
        runs.append(str(tmp_path / name))
    base = tmp_path / "baseline.json"
    assert main(["baseline", *runs[:2], "--output", str(base)]) == 0
    capsys.readouterr()
    code = main(["gate", *runs[2:], "--baseline", str(base), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc
    step = next(m for m in doc["metrics"] if m["metric"] == "step_ms.median")
    assert "2 baseline and 2 current runs" in step["message"]
