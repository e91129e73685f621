"""A real tensor-parallel job (DTensor ColwiseParallel/RowwiseParallel, 2 ranks, gloo on the CPU) is reported as
tensor parallel, not DDP: no DDP advice, and its collectives are placed where the training thread issues them."""

from __future__ import annotations

import json

import pytest
from helpers import run_cli, write_script

pytestmark = [pytest.mark.integration]

TP_SCRIPT = """
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)
    )
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel(), "3": ColwiseParallel(), "5": RowwiseParallel()}
    model = parallelize_module(model, mesh, plan)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10):
        loss = model(torch.randn(32, 64)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()
"""


@pytest.mark.timeout(240)
def test_dtensor_tensor_parallel_job_is_not_called_ddp(tmp_path):
    script = write_script(tmp_path / "tp_train.py", TP_SCRIPT)
    out = tmp_path / "run"
    window = ["--wait", "2", "--warmup", "1", "--active", "4"]
    traced = run_cli("trace", "-q", "--out", str(out), *window, "--standalone", "--nproc-per-node", "2", str(script))
    assert traced.returncode == 0, traced.stderr[-3000:]
    diagnosed = run_cli("diagnose", str(out), "--steps", "0..", "--format", "json", timeout=60)
    assert diagnosed.returncode == 0, diagnosed.stderr[-3000:]
    report = json.loads(diagnosed.stdout)
    assert report["run"]["parallelism"] == "tp", report["run"]["parallelism_evidence"]
    assert "tensor-parallel layers" in report["run"]["parallelism_evidence"]
    reasons = {n["name"]: n["reason"] for n in report["not_evaluated"]}
    for rule in ("poor-comm-compute-overlap", "ddp-bucket-size-mismatch", "missing-distributed-sampler"):
        assert "this run is tensor parallel (tp)" in reasons[rule], rule
    # one training thread per rank: nothing contends for the GIL, whatever the probe reads
    assert "gil-contention" in report["passed"]
