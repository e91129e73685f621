"""The gate's memory and input bounds (issue 23, items 5 and 14).

``gate`` of a 10,000-rank run was killed at 24 GB: ``baseline`` kept one sample per rank per step and the
bootstrap built a (resamples x samples) index array. The samples of a run are now bounded (per step, means over
groups of ranks, when a run has more than ``samples.MAX_SAMPLES`` rank-steps), the bootstrap batches its
resamples, and a baseline file is bounded in size, in samples per metric and in magnitude when it is read.
"""

from __future__ import annotations

import json
import tracemalloc
import warnings
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from ddpdoctor.cli import main
from ddpdoctor.compare import samples as smp
from ddpdoctor.compare import stats
from ddpdoctor.compare.baseline_file import dumps, from_json
from ddpdoctor.compare.gate import gate
from ddpdoctor.compare.snapshot import Snapshot, build, combine
from ddpdoctor.compare.thresholds import load_config

STEPS = 20
COLUMNS = ("dataloader_ms", "forward_ms", "backward_ms", "optimizer_ms", "other_ms", "comm_ms", "exposed_comm_ms")


def _metrics(ranks: int, seed: int, exposed_ms: float) -> SimpleNamespace:
    """RunMetrics-like: ``ranks`` ranks x 20 profiled steps, each rank with its own level (rank 0 waits less)
    plus per-step jitter, as the recorded 2-rank run has."""
    rng = np.random.default_rng(seed)
    rank = np.repeat(np.arange(ranks), STEPS)
    step = np.tile(np.arange(8, 8 + STEPS), ranks)
    n = ranks * STEPS
    level = rng.normal(0, 0.5, ranks)[rank]
    frame = {"rank": rank, "step": step, "analyzed": np.ones(n, dtype=bool)}
    for c in COLUMNS:
        frame[c] = np.abs(rng.normal(3.0, 0.3, n) + level)
    frame["exposed_comm_ms"] = np.abs(exposed_ms + level + rng.gamma(2.0, 0.4, n))
    frame["comm_ms"] = frame["exposed_comm_ms"] + 4.0
    frame["overlap_ratio"] = 1 - frame["exposed_comm_ms"] / frame["comm_ms"]
    frame["step_ms"] = 30 + rng.gamma(2.0, 0.5, n)
    per_step = pd.DataFrame(frame)
    means = per_step.groupby("rank")[list(COLUMNS)].mean()
    ranks_list = [{"rank": int(r), **row} for r, row in zip(means.index, means.to_dict("records"), strict=True)]
    return SimpleNamespace(ranks=ranks_list, run={"mode": "ddp", "world_size": ranks}, per_step=per_step)


def _captures(ranks: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    wall = 30 + rng.gamma(2.0, 0.5, (ranks, 30))
    return [
        {
            "rank": r,
            "world_size": ranks,
            "status": "ok",
            "steps": {"first": 1, "wall_ms": wall[r].tolist(), "profiled": [[8, 8 + STEPS - 1]]},
            "schedule": {"wait": 5, "warmup": 2, "active": STEPS, "repeat": 1},
        }
        for r in range(ranks)
    ]


def _exposed(result):
    return next(c for c in result.metrics if c.metric == "exposed_comm_ms")


@pytest.mark.parametrize("ranks", [500, 10_000])
def test_gate_memory_is_bounded_and_still_catches_a_regression(ranks):
    base_in = (_captures(ranks, 1), _metrics(ranks, 1, 5.0))
    slow_in = (_captures(ranks, 2), _metrics(ranks, 2, 8.0))  # +3 ms exposed communication per step
    same_in = (_captures(ranks, 3), _metrics(ranks, 3, 5.0))
    config = load_config(cwd="/")
    tracemalloc.start()
    try:
        baseline = from_json(json.loads(dumps(build("runs/base", *base_in))), "perf/baseline.json")
        slow = gate(build("runs/slow", *slow_in), baseline, config)
        same = gate(build("runs/same", *same_in), baseline, config)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200 * 2**20, f"gate statistics peaked at {peak / 2**20:.0f} MiB for {ranks} ranks x {STEPS} steps"
    assert all(len(v) <= smp.MAX_SAMPLES for v in baseline.samples.values())
    assert _exposed(slow).verdict == "regression" and slow.failed
    assert _exposed(same).verdict == "ok" and not same.failed
    # the mean is kept: the samples' mean is every rank-step's mean
    exact = float(base_in[1].per_step["exposed_comm_ms"].mean())
    assert baseline.value("exposed_comm_ms") == pytest.approx(exact, rel=1e-5)


def test_small_runs_keep_every_rank_step_sample():
    # up to MAX_SAMPLES rank-steps the samples are what they always were (the noise tests hold unchanged)
    snap = build("runs/a", [], _metrics(8, 1, 5.0))
    assert len(snap.samples["exposed_comm_ms"]) == 8 * STEPS


def test_large_runs_are_reduced_per_step_over_groups_of_ranks():
    rank = np.repeat(np.arange(400), STEPS)
    step = np.tile(np.arange(STEPS), 400)
    values = rank * 1.0 + step * 1000.0
    out, note = smp.reduce_rank_steps(rank, step, values, "mean")
    assert len(out) <= smp.MAX_SAMPLES and len(out) % STEPS == 0
    assert np.mean(out) == pytest.approx(np.mean(values))
    # each sample belongs to one step: no mixing of steps
    assert sorted({round(v, -3) for v in out}) == [s * 1000.0 for s in range(STEPS)]
    assert "400 ranks" in note and f"{STEPS} steps" in note


def test_combined_baseline_of_many_runs_is_bounded():
    runs = [
        Snapshot(
            source=f"runs/r{i}",
            environment={"world_size": 2},
            metrics={"step_ms.median": 30.0},
            samples={"step_ms": list(30 + np.random.default_rng(i).gamma(2.0, 0.5, smp.MAX_SAMPLES))},
            findings=[],
            rules_evaluated=[],
        )
        for i in range(12)
    ]
    base = combine(runs)
    assert len(base.samples["step_ms"]) <= smp.MAX_POOLED
    assert len(base.samples["step_ms"]) == 12 * (smp.MAX_POOLED // 12)  # every run weighs the same
    again = from_json(json.loads(dumps(base)), "b.json")
    assert again.samples["step_ms"] == pytest.approx(base.samples["step_ms"], rel=1e-4)
    assert not again.notes


def test_bootstrap_memory_is_bounded_for_a_long_sample_list():
    # more than the bootstrap resamples in full (MAX_POOLED): reduced to quantiles, resampled in batches
    a = 30 + np.random.default_rng(1).gamma(2.0, 0.5, 6_000)
    b = 33 + np.random.default_rng(2).gamma(2.0, 0.5, 6_000)
    tracemalloc.start()
    try:
        interval = stats.change_interval(a, b, "median", relative=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 100 * 2**20, f"{peak / 2**20:.0f} MiB"
    change = float(np.median(b) / np.median(a) - 1)  # about +9.7 %
    assert interval is not None and 0.09 < interval.low < change < interval.high < 0.105


# ---- the baseline file


GOOD = {
    "schema_version": 1,
    "kind": "ddpdoctor-baseline",
    "run": "runs/a",
    "environment": {"world_size": 2, "mode": "ddp"},
    "metrics": {"step_ms.median": 30.0, "step_ms.p90": 33.0},
    "samples": {"step_ms": [30.0, 31.0, 29.0, 30.5, 30.2, 29.8]},
    "findings": [],
    "rules_evaluated": [],
    "notes": [],
}


def _gate(tmp_path, capsys, text: str) -> tuple[int, str]:
    base = tmp_path / "baseline.json"
    base.write_text(text)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(GOOD))
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(["gate", str(good), "--baseline", str(base)])
    err = capsys.readouterr().err
    assert not caught, [str(w.message) for w in caught]
    return code, err


def test_a_baseline_with_too_many_samples_is_refused(tmp_path, capsys):
    doc = {**GOOD, "samples": {"step_ms": [30.0] * (50_001)}}
    code, err = _gate(tmp_path, capsys, json.dumps(doc))
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "baseline.json" in err and "samples.step_ms" in err and "50000" in err


def test_a_huge_baseline_file_is_refused_before_it_is_parsed(tmp_path, capsys):
    doc = {**GOOD, "notes": ["x" * 2**20] * 40}  # 40 MiB
    code, err = _gate(tmp_path, capsys, json.dumps(doc))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "baseline.json" in err and "MiB" in err


def test_an_older_baseline_with_many_samples_still_gates(tmp_path, capsys):
    # earlier versions kept one sample per rank per step: such a file is read, the bootstrap sees a bounded set
    samples = (30 + np.random.default_rng(1).gamma(2.0, 0.5, 20_000)).round(4).tolist()
    doc = {**GOOD, "metrics": {"step_ms.median": float(np.median(samples))}, "samples": {"step_ms": samples}}
    code, err = _gate(tmp_path, capsys, json.dumps(doc))
    assert code == 0, err


@pytest.mark.parametrize(
    "field,doc",
    [
        ("samples.step_ms[0]", {**GOOD, "samples": {"step_ms": [1.7e308, -1.7e308, 30.0, 31.0, 29.0, 30.5]}}),
        ("metrics.step_ms.median", {**GOOD, "metrics": {"step_ms.median": 1.7e308}}),
        (
            "runs[1].metrics.step_ms.median",
            {**GOOD, "runs": [{"metrics": {}}, {"metrics": {"step_ms.median": -1e300}}]},
        ),
    ],
)
def test_a_value_no_run_records_is_refused_without_a_warning(tmp_path, capsys, field, doc):
    code, err = _gate(tmp_path, capsys, json.dumps(doc))
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "baseline.json" in err and f'"{field}"' in err


def test_statistics_of_huge_values_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        big = [1.7e308, -1.7e308, 1.0, 2.0, 3.0, 4.0]
        assert stats.change_interval(big, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "mean", relative=False) is None
        assert stats.run_spread([1e308, -1e308, 5.0], 1.0, relative=False) is None


def test_baseline_never_writes_a_file_gate_refuses(tmp_path, capsys, monkeypatch):
    import ddpdoctor.compare

    # what a run directory whose capture file records a step of 1.7e308 ms gives: gate could not read it back
    snap = from_json(GOOD, "runs/a")
    huge = Snapshot(**{**snap.__dict__, "samples": {"step_ms": [1.7e308, 1.0, 2.0, 3.0, 4.0]}, "is_baseline": False})
    monkeypatch.setattr(ddpdoctor.compare, "read_input", lambda *a, **k: huge)
    out = tmp_path / "baseline.json"
    code = main(["baseline", str(tmp_path), "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert '"samples.step_ms[0]"' in err and not out.exists()
