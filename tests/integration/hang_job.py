"""A 2-rank DDP job (CPU + gloo) for the hang tests; it steps fast, then stalls the way the test asks.

STUCK_RANK/STUCK_STEP: that rank is stuck in its data function (``read_shard``) at that step, forever.
DESYNC_STEP: at that step rank 0 all-reduces a 1-element metric while rank 1 broadcasts a 4-element tensor.
SLOW_STEP/SLOW_S: every rank sleeps that long at that step (a compile-like first step), then goes on.
STEPS: steps in all; SLEEP_MS: per step. FAKE_DUMPS=1: the job answers dumps/request.json itself (for a capture
that does not yet do it).
"""

import os
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = int(os.environ.get("STEPS", "12"))
STUCK_RANK = int(os.environ.get("STUCK_RANK", "-1"))
STUCK_STEP = int(os.environ.get("STUCK_STEP", "6"))
DESYNC_STEP = int(os.environ.get("DESYNC_STEP", "-1"))
SLOW_STEP = int(os.environ.get("SLOW_STEP", "-1"))
SLOW_S = float(os.environ.get("SLOW_S", "0"))
SLEEP_MS = float(os.environ.get("SLEEP_MS", "0"))
step = 0


def read_shard(rank, step):
    if rank == STUCK_RANK and step == STUCK_STEP:
        while True:  # an NFS read that never returns
            time.sleep(0.1)
    return torch.randn(16, 32)


def fake_dumps(rank, world):
    """Answer ddpdoctor's dump requests the way the capture does (only with FAKE_DUMPS=1)."""
    import json

    import msgspec

    from ddpdoctor import rundir
    from ddpdoctor.flight.read import read_torch_dump
    from ddpdoctor.runfile_types import Frame, ThreadStack

    out = json.loads(os.environ["DDPDOCTOR_CAPTURE"])["out"]
    request = os.path.join(out, "dumps", "request.json")
    seen = set()
    main_id = threading.main_thread().ident
    while True:
        time.sleep(0.3)
        try:
            with open(request) as f:
                req = json.load(f)
        except (OSError, ValueError):
            continue
        if req["id"] in seen:
            continue
        seen.add(req["id"])
        dump = read_torch_dump(torch._C._distributed_c10d._dump_fr_trace(True, True, False), rank=rank)
        frames = sys._current_frames()
        threads = [
            ThreadStack(
                name="MainThread" if ident == main_id else str(ident),
                ident=ident,
                main=ident == main_id,
                frames=[
                    Frame(file=f.filename, line=f.lineno or 0, name=f.name)
                    for f in __import__("traceback").extract_stack(fr)
                ],
            )
            for ident, fr in frames.items()
        ]
        dump = msgspec.structs.replace(
            dump,
            rank=rank,
            world_size=world,
            pid=os.getpid(),
            request=req["id"],
            reason=req["reason"],
            time=time.time(),
            step=step,
            threads=threads,
        )
        path = os.path.join(out, "dumps", f"rank{rank}.{req['id']}.json")
        rundir.atomic_write_bytes(__import__("pathlib").Path(path), msgspec.json.encode(dump))


def main():
    global step
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if os.environ.get("FAKE_DUMPS") == "1":
        threading.Thread(target=fake_dumps, args=(rank, world), daemon=True).start()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        x = read_shard(rank, step)
        if step == SLOW_STEP:
            time.sleep(SLOW_S)
        if step == DESYNC_STEP:
            if rank == 0:
                dist.all_reduce(torch.ones(1))
            else:
                dist.broadcast(torch.ones(4), src=1)
        if SLEEP_MS:
            time.sleep(SLEEP_MS / 1000)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} finished {STEPS} steps")


if __name__ == "__main__":
    main()
