"""Mistake: ranks get different numbers of batches per epoch.

The data is sharded by hand (`Subset(data, range(rank, n, world_size))`) and `n` does not divide evenly, so
rank 0 gets one batch more than the others. In plain DDP the rank with the extra batch waits forever in an
all-reduce the others never join (the job hangs until the collective times out); this loop survives only
because it runs inside `model.join()`, where the finished ranks shadow the extra all-reduces. ddpdoctor
reports `uneven-batches-across-ranks`.

    ddpdoctor trace --standalone --nproc-per-node 2 samples/mistake_uneven_batches.py

The fix: give every rank the same number of batches -- `DistributedSampler(data)` pads the shards to equal
length (or `drop_last=True` drops the remainder); keep `model.join()` only where uneven inputs are intended.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20, help="batches per epoch of the shorter ranks")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)

    model = DDP(
        nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 10)).to(device),
        device_ids=[device.index] if use_cuda else None,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    n = args.steps * args.batch_size * world + 1  # one sample too many: rank 0's shard has one more batch
    data = TensorDataset(torch.randn(n, args.width), torch.randint(0, 10, (n,)))
    shard = Subset(data, range(rank, n, world))  # the mistake: hand-made shards of unequal length
    loader = DataLoader(shard, batch_size=args.batch_size)

    with model.join():  # without it, rank 0 hangs in its last all-reduce
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
