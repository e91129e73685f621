"""A 2-rank DDP job (CPU + gloo) for the hang tests; it steps fast, then stalls the way the test asks.

STUCK_RANK/STUCK_STEP: that rank is stuck in its data function (``read_shard``) at that step, forever.
DESYNC_STEP: at that step rank 0 all-reduces a 1-element metric while rank 1 broadcasts a 4-element tensor.
SLOW_STEP/SLOW_S: every rank sleeps that long at that step (a compile-like first step), then goes on.
SIZE_STEP: at that step rank 0 all-reduces a 4-element metric and the others a 16-element one (``sync_metric``):
gloo aborts rank 0 (SIGABRT) when the larger message arrives.
EARLY_RANK/EARLY_STEP: at that step that rank returns from ``main`` (its process ends normally, without destroying
the process group) while the others wait for it in a barrier (``wait_for_peers``).
STEPS: steps in all; SLEEP_MS: per step.
"""

import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = int(os.environ.get("STEPS", "12"))
STUCK_RANK = int(os.environ.get("STUCK_RANK", "-1"))
STUCK_STEP = int(os.environ.get("STUCK_STEP", "6"))
DESYNC_STEP = int(os.environ.get("DESYNC_STEP", "-1"))
SLOW_STEP = int(os.environ.get("SLOW_STEP", "-1"))
SLOW_S = float(os.environ.get("SLOW_S", "0"))
SIZE_STEP = int(os.environ.get("SIZE_STEP", "-1"))
EARLY_RANK = int(os.environ.get("EARLY_RANK", "-1"))
EARLY_STEP = int(os.environ.get("EARLY_STEP", "-1"))
SLEEP_MS = float(os.environ.get("SLEEP_MS", "0"))
step = 0


def read_shard(rank, step):
    if rank == STUCK_RANK and step == STUCK_STEP:
        while True:  # an NFS read that never returns
            time.sleep(0.1)
    return torch.randn(16, 32)


def sync_metric(rank):
    dist.all_reduce(torch.ones(4 if rank == 0 else 16))


def wait_for_peers():
    dist.barrier()


def main():
    global step
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        if step == EARLY_STEP:
            if rank == EARLY_RANK:
                return  # out of data: this rank leaves the job
            wait_for_peers()
        x = read_shard(rank, step)
        if step == SIZE_STEP:
            sync_metric(rank)
        if step == SLOW_STEP:
            time.sleep(SLOW_S)
        if step == DESYNC_STEP:
            if rank == 0:
                dist.all_reduce(torch.ones(1))
            else:
                dist.broadcast(torch.ones(4), src=1)
        if SLEEP_MS:
            time.sleep(SLEEP_MS / 1000)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} finished {STEPS} steps")


if __name__ == "__main__":
    main()
