"""Mistake (GPUs only): ranks that never call `torch.cuda.set_device(local_rank)`.

Each rank puts its model on its own GPU explicitly, but its *current* device stays cuda:0. Everything that
uses the current device -- `torch.cuda.synchronize()` here, `device="cuda"`, `.cuda()`, `torch.load` of a GPU
checkpoint, NCCL's first use -- creates a CUDA context (300-500 MiB) and often tensors on GPU 0, once per
rank: GPU 0 runs out of memory first. ddpdoctor reports `ranks-share-cuda0` (and `gpu0-oom-risk` when the
stray memory shows).

    ddpdoctor trace --standalone --nproc-per-node 2 samples/mistake_no_set_device.py     # 2+ GPUs

The fix: `torch.cuda.set_device(local_rank)` first thing, before any CUDA call and before init_process_group.
On a machine without GPUs this runs as a healthy CPU + gloo job.
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
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ["LOCAL_RANK"])
    # the mistake: no torch.cuda.set_device(local_rank) -- the current device stays cuda:0
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    dist.init_process_group("nccl" if use_cuda else "gloo")
    torch.manual_seed(0)

    model = DDP(
        nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 10)).to(device),
        device_ids=[local_rank] if use_cuda else None,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    n = args.steps * args.batch_size * dist.get_world_size()
    data = TensorDataset(torch.randn(n, args.width), torch.randint(0, 10, (n,)))
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    sampler.set_epoch(0)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if use_cuda:
            torch.cuda.synchronize()  # the current device: cuda:0, not this rank's GPU
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
