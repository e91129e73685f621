"""The training script the capture-overhead benchmark runs three ways: bare, under `ddpdoctor trace`, and with
a hand-written torch.profiler using the same schedule (BENCH_PROFILE=1). It times every step itself and writes
BENCH_OUT/rank<R>.json, so all three are measured by the same clock in the same place."""

import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

steps = int(os.environ.get("BENCH_STEPS", "60"))
wait, warmup, active = (int(x) for x in os.environ.get("BENCH_SCHEDULE", "5,2,5").split(","))
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(512, 512), nn.ReLU())], nn.Linear(512, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
prof = None
if os.environ.get("BENCH_PROFILE") == "1":
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        # skip_first=1 matches ddpdoctor, whose schedule starts counting after iteration 0 (start-up)
        schedule=torch.profiler.schedule(skip_first=1, wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(os.environ["BENCH_OUT"] + "/tb", f"rank{rank}"),
        record_shapes=True,
        profile_memory=True,
        experimental_config=torch._C._profiler._ExperimentalConfig(profile_all_threads=True),
    )
    prof.start()
times = []
t0 = time.perf_counter()
last = t0
for _ in range(steps):
    x = torch.randn(64, 512)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if prof is not None:
        prof.step()
    now = time.perf_counter()
    times.append((now - last) * 1e3)
    last = now
if prof is not None:
    prof.stop()
total = time.perf_counter() - t0
os.makedirs(os.environ["BENCH_OUT"], exist_ok=True)
with open(os.path.join(os.environ["BENCH_OUT"], f"rank{rank}.json"), "w") as f:
    json.dump({"step_ms": times, "loop_s": total}, f)
dist.barrier()
dist.destroy_process_group()
