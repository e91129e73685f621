"""`ddpdoctor trace` while the job runs (issue 27): the profiled window's start and its writing are said as they
happen, with what follows (the job runs on; `diagnose` already works); `-q` keeps ddpdoctor's lines and torch's
launch noise (torchrun's OMP_NUM_THREADS banner, the profiler's C++ warnings) off the terminal while the job's own
output stays; a `-- COMMAND` job that trains in one process without a process group (`accelerate launch --cpu`) is
traced, and one that never trains says what happened and what to run."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from helpers import read_json, run_cli, write_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

WINDOW = ["--wait", "1", "--warmup", "1", "--active", "2"]  # steps 3-4, written at the end of step 5
# The job prints its steps on stderr (where ddpdoctor's lines go: their order is the test) and a line on stdout.
# A tensor made before the window and freed inside it gives torch's profiler its C++ warning ("Memory block of
# unknown size was allocated before the profiling started") in every rank, as real jobs do.
JOB = """
import os, sys
import torch, torch.nn as nn

ddp = "RANK" in os.environ
if ddp:
    import torch.distributed as dist
    dist.init_process_group("gloo")
model = nn.Linear(32, 4)
if ddp:
    model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
early = torch.randn(256, 256)
print("job: TORCH_CPP_LOG_LEVEL=" + str(os.environ.get("TORCH_CPP_LOG_LEVEL")), flush=True)
for step in range(1, 9):
    if step == 4:
        del early
    model(torch.randn(8, 32)).square().mean().backward()
    opt.step()
    opt.zero_grad()
    print(f"job step {step}", file=sys.stderr, flush=True)
if ddp:
    dist.barrier()
    dist.destroy_process_group()
print("job: done", flush=True)
"""


def _env(**extra: str) -> dict[str, str]:
    """No rank variables of the test's own, and OMP_NUM_THREADS unset: torchrun then prints its banner."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k not in drop and k not in ("OMP_NUM_THREADS", "TORCH_CPP_LOG_LEVEL")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _run_with_env(env: dict[str, str], *args: str, timeout: float = 240):

    # run_cli adds os.environ back: a test that must not have OMP_NUM_THREADS starts the CLI itself
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_window_start_and_write_are_said_in_order_with_what_follows(tmp_path):
    script = write_script(tmp_path / "job.py", JOB)
    out = tmp_path / "run"
    result = run_cli("trace", "--out", str(out), *WINDOW, str(script), env=_env(), timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stderr.splitlines()

    def at(text: str) -> int:
        found = [i for i, line in enumerate(lines) if text in line]
        assert len(found) == 1, (text, result.stderr)
        return found[0]

    started = at("ddpdoctor: rank 0: profiling steps 3-4 (window 1)")
    written = at("ddpdoctor: rank 0: profiled window 1 written")
    runs_on = at("ddpdoctor: the job runs on to its own end, not profiled (Ctrl-C stops it")
    assert f"`ddpdoctor diagnose {out.resolve()}` works on what is written now" in lines[runs_on]
    # said as it happens: the window starts with step 3, is written at the end of step 5, the job goes on after
    assert at("job step 2") < started < at("job step 3") < at("job step 4") < written < runs_on < at("job step 5")
    assert at("job step 8") < at("ddpdoctor: wrote ")
    assert "job: done" in result.stdout


def test_quiet_torchrun_shows_only_the_jobs_output(tmp_path):
    script = write_script(tmp_path / "job.py", JOB)
    out = tmp_path / "run"
    launch = ["--standalone", "--nproc-per-node", "2", str(script)]
    result = _run_with_env(_env(), "trace", "-q", "--out", str(out), *WINDOW, *launch)
    assert result.returncode == 0, result.stderr[-3000:]
    # the job's own output, both ranks', as in a bare run (its stderr too)
    assert result.stdout.count("job: done") == 2 and result.stdout.count("job: TORCH_CPP_LOG_LEVEL=ERROR") == 2
    # the two ranks write to one stderr: their lines may run into each other ("job step 1job step 1")
    assert len(re.findall(r"job step \d", result.stderr)) == 16, result.stderr
    others = re.sub(r"job step \d", "", result.stderr)
    assert others.strip() == "", others  # no ddpdoctor line, no torchrun banner, no profiler warning
    log = (out / "nodes" / "node0.log").read_text()
    assert "Setting OMP_NUM_THREADS environment variable for each process to be 1" in log
    manifest = read_json(out / "manifest.json")
    assert [r["status"] for r in manifest["ranks"]] == ["ok", "ok"]


@pytest.mark.timeout(400)
def test_accelerate_cpu_one_process_is_traced(tmp_path):
    pytest.importorskip("accelerate")
    script = write_script(
        tmp_path / "acc_train.py",
        """
        import torch, torch.nn as nn
        from accelerate import Accelerator
        acc = Accelerator(cpu=True)
        model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        model, opt = acc.prepare(model, opt)
        assert not torch.distributed.is_initialized()  # one process, no process group: what --cpu starts
        for step in range(8):
            opt.zero_grad()
            acc.backward(model(torch.randn(16, 64)).square().mean())
            opt.step()
        acc.end_training()
        """,
    )
    out = tmp_path / "run"
    # accelerate 1.x: --cpu starts ONE process whatever --num_processes says (several need MPI)
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(script)]
    result = run_cli("trace", "--out", str(out), *WINDOW, "--", *launch, env=_env(OMP_NUM_THREADS="1"), timeout=360)
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = read_json(out / "manifest.json")
    assert manifest["launch"] == "command" and manifest["world_size"] == 1
    (entry,) = manifest["ranks"]
    assert entry["status"] == "ok" and entry["steps"] == 8 and entry["profiled_steps"] == [[3, 4]], entry
    assert [p.name.split(".")[0] for p in out.glob("*.pt.trace.json.gz")] == ["rank0"]
    assert "profiling steps 3-4 (window 1)" in result.stderr
    diagnosed = run_cli("diagnose", "--format", "json", str(out), timeout=120)
    assert diagnosed.returncode == 0, diagnosed.stderr
    assert '"world_size": 1' in diagnosed.stdout


def test_a_command_that_never_trains_says_what_happened(tmp_path):
    out = tmp_path / "run"
    result = run_cli("trace", "--out", str(out), "--", "sh", "-c", "echo job ran", env=_env(), timeout=60)
    assert result.returncode == 0 and "job ran" in result.stdout
    (entry,) = read_json(out / "manifest.json")["ranks"]
    expected = (
        "no data: no process the command started created a torch.distributed process group or a torch.optim "
        "optimizer, so none was traced (its exit code: 0); a job that trains in one process can be traced "
        "directly: `ddpdoctor trace SCRIPT ARGS`"
    )
    assert entry["reason"] == expected
    assert f"rank 0 failed: {expected}" in result.stderr
    diagnosed = run_cli("diagnose", str(out), timeout=60)
    assert "folders below it with traces" not in diagnosed.stdout + diagnosed.stderr
