"""A GIL-bound threaded step: four threads each prepare their inputs in pure Python (per-sample "decoding and
augmentation", as thread-pool data loading does) and then run a model made of many tiny operations, as
DataParallel's parallel_apply does with one thread per GPU. Pure-Python work and tiny ops spend their time in the
interpreter and the dispatcher, under the GIL, so the threads take turns instead of running in parallel.

    ddpdoctor trace samples/gil_threads.py
"""

from __future__ import annotations

import argparse
import math
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn as nn


def augment(seed: int, n: int) -> list[float]:
    """Per-sample Python work (stands for decoding, tokenising, augmenting): holds the GIL throughout."""
    x, out = float(seed % 97) + 0.5, []
    for k in range(n):
        x = (x * 1.000031 + math.sin(k)) % 7.0
        out.append(x)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument(
        "--python-work", type=int, default=60000, help="pure-Python iterations per thread and step"
    )
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
        values = augment(i, args.python_work)
        x = torch.tensor(values[: 8 * 16]).view(8, 16)
        return replicas[i](x).square().mean()

    with ThreadPoolExecutor(args.threads) as pool:
        for _ in range(args.steps):
            losses = list(pool.map(replica_step, range(args.threads)))
            optimizer.zero_grad()
            torch.stack(losses).sum().backward()
            optimizer.step()


if __name__ == "__main__":
    main()
