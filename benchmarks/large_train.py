"""The training script the large-trace benchmark traces: a deep, narrow DDP MLP (CPU + gloo), so each step
records tens of thousands of small operator events, the way a large real model fills a trace. It runs a fixed
number of steps; `ddpdoctor trace --active N` decides how many of them are recorded (and so the trace size).

    ddpdoctor trace --standalone --nproc-per-node 2 --wait 1 --warmup 1 --active 25 \
        benchmarks/large_train.py --depth 64 --steps 30
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--depth", type=int, default=64, help="Linear+LayerNorm+ReLU blocks")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)  # 2 ranks on 2 cores
    blocks: list[nn.Module] = []
    for _ in range(args.depth):
        blocks += [nn.Linear(args.width, args.width), nn.LayerNorm(args.width), nn.ReLU()]
    model = DDP(nn.Sequential(*blocks, nn.Linear(args.width, 10)), bucket_cap_mb=0.25)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(args.batch_size, args.width)
    y = torch.randint(0, 10, (args.batch_size,))
    for _ in range(args.steps):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
