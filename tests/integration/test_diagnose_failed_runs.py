"""`diagnose` of jobs that crashed, failed at start-up, were killed, hung before their profiled window, and of a
folder of torch's own Flight Recorder dumps (issue 24): an error finding leads, naming the culprit rank and where
it was; the survivors' wait for a dead or stuck peer never becomes a timing finding. Real gloo jobs on CPU, each
bounded in time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import REPO, read_json, run_cli, start_long_ddp_run, write_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# timing rules that a wait for a dead or stuck peer would otherwise fire
TIMING_RULES = {"poor-comm-compute-overlap", "rank-straggler", "low-collective-bandwidth", "ddp-bucket-size-mismatch"}
HEALTH_RULES = {"rank-crashed", "job-failed-at-startup", "collective-hang", "collective-mismatch", "rank-died"}
HANG_JOB = REPO / "tests" / "integration" / "hang_job.py"

CRASH = """
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train_step(model, opt, step, rank):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
    if rank == 1 and step == 11:
        raise RuntimeError(f"bad batch at step {step}")


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(20):
        train_step(model, opt, step, rank)
        time.sleep(0.01)
    dist.barrier()
    dist.destroy_process_group()


main()
"""


def _diagnose(path, *args):
    result = run_cli("diagnose", str(path), "--format", "json", *args)
    assert result.returncode in (0, 1), result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout), result


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("crash")
    script = write_script(tmp / "crash2.py", CRASH)
    out = tmp / "run"
    traced = run_cli(
        "trace", "--out", str(out), "--wait", "5", "--warmup", "1", "--active", "8",
        "--standalone", "--nproc-per-node", "2", str(script), timeout=150,
    )  # fmt: skip
    assert traced.returncode != 0, traced.stderr
    return out


def test_a_crash_inside_the_window_leads_with_the_crashed_rank(crashed):
    report, _ = _diagnose(crashed)
    first = report["findings"][0]
    assert (first["name"], first["severity"], first["ranks"]) == ("rank-crashed", "error", [1])
    assert "rank 1 crashed" in first["message"] and "RuntimeError: bad batch at step 11" in first["message"]
    assert "rank 0 failed as a consequence" in first["message"]
    assert "train_step (crash2.py:14)" in first["message"]  # the user-code frame, from the rank's exception dump
    # it raised after its 12th optimizer step (loop index 11): 12 steps completed, from its dump
    assert "rank 1 crashed after 12 steps" in first["message"], first["message"]
    names = {f["name"] for f in report["findings"]}
    assert names & HEALTH_RULES == {"rank-crashed"}
    # rank 0's wait for its dead peer (the cut step: ~1 s) is in no timing metric and no timing finding; what is
    # left is this tiny model's own few ms of exposed all-reduce per step
    assert not _large_gains(report), _large_gains(report)
    for rank in report["ranks"]:  # (the wait would be ~1 s; under load the model's own all-reduce takes ~20 ms)
        assert rank["exposed_comm_ms"] < 100 and rank["step_ms"]["p90"] < 200, rank
    cut = [n for n in report["run"]["notes"] if "left out of the timing metrics" in n]
    assert cut and "profiled step(s) 12" in cut[0], report["run"]["notes"]
    health = report["run"]["health"]
    assert health["kind"] == "crash" and health["culprits"] == [1]
    by_rank = {r["rank"]: r for r in health["ranks"]}
    assert by_rank[0]["state"] == "consequence", by_rank
    # the collective rank 0 lost its peer in: DDP's gradient all-reduce, from rank 0's own dump
    assert (by_rank[0]["collective"] or "").startswith("all_reduce #"), by_rank[0]
    assert by_rank[1]["steps"] == 12 and by_rank[1]["collective"] is None, by_rank[1]  # it raised in its own code


def test_every_format_leads_with_the_crash(crashed):
    for fmt in ("text", "markdown", "html"):
        result = run_cli("diagnose", str(crashed), "--format", fmt)
        assert result.returncode == 0, result.stderr
        assert "rank-crashed" in result.stdout and "bad batch at step 11" in result.stdout
        assert "How the job ended" in result.stdout
        text = result.stdout
        assert text.index("rank-crashed") < text.index("How the job ended")
    assert run_cli("diagnose", str(crashed), "--fail-on", "error").returncode == 1


def test_a_one_process_run_that_failed_at_start_up_is_an_error(tmp_path):
    script = write_script(tmp_path / "norank.py", 'import torch.distributed as dist\ndist.init_process_group("gloo")\n')
    out = tmp_path / "run"
    env = {k: "" for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k in os.environ}
    traced = run_cli("trace", "--out", str(out), str(script), env=env)
    assert traced.returncode == 1, traced.stderr
    assert read_json(out / "manifest.json")["ranks"][0]["status"] == "failed"
    report, _ = _diagnose(out)
    first = report["findings"][0]
    assert (first["name"], first["severity"], first["ranks"]) == ("job-failed-at-startup", "error", [0])
    assert "RANK expected, but not set" in first["message"] and "--nproc-per-node" in first["recommendation"]
    # where the user's code was: no dump (no process group yet), so from the traceback the rank file kept
    assert first["message"].rstrip(".").endswith(", in <module> (norank.py:2)"), first["message"]
    # no collective was ever issued: the report says the collective is unknown and why, and names no timing
    health = report["run"]["health"]
    assert health["kind"] == "startup" and health["culprits"] == [0] and health["collective"] is None, health
    assert health["ranks"][0]["where"] == "<module> (norank.py:2)", health["ranks"]
    assert any(
        n.startswith("collective: unknown: no rank left a dump") and "before any process group was made" in n
        for n in health["notes"]
    ), health["notes"]
    assert not {f["name"] for f in report["findings"]} & TIMING_RULES
    assert run_cli("diagnose", str(out), "--fail-on", "info").returncode == 1
    assert run_cli("diagnose", str(out), "--fail-on", "error").returncode == 1
    assert run_cli("diagnose", str(out)).returncode == 0  # --fail-on is off by default


def test_a_rank_killed_with_sigkill_is_named_and_its_peer_is_a_consequence(tmp_path):
    out = tmp_path / "run"
    proc = start_long_ddp_run(out, "--wait", "1", "--warmup", "1", "--active", "2")
    try:
        deadline = time.time() + 30
        while time.time() < deadline and not (out / "ranks" / "rank1.json").exists():
            time.sleep(0.2)
        os.kill(read_json(out / "ranks" / "rank1.json")["pid"], signal.SIGKILL)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0
    report, _ = _diagnose(out)
    first = report["findings"][0]
    assert (first["name"], first["severity"], first["ranks"]) == ("rank-died", "error", [1])
    assert "rank 1 died without an exception of its own" in first["message"]
    by_rank = {r["rank"]: r for r in read_json(out / "manifest.json")["ranks"]}
    assert by_rank[1]["exit_code"] == -9 and "SIGKILL" in by_rank[1]["reason"], by_rank[1]  # torchrun's status
    health = report["run"]["health"]
    assert health["culprits"] == [1]  # rank 0 lost its peer (or was stopped by torchrun): never the cause
    states = {r["rank"]: r for r in health["ranks"]}
    assert states[0]["state"] not in ("crashed", "died")
    # what the data allows of the killed rank: no dump, so no frame and no collective; its rank file was last
    # written before the kill, so its step is unknown (a lower bound), never a count said as exact
    assert states[1]["where"] is None and states[1]["collective"] is None, states[1]
    assert states[1]["steps"] is None and isinstance(states[1]["steps_at_least"], int), states[1]
    assert {f["name"] for f in report["findings"]} & HEALTH_RULES == {"rank-died"}
    assert not _large_gains(report), _large_gains(report)


def test_a_hang_before_the_window_is_diagnosed_without_a_trace(tmp_path):
    out = tmp_path / "run"
    env = {"STEPS": "40", "STUCK_RANK": "1", "STUCK_STEP": "3", "SLEEP_MS": "10"}
    traced = run_cli(
        "trace", "--out", str(out), "--wait", "30", "--warmup", "1", "--active", "3", "--hang-timeout", "5",
        "--standalone", "--nproc-per-node", "2", str(HANG_JOB),
        env=env, timeout=150,
    )  # fmt: skip
    assert traced.returncode != 0
    assert not list(out.glob("*.pt.trace.json*"))  # no trace at all
    # the terminal tells one story: the note of a run without a window says how each rank ended as the verdict does
    note = next(line for line in traced.stderr.splitlines() if "before the profiled window" in line)
    assert "rank 1 hung after 3 steps, rank 0 interrupted after 3 steps (a consequence of rank 1)" in note, note
    assert "rank 1 interrupted" not in traced.stderr, traced.stderr
    report, result = _diagnose(out)
    assert "no trace files" not in result.stderr
    first = report["findings"][0]
    assert (first["name"], first["severity"], first["ranks"]) == ("collective-hang", "error", [1])
    stuck = next(i for i, line in enumerate(HANG_JOB.read_text().splitlines(), 1) if "time.sleep(0.1)" in line)
    assert f"read_shard (hang_job.py:{stuck})" in first["message"], first["message"]
    assert "rank 0 waits in all_reduce #" in first["message"] and "(default_pg)" in first["message"]
    health = report["run"]["health"]
    assert health["culprits"] == [1] and health["waiting"] == [0] and health["collective"]["op"] == "all_reduce"
    assert not {f["name"] for f in report["findings"]} & TIMING_RULES
    assert any("no trace was recorded" in n for n in report["run"]["notes"])


FOREIGN = """
import os
import time

import torch
import torch.distributed as dist


def metric_sync(rank):
    if rank == 0:
        return dist.all_reduce(torch.ones(1), async_op=True)
    return dist.broadcast(torch.ones(4), src=0, async_op=True)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for _ in range(3):
        dist.all_reduce(torch.ones(8))
    metric_sync(rank)
    time.sleep(1.0)
    # what torch writes under TORCH_FR_DUMP_TEMP_FILE: the pickled Flight Recorder buffer, prefix + rank
    data = torch._C._distributed_c10d._dump_fr_trace(True, True, False)
    with open(os.path.join(os.environ["DUMP_DIR"], f"fr_trace_rank_{rank}"), "wb") as f:
        f.write(data)
    os._exit(0)


main()
"""


def test_a_folder_of_torch_own_flight_recorder_dumps_is_diagnosed(tmp_path):
    script = write_script(tmp_path / "desync.py", FOREIGN)
    dumps = tmp_path / "fr"
    dumps.mkdir()
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000", "DUMP_DIR": str(dumps)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    subprocess.run(cmd, env=env, timeout=120, capture_output=True, check=False)
    assert sorted(p.name for p in dumps.iterdir()) == ["fr_trace_rank_0", "fr_trace_rank_1"]
    report, result = _diagnose(dumps, "--fail-on", "error")
    assert result.returncode == 1
    first = report["findings"][0]
    assert (first["name"], first["severity"]) == ("collective-mismatch", "error")
    assert "all_reduce" in first["message"] and "broadcast" in first["message"]
    assert "rank 0" in first["message"] and "rank 1" in first["message"]
    # the user-code frame of each side, from the frames torch's pickle dump holds
    line = next(i for i, text in enumerate(FOREIGN.splitlines(), 1) if "dist.all_reduce(torch.ones(1)" in text)
    assert f"metric_sync (desync.py:{line})" in first["message"], first["message"]
    health = report["run"]["health"]
    assert health["kind"] == "desync" and health["culprits"] == [0, 1], health
    # the three all_reduces before it are #1-#3 (torch's sequence ids start at 1)
    assert health["collective"]["seq_id"] == 4 and "collective #4 (default_pg)" in first["message"], health
    assert not {f["name"] for f in report["findings"]} & TIMING_RULES  # no trace: no timing claim at all
    assert any("torch's own Flight Recorder dumps" in n for n in report["run"]["notes"])


def test_a_torchrun_job_that_failed_at_start_up_is_not_also_a_job_that_never_synchronises(tmp_path):
    """Both ranks stop at a bad argument before any step: the start-up the trace recorded holds no collective, which
    says nothing of whether the job would synchronise (it said "ranks-never-synchronize", an error of its own, and
    advised calling ddpdoctor.step())."""
    script = write_script(
        tmp_path / "badarg.py",
        'import argparse\nimport torch.distributed as dist\ndist.init_process_group("gloo")\n'
        'argparse.ArgumentParser().parse_args(["--stepz", "10"])\n',
    )
    out = tmp_path / "run"
    traced = run_cli("trace", "--out", str(out), "--standalone", "--nproc-per-node", "2", str(script), timeout=150)
    assert traced.returncode != 0, traced.stderr
    report, _ = _diagnose(out)
    assert [f["name"] for f in report["findings"]] == ["job-failed-at-startup"], report["findings"]
    reasons = {n["name"]: n["reason"] for n in report["not_evaluated"]}
    assert "the job failed before its first step" in reasons["ranks-never-synchronize"], reasons
    assert report["run"]["parallelism"] == "unknown", report["run"]["parallelism"]
    assert not any("ddpdoctor.step()" in n for n in report["run"]["notes"]), report["run"]["notes"]


def _large_gains(report: dict) -> list[tuple[str, float, str]]:
    """The findings that claim 20 ms or more per step (name, gain, message): both ranks sleep 20 ms a step in
    these runs, so such a gain is most likely that sleep blamed on something, said with its evidence when it fails
    (a flaky failure under load must name the finding)."""
    return [
        (f["name"], f["estimated_gain_ms"], f["message"] + " evidence: " + str(f.get("evidence")))
        for f in report["findings"]
        if f["estimated_gain_ms"] is not None and f["estimated_gain_ms"] >= 20
    ]
