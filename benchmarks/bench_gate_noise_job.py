"""The job bench_gate_noise traces: a small 2-rank DDP MLP (CPU + gloo) fed by a DataLoader, with three
regressions that can be switched on by environment variables (a real change, not a number edited in a file):

- ``BENCH_BUCKET_MB``: DDP's bucket_cap_mb (500: one big bucket, all-reduced only after the whole backward);
- ``BENCH_LOADER_MS``: extra ms per batch in the dataset's ``__getitem__`` (a slow loader);
- ``BENCH_SLOW_MS``: ms rank 1 sleeps before each forward (a straggler).
"""

import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

steps = int(os.environ.get("BENCH_STEPS", "40"))
bucket_mb = float(os.environ.get("BENCH_BUCKET_MB", "2"))
loader_ms = float(os.environ.get("BENCH_LOADER_MS", "0"))
slow_ms = float(os.environ.get("BENCH_SLOW_MS", "0"))
BATCH = 64


class Batches(Dataset):
    def __len__(self) -> int:
        return steps * BATCH

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if loader_ms and i % BATCH == 0:
            time.sleep(loader_ms / 1e3)
        g = torch.Generator().manual_seed(i)
        return torch.randn(512, generator=g), torch.randint(0, 10, (), generator=g)


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(
    nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(512, 512), nn.ReLU())], nn.Linear(512, 10)),
    bucket_cap_mb=bucket_mb,
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
for x, y in DataLoader(Batches(), batch_size=BATCH, num_workers=0):
    if slow_ms and rank == 1:
        time.sleep(slow_ms / 1e3)
    loss = loss_fn(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.barrier()
dist.destroy_process_group()
