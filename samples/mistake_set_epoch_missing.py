"""Mistake: a shuffling DistributedSampler whose `set_epoch()` is never called -- every epoch, the same order.

DistributedSampler seeds its shuffle with `seed + epoch`; its epoch stays 0 unless the loop calls
`sampler.set_epoch(epoch)`, so each epoch replays exactly the first epoch's order (and each rank the same
shard in it). ddpdoctor reports `sampler-epoch-not-set`.

    ddpdoctor trace --standalone --nproc-per-node 2 samples/mistake_set_epoch_missing.py --epochs 3

The fix: call `sampler.set_epoch(epoch)` at the start of every epoch, before iterating the DataLoader.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="batches per epoch and rank")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)

    model = DDP(
        nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 10)).to(device),
        device_ids=[device.index] if use_cuda else None,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    n = args.steps * args.batch_size * dist.get_world_size()
    data = TensorDataset(torch.randn(n, args.width), torch.randint(0, 10, (n,)))
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    for _epoch in range(args.epochs):
        # the mistake: no sampler.set_epoch(_epoch) here
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
