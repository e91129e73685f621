"""A balanced 2-rank DDP job (CPU + gloo) whose work depends on the data: each step applies a block k times, k drawn
per step and rank from a generator seeded by SEED and the rank (adaptive computation; a loop over a batch's
objects). No rank does more work by design, but in a short window one may by chance."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

WIDTH = 256


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.block, self.out = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor, k: int) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        for _ in range(k):
            h = torch.relu(self.block(h))
        return self.out(h)


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(int(os.environ.get("SEED", "0")) * 100 + rank)
for _ in range(int(os.environ.get("STEPS", "8"))):
    x, y = torch.randn(256, WIDTH, generator=g), torch.randint(0, 10, (256,), generator=g)
    k = int(torch.randint(1, 12, (1,), generator=g))
    opt.zero_grad()
    nn.functional.cross_entropy(model(x, k), y).backward()
    opt.step()
dist.barrier()
dist.destroy_process_group()
