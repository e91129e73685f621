"""A 2-rank DDP job (CPU + gloo) for the host-load tests: every rank does the same work each step.

Environment knobs, applied once the model is built (the start-up, torch's import above all, runs at full speed):

- PIN_CPUS="0,1": rank r and all its threads on CPU PIN_CPUS[r];
- BURNERS=n: rank 0 starts n CPU burners (``while True: pass``, each in a session of its own, as another user's
  job would be) pinned to its CPU, and kills them when the loop ends (each also stops by itself after 60 s);
- NICE=n: rank 0 lowers its priority by n (on a host whose other CPUs are busy too, the kernel's load balancing
  would otherwise starve every rank alike, and nothing would tell the starved rank from the others);
- SLOW_RANK/SLOW_MS: that rank sleeps SLOW_MS before each step (a rank that is truly slow, not starved);
- SLEEP_MS: every rank sleeps that long each step; WIDTH: the layers' width (32 with SLEEP_MS: a job that needs
  little CPU); STEPS.
"""

import os
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

steps = int(os.environ.get("STEPS", "14"))
slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
slow_ms = float(os.environ.get("SLOW_MS", "0"))
sleep_ms = float(os.environ.get("SLEEP_MS", "0"))
width = int(os.environ.get("WIDTH", "512"))
torch.set_num_threads(1)

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(256, width)


def _threads() -> list[int]:
    return [int(t) for t in os.listdir("/proc/self/task")]


burners = []
if os.environ.get("PIN_CPUS"):
    cpu = int(os.environ["PIN_CPUS"].split(",")[rank])
    for tid in _threads():  # gloo's threads too (affinity is per thread)
        os.sched_setaffinity(tid, {cpu})
    if rank == 0:
        for _ in range(int(os.environ.get("BURNERS", "0"))):
            hog = "import time\nend = time.time() + 60\nwhile time.time() < end: pass"
            burners.append(subprocess.Popen([sys.executable, "-c", hog], start_new_session=True))
            os.sched_setaffinity(burners[-1].pid, {cpu})
if os.environ.get("NICE") and rank == 0:  # rank 0 yields to the CPU's other processes (it is starved, not slow)
    # With autogroup scheduling a session shares the CPU as one, so the nice value that counts is the session's
    # (/proc/self/autogroup), without it each thread's own. torchrun starts each rank in a session of its own.
    assert os.getsid(0) == os.getpid(), "rank 0 shares its session: its nice value would slow the others too"
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(os.environ["NICE"])
    except OSError:
        pass
    for tid in _threads():
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + int(os.environ["NICE"]))
try:
    for _ in range(steps):
        if rank == slow_rank:
            time.sleep(slow_ms / 1000)
        if sleep_ms:
            time.sleep(sleep_ms / 1000)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
finally:
    for hog in burners:
        os.killpg(hog.pid, signal.SIGKILL)
        hog.wait()
dist.barrier()
dist.destroy_process_group()
