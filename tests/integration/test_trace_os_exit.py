"""A rank that ends with ``os._exit(n)`` skips every exit handler; its exit code is still recorded in the manifest
(issue 13, item 3). One-process mode and a 2-rank torchrun run (~15 s each on 2 cores)."""

from __future__ import annotations

import pytest
from helpers import read_json, run_cli, write_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SCRIPT = """
import os
import time

import torch
import torch.distributed as dist

distributed = "RANK" in os.environ
if distributed:
    dist.init_process_group("gloo")
rank = dist.get_rank() if distributed else 0
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.02)
    if step == 5 and rank == int(os.environ.get("EXIT_RANK", "0")):
        os._exit(7)
if distributed:
    dist.barrier()
"""


def _rank(manifest: dict, rank: int) -> dict:
    return next(r for r in manifest["ranks"] if r["rank"] == rank)


def test_os_exit_code_is_recorded_in_one_process_mode(tmp_path):
    script = write_script(tmp_path / "exit7.py", SCRIPT)
    out = tmp_path / "run"
    result = run_cli("trace", "-q", "--out", str(out), "--wait", "1", "--warmup", "1", "--active", "2", str(script))
    assert result.returncode == 7, result.stderr
    entry = _rank(read_json(out / "manifest.json"), 0)
    assert entry["exit_code"] == 7 and entry["status"] == "failed", entry


def test_os_exit_code_is_recorded_under_torchrun(tmp_path):
    script = write_script(tmp_path / "exit7.py", SCRIPT)
    out = tmp_path / "run"
    result = run_cli(
        "trace", "-q", "--out", str(out), "--wait", "1", "--warmup", "1", "--active", "2",
        "--standalone", "--nproc-per-node", "2", str(script), env={"EXIT_RANK": "1"}, timeout=150,
    )  # fmt: skip
    assert result.returncode != 0
    entry = _rank(read_json(out / "manifest.json"), 1)
    assert entry["exit_code"] == 7 and entry["status"] == "failed", entry
