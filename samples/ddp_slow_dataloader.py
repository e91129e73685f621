"""A data-loading bottleneck: each sample costs ~1 ms of CPU work in the main process (num_workers=0), so the
model waits for data every step. The fix is --num-workers (and pin_memory / persistent_workers on GPUs).

    ddpdoctor trace --standalone --nproc-per-node 2 samples/ddp_slow_dataloader.py
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class SlowDataset(Dataset):
    """Decoding/augmenting one sample takes `cost_ms` (stands for JPEG decoding, tokenisation, ...)."""

    def __init__(self, n: int, width: int, cost_ms: float) -> None:
        self.n, self.width, self.cost_ms = n, width, cost_ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.cost_ms / 1000)
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.width, generator=g), i % 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--cost-ms", type=float, default=1.0)
    parser.add_argument("--num-workers", type=int, default=0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    data = SlowDataset(args.steps * args.batch_size * dist.get_world_size(), 256, args.cost_ms)
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, num_workers=args.num_workers)
    sampler.set_epoch(0)
    for x, y in loader:
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
