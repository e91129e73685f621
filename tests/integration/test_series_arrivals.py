"""The always-on series names the DDP rank that keeps reaching the all-reduce last, and since when, at the default
profiling window (issue 28 item 1; issue 25 item 5: steps, not collectives, are the trials): a 2-rank CPU job whose
rank 1 sleeps 60 ms more per step from step 60 on. The default 5-step window alone cannot name a 2-rank straggler
at p < 0.01 (1/2^5 at best); the series' 150 steps can. Its balanced twin, quiet and beside a CPU burner, names no
rank."""

from __future__ import annotations

import json
import os

import pytest
from helpers import cpu_burner, run_cli, write_script

pytestmark = [pytest.mark.integration]

JOB = """
import os, time, torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo"); rank = dist.get_rank(); torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
slow_from = int(os.environ["SLOW_FROM"])
for step in range(150):
    time.sleep(0.005)
    if rank == 1 and 0 <= slow_from <= step:
        time.sleep(0.06)  # the straggler: 60 ms more per step
    loss = model(torch.randn(16, 128)).square().mean(); opt.zero_grad(); loss.backward(); opt.step()
dist.barrier(); dist.destroy_process_group()
"""
SLOW_FROM = 60


def _arrivals(tmp_path_factory, name: str, slow_from: int, burners: int = 0) -> dict:
    tmp = tmp_path_factory.mktemp("arrivals")
    script = write_script(tmp / "job.py", JOB)
    out = tmp / name
    args = ["trace", "-q", "--out", str(out), "--standalone", "--nproc-per-node", "2", str(script)]
    env = {**os.environ, "SLOW_FROM": str(slow_from)}
    with cpu_burner(burners):
        traced = run_cli(*args, timeout=300, env=env)
    assert traced.returncode == 0, traced.stderr[-3000:]
    diagnosed = run_cli("diagnose", str(out), "--format", "json", timeout=120)
    assert diagnosed.returncode == 0, diagnosed.stderr[-3000:]
    report = json.loads(diagnosed.stdout)
    text = run_cli("diagnose", str(out), timeout=120).stdout
    return {"arrivals": report["run"]["over_time"]["arrivals"], "text": text}


@pytest.fixture(scope="module")
def straggler(tmp_path_factory):
    return _arrivals(tmp_path_factory, "straggler", SLOW_FROM)


@pytest.fixture(scope="module")
def balanced(tmp_path_factory):
    return _arrivals(tmp_path_factory, "balanced", -1)


@pytest.fixture(scope="module")
def balanced_burned(tmp_path_factory):
    return _arrivals(tmp_path_factory, "balanced_burned", -1, burners=2)


@pytest.mark.timeout(400)
def test_the_late_rank_is_named_with_the_step_it_began(straggler):
    arr = straggler["arrivals"]
    assert arr["evaluated"] and arr["ranks"] == [1] and arr["pattern"] == "started", arr
    first = arr["stretches"][0]
    assert abs(first["first"] - SLOW_FROM) <= 2 and arr["stretches"][-1]["last"] >= 145, arr["stretches"]
    assert all(s["late_ms"] == pytest.approx(60, abs=25) for s in arr["stretches"]), arr["stretches"]
    assert arr["p_value"] < 1e-3
    # rank 1 sleeps: it is never said to do more work
    assert "more work on that rank" not in arr["text"] and f"since step {first['first']}" in arr["text"]
    assert "late arrivals: arrived last at the backward's all-reduce" in straggler["text"]


@pytest.mark.timeout(400)
def test_a_balanced_job_names_no_rank(balanced):
    arr = balanced["arrivals"]
    assert arr["evaluated"] and not arr.get("ranks") and arr["p_value"] > 1e-3, arr
    assert "late arrivals: no rank shown to keep arriving last" in balanced["text"]


@pytest.mark.timeout(400)
def test_a_balanced_job_beside_a_cpu_burner_names_no_rank(balanced_burned):
    arr = balanced_burned["arrivals"]
    assert arr["evaluated"] and not arr.get("ranks"), arr
