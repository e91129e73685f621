"""Hangs decided by evidence (issue 24): real 2-rank gloo jobs under `ddpdoctor trace`, each bounded in time.

A rank that makes no step for the hang timeout asks every rank to dump; the launcher reads the dumps, names the
cause (with its frame) and the ranks waiting for it (consequences), and stops the job; torchrun's own failure block
is one line per rank. The default timeout never stops a healthy job, nor one with a slow first step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import read_json, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

JOB = str(Path(__file__).with_name("hang_job.py"))
FAST = ["--wait", "1", "--warmup", "1", "--active", "2"]
TORCHRUN = ["--standalone", "--nproc-per-node", "2"]


def _trace(out: Path, *options: str, env: dict, timeout: float = 200, cwd: Path | None = None):
    return run_cli("trace", "--out", str(out), *FAST, *options, *TORCHRUN, JOB, env=env, timeout=timeout, cwd=cwd)


# timing rules a wait for a stuck peer would otherwise fire
TIMING_RULES = {"poor-comm-compute-overlap", "rank-straggler", "low-collective-bandwidth", "dataloader-bound",
                "ddp-bucket-size-mismatch", "broadcast-buffers-cost", "host-sync-stalls"}  # fmt: skip


def _diagnosed(out: Path) -> dict:
    """diagnose's JSON report of the run, checked: no timing finding is made of the wait for the stuck peer (the
    profiled window ended before the stall, so none may fire beyond the tiny model's own few ms)."""
    result = run_cli("diagnose", str(out), "--format", "json", timeout=120)
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr, result.stderr
    report = json.loads(result.stdout)
    timing = [f for f in report["findings"] if f["name"] in TIMING_RULES]
    assert all((f["estimated_gain_ms"] or 0) < 100 for f in timing), [f["message"] for f in timing]
    for rank in report["ranks"]:
        assert (rank["step_ms"]["p90"] or 0) < 1000, rank
    return report


def _line(text: str) -> int:
    """The line of hang_job.py that holds ``text`` (1-based)."""
    return next(i for i, line in enumerate(Path(JOB).read_text().splitlines(), 1) if text in line)


def _dumps(out: Path, reason: str) -> dict[int, dict]:
    """The ranks' dumps of ``reason`` ("hang", "on_demand"; a stopped rank also dumps on the signal), by rank."""
    found = {}
    for path in sorted((out / "dumps").glob("rank*.json")):
        dump = read_json(path)
        if dump["reason"] == reason:
            found[dump["rank"]] = dump
    return found


def test_rank_stuck_in_its_data_function_is_named_the_cause(tmp_path):
    out = tmp_path / "run"
    result = _trace(out, "--hang-timeout", "5", env={"STUCK_RANK": "1", "STUCK_STEP": "6", "STEPS": "40"})
    err = result.stderr
    assert result.returncode == 124, err
    assert "hang: rank 1 is stuck in read_shard (hang_job.py:" in err, err  # the cause, with its frame
    assert "rank 1 hung: the cause of the hang: at read_shard (hang_job.py:" in err, err
    assert "rank 0 interrupted: a consequence of rank 1: waiting in all_reduce #" in err, err
    assert "Traceback" not in err and "ChildFailedError" not in err, err
    assert "Connection closed by peer" not in err, err  # rank 0's lost peer is not reported as a failure
    assert sorted(_dumps(out, "hang")) == [0, 1]
    manifest = read_json(out / "manifest.json")
    assert manifest["exit_code"] == 124
    assert manifest["health"]["kind"] == "hang" and manifest["health"]["culprits"] == [1]
    assert manifest["health"]["waiting"] == [0]
    by_rank = {r["rank"]: r for r in manifest["ranks"]}
    assert by_rank[1]["status"] == "hung" and by_rank[0]["consequence_of"] == [1]
    first = _diagnosed(out)["findings"][0]
    assert (first["name"], first["ranks"]) == ("collective-hang", [1]), first
    assert f"read_shard (hang_job.py:{_line('time.sleep(0.1)')})" in first["message"], first["message"]
    assert "rank 0 waits in all_reduce #" in first["message"] and "(default_pg)" in first["message"], first["message"]


def test_different_collectives_are_a_desync_not_a_hung_rank(tmp_path):
    out = tmp_path / "run"
    result = _trace(Path("run"), "--hang-timeout", "5", env={"DESYNC_STEP": "6", "STEPS": "40"}, cwd=tmp_path)
    err = result.stderr
    assert result.returncode == 124, err
    # the stop line names the run directory as the user gave it, as "wrote run" does
    assert "stopping the job (dumps in run/dumps; `ddpdoctor diagnose run`)" in err, err
    assert "desync:" in err and "all_reduce" in err and "broadcast" in err, err
    assert "is stuck in" not in err, err
    manifest = read_json(out / "manifest.json")
    assert manifest["health"]["kind"] == "desync", manifest["health"]
    assert sorted(_dumps(out, "hang")) == [0, 1]
    report = _diagnosed(out)
    first = report["findings"][0]
    assert (first["name"], first["severity"]) == ("collective-mismatch", "error"), first
    assert "all_reduce" in first["message"] and "broadcast" in first["message"], first["message"]
    # where each side was issued: the user-code frame of each
    assert f"main (hang_job.py:{_line('dist.all_reduce(torch.ones(1))')})" in first["message"], first["message"]
    assert f"main (hang_job.py:{_line('dist.broadcast(torch.ones(4), src=1)')})" in first["message"], first["message"]
    assert report["run"]["health"]["culprits"] == [0, 1]
    assert report["run"]["health"]["collective"]["op"] in ("all_reduce", "broadcast"), report["run"]["health"]


def test_default_timeout_never_stops_a_healthy_job_with_a_slow_step(tmp_path):
    """A 20 s step (a compile, a first checkpoint) in a job of 10 ms steps: the default is no step for 300 s or
    10x the slowest step, so it is not called hung; the header says what the timeout is."""
    out = tmp_path / "run"
    result = _trace(out, env={"SLOW_STEP": "3", "SLOW_S": "20", "STEPS": "12"})
    err = result.stderr
    assert result.returncode == 0, err
    assert "hang timeout 300 s or 10x the slowest step" in err.splitlines()[0], err
    assert "hang timeout:" not in err and not (out / "dumps" / "request.json").exists(), err
    assert result.stdout.count("finished 12 steps") == 2


def test_dump_of_a_running_job_leaves_it_running(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "STEPS": "300", "SLEEP_MS": "30", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "ddpdoctor", "trace", "--out", str(out), *FAST, *TORCHRUN, JOB]
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 90
        while time.time() < deadline and len(list(out.glob("rank*.pt.trace.json.gz"))) < 2:
            time.sleep(0.3)
        dump = run_cli("dump", str(out), "--wait", "20", timeout=60)
        assert dump.returncode == 0, dump.stdout + dump.stderr
        assert "rank 0: answered at step" in dump.stdout and "rank 1: answered at step" in dump.stdout, dump.stdout
        stdout, stderr = job.communicate(timeout=150)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, stderr
    assert stdout.count("finished 300 steps") == 2
    assert sorted(_dumps(out, "on_demand")) == [0, 1]
    manifest = read_json(out / "manifest.json")
    assert manifest["exit_code"] == 0 and all(r["status"] == "ok" for r in manifest["ranks"])


def test_torchrun_failure_block_is_one_line_per_rank(tmp_path):
    out = tmp_path / "run"
    script = str(Path(__file__).with_name("ddp_script.py"))
    result = run_cli(
        "trace", "--out", str(out), *FAST, *TORCHRUN, script,
        env={"STEPS": "20", "FAIL_RANK": "1", "FAIL_STEP": "6"}, timeout=200,
    )  # fmt: skip
    err = result.stderr
    assert result.returncode == 1, err
    assert "ChildFailedError" not in err and "Root Cause" not in err, err
    assert "torchrun: rank 1 (local rank 1, pid" in err and "(the first to fail)" in err, err
    assert "torchrun: rank 0 (local rank 0, pid" in err, err
    log = (out / "nodes" / "node0.log").read_text()
    assert "ChildFailedError" in log and "Root Cause" in log
    assert "rank 1 failed: RuntimeError: injected failure" in err, err
    assert "rank 0 failed: a consequence of rank 1:" in err or "rank 0 interrupted: a consequence of rank 1" in err, err


def test_in_rank_mode_each_rank_stops_itself(tmp_path):
    """No ddpdoctor launcher (each rank is `ddpdoctor trace` started by a scheduler, here torchrun): the rank that
    asked for the dumps prints the verdict, and every rank whose watchdog fired ends itself."""
    out = tmp_path / "run"
    env = {**os.environ, "STUCK_RANK": "1", "STUCK_STEP": "6", "STEPS": "40", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", *TORCHRUN, "-m", "ddpdoctor", "trace", "--out", str(out)]
    cmd += [*FAST, "--hang-timeout", "8", JOB]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=200)
    err = result.stderr
    assert result.returncode != 0, err
    assert err.count("hang: rank 1 is stuck in read_shard (hang_job.py:") == 1, err  # once, by the asking rank
    assert sorted(_dumps(out, "hang")) == [0, 1]
    by_rank = {r["rank"]: r for r in read_json(out / "manifest.json")["ranks"]}
    assert by_rank[1]["status"] == "hung" and by_rank[0].get("consequence_of") == [1], by_rank


SPAWN_JOB = """
import os, time
import torch, torch.distributed as dist, torch.multiprocessing as mp, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

def read_shard(rank, step):
    if rank == 1 and step == 6:
        while True:
            time.sleep(0.1)
    return torch.randn(16, 32)

def worker(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = DDP(nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(30):
        x = read_shard(rank, step)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(2, os.environ["PORT"]), nprocs=2)
"""


def test_ranks_started_by_mp_spawn_are_stopped_by_the_trace_process(tmp_path):
    """The script runs in `ddpdoctor trace`'s own process and spawns its ranks: that process judges and stops
    them; mp.spawn's exception about the ranks it stopped is not shown as the script's error."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    script = tmp_path / "spawn_job.py"
    script.write_text(SPAWN_JOB)
    out = tmp_path / "run"
    result = run_cli("trace", "--out", str(out), *FAST, "--hang-timeout", "8", str(script), env={"PORT": port},
                     timeout=200)  # fmt: skip
    err = result.stderr
    assert result.returncode == 124, err
    assert "hang: rank 1 is stuck in read_shard (spawn_job.py:" in err, err
    assert "Traceback" not in err and "ProcessExitedException" not in err, err
    assert sorted(_dumps(out, "hang")) == [0, 1]
