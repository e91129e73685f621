"""missing-distributed-sampler fires only on evidence that the ranks read the same samples: real 2-rank runs whose
ranks shard the data by hand in several forms stay clean, the same data in different per-rank orders fires, and
data whose content cannot be compared is "not evaluated" with the reason.

Every run: 2-rank torchrun + gloo on the CPU, a DDP model, no DistributedSampler, traced three at a time.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import run_cli, write_script

pytestmark = [pytest.mark.integration]

WINDOW = ["--wait", "1", "--warmup", "1", "--active", "2", "--hang-timeout", "60"]
DDP = ["--standalone", "--nproc-per-node", "2"]
SCRIPT = """
    import argparse

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, IterableDataset, Subset, TensorDataset

    parser = argparse.ArgumentParser()
    parser.add_argument("mode")
    mode = parser.parse_args().mode
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    n, width = 192, 32


    class Stream(IterableDataset):  # WebDataset-style: each rank streams its own shard
        def __iter__(self):
            g = torch.Generator().manual_seed(100 + rank)
            for _ in range(n):
                yield torch.randn(width, generator=g), torch.randint(0, 10, (), generator=g)


    def data(seed):
        g = torch.Generator().manual_seed(seed)
        return TensorDataset(torch.randn(n, width, generator=g), torch.randint(0, 10, (n,), generator=g))

    order = torch.Generator().manual_seed(1000 + rank)  # every rank shuffles in its own order
    if mode == "same_data_own_order":  # the mistake: the whole same dataset on every rank, orders differ
        loader = DataLoader(data(0), batch_size=16, shuffle=True, generator=order)
    elif mode == "own_shard_file":  # each rank loads its own shard (a per-rank file), same length
        loader = DataLoader(data(rank + 1), batch_size=16, shuffle=True, generator=order)
    elif mode == "subset_by_rank":  # one dataset split by rank by hand
        loader = DataLoader(Subset(data(0), range(rank, n, world)), batch_size=16, shuffle=True, generator=order)
    elif mode == "iterable_by_rank":
        loader = DataLoader(Stream(), batch_size=16)
    elif mode == "own_shard_no_labels":  # float-only data: nothing to compare
        g = torch.Generator().manual_seed(rank + 1)
        floats = TensorDataset(torch.randn(n, width, generator=g))
        loader = DataLoader(floats, batch_size=16, shuffle=True, generator=order)
    model = DDP(nn.Linear(width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for batch in loader:
        loss = model(batch[0]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()
"""
MODES = ("same_data_own_order", "own_shard_file", "subset_by_rank", "iterable_by_rank", "own_shard_no_labels")


def _trace_and_diagnose(out: Path, script: Path, mode: str) -> dict:
    traced = run_cli("trace", "-q", "--out", str(out), *WINDOW, *DDP, str(script), mode, timeout=150)
    if traced.returncode != 0:
        return {"error": f"trace exited {traced.returncode}:\n{traced.stderr[-3000:]}"}
    diagnosed = run_cli("diagnose", str(out), "--select", "missing-distributed-sampler", "--format", "json")
    if diagnosed.returncode not in (0, 1):
        return {"error": f"diagnose exited {diagnosed.returncode}:\n{diagnosed.stderr[-3000:]}"}
    return json.loads(diagnosed.stdout)


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("sharding")
    script = write_script(root / "shard.py", SCRIPT)
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {m: pool.submit(_trace_and_diagnose, root / m, script, m) for m in MODES}
        return {m: f.result() for m, f in futures.items()}


def _verdict(report: dict) -> str:
    assert "error" not in report, report.get("error")
    if report["findings"]:
        return "fired"
    return "passed" if "missing-distributed-sampler" in report["passed"] else "not evaluated"


@pytest.mark.timeout(600)
def test_same_data_in_different_orders_fires(reports):
    assert _verdict(reports["same_data_own_order"]) == "fired"
    (f,) = reports["same_data_own_order"]["findings"]
    assert f["evidence"]["data_duplication_factor"] == pytest.approx(2.0)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["own_shard_file", "subset_by_rank", "iterable_by_rank"])
def test_hand_sharded_data_stays_clean(reports, mode):
    assert _verdict(reports[mode]) == "passed", json.dumps(reports[mode], indent=1)[:3000]


@pytest.mark.timeout(600)
def test_data_that_cannot_be_compared_is_not_evaluated_with_the_reason(reports):
    report = reports["own_shard_no_labels"]
    assert _verdict(report) == "not evaluated"
    (item,) = report["not_evaluated"]
    assert "cannot be told from per-rank shards" in item["reason"]
