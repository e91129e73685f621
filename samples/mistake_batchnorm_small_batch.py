"""Mistake (info): BatchNorm in a DDP model with a small per-rank batch.

Each rank normalises with the statistics of its own 8 samples, not of the global batch: noisy statistics, a
different model than the single-GPU one you tuned. ddpdoctor reports `batchnorm-not-synced`.

    ddpdoctor trace --standalone --nproc-per-node 2 samples/mistake_batchnorm_small_batch.py

The fix: `model = nn.SyncBatchNorm.convert_sync_batchnorm(model)` before wrapping it in DDP (or larger
per-rank batches, or a normalisation that does not depend on the batch, such as GroupNorm or LayerNorm).
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
    parser.add_argument("--batch-size", type=int, default=8, help="per rank")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--sync-bn", action="store_true", help="the fix: SyncBatchNorm (needs CUDA)")
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)

    net = nn.Sequential(
        nn.Linear(args.width, args.width), nn.BatchNorm1d(args.width), nn.ReLU(), nn.Linear(args.width, 10)
    )
    if args.sync_bn:
        net = nn.SyncBatchNorm.convert_sync_batchnorm(net)
    model = DDP(net.to(device), device_ids=[device.index] if use_cuda else None)
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
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
