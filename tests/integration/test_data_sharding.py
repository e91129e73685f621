"""missing-distributed-sampler fires only on evidence that the ranks read the same samples: real 2-rank runs whose
ranks shard the data by hand in several forms stay clean (also where their items' integers agree), the same data in
different per-rank orders fires (also float-only data augmented per rank), and data whose content cannot be compared
(an augmentation no seed reaches) is "not evaluated" with the reason.

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

    class Noisy(torch.utils.data.Dataset):
        def __init__(self, seed, noise):
            self.rows = torch.randn(n, width, generator=torch.Generator().manual_seed(seed))
            self.noise = noise

        def __len__(self):
            return n

        def __getitem__(self, i):
            if self.noise == "torch":
                return (self.rows[i] + 0.1 * torch.randn(width),)
            if self.noise == "unseeded":
                import numpy as np
                return (self.rows[i] + torch.from_numpy(np.random.default_rng().standard_normal(width)).float(),)
            return self.rows[i], i

    order = torch.Generator().manual_seed(1000 + rank)  # every rank shuffles in its own order
    if mode == "same_data_own_order":  # the mistake: the whole same dataset on every rank, orders differ
        loader = DataLoader(data(0), batch_size=16, shuffle=True, generator=order)
    elif mode == "own_shard_file":  # each rank loads its own shard (a per-rank file), same length
        loader = DataLoader(data(rank + 1), batch_size=16, shuffle=True, generator=order)
    elif mode == "subset_by_rank":  # one dataset split by rank by hand
        loader = DataLoader(Subset(data(0), range(rank, n, world)), batch_size=16, shuffle=True, generator=order)
    elif mode == "iterable_by_rank":
        loader = DataLoader(Stream(), batch_size=16)
    elif mode == "own_shard_no_labels":  # float-only data, each rank its own: the whole content differs
        g = torch.Generator().manual_seed(rank + 1)
        floats = TensorDataset(torch.randn(n, width, generator=g))
        loader = DataLoader(floats, batch_size=16, shuffle=True, generator=order)
    elif mode == "same_floats_own_order":  # the mistake on float-only data, augmented from torch's generator
        torch.manual_seed(rank)
        loader = DataLoader(Noisy(0, "torch"), batch_size=16, shuffle=True, generator=order)
    elif mode == "own_shard_local_index":  # a dataset sharding by rank itself, its items' one integer a local index
        loader = DataLoader(Noisy(rank + 1, None), batch_size=16, shuffle=True, generator=order)
    elif mode == "same_floats_unseeded_noise":  # an augmentation no seed reaches: two reads differ
        loader = DataLoader(Noisy(0, "unseeded"), batch_size=16, shuffle=True, generator=order)
    model = DDP(nn.Linear(width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for batch in loader:
        loss = model(batch[0]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()
"""
MODES = (
    "same_data_own_order",
    "own_shard_file",
    "subset_by_rank",
    "iterable_by_rank",
    "own_shard_no_labels",
    "same_floats_own_order",
    "own_shard_local_index",
    "same_floats_unseeded_noise",
)


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
def test_the_same_float_only_data_augmented_per_rank_fires(reports):
    # no integers anywhere, each rank its own seed: the datasets read alike at ddpdoctor's fixed seeds
    (f,) = reports["same_floats_own_order"]["findings"]
    assert f["evidence"]["data_duplication_factor"] == pytest.approx(2.0)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "mode", ["own_shard_file", "subset_by_rank", "iterable_by_rank", "own_shard_no_labels", "own_shard_local_index"]
)
def test_hand_sharded_data_stays_clean(reports, mode):
    # own_shard_local_index: equal integers on both ranks (a local index) over different rows; a traced job like
    # it was told it lacked a DistributedSampler (2026-12-07)
    assert _verdict(reports[mode]) == "passed", json.dumps(reports[mode], indent=1)[:3000]


@pytest.mark.timeout(600)
def test_data_that_cannot_be_compared_is_not_evaluated_with_the_reason(reports):
    report = reports["same_floats_unseeded_noise"]
    assert _verdict(report) == "not evaluated", json.dumps(report, indent=1)[:3000]
    (item,) = report["not_evaluated"]
    assert "cannot be told from per-rank shards" in item["reason"] and "read differently twice" in item["reason"]
