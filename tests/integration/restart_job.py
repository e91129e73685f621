"""A 2-rank DDP job (CPU + gloo) for the elastic-restart test: in torchrun's first attempt
(TORCHELASTIC_RESTART_COUNT 0) rank 1 raises ValueError at step CRASH_STEP; the next attempt runs to the end."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = int(os.environ.get("STEPS", "10"))
CRASH_STEP = int(os.environ.get("CRASH_STEP", "6"))
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def check_batch(rank, step, x):
    if ATTEMPT == 0 and rank == 1 and step == CRASH_STEP:
        raise ValueError(f"corrupt batch at step {step}")
    return x


def main():
    # torchrun's store keeps attempt 0's addresses: without a prefix of its own, attempt 1's gloo may read a dead
    # peer's address (torch, seen 2 runs in 4 without ddpdoctor: "Connection refused" at init)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{ATTEMPT}", store), rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        x = check_batch(rank, step, torch.randn(16, 32))
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} attempt {ATTEMPT} finished {STEPS} steps")


if __name__ == "__main__":
    main()
