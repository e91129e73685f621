"""A 2-rank DDP job (CPU + gloo) for the host-load tests: every rank does the same work each step.

Environment knobs: STEPS; PIN_CPUS="0,1" pins rank r to CPU PIN_CPUS[r] (before the process group exists, so
gloo's and torch's threads inherit it); NICE: rank 0 lowers its priority by that much (on a host whose other
CPUs are busy too, the kernel's load balancing would otherwise starve every rank alike, and nothing would tell
the starved rank from the others); SLOW_RANK/SLOW_MS: that rank sleeps SLOW_MS before each step (a rank that
is truly slow, not starved); SLEEP_MS: every rank sleeps that long each step; WIDTH: the layers' width (64 with SLEEP_MS: a job that needs
little CPU).
"""

import os
import time

pin = os.environ.get("PIN_CPUS")
rank_env = int(os.environ.get("RANK", "0"))
if pin:
    os.sched_setaffinity(0, {int(pin.split(",")[rank_env])})
if os.environ.get("NICE") and rank_env == 0:  # rank 0 yields to the CPU's other processes (it is starved, not slow)
    # With autogroup scheduling a session shares the CPU as one, so the nice value that counts is the session's
    # (/proc/self/autogroup), without it the process's own. torchrun starts each rank in a session of its own.
    assert os.getsid(0) == os.getpid(), "rank 0 shares its session: its nice value would slow the others too"
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(os.environ["NICE"])
    except OSError:
        pass
    os.nice(int(os.environ["NICE"]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

steps = int(os.environ.get("STEPS", "14"))
slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
slow_ms = float(os.environ.get("SLOW_MS", "0"))
sleep_ms = float(os.environ.get("SLEEP_MS", "0"))
width = int(os.environ.get("WIDTH", "512"))  # 64: a job that needs little CPU
torch.set_num_threads(1)

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(256, width)
for step in range(steps):
    if rank == slow_rank:
        time.sleep(slow_ms / 1000)
    if sleep_ms:
        time.sleep(sleep_ms / 1000)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.barrier()
dist.destroy_process_group()
