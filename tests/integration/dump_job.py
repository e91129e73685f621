"""A small 2-rank gloo job for the dump tests (tests/integration/test_trace_dumps.py).

MODE=wait: at step 3 rank 1 sits in its data function (``read_batch``) until the file RELEASE exists (90 s at most; it
creates the file STALLED first),
while rank 0 waits in the gradients' all_reduce. MODE=crash: rank 1 raises at step 4, after its all_reduce.
MODE=long: STEPS steps of SLEEP_S each, nothing goes wrong. SPAWN=1: the ranks are started by ``mp.spawn`` (the
start-up hook traces them), not by torchrun.
"""

import os
import time

import torch
import torch.distributed as dist

MODE = os.environ.get("MODE", "long")
RELEASE = os.environ.get("RELEASE", "")
STEPS = int(os.environ.get("STEPS", "6"))
SLEEP_S = float(os.environ.get("SLEEP_S", "0"))


def read_batch(rank, step):
    if MODE == "wait" and rank == 1 and step == 3:
        open(os.environ["STALLED"], "w").close()  # tells the test it sits here now
        deadline = time.time() + 90
        while time.time() < deadline and not os.path.exists(RELEASE):
            time.sleep(0.05)
    return torch.randn(8, 4)


def main(rank=None, world_size=None):
    if rank is None:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, STEPS + 1):
        x = read_batch(rank, step)
        loss = model(x).sum()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        if MODE == "crash" and rank == 1 and step == 4:
            raise RuntimeError("bad shard at step 4")
        opt.step()
        opt.zero_grad()
        time.sleep(SLEEP_S)
    dist.barrier()
    dist.destroy_process_group()


def spawned(rank, world_size):
    main(rank, world_size)


if __name__ == "__main__":
    if os.environ.get("SPAWN") == "1":
        import socket

        import torch.multiprocessing as mp

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        mp.spawn(spawned, args=(2,), nprocs=2)
    else:
        main()
