"""A job that trains in a thread of its own (``threading.Thread(target=train)``; Ray Train runs the training
function in a worker thread). The session followed only the thread it started in, so such a run said that no
optimizer ever stepped and, with ranks, that they never synchronised. Now the first thread to step an optimizer
before the session's own is followed; a helper thread that steps after the training loop started is not."""

from __future__ import annotations

import json

import pytest
from helpers import free_port, read_json, run_cli, write_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SCRIPT = """
import os
import threading
import time

import torch
import torch.distributed as dist

distributed = "RANK" in os.environ


def train():
    if distributed:
        dist.init_process_group("gloo")
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(16):
        model(torch.randn(16, 32)).sum().backward()
        opt.step()
        opt.zero_grad()
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


def helper_steps(stop):  # a helper thread stepping an optimizer of its own (an EMA, a probe), now and then
    probe = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(probe.parameters(), lr=0.1)
    while not stop.is_set():
        probe(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.005)


if os.environ.get("MAIN_TRAINS"):
    stop = threading.Event()
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()  # the main thread's first step, before the helper starts
    opt.zero_grad()
    helper = threading.Thread(target=helper_steps, args=(stop,))
    helper.start()
    for step in range(11):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.01)
    stop.set()
    helper.join()
else:
    worker = threading.Thread(target=train, name="train")
    worker.start()
    worker.join()
print("trained")
"""


def test_one_process_training_in_a_thread_is_traced(tmp_path):
    script = write_script(tmp_path / "thread_job.py", SCRIPT)
    out = tmp_path / "run"
    result = run_cli("trace", "-q", "--out", str(out), "--wait", "2", "--warmup", "1", "--active", "3", str(script))
    assert result.returncode == 0, result.stderr[-3000:]
    rank = read_json(out / "ranks" / "rank0.json")
    assert rank["steps"]["source"] == "optimizer" and rank["steps"]["count"] == 16, rank["steps"]
    assert rank["steps"]["profiled"] == [[4, 6]] and len(rank["trace_files"]) == 1, rank
    report = json.loads(run_cli("diagnose", str(out), "--format", "json").stdout)
    assert not any("no training step was detected" in n for n in report["run"].get("notes", [])), report["run"]


def test_ranks_training_in_a_thread_are_seen_to_synchronise(tmp_path):
    script = write_script(tmp_path / "thread_job.py", SCRIPT)
    out = tmp_path / "run"
    port = free_port()
    result = run_cli(
        "trace", "-q", "--out", str(out), "--wait", "2", "--warmup", "1", "--active", "3",
        "--nproc-per-node", "2", "--master-port", str(port), str(script), timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    for r in (0, 1):
        assert read_json(out / "ranks" / f"rank{r}.json")["steps"]["count"] == 16
    diagnosis = run_cli("diagnose", str(out), "--format", "json", timeout=120)
    report = json.loads(diagnosis.stdout)
    assert report["run"]["parallelism"] == "ddp", report["run"].get("parallelism")
    assert "ranks-never-synchronize" not in {f["name"] for f in report["findings"]}


def test_a_helper_thread_stepping_after_the_training_loop_started_is_not_followed(tmp_path):
    script = write_script(tmp_path / "thread_job.py", SCRIPT)
    out = tmp_path / "run"
    result = run_cli(
        "trace", "-q", "--out", str(out), "--wait", "2", "--warmup", "1", "--active", "3", str(script),
        env={"MAIN_TRAINS": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rank = read_json(out / "ranks" / "rank0.json")
    assert rank["steps"]["count"] == 12, rank["steps"]  # the main thread's 12 steps, none of the helper's
