"""A 2-rank DDP job (CPU + gloo) for the straggler tests: samples/ddp_train.py's small model (4 layers of 256, a
batch of 128 from a DataLoader), every rank the same work unless a knob sets one rank apart:

- EXTRA_RANK/EXTRA_MM: that rank also multiplies two 256 x 256 matrices EXTRA_MM times each step (work only it
  does: more ops, more CPU time);
- PY_RANK/PY_MS: that rank runs a pure Python loop for PY_MS before each step (extra work without torch ops);
- SLOW_RANK/SLOW_MS: that rank sleeps SLOW_MS before each step;
- LOADER_RANK/LOADER_MS: that rank's data loader sleeps LOADER_MS for each batch (a slow data pipeline);
- STEPS.
"""

import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

steps = int(os.environ.get("STEPS", "13"))
extra_rank, extra_mm = int(os.environ.get("EXTRA_RANK", "-1")), int(os.environ.get("EXTRA_MM", "0"))
slow_rank, slow_ms = int(os.environ.get("SLOW_RANK", "-1")), float(os.environ.get("SLOW_MS", "0"))
py_rank, py_ms = int(os.environ.get("PY_RANK", "-1")), float(os.environ.get("PY_MS", "0"))
loader_rank, loader_ms = int(os.environ.get("LOADER_RANK", "-1")), float(os.environ.get("LOADER_MS", "0"))
width, batch = 256, 128

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
layers: list[nn.Module] = []
for _ in range(4):
    layers += [nn.Linear(width, width), nn.ReLU()]
model = DDP(nn.Sequential(*layers, nn.Linear(width, 10)), bucket_cap_mb=2.0)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()
n = steps * batch * dist.get_world_size()
data = TensorDataset(torch.randn(n, width), torch.randint(0, 10, (n,)))


def collate(items):
    if rank == loader_rank:
        time.sleep(loader_ms / 1000)
    return torch.utils.data.default_collate(items)


loader = DataLoader(data, batch_size=batch, sampler=DistributedSampler(data), collate_fn=collate)
a, b = torch.randn(width, width), torch.randn(width, width)
for x, y in loader:
    if rank == slow_rank:
        time.sleep(slow_ms / 1000)
    if rank == py_rank:
        end = time.thread_time() + py_ms / 1000
        while time.thread_time() < end:
            pass
    if rank == extra_rank:
        for _ in range(extra_mm):
            a = torch.tanh(a @ b)
    opt.zero_grad(set_to_none=True)
    loss_fn(model(x), y).backward()
    opt.step()
dist.barrier()
dist.destroy_process_group()
