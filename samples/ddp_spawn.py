"""The training loop of ``ddp_train.py``, with its ranks started by ``torch.multiprocessing.spawn`` (the pattern of
PyTorch's DDP tutorial and of ``pytorch/examples``) instead of torchrun. CPU + gloo here, GPUs + NCCL unchanged.

    python samples/ddp_spawn.py --nprocs 2                    # bare
    ddpdoctor trace samples/ddp_spawn.py --nprocs 2           # traced: both spawned ranks, no torchrun needed

The parent process only picks a free port and spawns the ranks; each rank joins the process group itself.
"""

from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def build_model(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def worker(rank: int, world_size: int, args: argparse.Namespace) -> None:
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world_size)
    if use_cuda:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
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

    n = args.steps * args.batch_size * world_size
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nprocs", type=int, default=2, help="ranks to spawn")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--bucket-cap-mb", type=float, default=2.0, help="DDP's bucket_cap_mb")
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    mp.spawn(worker, args=(args.nprocs, args), nprocs=args.nprocs, join=True)


if __name__ == "__main__":
    main()
