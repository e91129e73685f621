"""Mistake: gradient accumulation without `no_sync()` -- DDP all-reduces after every micro-batch.

Each optimizer step accumulates `--accum` micro-batches. DDP all-reduces the gradients in every `backward()`,
although only the last one's result is used: `accum - 1` of every `accum` all-reduces are wasted
communication. ddpdoctor reports `allreduce-every-microstep` with the communication time that costs per step.

    ddpdoctor trace --standalone --nproc-per-node 2 samples/mistake_grad_accum_no_sync.py --accum 4

The fix: run the first `accum - 1` micro-batches inside `with model.no_sync():` (see the docs of the rule:
`ddpdoctor explain allreduce-every-microstep`).
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
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
    parser.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
    parser.add_argument("--batch-size", type=int, default=32, help="micro-batch size")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=4)
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)

    model = DDP(
        build_model(args.width, args.depth).to(device), device_ids=[device.index] if use_cuda else None
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    n = args.steps * args.accum * args.batch_size * dist.get_world_size()
    data = TensorDataset(torch.randn(n, args.width), torch.randint(0, 10, (n,)))
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    sampler.set_epoch(0)
    optimizer.zero_grad(set_to_none=True)
    for i, (x, y) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device)) / args.accum
        loss.backward()  # the mistake: all-reduces now, although only every accum-th result is used
        if (i + 1) % args.accum == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
