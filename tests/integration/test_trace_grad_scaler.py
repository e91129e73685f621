"""A GradScaler that skips optimizer steps (overflowed gradients, as an fp16 job's first iterations do): every
iteration is still a step, the skipped ones included; none merges into the next one's step."""

from __future__ import annotations

import gzip
import json

import pytest
from helpers import read_json, trace_one_process, write_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_iterations_whose_step_the_scaler_skipped_are_steps(tmp_path):
    script = write_script(
        tmp_path / "train.py",
        """
        import torch, torch.nn as nn

        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu")
        for step in range(20):
            optimizer.zero_grad()
            loss = model(torch.randn(16, 32)).pow(2).mean()
            if step in (7, 8, 9):  # overflowed gradients, inside the profiled window: the scaler skips the step
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        """,
    )
    out = tmp_path / "run"
    result = trace_one_process(out, script, "--wait", "5", "--warmup", "1", "--active", "6")
    assert result.returncode == 0, result.stderr[-3000:]
    (rank,) = read_json(out / "manifest.json")["ranks"]
    assert rank["steps"] == 20 and rank["step_source"] == "optimizer"
    assert rank["profiled_steps"] == [[7, 12]]
    (name,) = rank["trace_files"]
    with gzip.open(out / name, "rt") as f:
        events = json.load(f)["traceEvents"]
    steps = sorted((e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    assert [e["name"] for e in steps] == [f"ProfilerStep#{n}" for n in range(7, 13)]
    updates = [e for e in events if e.get("name") == "aten::_amp_update_scale_"]
    for step in steps:  # one iteration each: one scale update inside every profiled step
        inside = [u for u in updates if step["ts"] <= u["ts"] <= step["ts"] + step["dur"]]
        assert len(inside) == 1, step["name"]
