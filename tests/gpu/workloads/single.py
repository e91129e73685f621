"""One-process CUDA training for the GPU checks (run bare or under ``ddpdoctor trace``).

Per step it records, independently of ddpdoctor: the GPU time between two ``torch.cuda.Event``s around all the
work the step launches, the wall time of the step, and the time spent inside ``.item()`` calls. At the end it
records ``torch.cuda.max_memory_allocated()`` / ``max_memory_reserved()`` and which devices it touched.

    --vary            step k runs (k % 3) * 8 extra matrix products: per-step GPU time differs, so a step
                      matched to the wrong ProfilerStep shows
    --reserve F       after the first step, hold a buffer so the allocator reserves about F of the GPU's memory
    --sync-every N    call .item() on the activations every N layers (a host sync); 0 = never
    --train-last N    train only the last N linear layers (a fine-tuning loop: backward is short); 0 = all
    --log-every N     call loss.item() after backward every N steps, as a logging loop does (0 = never):
                      with 1, steps do not run ahead of each other on the GPU
"""

from __future__ import annotations

import argparse
import time

import _measure
import torch
import torch.nn as nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--vary", action="store_true")
    p.add_argument("--reserve", type=float, default=0.0)
    p.add_argument("--sync-every", type=int, default=0)
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--train-last", type=int, default=0)
    args = p.parse_args()
    _measure.shrink_for_cpu(args)

    device = _measure.device(0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    layers = [m for _ in range(args.depth) for m in (nn.Linear(args.width, args.width), nn.ReLU())]
    model = nn.Sequential(*layers, nn.Linear(args.width, 10)).to(device)
    if args.train_last:
        linears = [m for m in model if isinstance(m, nn.Linear)]
        for m in linears[: -args.train_last]:
            m.requires_grad_(False)
    opt = torch.optim.SGD([q for q in model.parameters() if q.requires_grad], lr=1e-4)
    extra_w = torch.randn(args.width, args.width, device=device) / args.width**0.5
    host_x = _measure.pinned(torch.randn(args.batch, args.width))
    host_y = _measure.pinned(torch.randint(0, 10, (args.batch,)))

    timer = _measure.StepTimer(args.steps)
    wall_ms, item_ms, items = [], [], []
    ballast = None
    for step in range(args.steps):
        t0 = time.perf_counter()
        in_item = 0.0
        timer.mark(step, 0)
        x = host_x.to(device, non_blocking=True)
        y = host_y.to(device, non_blocking=True)
        h = x
        for i, layer in enumerate(model):
            h = layer(h)
            if args.sync_every and isinstance(layer, nn.ReLU) and (i // 2) % args.sync_every == 0:
                t = time.perf_counter()
                items.append(h[0, 0].item())  # the host waits for every kernel queued so far
                in_item += time.perf_counter() - t
        loss = nn.functional.cross_entropy(h, y)
        if args.vary:
            with torch.no_grad():
                z = x
                for _ in range((step % 3) * 8):
                    z = z @ extra_w
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.log_every and step % args.log_every == 0:
            # Before opt.step(), which holds ddpdoctor's step boundary (the optimizer step hook): at the
            # boundary only the optimizer's kernels are still queued, so no step's GPU work runs in the next.
            loss.item()
        opt.step()
        timer.mark(step, 1)
        if step == 0 and args.reserve > 0 and device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
            want = int(args.reserve * total) - torch.cuda.memory_reserved(device)
            if want > 0:
                ballast = torch.empty(want, dtype=torch.uint8, device=device)
        wall_ms.append((time.perf_counter() - t0) * 1e3)
        item_ms.append(in_item * 1e3)
    record = {
        "workload": "single",
        "args": vars(args),
        "event_ms": timer.elapsed_ms(),
        "wall_ms": wall_ms,
        "item_ms": item_ms,
        "item_calls_per_step": len(items) // max(args.steps, 1),
        "ballast_bytes": 0 if ballast is None else ballast.numel(),
        "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        **_measure.memory_peaks(0),
        **_measure.device_facts(),
    }
    _measure.write(record)


if __name__ == "__main__":
    main()
