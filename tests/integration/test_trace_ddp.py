"""Real 2-rank torchrun + gloo DDP runs on CPU under `ddpdoctor trace`."""

from __future__ import annotations

import gzip
import json
import os
import signal
import time
from pathlib import Path

import pytest
from helpers import read_json, run_cli, start_long_ddp_run

pytestmark = [pytest.mark.integration]

SCRIPT = str(Path(__file__).with_name("ddp_script.py"))
FAST = ["--wait", "1", "--warmup", "1", "--active", "3"]


def _trace_names(path: Path) -> set[str]:
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    return {e.get("name") for e in trace["traceEvents"]}, trace


@pytest.mark.timeout(180)
def test_two_rank_ddp_run(tmp_path):
    out = tmp_path / "run"
    result = run_cli(
        "trace", "--out", str(out), *FAST, "--standalone", "--nproc-per-node", "2", SCRIPT, env={"STEPS": "8"}
    )
    assert result.returncode == 0, result.stderr
    manifest = read_json(out / "manifest.json")
    assert manifest["world_size"] == 2 and manifest["exit_code"] == 0 and manifest["mode"] == "torchrun"
    assert manifest["steps_detected"] is True
    assert [r["rank"] for r in manifest["ranks"]] == [0, 1]
    for entry in manifest["ranks"]:
        assert entry["status"] == "ok" and entry["exit_code"] == 0
        assert entry["profiled_steps"] == [[3, 5]]
        assert len(entry["trace_files"]) == 1
        names, trace = _trace_names(out / entry["trace_files"][0])
        assert "gloo:all_reduce" in names
        assert {"ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"} <= names
        assert "DistributedDataParallel.forward" in names
        assert trace["distributedInfo"]["rank"] == entry["rank"]
        assert trace["distributedInfo"]["world_size"] == 2
        rank = read_json(out / "ranks" / f"rank{entry['rank']}.json")
        assert (
            rank["backend"] == "gloo"
            and rank["steps"]["source"] == "optimizer"
            and rank["steps"]["count"] == 8
        )
        assert len(rank["steps"]["wall_ms"]) == 7 and all(ms > 0 for ms in rank["steps"]["wall_ms"])
        (ddp,) = rank["ddp"]
        data = ddp["logging_data"]
        assert data["world_size"] == 2 and data["backend_name"] == "gloo"
        assert data["bucket_cap_bytes"] > 0 and "avg_backward_compute_comm_overlap_time" in data
        gil = rank["gil"]
        assert gil["available"] and len(gil["per_step"]["contention"]) >= 3
        # gilwatch samples every 2 ms: a step of this tiny model may fall between two samples (no value, None)
        readings = [c for c in gil["per_step"]["contention"] if c is not None]
        assert readings and all(0.0 <= c <= 1.0 for c in readings), gil["per_step"]
    assert f"ddpdoctor diagnose {out}" in result.stderr


@pytest.mark.timeout(180)
def test_rank_failure_keeps_data(tmp_path):
    """Rank 0 raises at step 7: exit non-zero, rank 0 marked failed, both ranks' completed windows on disk."""
    out = tmp_path / "run"
    result = run_cli(
        "trace",
        "--out",
        str(out),
        *FAST,
        "--standalone",
        "--nproc-per-node",
        "2",
        SCRIPT,
        env={"STEPS": "12", "FAIL_RANK": "0", "FAIL_STEP": "7"},
    )
    assert result.returncode != 0
    assert "injected failure on rank 0 at step 7" in result.stderr
    manifest = read_json(out / "manifest.json")
    assert manifest["exit_code"] == result.returncode
    by_rank = {r["rank"]: r for r in manifest["ranks"]}
    assert by_rank[0]["status"] == "failed" and "injected failure" in by_rank[0]["reason"]
    for rank in (0, 1):
        files = by_rank[rank]["trace_files"]
        assert files, f"rank {rank} lost its completed window"
        names, _ = _trace_names(out / files[0])
        assert "ProfilerStep#5" in names
        assert read_json(out / "ranks" / f"rank{rank}.json")["steps"]["profiled"] == [[3, 5]]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(180)
def test_sigterm_flushes_and_leaves_no_orphans(tmp_path):
    out = tmp_path / "run"
    launcher = start_long_ddp_run(out, *FAST)
    pids = [read_json(out / "ranks" / f"rank{r}.json")["pid"] for r in (0, 1)]
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=90)
    assert launcher.returncode != 0
    manifest = read_json(out / "manifest.json")
    for entry in manifest["ranks"]:
        assert entry["status"] in ("interrupted", "failed"), entry
        assert entry["trace_files"]
        rank = read_json(out / "ranks" / f"rank{entry['rank']}.json")
        assert rank["status"] == "interrupted", rank["status"]
        assert rank["steps"]["count"] > 5  # the per-step record was flushed, not lost
    time.sleep(0.5)
    assert not [p for p in pids if _alive(p)], "rank processes outlived the launcher"
