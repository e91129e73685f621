"""Every way a DDP job is launched, traced for real (CPU + gloo, 2 ranks): mp.spawn, ranks started by a scheduler
(torchrun-style and SLURM variables), `-- COMMAND` (a shell script calling torchrun, accelerate launch) and a
Lightning Trainer that re-executes its script. Each test checks the run directory a user would then diagnose."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SAMPLES, read_json, run_cli, write_script

from ddpdoctor import liveness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FAST = ["--wait", "1", "--warmup", "1", "--active", "3"]
DDP_SCRIPT = str(Path(__file__).with_name("ddp_script.py"))
SMALL = ["--steps", "8", "--width", "128", "--depth", "2", "--batch-size", "64"]
# Findings that turn on timing alone (overlap, exposed transfer, stragglers, ...): a busy 2-core host moves a run of
# 3-ms steps across their thresholds from one run to the next, under any launcher. Everything else must agree.
TIMING_RULES = {
    "poor-comm-compute-overlap",
    "ddp-bucket-size-mismatch",
    "broadcast-buffers-cost",
    "rank-straggler",
    "dataloader-bound",
    "host-sync-stalls",
    "gil-contention",
    "low-collective-bandwidth",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any rank variables of its own (a CI runner might be inside a job)."""
    rank_vars = (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        "PYTHONPATH",
        "DDPDOCTOR_CAPTURE",
    )
    env = {k: v for k, v in os.environ.items() if k not in rank_vars and not k.startswith(("SLURM_", "OMPI_", "PMI_"))}
    env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **extra})
    return env


def _assert_two_ranks_traced(out: Path, launch: str, *, steps: int = 8) -> dict:
    manifest = read_json(out / "manifest.json")
    assert manifest["launch"] == launch
    assert manifest["world_size"] == 2 and manifest["exit_code"] == 0
    assert [r["rank"] for r in manifest["ranks"]] == [0, 1]
    pids = set()
    for entry in manifest["ranks"]:
        assert entry["status"] == "ok" and entry["exit_code"] == 0, entry
        assert entry["steps"] == steps and entry["profiled_steps"] == [[3, 5]]
        (name,) = entry["trace_files"]
        assert name.startswith(f"rank{entry['rank']}.")
        with gzip.open(out / name, "rt") as f:
            trace = json.load(f)
        names = {e.get("name") for e in trace["traceEvents"]}
        assert {"ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"} <= names
        assert any(str(n).startswith("gloo:all_reduce") for n in names)
        assert trace["distributedInfo"]["rank"] == entry["rank"] and trace["distributedInfo"]["world_size"] == 2
        rank = read_json(out / "ranks" / f"rank{entry['rank']}.json")
        assert rank["backend"] == "gloo" and rank["world_size"] == 2
        assert rank["pid_ns"] == liveness.pid_namespace()  # whose pid it is (rundir.rank_process_gone reads it)
        pids.add(rank["pid"])
    assert len(pids) == 2
    # Only the ranks wrote: no third rank file from a launcher or a helper process.
    assert sorted(p.name for p in (out / "ranks").glob("rank*.json") if "summary" not in p.name) == [
        "rank0.json",
        "rank1.json",
    ]
    return manifest


def _diagnosis(out: Path) -> tuple[set[str], set[str]]:
    """(findings that do not turn on timing alone, rules diagnose could not evaluate) of `diagnose --format json`.
    Timing rules are left out of both: whether one can be decided turns on the host's load in that run too
    (rank-straggler is not evaluated where the slow rank ran the same work slower on a busy host)."""
    result = run_cli("diagnose", "--format", "json", str(out), timeout=120)
    assert result.returncode in (0, 1), result.stderr
    doc = json.loads(result.stdout)
    assert doc["run"]["world_size"] == 2 and doc["run"]["mode"] == "ddp" and doc["run"]["backend"] == "gloo"
    return {f["name"] for f in doc["findings"]} - TIMING_RULES, {n["name"] for n in doc["not_evaluated"]} - TIMING_RULES


def test_mp_spawn_two_ranks_diagnosed_as_under_torchrun(tmp_path):
    """samples/ddp_spawn.py (mp.spawn) under plain `ddpdoctor trace` traces both spawned ranks, not the parent, and
    diagnose finds what it finds for the same loop (samples/ddp_train.py) under torchrun.

    OMP_NUM_THREADS=2 for both: torchrun would otherwise set 1 for its ranks and mp.spawn leaves torch's default, a
    real difference between the launchers that diagnose reports (cpu-thread-oversubscription on a small host).
    """
    threads = {"OMP_NUM_THREADS": "2"}
    spawned = tmp_path / "spawn"
    result = run_cli(
        "trace",
        "--out",
        str(spawned),
        *FAST,
        str(SAMPLES / "ddp_spawn.py"),
        "--nprocs",
        "2",
        *SMALL,
        env=_clean_env(**threads),
        timeout=200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done: 8 steps" in result.stdout
    manifest = _assert_two_ranks_traced(spawned, "spawn")
    assert "2 rank(s), 3 step(s) profiled per rank" in result.stderr

    torchrun = tmp_path / "torchrun"
    result = run_cli(
        "trace",
        "--out",
        str(torchrun),
        *FAST,
        "--standalone",
        "--nproc-per-node",
        "2",
        str(SAMPLES / "ddp_train.py"),
        *SMALL,
        env=_clean_env(**threads),
        timeout=200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_json(torchrun / "manifest.json")["launch"] == "torchrun"
    spawn_findings, spawn_not_evaluated = _diagnosis(spawned)
    assert (spawn_findings, spawn_not_evaluated) == _diagnosis(torchrun)
    # 2 ranks x 2 threads on fewer than 4 CPUs: found under both launchers, from what the ranks recorded of the host
    host = read_json(spawned / "ranks" / "rank0.json")["threads"]
    oversubscribed = host["torch_intra_op_threads"] * 2 > (host["affinity_cpus"] or host["cpu_count"])
    assert ("cpu-thread-oversubscription" in spawn_findings) == oversubscribed, (host, spawn_findings)
    assert manifest["mode"] == "spawn"  # ddpdoctor ran one process itself; its children were the 2 ranks


def test_mp_spawn_rank_failure_is_recorded(tmp_path):
    """A spawned rank that raises: its status, exit code and error are in the manifest, as is how the other ended."""
    script = write_script(
        tmp_path / "spawn_fail.py",
        """
        import os, sys
        import torch, torch.distributed as dist, torch.multiprocessing as mp, torch.nn as nn

        def worker(rank, world_size):
            dist.init_process_group("gloo", rank=rank, world_size=world_size)
            model = nn.parallel.DistributedDataParallel(nn.Linear(32, 4))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(6):
                if rank == 1 and step == 4:
                    raise ValueError("bad batch at step 4")
                model(torch.randn(8, 32)).sum().backward()
                opt.step()
            dist.barrier()
            dist.destroy_process_group()

        if __name__ == "__main__":
            mp.spawn(worker, args=(2,), nprocs=2)
        """,
    )
    out = tmp_path / "run"
    env = _clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    result = run_cli("trace", "--out", str(out), *FAST, str(script), env=env, timeout=200)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "ValueError: bad batch at step 4" in result.stderr  # mp.spawn's own report, unchanged
    manifest = read_json(out / "manifest.json")
    assert manifest["launch"] == "spawn" and manifest["exit_code"] == 1
    by_rank = {r["rank"]: r for r in manifest["ranks"]}
    assert by_rank[1]["status"] == "failed" and by_rank[1]["exit_code"] == 1
    assert by_rank[1]["reason"] == "ValueError: bad batch at step 4"
    # Rank 0 was blocked in all-reduce: mp.spawn ends it with SIGTERM once rank 1 failed.
    assert by_rank[0]["status"] in ("interrupted", "failed") and by_rank[0]["exit_code"] != 0


def _scheduler_launch(tmp_path: Path, script: Path, per_rank_env: list[dict[str, str]], out: Path) -> list:
    """Start one `ddpdoctor trace --out OUT script` per rank from a plain shell loop, as srun or a Kubernetes operator
    would (each with its own rank variables); return the finished processes' (returncode, stdout, stderr)."""
    procs = []
    for env in per_rank_env:
        cmd = [sys.executable, "-m", "ddpdoctor", "trace", "--out", str(out), *FAST, str(script)]
        procs.append(
            subprocess.Popen(
                ["sh", "-c", 'exec "$@"', "sh", *cmd],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    results = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for p in procs:
                os.killpg(p.pid, 9)
            raise
        results.append((proc.returncode, stdout, stderr))
    return results


def test_scheduler_started_ranks_share_out(tmp_path):
    """RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT set per process: each traces itself into one run."""
    out = tmp_path / "run"
    port = str(_free_port())
    envs = [
        _clean_env(
            RANK=str(r),
            WORLD_SIZE="2",
            LOCAL_RANK=str(r),
            LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            STEPS="8",
        )
        for r in (0, 1)
    ]
    results = _scheduler_launch(tmp_path, Path(DDP_SCRIPT), envs, out)
    assert [r[0] for r in results] == [0, 0], [r[2][-2000:] for r in results]
    manifest = _assert_two_ranks_traced(out, "scheduler")
    assert not (out / "nodes").exists() or not any((out / "nodes").iterdir())
    assert all(r["local_rank"] == r["rank"] for r in manifest["ranks"])


def test_scheduler_slurm_variables_only(tmp_path):
    """Only SLURM's variables, read by the training script itself (tcp:// rendezvous): ranks come from them."""
    script = write_script(
        tmp_path / "slurm_train.py",
        """
        import os
        import torch, torch.distributed as dist, torch.nn as nn
        rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['TEST_PORT']}",
                                rank=rank, world_size=world)
        model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(8):
            opt.zero_grad()
            model(torch.randn(16, 64)).square().mean().backward()
            opt.step()
        dist.barrier()
        dist.destroy_process_group()
        """,
    )
    out = tmp_path / "run"
    port = str(_free_port())
    envs = [_clean_env(SLURM_PROCID=str(r), SLURM_NTASKS="2", SLURM_LOCALID=str(r), TEST_PORT=port) for r in (0, 1)]
    results = _scheduler_launch(tmp_path, script, envs, out)
    assert [r[0] for r in results] == [0, 0], [r[2][-2000:] for r in results]
    manifest = _assert_two_ranks_traced(out, "scheduler")
    assert [r["local_rank"] for r in manifest["ranks"]] == [0, 1]


def test_command_shell_script_calling_torchrun(tmp_path):
    run_sh = tmp_path / "run.sh"
    run_sh.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" -m torch.distributed.run --standalone --nproc-per-node 2 "{DDP_SCRIPT}"\n'
    )
    out = tmp_path / "run"
    result = run_cli("trace", "--out", str(out), *FAST, "--", "sh", str(run_sh), env=_clean_env(STEPS="8"))
    assert result.returncode == 0, result.stderr[-3000:]
    _assert_two_ranks_traced(out, "command")
    assert "every rank started by `sh " in result.stderr


def test_command_exit_code_and_non_ranks_untraced(tmp_path):
    """`-- python script.py` where the script is a 1-rank job with spawned DataLoader workers and a helper Python
    subprocess: only the rank is traced; the command's exit code is ddpdoctor's and the manifest's."""
    script = write_script(
        tmp_path / "one_rank.py",
        """
        import subprocess, sys
        import torch, torch.distributed as dist, torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset

        if __name__ == "__main__":
            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1)
            model = nn.parallel.DistributedDataParallel(nn.Linear(16, 2))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            loader = DataLoader(TensorDataset(torch.randn(64, 16)), batch_size=8, num_workers=2,
                                multiprocessing_context="spawn")
            for (x,) in loader:
                model(x).sum().backward()
                opt.step()
            subprocess.run([sys.executable, "-c", "print('helper ran')"], check=True)
            dist.destroy_process_group()
            sys.exit(3)
        """,
    )
    out = tmp_path / "run"
    result = run_cli(
        "trace",
        "--out",
        str(out),
        *FAST,
        "--",
        sys.executable,
        str(script),
        str(_free_port()),
        env=_clean_env(),
        timeout=200,
    )
    assert result.returncode == 3, result.stderr[-3000:]
    assert "helper ran" in result.stdout
    manifest = read_json(out / "manifest.json")
    assert manifest["launch"] == "command" and manifest["exit_code"] == 3
    (entry,) = manifest["ranks"]
    assert entry["status"] == "failed" and entry["exit_code"] == 3 and entry["steps"] == 8
    assert [p.name for p in (out / "ranks").glob("rank*.json") if "summary" not in p.name] == ["rank0.json"]
    assert {p.name.split(".")[0] for p in out.glob("*.pt.trace.json.gz")} == {"rank0"}


def test_command_accelerate_launch(tmp_path):
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
        for step in range(8):
            opt.zero_grad()
            acc.backward(model(torch.randn(16, 64)).square().mean())
            opt.step()
        acc.wait_for_everyone()
        acc.end_training()
        """,
    )
    out = tmp_path / "run"
    # accelerate 1.x: --cpu means one process (several need MPI); --multi_gpu on a machine without GPUs starts
    # torch's elastic launcher with 2 processes, which the script runs on the CPU with gloo.
    launch = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(_free_port()),
        str(script),
    ]
    result = run_cli("trace", "--out", str(out), *FAST, "--", *launch, env=_clean_env(), timeout=200)
    assert result.returncode == 0, result.stderr[-3000:]
    _assert_two_ranks_traced(out, "command")


def test_lightning_trainer_ddp(tmp_path):
    pytest.importorskip("lightning")
    script = write_script(
        tmp_path / "lit_train.py",
        """
        import torch, torch.nn as nn
        import lightning as L
        from torch.utils.data import DataLoader, TensorDataset

        class Model(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
            def training_step(self, batch, batch_idx):
                return self.net(batch[0]).square().mean()
            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)

        if __name__ == "__main__":
            data = DataLoader(TensorDataset(torch.randn(16 * 16, 64)), batch_size=16)
            trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=8, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
            trainer.fit(Model(), data)
        """,
    )
    out = tmp_path / "run"
    env = _clean_env(MASTER_PORT=str(_free_port()))
    result = run_cli("trace", "--out", str(out), *FAST, str(script), env=env, timeout=200)
    assert result.returncode == 0, result.stderr[-3000:]
    # Lightning runs rank 0 in the process ddpdoctor started and re-executes the script for rank 1.
    assert _assert_two_ranks_traced(out, "spawn")["mode"] == "spawn"
    # its automatic optimisation runs forward and backward inside optimizer.step(closure): DDP's gradient
    # all-reduces are the backward pass's, not collectives of the optimizer's own (ZeRO's, left out of DDP's time)
    for rank in (0, 1):
        c = json.loads((out / "ranks" / f"rank{rank}.summary.json").read_text())["collectives"]
        issued = {w for k, w in zip(c["kind"], c["issued_in"], strict=True) if k == "all_reduce"}
        assert issued == {"backward"}, c


def test_lightning_fabric_ddp(tmp_path):
    """Lightning Fabric, 2 CPU ranks: Fabric re-executes the script for rank 1 as the Trainer does. The manifest says
    ddpdoctor launched one process whose children were the ranks (mode "spawn", never "single"), and diagnose reads
    a 2-rank DDP job."""
    pytest.importorskip("lightning")
    script = write_script(
        tmp_path / "fabric_train.py",
        """
        import torch, torch.nn as nn
        from lightning.fabric import Fabric

        if __name__ == "__main__":
            fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
            fabric.launch()
            model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            model, opt = fabric.setup(model, opt)
            for _ in range(8):
                opt.zero_grad()
                fabric.backward(model(torch.randn(16, 64, device=fabric.device)).square().mean())
                opt.step()
        """,
    )
    out = tmp_path / "run"
    env = _clean_env(MASTER_PORT=str(_free_port()))
    result = run_cli("trace", "--out", str(out), *FAST, str(script), env=env, timeout=200)
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = _assert_two_ranks_traced(out, "spawn")
    assert manifest["mode"] == "spawn", manifest["mode"]
    _diagnosis(out)  # a 2-rank gloo DDP job, as diagnose reads it


def test_in_rank_refuses_to_overwrite_its_rank(tmp_path):
    out = tmp_path / "run"
    (out / "ranks").mkdir(parents=True)
    (out / "ranks" / "rank1.json").write_text('{"rank": 1}')
    env = _clean_env(RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    result = run_cli("trace", "--out", str(out), DDP_SCRIPT, env=env, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"ddpdoctor: error: --out {out} already holds rank 1 of a run; choose another directory or pass --force"
    ]
    assert (out / "ranks" / "rank1.json").read_text() == '{"rank": 1}'


def test_command_not_found_is_one_line(tmp_path):
    result = run_cli("trace", "--out", str(tmp_path / "run"), "--", "no-such-launcher-xyz", "train.py", timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "ddpdoctor: error: cannot run command 'no-such-launcher-xyz': not found on PATH"
    ]
    assert not (tmp_path / "run").exists()


def test_in_rank_needs_a_shared_out(tmp_path):
    """A scheduler-started rank without --out would pick a time-stamped folder of its own: refused in one line."""
    env = _clean_env(SLURM_PROCID="0", SLURM_NTASKS="4")
    result = run_cli("trace", DDP_SCRIPT, env=env, cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "ddpdoctor: error: this process is rank 0 of 4 (slurm variables): give every rank the same --out DIR"
    ]
    assert list(tmp_path.iterdir()) == []
