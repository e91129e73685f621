"""Tiny 2-rank CPU/gloo training loops of the kinds real jobs use (issue 26 items 6, 7, 9), one per KIND:

- ``accum``: gradient accumulation of ACCUM micro-batches, the first ACCUM-1 inside ``model.no_sync()``, from a
  ``DataLoader(batch_sampler=BatchSampler(DistributedSampler(...)))`` (HF-style sharding), ``set_epoch`` each epoch
- ``manual``: no torch.optim: the update is ``p.data.add_(...)`` by hand (``MARK=1``: ``ddpdoctor.step()`` after it)
- ``join``: uneven inputs on purpose (rank 0 one batch less per epoch) under ``torch.distributed.algorithms.Join``
- ``accelerate``: a shuffling DataLoader prepared by ``accelerate.Accelerator`` (what the HF Trainer does)
- ``sam``: sharpness-aware minimisation, two forward/backward passes per optimizer step on one batch, gradients
  cleared (``zero_grad()``) between each forward and its backward: the first pass's all-reduced gradient is used
  (to perturb the weights) and thrown away, not accumulated
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, TensorDataset

KIND = os.environ.get("KIND", "accum")
STEPS = int(os.environ.get("STEPS", "8"))
ACCUM = int(os.environ.get("ACCUM", "4"))
EPOCHS = int(os.environ.get("EPOCHS", "2"))
WIDTH = int(os.environ.get("WIDTH", "256"))

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 10)))


def loss_of(x, y):
    return nn.functional.cross_entropy(model(x), y)


if KIND == "accum":  # over a BatchSampler(DistributedSampler) loader (HF-style sharding), set_epoch each epoch
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n = STEPS * ACCUM * 16 * world
    data = TensorDataset(torch.randn(n, WIDTH), torch.randint(0, 10, (n,)))
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_sampler=BatchSampler(sampler, batch_size=16, drop_last=False))
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if (i + 1) % ACCUM:
                with model.no_sync():
                    (loss_of(x, y) / ACCUM).backward()
            else:
                (loss_of(x, y) / ACCUM).backward()
                opt.step()
                opt.zero_grad()
elif KIND == "manual":
    import ddpdoctor

    mark = os.environ.get("MARK") == "1"
    for _step in range(STEPS):
        x, y = torch.randn(64, WIDTH), torch.randint(0, 10, (64,))
        loss_of(x, y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.01)
                p.grad = None
        if mark:
            ddpdoctor.step()
elif KIND == "join":
    from torch.distributed.algorithms.join import Join

    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n = STEPS + (0 if rank == 0 else 1)  # rank 0: one batch less per epoch, shadowed by Join
    data = TensorDataset(torch.randn(n * 16, WIDTH), torch.randint(0, 10, (n * 16,)))
    loader = DataLoader(data, batch_size=16)
    for _epoch in range(EPOCHS):
        with Join([model]):
            for x, y in loader:
                opt.zero_grad()
                loss_of(x, y).backward()
                opt.step()
elif KIND == "accelerate":
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    data = TensorDataset(torch.randn(STEPS * 16 * world, WIDTH), torch.randint(0, 10, (STEPS * 16 * world,)))
    loader = DataLoader(data, batch_size=16, shuffle=True)  # accelerate shards it (BatchSamplerShard)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    opt, loader = accelerator.prepare(opt, loader)
    for _epoch in range(EPOCHS):
        for x, y in loader:
            opt.zero_grad()
            loss_of(x, y).backward()
            opt.step()
elif KIND == "sam":
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(STEPS * 16 * world, WIDTH), torch.randint(0, 10, (STEPS * 16 * world,)))
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = loss_of(x, y)
            opt.zero_grad()
            loss.backward()
            with torch.no_grad():
                eps = [0.05 * p.grad / (p.grad.norm() + 1e-12) for p in model.parameters()]
                for p, e in zip(model.parameters(), eps, strict=True):
                    p.add_(e)
            loss = loss_of(x, y)
            opt.zero_grad()
            loss.backward()
            with torch.no_grad():
                for p, e in zip(model.parameters(), eps, strict=True):
                    p.sub_(e)
            opt.step()
else:
    raise SystemExit(f"unknown KIND {KIND}")
dist.barrier()
dist.destroy_process_group()
