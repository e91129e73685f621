"""`ddpdoctor trace --max-steps N`: every rank stops cleanly at the same step boundary, exit 0, and the manifest
says ddpdoctor stopped the job (torchrun + gloo with torch.optim; one process with ddpdoctor.step() only)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import SAMPLES, read_json, run_cli, write_script

pytestmark = [pytest.mark.integration]

FAST = ["--wait", "1", "--warmup", "1", "--active", "3"]


@pytest.mark.timeout(240)
def test_torchrun_ranks_stop_at_the_same_step(tmp_path):
    out = tmp_path / "run"
    result = run_cli(
        "trace",
        "--out",
        str(out),
        *FAST,
        "--max-steps",
        "6",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(SAMPLES / "ddp_train.py"),
        "--steps",
        "40",
        "--batch-size",
        "32",
        "--width",
        "128",
        timeout=200,
    )
    assert result.returncode == 0, result.stderr
    manifest = read_json(out / "manifest.json")
    assert manifest["exit_code"] == 0 and manifest["stopped_by"] == "ddpdoctor --max-steps 6"
    assert [(r["rank"], r["status"], r["steps"]) for r in manifest["ranks"]] == [(0, "ok", 6), (1, "ok", 6)]
    for rank in (0, 1):
        capture = read_json(out / "ranks" / f"rank{rank}.json")
        assert capture["steps"]["count"] == 6 and len(capture["steps"]["wall_ms"]) == 5
        assert capture["stopped_by"] == "ddpdoctor --max-steps 6"
    assert "every rank stopped at the same step (ddpdoctor --max-steps 6)" in result.stderr
    assert "done: 40 steps" not in result.stdout  # the script's own end was never reached


@pytest.mark.timeout(120)
def test_one_process_without_optimizer_stops_after_n_manual_steps(tmp_path):
    script = write_script(
        tmp_path / "manual.py",
        """
        import torch, ddpdoctor
        w = torch.randn(32, 32, requires_grad=True)
        n = 0
        try:
            for _ in range(1000):
                torch.randn(8, 32).matmul(w).square().mean().backward()
                with torch.no_grad():
                    w -= 0.01 * w.grad
                    w.grad = None
                ddpdoctor.step()
                n += 1
        finally:
            print("finally ran after", n, "completed loop bodies")
        print("reached the end of the script")
        """,
    )
    out = tmp_path / "run"
    result = run_cli("trace", "--out", str(out), *FAST, "--max-steps", "7", str(script), cwd=tmp_path, timeout=100)
    assert result.returncode == 0, result.stderr
    assert "finally ran after 6 completed loop bodies" in result.stdout  # stopped inside the 7th step() call
    assert "reached the end of the script" not in result.stdout
    manifest = read_json(out / "manifest.json")
    assert manifest["stopped_by"] == "ddpdoctor --max-steps 7" and manifest["exit_code"] == 0
    (rank,) = manifest["ranks"]
    assert rank["status"] == "ok" and rank["steps"] == 7 and rank["step_source"] == "manual"
    assert manifest["cwd"] == str(Path(tmp_path).resolve())


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-steps", "0"], "argument --max-steps: must be a whole number from 1 to"),
        (["--set", "ddp.bucket_size=25"], "unknown knob 'ddp.bucket_size'; did you mean ddp.bucket_cap_mb?"),
        (["--set", "ddp.bucket_cap_mb=-1"], "ddp.bucket_cap_mb=-1: must be a number above 0"),
        (["--set", "loader.pin_memory=maybe"], "loader.pin_memory=maybe: must be true or false"),
        (["--set", "ddp.static_graph"], "expected KNOB=VALUE"),
    ],
)
def test_bad_max_steps_and_knobs_are_one_line_exit_2(tmp_path, args, message):
    script = write_script(tmp_path / "s.py", "print('ran')\n")
    result = run_cli("trace", "--out", str(tmp_path / "run"), *args, str(script), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr, result.stderr
    assert "ran" not in result.stdout and not (tmp_path / "run").exists()


@pytest.mark.timeout(180)
def test_ranks_started_by_mp_spawn_stop_at_the_same_step(tmp_path):
    out = tmp_path / "run"
    result = run_cli(
        "trace",
        "--out",
        str(out),
        *FAST,
        "--max-steps",
        "7",
        str(SAMPLES / "ddp_spawn.py"),
        "--nprocs",
        "2",
        timeout=160,
    )
    assert result.returncode == 0, result.stderr
    manifest = read_json(out / "manifest.json")
    assert manifest["launch"] == "spawn" and manifest["stopped_by"] == "ddpdoctor --max-steps 7"
    assert [(r["rank"], r["status"], r["steps"]) for r in manifest["ranks"]] == [(0, "ok", 7), (1, "ok", 7)]
