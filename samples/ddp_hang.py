"""A DDP job that hangs: rank 1 gets stuck reading its next shard at step 6 (a read that never returns, as an NFS
mount can), while rank 0 waits for it in the gradient all-reduce. CPU + gloo here, GPUs + NCCL unchanged.

    ddpdoctor trace --hang-timeout 10 --nproc-per-node 2 samples/ddp_hang.py   # the hang is named, the job stopped
    ddpdoctor diagnose RUN                                                       # the report leads with the hang

Bare, under torchrun, it waits for gloo's timeout (30 minutes by default): the job simply stops making progress.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def read_shard(rank: int, step: int, stuck_rank: int, stuck_step: int) -> torch.Tensor:
    """The next batch of this rank's shard; on ``stuck_rank`` at ``stuck_step`` the read never returns."""
    if rank == stuck_rank and step == stuck_step:
        while True:  # stands in for a read of a file whose server went away
            time.sleep(1.0)
    return torch.randn(64, 256)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--stuck-rank", type=int, default=1)
    parser.add_argument("--stuck-step", type=int, default=6)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        batch = read_shard(rank, step, args.stuck_rank, args.stuck_step)
        loss = model(batch).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
