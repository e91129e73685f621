"""A small, healthy DistributedDataParallel training run: CPU + gloo here, GPUs + NCCL unchanged.

    torchrun --nproc-per-node 2 samples/ddp_train.py                 # bare
    ddpdoctor trace --nproc-per-node 2 samples/ddp_train.py          # traced

Healthy means: compute dominates the step, gradients are all-reduced in several buckets while backward runs, data
is sharded and cheap to load. Each parameter stays well under 32 MiB (glibc would mmap/unmap bigger tensors every
step on CPU, making step times jumpy). The data is synthetic and sharded with DistributedSampler, as a real job
should be.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def build_model(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=1)
    # 2 MB buckets (DDP's default is 25) give this ~8 MB model several buckets, so all-reduce overlaps backward.
    parser.add_argument("--bucket-cap-mb", type=float, default=2.0, help="DDP's bucket_cap_mb")
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    if use_cuda:
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    torch.manual_seed(0)

    model = DDP(
        build_model(args.width, args.depth).to(device),
        device_ids=[device.index] if use_cuda else None,
        bucket_cap_mb=args.bucket_cap_mb,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    n = args.steps * args.batch_size * dist.get_world_size()
    data = TensorDataset(torch.randn(n, args.width), torch.randint(0, 10, (n,)))
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
    if rank == 0:
        print(f"done: {args.steps} steps, last loss {loss.item():.4f}")
    dist.barrier()  # every rank reaches teardown together (gloo can hang in destroy otherwise)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
