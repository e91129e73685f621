"""A script that profiles itself with torch.profiler, traced by ``ddpdoctor trace``: its profiler's window overlaps
ddpdoctor's. Before the guard (capture/other_profiler.py) the process died of SIGSEGV (exit 139) and diagnose blamed
the job (rank-crashed); now the job ends well, ddpdoctor's window is written and the rank says what became of the
script's profiler. One process (~5 s on 2 cores)."""

from __future__ import annotations

import json

import pytest
from helpers import read_json, run_cli, write_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SCRIPT = """
import os
import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with profile(
    activities=[ProfilerActivity.CPU],
    schedule=schedule(wait=1, warmup=1, active=4, repeat=1),
    on_trace_ready=tensorboard_trace_handler(os.environ["OWN_OUT"]),
    record_shapes=True,
    profile_memory=True,
) as prof:
    for step in range(10):
        model(torch.randn(8, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
        prof.step()
print("own events:", len(prof.events()))
"""


def test_a_self_profiling_script_runs_to_its_end_and_ddpdoctor_keeps_its_window(tmp_path):
    script = write_script(tmp_path / "own_profiler.py", SCRIPT)
    out, own = tmp_path / "run", tmp_path / "own"
    result = run_cli(
        "trace", "--out", str(out), "--wait", "1", "--warmup", "1", "--active", "3", str(script),
        env={"OWN_OUT": str(own)}, timeout=150,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = script.read_text().splitlines()
    where = f"(at own_profiler.py:{lines.index('        prof.step()') + 1})"  # where it began to record
    assert "own events: 0" in result.stdout
    warnings = [line for line in result.stderr.splitlines() if "the script's own torch.profiler" in line]
    assert len(warnings) == 1 and where in warnings[0], result.stderr[-3000:]
    rank = read_json(out / "ranks" / "rank0.json")
    assert rank["status"] == "ok" and len(rank["trace_files"]) == 1, rank
    assert any(f"the script's own torch.profiler {where}" in e for e in rank["capture_errors"])
    # the script's handler wrote a trace without events (what it recorded), never ddpdoctor's events
    (written,) = own.iterdir()
    assert json.loads(written.read_text())["traceEvents"] == []
    diagnosis = run_cli("diagnose", str(out), "--format", "json", timeout=120)
    assert diagnosis.returncode == 0, diagnosis.stderr
    report = json.loads(diagnosis.stdout)
    assert not any(f["name"] in ("rank-crashed", "rank-died") for f in report["findings"]), report["findings"]
    # the script's profiler marked no steps in ddpdoctor's trace: each would be one more step analysed
    assert report["run"]["steps_analyzed"] == 3, report["run"]["steps_analyzed"]
