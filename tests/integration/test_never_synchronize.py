"""Several ranks that never synchronise (imagenet/main.py on CPU: DDP only on GPUs) are an error that leads the
report; the same script's twin with DDP, and a one-process run, are not."""

from __future__ import annotations

import json

import pytest
from helpers import SAMPLES, trace_and_diagnose, write_script

pytestmark = [pytest.mark.integration]

WINDOW = ["--wait", "1", "--warmup", "1", "--active", "3"]


def _diagnose(tmp_path, *launch: str) -> dict:
    return trace_and_diagnose(tmp_path / "run", *WINDOW, *launch)[0]


@pytest.mark.timeout(240)
def test_two_ranks_without_ddp_is_an_error_that_leads_the_report(tmp_path):
    report = _diagnose(tmp_path, "--standalone", "--nproc-per-node", "2", str(SAMPLES / "mistake_no_ddp_on_cpu.py"))
    first = report["findings"][0]
    assert first["name"] == "ranks-never-synchronize" and first["severity"] == "error"
    assert first["evidence"]["max(collectives_per_step)"] == 0 and first["evidence"]["world_size"] == 2
    assert "DistributedSampler" in first["message"]  # it also shards the data: each model sees half
    assert report["run"]["parallelism"] == "none"
    # rules about communication are not "passed" on a run without any
    passed = set(report["passed"])
    assert not passed & {"poor-comm-compute-overlap", "rank-straggler", "low-collective-bandwidth"}
    reasons = {n["name"]: n["reason"] for n in report["not_evaluated"]}
    assert "without any synchronisation" in reasons["poor-comm-compute-overlap"]


LOCAL_SGD = """
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Linear(32, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, 21):
        loss = model(torch.randn(16, 32)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:  # local SGD: the replicas are averaged every 10 steps, outside the profiled ones
            with torch.no_grad():
                for p in model.parameters():
                    dist.all_reduce(p)
                    p /= dist.get_world_size()
    dist.barrier()
    dist.destroy_process_group()
"""


@pytest.mark.timeout(240)
def test_ranks_that_average_their_models_outside_the_profiled_steps_synchronise(tmp_path):
    """No DDP and no collective in steps 3-5, but an all-reduce of every parameter at steps 10 and 20: the Flight
    Recorder's count where the run ended (run_collectives) shows the ranks meet (2026-12-07: it was an error saying
    each rank trains its own model)."""
    script = write_script(tmp_path / "local_sgd.py", LOCAL_SGD)
    report = _diagnose(tmp_path, "--standalone", "--nproc-per-node", "2", str(script))
    assert "ranks-never-synchronize" in report["passed"], json.dumps(report["findings"], indent=1)[:3000]
    why = {p["name"]: p["reason"] for p in report["passed_reasons"]}["ranks-never-synchronize"]
    assert "max(run_collectives) = 4 != 0" in why, why  # 2 parameters x 2 averagings


DDP_NO_SYNC = """
    import sys
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    AVERAGE, LOG = sys.argv[1] == "average", sys.argv[1] == "logged"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for step in range(1, 21):
        opt.zero_grad()
        for micro in range(2):
            with model.no_sync():  # every micro-batch, the last one too: DDP never all-reduces
                loss = model(torch.randn(16, 32, generator=g)).pow(2).mean()
                loss.backward()
        opt.step()
        if LOG:  # the loss all-reduced for logging, every step: 4 bytes
            logged = loss.detach().clone()
            dist.all_reduce(logged)
        if AVERAGE and step % 10 == 0:  # ... unless the replicas are averaged by hand (outside the profiled steps)
            with torch.no_grad():
                for p in model.parameters():
                    dist.all_reduce(p)
                    p /= dist.get_world_size()
    # the replicas compared through files, not a collective (one after the first step would be synchronisation)
    torch.save(model.module.weight.detach(), f"{sys.argv[2]}/w{rank}.pt")
    dist.barrier()  # (barriers are not counted)
    if rank == 0:
        print("replicas equal:", torch.equal(*(torch.load(f"{sys.argv[2]}/w{r}.pt") for r in range(2))))
    dist.barrier()
    dist.destroy_process_group()
"""


def _no_sync(tmp_path, how: str) -> tuple[dict, str]:
    script = write_script(tmp_path / "no_sync.py", DDP_NO_SYNC)
    launch = ["--standalone", "--nproc-per-node", "2", str(script), how, str(tmp_path)]
    return trace_and_diagnose(tmp_path / "run", *WINDOW, *launch)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["never", "logged"])
def test_a_ddp_model_whose_every_forward_is_inside_no_sync_never_synchronises(tmp_path, how):
    """DDP is there, but no collective runs after the first step in the whole run (the Flight Recorder where it ended,
    DDP's start-up broadcasts before it), or only a loss all-reduced for logging: an error (2026-12-07: "No
    findings")."""
    report, output = _no_sync(tmp_path, how)
    assert "replicas equal: False" in output  # the job's own check: the mistake is real
    first = report["findings"][0]
    assert first["name"] == "ranks-never-synchronize" and first["severity"] == "error", report["findings"]
    assert first["evidence"]["max(run_collectives)"] > 0  # DDP's start-up broadcasts
    if how == "never":
        assert first["evidence"]["max(training_collectives)"] == 0 and first["evidence"]["min(steps_run)"] == 20
        assert "They do build a DDP model, but not one collective ran after their first step" in first["message"]
        assert "Not one collective runs in those steps." in first["message"]
    else:  # the 20 losses of 4 bytes logged after the first optimizer step began, against 1.3 KiB of gradients
        assert "sent 80 bytes in 20 collective(s), under 25% of one round" in first["message"], first["message"]


@pytest.mark.timeout(240)
def test_a_ddp_model_inside_no_sync_whose_replicas_are_averaged_by_hand_synchronises(tmp_path):
    report, output = _no_sync(tmp_path, "average")
    assert "replicas equal: True" in output
    assert "ranks-never-synchronize" in report["passed"], json.dumps(report["findings"], indent=1)[:3000]
    why = {p["name"]: p["reason"] for p in report["passed_reasons"]}["ranks-never-synchronize"]
    assert "max(training_collectives) = 4 != 0" in why, why  # 2 parameters x 2 averagings
