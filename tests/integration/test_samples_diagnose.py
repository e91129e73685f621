"""Each bundled sample, traced for real and diagnosed: exactly the rule it demonstrates fires (and none on the
healthy one), with evidence in a plausible range.

Every sample is traced once per module (short windows: 10 steps, `--wait 2 --warmup 1 --active 4`); the DDP samples
run as 2-rank torchrun + gloo on the CPU, `gil_threads.py` as one process.
"""

from __future__ import annotations

import json

import pytest
from helpers import SAMPLES, run_cli

pytestmark = [pytest.mark.integration]

WINDOW = ["--wait", "2", "--warmup", "1", "--active", "4"]
DDP = ["--standalone", "--nproc-per-node", "2"]


def _trace_and_diagnose(
    tmp_path_factory, name: str, launch: list[str], args: list[str], window: list[str] = WINDOW
) -> dict:
    out = tmp_path_factory.mktemp("samples") / name
    traced = run_cli(
        "trace", "-q", "--out", str(out), *window, *launch, str(SAMPLES / f"{name}.py"), *args, timeout=150
    )
    assert traced.returncode == 0, traced.stderr[-3000:]
    diagnosed = run_cli("diagnose", str(out), "--format", "json", timeout=60)
    assert diagnosed.returncode == 0, diagnosed.stderr[-3000:]
    return json.loads(diagnosed.stdout)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    # On a shared 2-core machine, a busy neighbour can starve one rank for the whole run, and then it really is a
    # straggler (seen: 158 ms of waiting in 235 ms steps, against ~100 ms steps on a quiet machine). A second
    # trace tells that apart from a sample that is not healthy; the test fails if both runs have findings.
    first = _trace_and_diagnose(tmp_path_factory, "ddp_train", DDP, ["--steps", "10"])
    if not first["findings"]:
        return first
    return _trace_and_diagnose(tmp_path_factory, "ddp_train", DDP, ["--steps", "10"])


@pytest.fixture(scope="module")
def poor_overlap(tmp_path_factory):
    return _trace_and_diagnose(tmp_path_factory, "ddp_poor_overlap", DDP, ["--steps", "10"])


@pytest.fixture(scope="module")
def straggler(tmp_path_factory):
    # A long delay (150 ms) on rank 1 keeps the sample's small exposed all-reduce (~5 ms) under the 5% step share
    # of poor-comm-compute-overlap / ddp-bucket-size-mismatch, so the straggler is the one thing wrong with it.
    # Eight profiled steps: the all-reduces of one step count as one observation, and with 2 ranks "last in every
    # step" is chance with p = 2**-n, below the test's bound from 8 steps on.
    window = ["--wait", "2", "--warmup", "1", "--active", "8"]
    return _trace_and_diagnose(tmp_path_factory, "ddp_straggler", DDP, ["--steps", "14", "--slow-ms", "150"], window)


@pytest.fixture(scope="module")
def slow_dataloader(tmp_path_factory):
    # 2 ms a sample (~70 ms of loading per step) keeps the small exposed all-reduce (~2 ms) of this sample under
    # the 5% step share of poor-comm-compute-overlap / ddp-bucket-size-mismatch.
    return _trace_and_diagnose(tmp_path_factory, "ddp_slow_dataloader", DDP, ["--steps", "10", "--cost-ms", "2"])


@pytest.fixture(scope="module")
def gil_threads(tmp_path_factory):
    # The rule needs two or more of the job's threads making progress in the median step. On this shared 2-core
    # machine a busy neighbour can starve the sample's threads so that only one runs in most steps (seen in CI while
    # another traced job ran: no finding, a miss, never a false one). Eight profiled steps steady the median; a
    # second trace tells a starved run from a sample that is not GIL-bound; the test fails if both runs miss.
    window = ["--wait", "2", "--warmup", "1", "--active", "8"]

    def traced() -> dict:
        out = tmp_path_factory.mktemp("samples") / "gil_threads"
        run = run_cli(
            "trace", "-q", "--out", str(out), *window, str(SAMPLES / "gil_threads.py"), "--steps", "14", timeout=150
        )
        assert run.returncode == 0, run.stderr[-3000:]
        diagnosed = run_cli("diagnose", str(out), "--format", "json", timeout=60)
        assert diagnosed.returncode == 0, diagnosed.stderr[-3000:]
        return json.loads(diagnosed.stdout)

    first = traced()
    if any(f["name"] == "gil-contention" for f in first["findings"]):
        return first
    return traced()


def _findings(report: dict) -> dict[str, dict]:
    return {f["name"]: f for f in report["findings"]}


def _only(report: dict, name: str) -> dict:
    """Exactly `name` fired (any severity, info included); return its finding."""
    found = _findings(report)
    assert set(found) == {name}, json.dumps(report["findings"], indent=1)
    return found[name]


def _metric(report: dict, rank: int, name: str):
    return next(r for r in report["ranks"] if r["rank"] == rank)[name]


@pytest.mark.timeout(240)
def test_healthy_ddp_train_has_no_findings(healthy):
    assert healthy["findings"] == [], json.dumps(healthy["findings"], indent=1)
    assert healthy["run"]["world_size"] == 2
    assert healthy["run"]["steps_analyzed"] >= 3
    for rank in (0, 1):
        assert _metric(healthy, rank, "gil_contention") < 0.2


@pytest.mark.timeout(240)
def test_poor_overlap_sample(poor_overlap):
    if not poor_overlap["findings"]:
        # a busy host (CI clone 2026-12-07, beside other jobs: the backend's threads waited 25 ms a step for a CPU
        # against 24 ms of exposed transfer) leaves it undecided, said with the numbers: never passed
        assert "poor-comm-compute-overlap" not in poor_overlap["passed"]
        why = {n["name"]: n["reason"] for n in poor_overlap["not_evaluated"]}["poor-comm-compute-overlap"]
        assert why.startswith("the host was busy, and communication waited for a CPU too: "), why
        assert "cannot be told from the host's" in why, why
        return
    f = _only(poor_overlap, "poor-comm-compute-overlap")
    assert f["severity"] == "warning" and f["ranks"] == [0, 1]
    ev = f["evidence"]
    assert 0.0 <= ev["mean(overlap_ratio)"] < ev["params.min_overlap"]
    # DDP's share of the exposed transfer (the sample issues no collective of its own, and no optimizer's)
    assert ev["mean(ddp_exposed_transfer_ms)"] > ev["params.min_exposed_ms"]
    assert 0.05 < ev["mean(ddp_exposed_transfer_ms)"] / ev["mean(step_ms_median)"] < 1.0
    assert 0 < f["estimated_gain_ms"] < ev["mean(step_ms_median)"]


@pytest.mark.timeout(240)
def test_straggler_sample_names_rank_1(straggler):
    f = _only(straggler, "rank-straggler")
    assert f["severity"] == "warning" and f["ranks"] == [1]
    ev = f["evidence"]
    # Rank 1 sleeps 150 ms a step: rank 0 waits for most of it, inside the collectives.
    assert 100 < ev["straggler_wait_ms"] < 200
    assert ev["straggler_wait_ms"] / ev["mean(step_ms_median)"] > 0.5
    # rank 1 is last at (nearly) every collective: far above the 1 in 2 chance
    assert ev["slow_rank"] == {"1": True} and ev["wait_caused_ms"]["1"] > 50
    assert "chance explains its arrivals with p = " in f["message"]


@pytest.mark.timeout(240)
def test_slow_dataloader_sample(slow_dataloader):
    f = _only(slow_dataloader, "dataloader-bound")
    assert f["severity"] == "warning" and f["ranks"] == [0, 1]
    ev = f["evidence"]
    for rank in ("0", "1"):
        # 32 samples x ~2 ms of sleep per batch in the main process.
        assert 50 < ev["dataloader_ms"][rank] < 250
        assert ev["dataloader_ms"][rank] / ev["step_ms_median"][rank] > 0.5


@pytest.mark.timeout(240)
def test_gil_threads_sample(gil_threads):
    f = _only(gil_threads, "gil-contention")
    assert f["severity"] == "warning" and f["ranks"] == [0]
    assert gil_threads["run"]["mode"] == "single"
    contention = _metric(gil_threads, 0, "gil_contention")
    assert 0.2 < contention <= 1.0
    assert f["evidence"]["gil_contention"]["0"] == pytest.approx(contention)
