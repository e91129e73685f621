"""Correct jobs that look unusual, with models small enough that DDP's all-reduce is its latency, not its bytes:
a GAN (two DDP models, two optimizers, three discriminator forwards per step) and a tiny classifier with an
evaluation loop every few steps. Neither is accumulating gradients without no_sync(), and neither has a "giant"
gradient that a sparse table or sharding could shrink (a 64 KiB weight is 85% of a tiny model's bytes): no rule
may say so, and no rule may advise a bucket size that cannot make a second bucket."""

from __future__ import annotations

import json

import pytest
from helpers import run_cli, write_script

pytestmark = [pytest.mark.integration]

GAN = """
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo"); torch.manual_seed(dist.get_rank())
G = DDP(nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 64)))
D = DDP(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1)))
og = torch.optim.Adam(G.parameters(), 1e-3); od = torch.optim.Adam(D.parameters(), 1e-3)
for step in range(16):
    z, real = torch.randn(64, 32), torch.randn(64, 64)
    fake = G(z)
    od.zero_grad()
    loss_d = nn.functional.softplus(-D(real)).mean() + nn.functional.softplus(D(fake.detach())).mean()
    loss_d.backward(); od.step()
    og.zero_grad()
    nn.functional.softplus(-D(fake)).mean().backward(); og.step()
dist.barrier(); dist.destroy_process_group()
"""

TINY = """
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo"); torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(16):
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 4 == 3:  # evaluation: no_grad forwards, a metric all-reduced
        model.eval()
        with torch.no_grad():
            correct = (model(torch.randn(64, 64)).argmax(1) == 0).sum().float()
        dist.all_reduce(correct); model.train()
dist.barrier(); dist.destroy_process_group()
"""


def _diagnosed(tmp_path, name: str, source: str) -> dict:
    script = write_script(tmp_path / f"{name}.py", source)
    out = tmp_path / name
    args = ["trace", "-q", "--out", str(out), "--wait", "1", "--warmup", "1", "--active", "8"]
    traced = run_cli(*args, "--standalone", "--nproc-per-node", "2", str(script), timeout=200)
    assert traced.returncode == 0, traced.stderr[-3000:]
    diagnosed = run_cli("diagnose", str(out), "--format", "json", timeout=120)
    assert diagnosed.returncode == 0, diagnosed.stderr[-3000:]
    return json.loads(diagnosed.stdout)


def _no_false_size_advice(report: dict) -> None:
    found = {f["name"]: f for f in report["findings"]}
    assert "ddp-giant-gradient" not in found, found["ddp-giant-gradient"]["message"]
    assert "ddp-bucket-size-mismatch" not in found, found["ddp-bucket-size-mismatch"]["message"]
    passed = {p["name"]: p["reason"] for p in report["passed_reasons"]}
    assert "min_mb" in passed["ddp-giant-gradient"], passed["ddp-giant-gradient"]  # passed on its size
    overlap = found.get("poor-comm-compute-overlap")
    if overlap is not None:  # the exposed all-reduce is real; the advice must be one that can change it
        assert "KiB: a round of all-reduces is one or two buckets" in overlap["message"], overlap["message"]
        assert "bucket_cap_mb" not in overlap["recommendation"] and "no_sync" in overlap["recommendation"]


@pytest.mark.timeout(300)
def test_a_gan_is_no_gradient_accumulation_and_its_small_weights_are_no_giants(tmp_path):
    report = _diagnosed(tmp_path, "gan", GAN)
    assert "allreduce-every-microstep" not in {f["name"] for f in report["findings"]}, report["findings"]
    why = {n["name"]: n["reason"] for n in report["not_evaluated"]}
    assert "the job built 2 DDP models" in why["allreduce-every-microstep"], why.get("allreduce-every-microstep")
    _no_false_size_advice(report)


@pytest.mark.timeout(300)
def test_a_tiny_model_with_an_evaluation_loop_gets_no_bucket_or_giant_gradient_advice(tmp_path):
    report = _diagnosed(tmp_path, "tiny", TINY)
    names = {f["name"] for f in report["findings"]}
    assert "allreduce-every-microstep" not in names  # the no_grad evaluation forwards are no micro-batches
    assert "allreduce-every-microstep" in report["passed"], report["not_evaluated"]
    _no_false_size_advice(report)
