"""A configurable 2-rank DDP training script for the integration tests (CPU + gloo).

Environment knobs (so the tests need not edit code): STEPS, FAIL_RANK/FAIL_STEP (raise there),
SLEEP_MS (sleep per step, to make the run long enough to signal), SLOW_RANK/SLOW_MS (straggler),
HANG_RANK/HANG_STEP (never finish that step).
"""

import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

steps = int(os.environ.get("STEPS", "10"))
fail_rank = int(os.environ.get("FAIL_RANK", "-1"))
fail_step = int(os.environ.get("FAIL_STEP", "-1"))
sleep_ms = float(os.environ.get("SLEEP_MS", "0"))
slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
slow_ms = float(os.environ.get("SLOW_MS", "0"))
hang_rank = int(os.environ.get("HANG_RANK", "-1"))
hang_step = int(os.environ.get("HANG_STEP", "-1"))

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(steps):
    if rank == fail_rank and step == fail_step:
        raise RuntimeError(f"injected failure on rank {rank} at step {step}")
    if rank == hang_rank and step == hang_step:
        while (
            True
        ):  # a rank stuck in Python (a deadlocked data pipeline, say); its peer then waits in all-reduce
            time.sleep(0.1)
    if rank == slow_rank:
        time.sleep(slow_ms / 1000)
    if sleep_ms:
        time.sleep(sleep_ms / 1000)
    x = torch.randn(32, 256)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} finished {steps} steps")
