"""A one-process script that moves its working directory (hydra does, and scripts that ``os.chdir`` to their
output folder) traced with a relative ``--out``: the run directory is where the user meant, from where ddpdoctor
was run. The manifest and node record were written relative to the script's new directory (a second, partial run
directory), while the traces and rank files were where the user asked. ~3 s."""

from __future__ import annotations

import pytest
from helpers import read_json, run_cli, write_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SCRIPT = """
import os
import torch

os.makedirs("elsewhere", exist_ok=True)
os.chdir("elsewhere")
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(12):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_a_script_that_changes_directory_leaves_one_whole_run_directory(tmp_path):
    script = write_script(tmp_path / "moves.py", SCRIPT)
    result = run_cli("trace", "--out", "runs/rel", "--wait", "1", "--warmup", "1", "--active", "2", str(script),
                     cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "runs" / "rel"
    manifest = read_json(run / "manifest.json")
    assert manifest["ranks"][0]["status"] == "ok", manifest
    assert (run / "ranks" / "rank0.json").is_file() and list(run.glob("rank0.*.pt.trace.json*"))
    assert not (tmp_path / "elsewhere" / "runs").exists()
    assert "wrote runs/rel in" in result.stderr, result.stderr[-2000:]
