"""Mistake: DDP without a DistributedSampler -- every rank reads the same samples.

The DataLoader shuffles with its default RandomSampler. Every rank seeds torch the same way (as most scripts
do), so every rank draws the same permutation and trains on the same batches: N ranks do the work of one, and
an epoch takes N times the steps it should. ddpdoctor reports `missing-distributed-sampler`.

    ddpdoctor trace --standalone --nproc-per-node 2 samples/mistake_no_distributed_sampler.py

The fix: `sampler = DistributedSampler(data, shuffle=True)`, `DataLoader(data, batch_size=...,
sampler=sampler)` and `sampler.set_epoch(epoch)` at the start of every epoch (see samples/ddp_train.py).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20, help="batches per epoch")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)  # the same seed on every rank: the same shuffle too

    model = DDP(
        nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 10)).to(device),
        device_ids=[device.index] if use_cuda else None,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    n = args.steps * args.batch_size
    data = TensorDataset(torch.randn(n, args.width), torch.randint(0, 10, (n,)))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)  # the mistake: no DistributedSampler

    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
