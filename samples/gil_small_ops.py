"""Threads that take turns on the GIL, and their twins that do not: four Python threads per step, each doing small
torch operations and a little Python bookkeeping (as a thread pool feeding a model, or DataParallel's per-GPU
threads with tiny layers). Small ops spend their time in the interpreter and the dispatcher, under the GIL, so
the threads run one at a time: `gil-contention` fires.

    ddpdoctor trace samples/gil_small_ops.py                 # 4 threads: gil-contention
    ddpdoctor trace samples/gil_small_ops.py --threads 1     # the twin: the same work on one worker thread
    ddpdoctor trace samples/gil_small_ops.py --threads 0     # the same work on the main thread
    ddpdoctor trace samples/gil_small_ops.py --release       # 4 threads in large matmuls and sleeps: GIL released
    ddpdoctor trace samples/gil_small_ops.py --sleepy        # 4 threads that mostly sleep: little lost to the GIL
    python samples/gil_small_ops.py --speed                  # 4 threads against the same work done serially
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=4, help="worker threads; 0: the main thread does the work")
    parser.add_argument("--parts", type=int, default=4, help="pieces of work per step (one per thread)")
    parser.add_argument("--ops", type=int, default=150, help="small torch operations per piece")
    parser.add_argument("--python", type=int, default=40, help="Python bookkeeping iterations per small op")
    parser.add_argument("--release", action="store_true", help="pieces that release the GIL (big matmul, sleep)")
    parser.add_argument(
        "--sleepy", action="store_true", help="pieces that mostly sleep: 20 x (sleep 1 ms, one small op)"
    )
    parser.add_argument("--speed", action="store_true", help="print the threads' speed against serial and exit")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    weights = [torch.randn(16, 16, requires_grad=True) for _ in range(args.parts)]
    big = torch.randn(320, 320)
    optimizer = torch.optim.SGD(weights, lr=1e-4)

    def piece(i: int) -> torch.Tensor:
        if args.release:
            for _ in range(4):
                big @ big  # one large op: the GIL is released while it runs
            time.sleep(0.005)
            loss = (torch.ones(4, 16) @ weights[i]).square().mean()
            loss.backward()
            return loss.detach()
        if args.sleepy:  # the threads wake together now and then and meet the GIL, but hardly work
            x = torch.ones(4, 16)
            for _ in range(20):
                time.sleep(0.001)
                x = torch.tanh(x @ weights[i])
            loss = x.square().mean()
            loss.backward()
            return loss.detach()
        x, seen = torch.ones(4, 16), []
        for k in range(args.ops):
            x = torch.tanh(x @ weights[i]) * 0.5 + 0.1  # small ops: interpreter and dispatcher time
            seen.append(sum(j * k for j in range(args.python)))  # a little Python bookkeeping
        loss = x.square().mean() + 0.0 * len(seen)
        loss.backward()  # each thread its own backward, as a thread per replica does
        return loss.detach()

    def step(pool: ThreadPoolExecutor | None) -> None:
        optimizer.zero_grad()
        losses = list(pool.map(piece, range(args.parts))) if pool else [piece(i) for i in range(args.parts)]
        torch.stack(losses).sum().item()
        optimizer.step()

    if args.speed:
        with ThreadPoolExecutor(max(args.threads, 1)) as pool:
            timed = {}
            for name, p in (("serial", None), ("threads", pool)) * 2:
                t = time.perf_counter()
                for _ in range(args.steps):
                    step(p)
                timed[name] = time.perf_counter() - t
        print(f"threads {timed['serial'] / timed['threads']:.2f}x the speed of serial")
        return
    pool = ThreadPoolExecutor(args.threads) if args.threads > 0 else None
    try:
        for _ in range(args.steps):
            step(pool)
    finally:
        if pool is not None:
            pool.shutdown()


if __name__ == "__main__":
    main()
