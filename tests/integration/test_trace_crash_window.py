"""A script that crashes inside the profiled window keeps the steps recorded before the crash; one that crashes
before the window starts says so, in the manifest and on the terminal (issue 13, item 4). One process, ~10 s."""

from __future__ import annotations

import json

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
    # steps 4-6 ran whole; step 7 was cut short by the crash (its trace ends at it) and is not analysed
    assert json.loads(diagnosed.stdout)["run"]["steps_analyzed"] == 3, diagnosed.stdout[:2000]


def test_a_crash_before_the_window_says_so(tmp_path):
    out, result = _trace(tmp_path, 1)
    manifest = read_json(out / "manifest.json")
    assert manifest["ranks"][0]["trace_files"] == []
    note = next(n for n in manifest["notes"] if "before the profiled window" in n)
    assert "rank 0 failed after 2 steps" in note and "step 4" in note
    assert "before the profiled window" in result.stderr and "rank 0 failed after 2 steps" in result.stderr


ENDS_IN_WINDOW = """
import torch

model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):  # the window (steps 4-8) starts at the 4th optimizer step: the run ends in it
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_a_run_that_ends_in_the_first_step_of_its_window_analyses_no_step(tmp_path):
    # The profiler recorded from the 4th optimizer step to the exit: part of a step, which read as a whole (a
    # 2 ms "step" of an accelerate job whose steps take 30-60 ms). It is not analysed, and the report says why.
    script = write_script(tmp_path / "short.py", ENDS_IN_WINDOW)
    out = tmp_path / "run"
    traced = run_cli("trace", "--out", str(out), *WINDOW, str(script))
    assert traced.returncode == 0, traced.stderr
    rank = read_json(out / "ranks" / "rank0.json")
    assert rank["steps"]["count"] == 4 and rank["steps"]["profiled"] == [] and rank["trace_files"]
    for args in ([], ["--steps", "0.."]):  # from the rank's summary, and from its trace
        diagnosed = run_cli("diagnose", str(out), "--format", "json", *args)
        if args and diagnosed.returncode == 2:  # no analysable step in the range: one clear line
            assert "none of the run's profiled steps" in diagnosed.stderr
            continue
        assert diagnosed.returncode == 0, diagnosed.stderr
        report = json.loads(diagnosed.stdout)
        assert report["run"]["steps_analyzed"] == 0 and report["findings"] == []
        note = next(n for n in report["run"]["notes"] if n.startswith("No complete step was recorded"))
        assert "the run ended in step 4" in note and "it starts at step 4" in note
