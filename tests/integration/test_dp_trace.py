"""`ddpdoctor trace` on a DataParallel script: the stage ranges and per-step stats land in the run directory.

No GPU here: the script runs DataParallel's real 2-device path on CPU through tests/dp_harness.py.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import read_json, run_cli, write_script

pytestmark = [pytest.mark.integration]

TESTS = Path(__file__).resolve().parents[1]
DEVICES = 2
BATCH, OUT_FEATURES = 8, 4

SCRIPT = f"""
    import sys

    sys.path.insert(0, {str(TESTS)!r})

    import torch

    import dp_harness


    def main():
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, {OUT_FEATURES})
        )
        with dp_harness.simulated_devices():
            model = dp_harness.data_parallel(net, {DEVICES})
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(6):
                loss = model(torch.randn({BATCH}, 16)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        print("trained")


    if __name__ == "__main__":
        main()
"""

# The exact names the metrics key on.
STAGES = [
    "DataParallel.scatter",
    "DataParallel.replicate",
    "DataParallel.parallel_apply",
    "DataParallel.gather",
    "DataParallel.backward_reduce",
    "DataParallel.gather_backward",
]


def _complete_events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


@pytest.mark.timeout(120)
def test_dataparallel_stages_are_traced(tmp_path: Path) -> None:
    script = write_script(tmp_path / "dp_script.py", SCRIPT)
    out = tmp_path / "run"
    result = run_cli("trace", "--out", str(out), "--wait", "1", "--warmup", "1", "--active", "2", str(script))
    assert result.returncode == 0, result.stderr
    assert "trained" in result.stdout

    traces = sorted(out.glob("rank0.*.pt.trace.json.gz"))
    assert traces, list(out.iterdir())
    events = [e for path in traces for e in _complete_events(path)]
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    assert len(steps) == 2
    for step in steps:
        in_step = [e for e in events if step["ts"] <= e["ts"] <= step["ts"] + step["dur"]]
        names = [e["name"] for e in in_step]
        for stage in STAGES:
            assert names.count(stage) == 1, (stage, step["name"])
        replicas = [e for e in in_step if e["name"].startswith("DataParallel.replica[")]
        assert sorted(e["name"] for e in replicas) == [f"DataParallel.replica[{i}]" for i in range(DEVICES)]
        assert step["tid"] not in {e["tid"] for e in replicas}  # opened in parallel_apply's worker threads

    rank = read_json(out / "ranks" / "rank0.json")
    # described after the script returned and its model was freed
    described = {
        "module": "Sequential",
        "wrapper": "DataParallel",
        "device_ids": list(range(DEVICES)),
        "output_device": 0,
        "dim": 0,
    }
    assert rank["dp"] == [described]
    assert len(rank["dp_steps"]) == 6
    for stats in rank["dp_steps"]:
        assert stats["replicas"] == DEVICES and stats["forwards"] == 1
        assert stats["gathered_bytes"] == BATCH * OUT_FEATURES * 4
        assert stats["parallel_apply_ms"] > 0
