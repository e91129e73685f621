"""DDP models that never average a gradient. One whose training steps call ``model.module`` (bypassing DDP's
forward) never all-reduces one: an error, whether or not it also all-reduces its loss for logging; the same job
through the wrapper, one whose whole profiled window lies inside ``no_sync()`` accumulation, and one that all-reduces
its gradients by hand, are not. One whose communication hook is torch's ``noop_hook`` (left in from a headroom
measurement) averages none either (``ddp-noop-comm-hook``); the same hook beside gradients all-reduced by hand, and a
hook that communicates (fp16 compression), are not."""

from __future__ import annotations

import json

import pytest
from helpers import trace_and_diagnose, write_script

pytestmark = [pytest.mark.integration]

WINDOW = ["--wait", "1", "--warmup", "1", "--active", "3"]

SCRIPT = """
    import contextlib, os, sys
    import torch, torch.distributed as dist, torch.nn as nn
    from torch.distributed.algorithms.ddp_comm_hooks import debugging_hooks, default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    HOW = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    if HOW.startswith("noop"):  # the mistake: a hook that reduces nothing
        model.register_comm_hook(None, debugging_hooks.noop_hook)
    elif HOW == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for step in range(8):
        x = torch.randn(16, 32, generator=g)
        opt.zero_grad()
        if HOW in ("module", "module_logged", "module_synced"):  # the mistake: DDP never sees the forward
            loss = model.module(x).pow(2).mean()
        elif HOW == "no_sync" and step < 7:  # accumulation over the whole window, synchronised at the last step
            with model.no_sync():
                loss = model(x).pow(2).mean()
        else:
            loss = model(x).pow(2).mean()
        loss.backward()
        if HOW in ("module_synced", "noop_synced"):  # ... made good by hand: every gradient all-reduced
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
        opt.step()
        if HOW in ("module_logged", "module_synced", "noop_logged", "noop_synced"):  # the loss logged, every step
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
def test_training_through_model_module_is_an_error(tmp_path):
    report, output = _diagnose(tmp_path, "module")
    assert "replicas equal: False" in output  # the job's own check: the mistake is real
    first = report["findings"][0]
    assert first["name"] == "ddp-forward-bypassed" and first["severity"] == "error"
    assert first["evidence"]["max(ddp_forwards_per_step)"] == 0
    assert first["evidence"]["max(collectives_per_step)"] == 0
    assert "ranks-never-synchronize" not in {f["name"] for f in report["findings"]}  # one finding, not two
    assert "Not one collective runs in those steps." in first["message"], first["message"]


@pytest.mark.timeout(240)
def test_a_loss_all_reduced_for_logging_is_no_gradient_sync(tmp_path):
    """The same mistake in a job that all-reduces its loss each step (most jobs log one): a 0-dim tensor, 4
    bytes a step, against the model's 9 KiB of gradients."""
    report, output = _diagnose(tmp_path, "module_logged")
    assert "replicas equal: False" in output
    first = report["findings"][0]
    assert first["name"] == "ddp-forward-bypassed" and first["severity"] == "error", first
    assert first["evidence"]["max(collectives_per_step)"] == 1
    assert first["evidence"]["max(collective_bytes_per_step)"] == 4
    assert "(1 a step, 4 bytes on the busiest rank) move under 25% of the model's 9 KiB" in first["message"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["wrapper", "no_sync", "module_synced"])
def test_training_through_the_wrapper_is_not(tmp_path, how):
    """Nor is the bypass made good by hand (every gradient all-reduced after backward, the loss logged too)."""
    report, output = _diagnose(tmp_path, how)
    if how in ("wrapper", "module_synced"):
        assert "replicas equal: True" in output
    assert "ddp-forward-bypassed" in report["passed"], json.dumps(report["findings"], indent=1)[:3000]
    assert not {f["name"] for f in report["findings"]} & {"ddp-forward-bypassed", "ranks-never-synchronize"}


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
