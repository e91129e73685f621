"""Mistake: every rank runs as many intra-op threads as the node has CPUs.

`torch.set_num_threads(os.cpu_count())`, copied from a single-process script, undoes torchrun's
`OMP_NUM_THREADS=1`: with N ranks per node the node runs N x cpu_count compute threads that fight for the same
cores. ddpdoctor reports `cpu-thread-oversubscription`.

    ddpdoctor trace --standalone --nproc-per-node 2 samples/mistake_thread_oversubscription.py

The fix: leave the thread count to torchrun, or give each rank its share: `torch.set_num_threads(max(1,
os.cpu_count() // int(os.environ["LOCAL_WORLD_SIZE"])))`.
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

    torch.set_num_threads(os.cpu_count() or 1)  # the mistake: all cores, in every rank
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)

    model = DDP(
        nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 10)).to(device),
        device_ids=[device.index] if use_cuda else None,
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
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
