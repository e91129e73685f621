"""``torch.nn.DataParallel`` on one GPU (``device_ids=[0]``) for the GPU checks.

With one device DataParallel scatters the batch and then calls the module directly: no replicate, no
parallel_apply threads, no gather. The workload records what DataParallel itself says (its ``device_ids``) and
the allocator's peaks, independently of ddpdoctor.
"""

from __future__ import annotations

import argparse

import _measure
import torch
import torch.nn as nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--batch", type=int, default=1024)
    args = p.parse_args()
    _measure.shrink_for_cpu(args)

    device = _measure.device(0)
    torch.manual_seed(0)
    layers = [m for _ in range(args.depth) for m in (nn.Linear(args.width, args.width), nn.ReLU())]
    module = nn.Sequential(*layers, nn.Linear(args.width, 10)).to(device)
    model = nn.DataParallel(module, device_ids=[0] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width)  # on the host: DataParallel scatters it to the GPU
    y = torch.randint(0, 10, (args.batch,))
    for _ in range(args.steps):
        out = model(x)
        loss = nn.functional.cross_entropy(out, y.to(out.device, non_blocking=True))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
    record = {
        "workload": "dp",
        "args": vars(args),
        "device_ids": list(model.device_ids),
        "output_device": getattr(model, "output_device", None),  # unset on a machine without CUDA
        **_measure.memory_peaks(0),
        **_measure.device_facts(),
    }
    _measure.write(record)


if __name__ == "__main__":
    main()
