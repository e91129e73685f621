"""DDP training on the GPU for the GPU checks (run under ``torchrun`` bare, or under ``ddpdoctor trace``).

    --backend nccl --set-device       the correct job: each rank calls torch.cuda.set_device(local_rank)
    --backend gloo --no-set-device    the mistake: ranks never call set_device and all compute on cuda:0

It records, independently of ddpdoctor: the bytes DDP must all-reduce per step (every parameter's gradient),
the wall time of every step (``time.perf_counter``, with ``loss.item()`` ending each step as a logging loop
does), the GPU each rank computes on (index and UUID) and the allocator's peaks.
"""

from __future__ import annotations

import argparse
import os
import time

import _measure
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    p.add_argument("--set-device", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--batch", type=int, default=1024)
    args = p.parse_args()
    _measure.shrink_for_cpu(args)

    local_rank = int(os.environ["LOCAL_RANK"])
    if _measure.CPU_SMOKE:
        device, args.backend = torch.device("cpu"), "gloo"
    elif args.set_device:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cuda")  # the mistake: the current device, cuda:0 on every rank
    dist.init_process_group(args.backend)
    torch.manual_seed(0)
    layers = [m for _ in range(args.depth) for m in (nn.Linear(args.width, args.width), nn.ReLU())]
    module = nn.Sequential(*layers, nn.Linear(args.width, 10)).to(device)
    model = DDP(module, device_ids=[local_rank] if args.set_device and device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    host_x = _measure.pinned(torch.randn(args.batch, args.width))
    host_y = _measure.pinned(torch.randint(0, 10, (args.batch,)))

    wall_ms = []
    t_last = time.perf_counter()
    t_loop = t_last
    for _ in range(args.steps):
        x = host_x.to(device, non_blocking=True)
        y = host_y.to(device, non_blocking=True)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        now = time.perf_counter()
        wall_ms.append((now - t_last) * 1e3)
        t_last = now
    loop_s = time.perf_counter() - t_loop
    params = list(module.parameters())
    model_device = params[0].device
    record = {
        "workload": "ddp",
        "args": vars(args),
        "backend": dist.get_backend(),
        "world_size": dist.get_world_size(),
        "gradient_bytes_per_step": sum(q.numel() * q.element_size() for q in params if q.requires_grad),
        "model_device_index": model_device.index,
        "model_device_uuid": _uuid(model_device),
        "wall_ms": wall_ms,
        "loop_s": loop_s,
        **_measure.memory_peaks(model_device.index or 0),
        **_measure.device_facts(),
    }
    _measure.write(record)
    dist.barrier()
    dist.destroy_process_group()


def _uuid(device: torch.device) -> str | None:
    if device.type != "cuda":
        return None
    return str(getattr(torch.cuda.get_device_properties(device), "uuid", ""))


if __name__ == "__main__":
    main()
