"""Poorly overlapped data parallelism: gradients all-reduced by hand, one tensor at a time, *after* backward.

This is what DDP exists to avoid: nothing hides the communication, so every step pays all of it. Compare with
samples/ddp_train.py (DDP buckets gradients and all-reduces them while backward is still running).

    ddpdoctor trace --standalone --nproc-per-node 2 samples/ddp_poor_overlap.py
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=6)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(args.width, 10))
    for p in model.parameters():  # same start on every rank, as DDP would do
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    world = dist.get_world_size()
    for _ in range(args.steps):
        x = torch.randn(args.batch_size, args.width)
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():  # the anti-pattern: blocking, unbucketed, after backward
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
