"""Mistake: a process group and a DistributedSampler, but DDP only on GPUs -- on CPU the ranks never synchronise.

Shaped like pytorch/examples' imagenet/main.py, which wraps the model in DistributedDataParallel only when it runs on
GPUs: on CPU (`--dist-backend gloo`) every rank trains its own model on its own shard, their losses drift apart,
and nothing fails. ddpdoctor reports `ranks-never-synchronize` (error).

    ddpdoctor trace --standalone --nproc-per-node 2 samples/mistake_no_ddp_on_cpu.py

The fix: wrap the model in DDP on every device (`DDP(model)` on CPU, `DDP(model, device_ids=[gpu])` on a GPU).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=12, help="batches per epoch and rank")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--width", type=int, default=128)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 10))
    gpu = torch.cuda.current_device() if torch.cuda.is_available() else None
    if gpu is not None:  # the mistake: DDP only on GPUs
        model = DDP(model.cuda(gpu), device_ids=[gpu])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    n = args.steps * args.batch_size * world
    data = TensorDataset(torch.randn(n, args.width), torch.randint(0, 10, (n,)))
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
