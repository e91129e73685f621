"""A script that crashes inside the profiled window keeps the steps recorded before the crash; one that crashes
before the window starts says so, in the manifest and on the terminal (issue 13, item 4). One process, ~10 s."""

from __future__ import annotations

import pytest
from helpers import read_json, run_cli, write_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SCRIPT = """
import os

import torch

model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
    if step == int(os.environ["CRASH_STEP"]):
        raise RuntimeError(f"crash at step {step}")
"""
WINDOW = ["--wait", "2", "--warmup", "1", "--active", "5"]  # profiles steps 4-8


def _trace(tmp_path, crash_step: int):
    script = write_script(tmp_path / "crash.py", SCRIPT)
    out = tmp_path / "run"
    result = run_cli("trace", "--out", str(out), *WINDOW, str(script), env={"CRASH_STEP": str(crash_step)})
    assert result.returncode == 1, result.stderr
    return out, result


def test_a_crash_inside_the_window_keeps_the_steps_before_it(tmp_path):
    out, _ = _trace(tmp_path, 6)
    rank = read_json(out / "manifest.json")["ranks"][0]
    assert rank["status"] == "failed" and rank["trace_files"] and rank["profiled_steps"]
    diagnosed = run_cli("diagnose", str(out), "--format", "json")
    assert diagnosed.returncode in (0, 1), diagnosed.stderr
    assert '"steps_analyzed"' in diagnosed.stdout


def test_a_crash_before_the_window_says_so(tmp_path):
    out, result = _trace(tmp_path, 1)
    manifest = read_json(out / "manifest.json")
    assert manifest["ranks"][0]["trace_files"] == []
    note = next(n for n in manifest["notes"] if "before the profiled window" in n)
    assert "rank 0 failed after 2 steps" in note and "step 4" in note
    assert "before the profiled window" in result.stderr and "rank 0 failed after 2 steps" in result.stderr
