"""A rank that runs in a Python started with -I (issue 23, item 13), found only after the fact: the script re-execs
itself with -I, so the interpreter ignores PYTHONPATH and ddpdoctor's start-up hook never runs. The end of the run
names that cause instead of "crashed at start-up or was not launched". ~10 s."""

from __future__ import annotations

import pytest
from helpers import read_json, run_cli, write_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REEXEC = """
import os, sys, time

if sys.argv[1:] != ["child"]:
    os.execv(sys.executable, [sys.executable, "-I", os.path.abspath(__file__), "child"])

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="file://" + os.path.abspath("rendezvous"), rank=0, world_size=1)
model = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.3)  # a rank that lives for a while, as training does
dist.barrier()
dist.destroy_process_group()
print("trained", flush=True)
"""


def test_a_rank_that_re_execs_itself_with_minus_i_is_named_as_the_cause(tmp_path) -> None:
    script = write_script(tmp_path / "job.py", REEXEC)
    out = tmp_path / "run"
    result = run_cli("trace", "--out", str(out), "--", "python", str(script), cwd=tmp_path, timeout=150)
    assert "trained" in result.stdout and "Traceback" not in result.stderr, result.stderr
    assert "crashed at start-up" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if "rank 0 failed" in line]
    assert lines and "-I" in lines[0] and "PYTHONPATH" in lines[0] and "without -I" in lines[0], result.stderr
    (entry,) = read_json(out / "manifest.json")["ranks"]
    assert "-I" in entry["reason"] and "crashed at start-up" not in entry["reason"]
