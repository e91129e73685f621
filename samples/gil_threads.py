"""A GIL-bound threaded step: four threads each run a model made of many tiny operations, as DataParallel's
parallel_apply does with one thread per GPU. Tiny ops spend their time in Python and the dispatcher, under the
GIL, so the threads take turns instead of running in parallel.

    ddpdoctor trace samples/gil_threads.py
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn as nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=60)
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    replicas = [
        nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(args.layers)])
        for _ in range(args.threads)
    ]
    params = [p for r in replicas for p in r.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.001)

    def replica_step(i: int) -> torch.Tensor:
        return replicas[i](torch.randn(8, 16)).square().mean()

    with ThreadPoolExecutor(args.threads) as pool:
        for _ in range(args.steps):
            losses = list(pool.map(replica_step, range(args.threads)))
            optimizer.zero_grad()
            torch.stack(losses).sum().backward()
            optimizer.step()


if __name__ == "__main__":
    main()
