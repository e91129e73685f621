"""Faults under `ddpdoctor trace` with real ranks: a rank killed with SIGKILL, a rank that hangs."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from helpers import read_json, run_cli, start_long_ddp_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SCRIPT = str(Path(__file__).with_name("ddp_script.py"))
FAST = ["--wait", "1", "--warmup", "1", "--active", "3"]


def test_rank_killed_with_sigkill(tmp_path):
    out = tmp_path / "run"
    proc = start_long_ddp_run(out, *FAST)
    victim = read_json(out / "ranks" / "rank1.json")["pid"]
    os.kill(victim, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0
    manifest = read_json(out / "manifest.json")
    by_rank = {r["rank"]: r for r in manifest["ranks"]}
    assert by_rank[1]["status"] == "failed" and "died" in by_rank[1]["reason"]
    assert by_rank[0]["status"] in ("interrupted", "failed")
    for r in (0, 1):  # both completed windows survive
        assert by_rank[r]["trace_files"] and (out / by_rank[r]["trace_files"][0]).stat().st_size > 0


def test_hanging_rank_is_named(tmp_path):
    out = tmp_path / "run"
    result = run_cli(
        "trace",
        "--out",
        str(out),
        *FAST,
        "--hang-timeout",
        "3",
        "--standalone",
        "--nproc-per-node",
        "2",
        SCRIPT,
        env={"STEPS": "30", "HANG_RANK": "1", "HANG_STEP": "8"},
        timeout=150,
    )
    assert result.returncode != 0
    assert "rank 1 hung" in result.stderr
    manifest = read_json(out / "manifest.json")
    by_rank = {r["rank"]: r for r in manifest["ranks"]}
    assert by_rank[1]["status"] == "hung"
    assert "ddp_script.py:" in by_rank[1]["reason"]  # where it was stuck (from its dump: dumps/rank1.<id>.json)
    for r in (0, 1):
        assert by_rank[r]["trace_files"]
