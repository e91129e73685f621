"""A real 2-rank run whose rank 1 crashes fails the gate against a healthy baseline, naming the rank (issue 13,
item 6); before, its few fast steps passed as an improvement. ~25 s on 2 cores."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run_cli

pytestmark = [pytest.mark.integration]

SCRIPT = str(Path(__file__).with_name("ddp_script.py"))
TRACE = ["trace", "-q", "--wait", "2", "--warmup", "1", "--active", "5", "--standalone", "--nproc-per-node", "2"]


@pytest.mark.timeout(400)
def test_a_run_with_a_crashed_rank_fails_the_gate(tmp_path):
    healthy, crashed = tmp_path / "healthy", tmp_path / "crashed"
    env = {"STEPS": "30", "SLEEP_MS": "30"}
    ok = run_cli(*TRACE[:1], "--out", str(healthy), *TRACE[1:], SCRIPT, env=env, timeout=150)
    assert ok.returncode == 0, ok.stderr[-2000:]
    env = {**env, "FAIL_RANK": "1", "FAIL_STEP": "14"}
    bad = run_cli(*TRACE[:1], "--out", str(crashed), *TRACE[1:], SCRIPT, env=env, timeout=150)
    assert bad.returncode != 0
    baseline = tmp_path / "baseline.json"
    made = run_cli("baseline", str(healthy), "--output", str(baseline), timeout=150)
    assert made.returncode == 0, made.stderr
    assert '"incomplete"' not in baseline.read_text()  # a healthy run is complete
    result = run_cli("gate", str(crashed), "--baseline", str(baseline), "--fail-on", "off", timeout=150)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ddpdoctor gate: FAIL: run incomplete" in result.stdout
    assert "current run: rank 1 failed" in result.stdout and "injected failure" in result.stdout
    # and a crashed run is no baseline: gating a healthy run against it fails too
    bad_base = tmp_path / "bad.json"
    assert run_cli("baseline", str(crashed), "--output", str(bad_base), timeout=150).returncode == 0
    against = run_cli("gate", str(healthy), "--baseline", str(bad_base), timeout=150)
    assert against.returncode == 1 and "baseline: rank 1 failed" in against.stdout
