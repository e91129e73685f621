"""A job whose start outlasts --no-step-limit (60 s by default: loading data, an initial evaluation) before its
first optimizer step. The start-up's recording, kept in case the run never steps, was analysed as one more step
("6 steps analysed" of 5), the profiler's steps ran one ahead of the run's ("profiling steps 7-11" announced as
8-12), and with two ranks the run analysed 1 step. A run that never steps still keeps its start-up trace."""

from __future__ import annotations

import json

import pytest
from helpers import free_port, read_json, run_cli, write_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SCRIPT = """
import os
import time

import torch
import torch.distributed as dist

distributed = "RANK" in os.environ
if distributed:
    dist.init_process_group("gloo")
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
if os.environ.get("EVALUATE"):  # an initial evaluation: forwards and no step, past the limit
    t0 = time.time()
    with torch.no_grad():
        while time.time() - t0 < 1.6:
            model(torch.randn(8, 16))
            time.sleep(0.01)
else:
    time.sleep(1.6)  # loading the data: nothing but waiting
if os.environ.get("NO_STEP"):
    raise SystemExit(0)
if distributed:
    model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(12):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
if distributed:
    dist.barrier()
"""

WINDOW = ("--wait", "1", "--warmup", "1", "--active", "3", "--no-step-limit", "0.5")


@pytest.mark.parametrize("start", ["loading", "evaluating"])
def test_a_slow_start_is_no_step_and_the_window_is_the_one_announced(tmp_path, start):
    script = write_script(tmp_path / "slow_start.py", SCRIPT)
    out = tmp_path / "run"
    env = {"EVALUATE": "1"} if start == "evaluating" else {}
    result = run_cli("trace", "--out", str(out), *WINDOW, str(script), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "profiling steps 3-5 (window 1)" in result.stderr, result.stderr[-3000:]
    assert result.stderr.count("profiled window") == 1, result.stderr[-3000:]
    rank = read_json(out / "ranks" / "rank0.json")
    assert rank["steps"]["profiled"] == [[3, 5]], rank["steps"]
    assert sorted(p.name for p in out.glob("*.pt.trace.json*")) == rank["trace_files"] and len(rank["trace_files"]) == 1
    report = json.loads(run_cli("diagnose", str(out), "--format", "json").stdout)
    assert report["run"]["steps_analyzed"] == 3, report["run"]["steps_analyzed"]


def test_two_ranks_with_a_slow_start_analyse_their_window(tmp_path):
    script = write_script(tmp_path / "slow_start.py", SCRIPT)
    out = tmp_path / "run"
    port = free_port()
    result = run_cli(
        "trace", "-q", "--out", str(out), *WINDOW, "--nproc-per-node", "2", "--master-port", str(port), str(script),
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(run_cli("diagnose", str(out), "--format", "json", timeout=120).stdout)
    assert report["run"]["steps_analyzed"] == 3 and report["run"]["parallelism"] == "ddp", report["run"]


def test_a_run_that_never_steps_keeps_its_start_up_trace(tmp_path):
    script = write_script(tmp_path / "slow_start.py", SCRIPT)
    out = tmp_path / "run"
    result = run_cli("trace", "--out", str(out), *WINDOW, str(script), env={"EVALUATE": "1", "NO_STEP": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    rank = read_json(out / "ranks" / "rank0.json")
    assert rank["steps"]["count"] == 0 and len(rank["trace_files"]) == 1, rank
    report = json.loads(run_cli("diagnose", str(out), "--format", "json").stdout)
    assert any("no training step was detected" in n for n in report["run"]["notes"]), report["run"]["notes"]
