"""One process of the flight benchmark: a small training loop on a one-rank gloo group (an all_reduce per
parameter each step, as DDP's buckets), with or without what ``ddpdoctor trace`` adds in every rank for the dumps:
the Flight Recorder (``TORCH_FR_BUFFER_SIZE``, set by the caller) and the phase tracker's hooks
(``BENCH_PHASE=1``). BENCH_MICRO=1: only the CPU time of one small all_reduce, {"collective_us"}.
Else prints {"step_us": [...], "cpu_us": [...]}: wall and CPU time (all the process's threads:
gloo's too) of every measured step."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist

STEPS = int(os.environ.get("BENCH_STEPS", "200"))
WARM = 20


def collective_us(blocks: int = 7, calls: int = 2000) -> float:
    """CPU time of one small all_reduce (the least over blocks of calls): what the Flight Recorder adds to each."""
    t = torch.ones(4)
    for _ in range(200):
        dist.all_reduce(t)
    best = float("inf")
    for _ in range(blocks):
        c = time.process_time()
        for _ in range(calls):
            dist.all_reduce(t)
        best = min(best, (time.process_time() - c) / calls * 1e6)
    return best


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        if os.environ.get("BENCH_MICRO") == "1":
            json.dump({"collective_us": collective_us()}, sys.stdout)
            dist.destroy_process_group()
            return
        tracker = None
        if os.environ.get("BENCH_PHASE") == "1":
            from ddpdoctor.capture.phase import PhaseTracker

            tracker = PhaseTracker()
            tracker.install()
        torch.manual_seed(0)
        layers = [torch.nn.Linear(256, 256) for _ in range(4)]
        model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.ReLU())])
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(64, 256)
        times, cpu = [], []
        for step in range(WARM + STEPS):
            t, c = time.perf_counter(), time.process_time()
            loss = model(x).square().mean()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
            opt.zero_grad()
            if tracker is not None:
                tracker.step_ended(step + 1)  # what the session does from the optimizer's post-hook
            if step >= WARM:
                times.append((time.perf_counter() - t) * 1e6)
                cpu.append((time.process_time() - c) * 1e6)
        if tracker is not None:
            tracker.uninstall()
        dist.destroy_process_group()
    json.dump({"step_us": times, "cpu_us": cpu}, sys.stdout)


if __name__ == "__main__":
    main()
