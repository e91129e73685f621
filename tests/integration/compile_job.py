"""A small torch.compile'd training job that counts what dynamo compiles (tests/integration/test_compile_jobs.py).

Run bare (``torchrun ... compile_job.py`` or ``python compile_job.py``) and under ``ddpdoctor trace``: the counts
must be the same (a profiler must not change the program it measures). Environment:
FORM   inner (DDP(torch.compile(model)), the default), outer (torch.compile(DDP(model))), method (model.compile()),
       function (torch.compile(train_step) around the forward and loss)
DIST   1 (default: a DDP job under torchrun) or 0 (one process, no DDP)
COMPILE_BACKEND  count (a backend that counts the graphs it is given and their calls), count_aot (counts, and
       compiles them as aot_eager does), eager, aot_eager, inductor
RECOMPILE=1  the batch size changes every step and the model is compiled with dynamic=False: a recompile per step
STEPS, WIDTH, LAYERS, CAP_MB (DDP's bucket_cap_mb: DDPOptimizer splits the graph at DDP's buckets), RESULT (a file
for rank 0's counts as JSON).
"""

import json
import os

import torch
import torch.nn as nn

BACKEND = os.environ.get("COMPILE_BACKEND", "count")
FORM = os.environ.get("FORM", "inner")
RECOMPILE = os.environ.get("RECOMPILE", "0") == "1"
OPTIONS = {"dynamic": False} if RECOMPILE else {}
DIST = os.environ.get("DIST", "1") == "1"
STEPS = int(os.environ.get("STEPS", "12"))
WIDTH = int(os.environ.get("WIDTH", "512"))
LAYERS = int(os.environ.get("LAYERS", "4"))
counts = {"graphs": 0, "calls": 0}


def counting(gm, example_inputs):
    counts["graphs"] += 1
    compiled = gm.forward
    if BACKEND == "count_aot":  # the graphs AOT-compiled as aot_eager does (CompiledFunction ranges in the trace)
        from torch._dynamo.backends.registry import lookup_backend

        compiled = lookup_backend("aot_eager")(gm, example_inputs)

    def run(*args):
        counts["calls"] += 1
        return compiled(*args)

    return run


def main():
    if DIST:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group("gloo")
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    model = nn.Sequential(*layers)
    backend = counting if BACKEND in ("count", "count_aot") else BACKEND
    cap = float(os.environ.get("CAP_MB", "1"))
    wrap = (lambda m: DDP(m, bucket_cap_mb=cap)) if DIST else (lambda m: m)
    if FORM == "outer":
        net = torch.compile(wrap(model), backend=backend, **OPTIONS)
    elif FORM == "method":
        net = wrap(model)
        model.compile(backend=backend, **OPTIONS)
    elif FORM == "function":
        net = wrap(model)
    else:
        net = wrap(torch.compile(model, backend=backend, **OPTIONS))

    def loss_of(x, y):
        return nn.functional.mse_loss(net(x), y)

    if FORM == "function":
        loss_of = torch.compile(loss_of, backend=backend, **OPTIONS)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x, y = torch.randn(16, WIDTH), torch.randn(16, WIDTH)
    per_step = []
    for step in range(STEPS):
        if RECOMPILE:
            x, y = torch.randn(8 + step, WIDTH), torch.randn(8 + step, WIDTH)
        before = counts["calls"]
        opt.zero_grad()
        loss_of(x, y).backward()
        opt.step()
        per_step.append(counts["calls"] - before)
    from torch._dynamo.utils import counters

    out = {
        "graphs": counts["graphs"],
        "per_step": per_step,
        "unique_graphs": counters["stats"]["unique_graphs"],
        "frames": dict(counters["frames"]),
        "graph_breaks": sorted(counters["graph_break"]),
    }
    rank = 0
    if DIST:
        rank = dist.get_rank()
    if rank == 0 and os.environ.get("RESULT"):
        with open(os.environ["RESULT"], "w") as f:
            json.dump(out, f)
    if DIST:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
