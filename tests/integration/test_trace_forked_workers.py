"""A traced script whose ``multiprocessing.Pool`` (fork) workers end by the SIGTERM that ``Pool.terminate()``
sends them (``with Pool(2) as pool:``). The workers are not the rank: they must die by it as in a bare run. With
the rank's handlers they raised ddpdoctor's ``_Terminated`` (a traceback per pool), their signal reached the rank's
watcher through its wakeup fd (a signal dump, the rank file "interrupted" while it ran), and under torchrun a rank
hung in the pool's ``__exit__``. One process (~5 s on 2 cores)."""

from __future__ import annotations

import pytest
from helpers import free_port, read_json, run_cli, write_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SCRIPT = """
import multiprocessing as mp
import torch


def prep(i):
    return float(torch.randn(8).sum()) * i


model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for round_ in range(6):
    with mp.get_context("fork").Pool(2) as pool:
        rows = pool.map(prep, range(64))
    for step in range(2):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
print("rounds done")
"""


def test_pool_workers_end_by_sigterm_as_in_a_bare_run(tmp_path):
    script = write_script(tmp_path / "pool_job.py", SCRIPT)
    out = tmp_path / "run"
    result = run_cli(
        "trace", "-q", "--out", str(out), "--wait", "1", "--warmup", "1", "--active", "2", str(script), timeout=120
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rounds done" in result.stdout
    assert "Traceback" not in result.stderr and "_Terminated" not in result.stderr, result.stderr[-3000:]
    rank = read_json(out / "ranks" / "rank0.json")
    assert rank["status"] == "ok" and rank["steps"]["count"] == 12, rank
    # no signal reached the rank: no dump of one (a run that ends well leaves no dumps at all)
    assert not (out / "dumps").exists() or not any((out / "dumps").glob("rank0.signal-*")), list(
        (out / "dumps").iterdir()
    )


SWEEP = """
import multiprocessing as mp
import torch


def fit(lr):
    m = torch.nn.Linear(8, 1)
    o = torch.optim.SGD(m.parameters(), lr=lr)
    for _ in range(30):
        m(torch.randn(16, 8)).pow(2).mean().backward()
        o.step()
        o.zero_grad()
    return lr


model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for round_ in range(3):
    for step in range(4):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    with mp.get_context("fork").Pool(2) as pool:
        pool.map(fit, [0.1, 0.01, 0.001, 0.2])
print("sweeps done")
"""


def test_pool_workers_that_train_models_of_their_own_write_nothing_into_the_run(tmp_path):
    """Forked workers inherit the rank's session and its hooks in torch: their optimizer steps drove it, and each
    worker wrote a trace of its own as the rank's ("profiled window 1 written" three times, traces the rank file did
    not list) and waited at its exit (the job took 12 s, not 2)."""
    script = write_script(tmp_path / "sweep_job.py", SWEEP)
    out = tmp_path / "run"
    result = run_cli("trace", "--out", str(out), "--wait", "1", "--warmup", "1", "--active", "2", str(script))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("profiled window 1 written") == 1, result.stderr[-3000:]
    rank = read_json(out / "ranks" / "rank0.json")
    assert rank["steps"]["count"] == 12 and rank["steps"]["profiled"] == [[3, 4]], rank["steps"]
    traces = sorted(p.name for p in out.glob("*.pt.trace.json*"))
    assert traces == rank["trace_files"] and len(traces) == 1, (traces, rank["trace_files"])


FORKED_RANKS = """
import os
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(14):
        model(torch.randn(16, 32)).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    tmp.start_processes(worker, args=(2,), nprocs=2, start_method="fork")  # Lightning's ddp_fork, notebook launchers
"""


def test_ranks_started_by_fork_each_trace_themselves(tmp_path):
    """Ranks forked from the traced process (``start_method="fork"``) once shared its session: the run said the job
    made 2 process groups (one of "1 rank, 13 steps"), and rank 0 had two traces. Each is now a rank of its own."""
    port = free_port()
    script = write_script(tmp_path / "forked_ranks.py", FORKED_RANKS)
    out = tmp_path / "run"
    result = run_cli("trace", "--out", str(out), str(script), env={"PORT": str(port)}, timeout=150)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "process groups" not in result.stderr and not (out / "groups").exists(), result.stderr[-3000:]
    for r in (0, 1):
        rank = read_json(out / "ranks" / f"rank{r}.json")
        assert rank["status"] == "ok" and rank["steps"]["count"] == 14, rank["steps"]
        assert len(rank["trace_files"]) == 1 and rank["pid"] != read_json(out / "ranks" / f"rank{1 - r}.json")["pid"]
    assert len(list(out.glob("*.pt.trace.json*"))) == 2
