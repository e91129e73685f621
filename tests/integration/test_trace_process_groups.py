"""A job that creates more than one process group (issue 23, item 1): every group's files are kept apart, the
training one is the one in the run directory's top level (the one `diagnose` reads), and nothing is overwritten.
Real mp.spawn scripts, CPU + gloo, 2 ranks, a few steps each."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import read_json, run_cli, write_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FAST = ["--wait", "1", "--warmup", "1", "--active", "3"]

SCRIPT = """
import os, socket, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp, torch.nn as nn

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

AUX = '''
import os, socket, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo", rank=0, world_size=1)
total = torch.ones(4)
dist.all_reduce(total)
dist.destroy_process_group()
'''

def train(rank, world_size, port, steps, aux=False):
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        if aux and rank == 0 and step == 10:  # an auxiliary job (a checkpoint uploader, an eval) mid-training
            import subprocess
            subprocess.run([sys.executable, "-c", AUX], check=True)
        opt.zero_grad()
        model(torch.randn(16, 64)).sum().backward()
        opt.step()
    dist.barrier()
    dist.destroy_process_group()

def train_then_alone(rank, world_size, port, steps):
    # the training, then rank 1's process makes a world-size-1 group of its own (rank 0 there)
    train(rank, world_size, port, steps)
    if rank == 1:
        os.environ["MASTER_PORT"] = str(free_port())
        dist.init_process_group("gloo", rank=0, world_size=1)
        total = torch.ones(4)
        dist.all_reduce(total)
        dist.destroy_process_group()

def evaluate(rank, world_size, port):
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    model = nn.Linear(64, 4)
    with torch.no_grad():
        for _ in range(5):
            total = model(torch.randn(16, 64)).sum()
            dist.all_reduce(total)
    dist.barrier()
    dist.destroy_process_group()

def alone_in_parent(steps):
    # a world-size-1 group in the parent (fine-tuning on one process): DDP and optimizer steps of its own
    os.environ["MASTER_PORT"] = str(free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    model = nn.parallel.DistributedDataParallel(nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        model(torch.randn(16, 64)).sum().backward()
        opt.step()
    dist.destroy_process_group()

if __name__ == "__main__":
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    for part in sys.argv[1:]:
        if part == "train":
            mp.spawn(train, args=(2, free_port(), 25), nprocs=2)
        elif part == "train_aux":
            mp.spawn(train, args=(2, free_port(), 25, True), nprocs=2)
        elif part == "train_regroup":
            mp.spawn(train_then_alone, args=(2, free_port(), 25), nprocs=2)
        elif part == "eval":
            mp.spawn(evaluate, args=(2, free_port()), nprocs=2)
        elif part == "parent":
            alone_in_parent(8)
"""


def _env() -> dict[str, str]:
    drop = (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "PYTHONPATH",
        "DDPDOCTOR_CAPTURE",
    )
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("SLURM_", "OMPI_", "PMI_"))}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _trace(tmp_path: Path, *parts: str) -> Path:
    script = write_script(tmp_path / "job.py", SCRIPT)
    out = tmp_path / "run"
    result = run_cli("trace", "--out", str(out), *FAST, str(script), *parts, env=_env(), timeout=220)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _rank_files(folder: Path) -> dict[int, dict]:
    return {int(p.name[4:-5]): read_json(p) for p in (folder / "ranks").glob("rank*.json") if "summary" not in p.name}


def _assert_training_at_top(out: Path) -> None:
    """The top level holds the 2-rank DDP training of 25 steps, with every trace its rank files name."""
    ranks = _rank_files(out)
    assert sorted(ranks) == [0, 1]
    for rank, data in ranks.items():
        assert data["steps"]["count"] == 25 and data["ddp"], (rank, data["steps"], data["ddp"])
        assert data["world_size"] == 2 and data["steps"]["profiled"] == [[3, 5]]
        (name,) = data["trace_files"]
        assert (out / name).is_file()
    on_disk = sorted(p.name for p in out.glob("rank*.pt.trace.json*"))
    assert on_disk == sorted(n for d in ranks.values() for n in d["trace_files"])  # no other group's trace here
    for rank in ranks:  # the training's step series (one line per step) came with it
        lines = (out / "ranks" / f"rank{rank}.series.jsonl").read_text().splitlines()
        assert [json.loads(line).get("step") for line in lines[1:]] == list(range(25)), (rank, len(lines))


def _diagnosed(out: Path) -> dict:
    result = run_cli("diagnose", "--format", "json", str(out), timeout=120)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def test_train_then_eval_keeps_both_groups_and_diagnoses_the_training(tmp_path):
    out = _trace(tmp_path, "train", "eval")
    _assert_training_at_top(out)
    # The evaluation: its own folder, both ranks, its own traces, nothing of the training's.
    manifest = read_json(out / "manifest.json")
    groups = manifest["groups"]
    assert [(g["dir"], g["training"]) for g in groups] == [(".", True), ("groups/group1", False)]
    assert groups[0]["steps"] == 25 and groups[0]["ddp"] and groups[1]["steps"] == 0 and not groups[1]["ddp"]
    evaluation = _rank_files(out / "groups" / "group1")
    assert sorted(evaluation) == [0, 1]
    assert all(d["steps"]["count"] == 0 and d["world_size"] == 2 for d in evaluation.values())
    for data in evaluation.values():
        assert all((out / "groups" / "group1" / name).is_file() for name in data["trace_files"])
    assert any("groups/group1/" in note and "2 process groups" in note for note in manifest["notes"])
    doc = _diagnosed(out)
    assert doc["run"]["mode"] == "ddp" and doc["run"]["world_size"] == 2
    assert doc["run"]["parallelism"] != "unknown" and doc["run"]["steps_analyzed"] == 3
    # the report says which group it is of and where the other one is kept
    assert any("2 process groups" in n and "groups/group1/" in n for n in doc["run"]["notes"]), doc["run"]["notes"]
    # The evaluation's folder reads as a run directory of its own.
    assert _diagnosed(out / "groups" / "group1")["run"]["world_size"] == 2


def test_world_size_1_group_in_the_parent_after_training_replaces_nothing(tmp_path):
    out = _trace(tmp_path, "train", "parent")
    _assert_training_at_top(out)
    (alone,) = _rank_files(out / "groups" / "group1").values()
    assert (
        alone["world_size"] == 1
        and alone["steps"]["count"] == 8
        and alone["pid"] not in {d["pid"] for d in _rank_files(out).values()}
    )
    manifest = read_json(out / "manifest.json")
    assert [g["dir"] for g in manifest["groups"]] == [".", "groups/group1"]
    assert _diagnosed(out)["run"]["world_size"] == 2


def test_a_group_before_the_training_is_moved_aside_when_the_run_ends(tmp_path):
    """A world-size-1 group first (it takes the top level), then the training: at the end the training is moved to
    the top level, the first group to a folder of its own."""
    out = _trace(tmp_path, "parent", "train")
    _assert_training_at_top(out)
    (alone,) = _rank_files(out / "groups" / "group2").values()
    assert alone["world_size"] == 1 and alone["steps"]["count"] == 8
    assert not (out / "groups" / "group1").exists()  # the training's folder, now empty, is gone
    manifest = read_json(out / "manifest.json")
    assert [(g["dir"], g["training"]) for g in manifest["groups"]] == [(".", True), ("groups/group2", False)]
    assert manifest["world_size"] == 2 and [r["rank"] for r in manifest["ranks"]] == [0, 1]


def test_an_auxiliary_job_during_training_is_not_a_second_span_of_rank_0(tmp_path):
    out = _trace(tmp_path, "train_aux")
    _assert_training_at_top(out)  # rank 0: one trace, its own
    (aux,) = _rank_files(out / "groups" / "group1").values()
    assert aux["world_size"] == 1 and aux["rank"] == 0 and aux["steps"]["count"] == 0
    assert aux["pid"] not in {d["pid"] for d in _rank_files(out).values()}
    manifest = read_json(out / "manifest.json")
    assert [(g["dir"], g["training"]) for g in manifest["groups"]] == [(".", True), ("groups/group1", False)]
    assert [len(r["trace_files"]) for r in manifest["ranks"]] == [1, 1]


def test_a_second_group_in_a_rank_process_changes_nothing_of_its_files(tmp_path):
    """Rank 1's own process becomes rank 0 of a world-size-1 group after training: rank 0's files stay rank 0's,
    rank 1's file says it joined a second group, and the manifest's notes say so."""
    out = _trace(tmp_path, "train_regroup")
    _assert_training_at_top(out)
    ranks = _rank_files(out)
    assert ranks[0]["pid"] != ranks[1]["pid"]
    assert [(g["rank"], g["world_size"]) for g in ranks[1]["process_groups"]] == [(1, 2), (0, 1)]
    manifest = read_json(out / "manifest.json")
    assert "groups" not in manifest  # the second group has no process of its own: no folder to read
    assert any("rank 1" in note and "process_groups" in note for note in manifest["notes"])


def test_one_group_run_is_laid_out_as_before(tmp_path):
    out = _trace(tmp_path, "train")
    _assert_training_at_top(out)
    assert not (out / "groups").exists()
    manifest = read_json(out / "manifest.json")
    assert "groups" not in manifest and manifest["notes"] == []
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.json", "nodes", "ranks", *(p.name for p in out.glob("rank*.pt.trace.json.gz"))]
    )
