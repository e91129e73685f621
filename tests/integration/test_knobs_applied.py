"""`ddpdoctor trace --set`: each knob reaches the object it changes in every rank, as that object itself reports it
(DDP's own logging data, the DataLoader's attributes, torch's thread count), with no change to the script."""

from __future__ import annotations

import pytest
from helpers import SAMPLES, read_json, run_cli

pytestmark = [pytest.mark.integration]


@pytest.mark.timeout(200)
def test_ddp_and_thread_knobs_reach_every_rank(tmp_path):
    out = tmp_path / "run"
    knobs = {
        "ddp.bucket_cap_mb": "1",
        "ddp.comm_hook": "fp16",
        "ddp.gradient_as_bucket_view": "true",
        "ddp.static_graph": "true",
        "ddp.broadcast_buffers": "false",
        "env.OMP_NUM_THREADS": "1",
        "torch.intra_op_threads": "1",
    }
    sets = [a for k, v in knobs.items() for a in ("--set", f"{k}={v}")]
    result = run_cli(
        "trace", "--out", str(out), "--wait", "1", "--warmup", "1", "--active", "3", "--max-steps", "6", *sets,
        "--standalone", "--nproc-per-node", "2", str(SAMPLES / "ddp_train.py"), "--steps", "30", "--batch-size", "32",
        "--width", "128", timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    manifest = read_json(out / "manifest.json")
    assert {k: (v["value"], v["applied"]) for k, v in manifest["knobs"].items()} == {
        k: (v, 2) for k, v in knobs.items()
    }
    for rank in (0, 1):
        capture = read_json(out / "ranks" / f"rank{rank}.json")
        ddp = capture["ddp"][0]["logging_data"]  # what DDP itself says it was built with
        assert ddp["bucket_cap_bytes"] == 1024 * 1024 and ddp["comm_hook"] == "fp16_compress_hook"
        assert ddp["gradient_as_bucket_view"] == 1 and ddp["static_graph"] == 1 and ddp["broadcast_buffers"] == 0
        assert capture["threads"]["omp_num_threads"] == "1" and capture["threads"]["torch_intra_op_threads"] == 1


@pytest.mark.timeout(200)
def test_a_loader_knob_that_torch_refuses_fails_the_run_with_torchs_words(tmp_path):
    # prefetch_factor needs worker processes: DataLoader itself refuses it with num_workers=0
    result = run_cli(
        "trace", "--out", str(tmp_path / "run"), "--max-steps", "4", "--set", "loader.prefetch_factor=4",
        "--standalone", "--nproc-per-node", "2", str(SAMPLES / "ddp_train.py"), "--steps", "10", "--width", "64",
        timeout=180,
    )  # fmt: skip
    assert result.returncode != 0
    assert "prefetch_factor" in read_json(tmp_path / "run" / "manifest.json")["ranks"][0]["reason"]


@pytest.mark.timeout(200)
def test_workers_started_anew_every_epoch_are_measured_as_such(tmp_path):
    # a real job of 3 epochs of 3 batches with 1 worker process a rank, not persistent: the setup metrics say so
    # (dataloader-bound's clause on persistent_workers reads them; whether the wait fires it depends on the host)
    from ddpdoctor.load import load
    from ddpdoctor.metrics import analyze

    out = tmp_path / "run"
    result = run_cli(
        "trace", "--out", str(out), "--wait", "1", "--warmup", "1", "--active", "3", "--set", "loader.num_workers=1",
        "--standalone", "--nproc-per-node", "2", str(SAMPLES / "ddp_train.py"), "--steps", "3", "--epochs", "3",
        "--batch-size", "32", "--width", "64", timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = analyze(load(out, workers=1)).ranks
    got = {
        (r["dataloader_workers"], r["dataloader_persistent_workers"], r["dataloader_epochs"], r["batches_per_epoch"])
        for r in rows
    }
    assert got == {(1, False, 3, 3)}, got
