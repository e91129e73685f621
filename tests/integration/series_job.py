"""A 2-rank DDP job (CPU + gloo) that trains until the file named by STOP_FILE exists (both ranks stop at the same
step: rank 0's "stop" is all-reduced each step), at most MAX_STEPS steps; rank 0 prints ddpdoctor.summary() at the end
(tests/integration/test_series_live.py)."""

import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ddpdoctor

stop_file = os.environ["STOP_FILE"]
max_steps = int(os.environ.get("MAX_STEPS", "3000"))
sleep_s = float(os.environ.get("SLEEP_MS", "20")) / 1000

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
flag = torch.zeros(1)
steps = 0
while steps < max_steps:
    time.sleep(sleep_s)  # the data phase
    loss = model(torch.randn(16, 128)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    steps += 1
    flag[0] = 1.0 if rank == 0 and os.path.exists(stop_file) else 0.0
    dist.all_reduce(flag)
    if flag[0] > 0:
        break
if rank == 0:
    print("SUMMARY " + json.dumps(ddpdoctor.summary()), flush=True)
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} finished {steps} steps", flush=True)
