"""A script that builds a new optimizer during the run (issue 23, item 6): steps go on being counted and the
profiled window is recorded, as for a script that keeps one optimizer."""

from __future__ import annotations

import gzip
import json

import pytest
from helpers import read_json, trace_one_process, write_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_new_adam_at_step_3_of_40_is_profiled(tmp_path):
    script = write_script(
        tmp_path / "train.py",
        """
        import torch, torch.nn as nn

        model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(40):
            if step == 3:  # warm-up done: switch to Adam
                optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
            optimizer.zero_grad()
            model(torch.randn(16, 32)).sum().backward()
            optimizer.step()
        """,
    )
    out = tmp_path / "run"
    result = trace_one_process(out, script, "--wait", "5", "--warmup", "2", "--active", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ended before the profiled window" not in result.stderr
    manifest = read_json(out / "manifest.json")
    (rank,) = manifest["ranks"]
    assert rank["steps"] == 40 and rank["step_source"] == "optimizer" and rank["profiled_steps"] == [[8, 10]]
    (name,) = rank["trace_files"]
    with gzip.open(out / name, "rt") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert {"ProfilerStep#8", "ProfilerStep#9", "ProfilerStep#10"} <= names
