"""A straggler: one rank does extra work before every step, so all others wait for it in each all-reduce.

On real clusters this is a slower GPU, a noisy neighbour, thermal throttling or an unbalanced data shard.

    ddpdoctor trace --active 8 --standalone --nproc-per-node 2 samples/ddp_straggler.py --slow-rank 1 --slow-ms 40

8 profiled steps (`--active 8`; 5 by default) are the fewest in which 2 ranks' "last every time" is not chance.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--slow-ms", type=float, default=40.0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(
        nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        if rank == args.slow_rank:
            time.sleep(args.slow_ms / 1000)  # stands for a slower device or a heavier shard
        x = torch.randn(args.batch_size, 512)
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
