"""A DDP model whose communication hook is torch's ``noop_hook`` (left in from a headroom measurement) averages no
gradient: an error, whether or not the job all-reduces its loss for logging; the same hook beside gradients
all-reduced by hand, and a hook that communicates (fp16 compression), are not."""

from __future__ import annotations

import json

import pytest
from helpers import trace_and_diagnose, write_script

pytestmark = [pytest.mark.integration]

WINDOW = ["--wait", "1", "--warmup", "1", "--active", "3"]

SCRIPT = """
    import sys
    import torch, torch.distributed as dist, torch.nn as nn
    from torch.distributed.algorithms.ddp_comm_hooks import debugging_hooks, default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    HOW = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    hook = default_hooks.fp16_compress_hook if HOW == "fp16" else debugging_hooks.noop_hook
    model.register_comm_hook(None, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for step in range(8):
        x = torch.randn(16, 32, generator=g)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        if HOW == "noop_synced":  # the hook beside a gradient all-reduce of the job's own: the ranks synchronise
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
        opt.step()
        if HOW in ("noop_logged", "noop_synced"):  # the loss all-reduced for logging, every step
            logged = loss.detach().clone()
            dist.all_reduce(logged)
    w = model.module[0].weight.detach().clone()
    both = [torch.empty_like(w) for _ in range(2)]
    dist.all_gather(both, w)
    if rank == 0:
        print("replicas equal:", torch.equal(both[0], both[1]))
    dist.barrier()
    dist.destroy_process_group()
"""


def _diagnose(tmp_path, how: str) -> tuple[dict, str]:
    script = write_script(tmp_path / "train.py", SCRIPT)
    return trace_and_diagnose(tmp_path / "run", *WINDOW, "--standalone", "--nproc-per-node", "2", str(script), how)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["noop", "noop_logged"])
def test_the_noop_hook_is_an_error(tmp_path, how):
    report, output = _diagnose(tmp_path, how)
    assert "replicas equal: False" in output  # the job's own check: the replicas drift apart
    first = report["findings"][0]
    assert first["name"] == "ddp-noop-comm-hook" and first["severity"] == "error", json.dumps(report["findings"])[:2000]
    assert first["evidence"]["count(ddp_noop_hook)"] == 2
    assert first["evidence"]["max(ddp_sync_rounds_per_step)"] == 1
    assert "communication hook is torch's noop_hook" in first["message"]
    if how == "noop":
        assert first["evidence"]["max(collectives_per_step)"] == 0
        assert "Not one collective runs in those steps." in first["message"]
    else:  # one 0-dim all-reduce a step: 4 bytes against the model's 9 KiB of gradients
        assert first["evidence"]["max(collectives_per_step)"] == 1
        assert first["evidence"]["max(collective_bytes_per_step)"] == 4
        assert "(1 a step, 4 bytes on the busiest rank) move under 25% of the model's 9 KiB" in first["message"]
    assert not {f["name"] for f in report["findings"]} & {"ranks-never-synchronize", "ddp-forward-bypassed"}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["noop_synced", "fp16"])
def test_a_hook_that_leaves_the_ranks_in_sync_is_not(tmp_path, how):
    """The noop hook made good by hand (every gradient all-reduced after backward), and a hook that communicates."""
    report, output = _diagnose(tmp_path, how)
    assert "replicas equal: True" in output
    assert "ddp-noop-comm-hook" in report["passed"], json.dumps(report["findings"], indent=1)[:3000]
    why = {p["name"]: p["reason"] for p in report["passed_reasons"]}["ddp-noop-comm-hook"]
    assert ("count(ddp_noop_hook) = 0" in why) == (how == "fp16"), why
