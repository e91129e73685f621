"""Several ranks that never synchronise (imagenet/main.py on CPU: DDP only on GPUs) are an error that leads the
report; the same script's twin with DDP, and a one-process run, are not."""

from __future__ import annotations

import json

import pytest
from helpers import SAMPLES, run_cli

pytestmark = [pytest.mark.integration]

WINDOW = ["--wait", "1", "--warmup", "1", "--active", "3"]


def _diagnose(tmp_path, *launch: str) -> dict:
    out = tmp_path / "run"
    traced = run_cli("trace", "-q", "--out", str(out), *WINDOW, *launch, timeout=150)
    assert traced.returncode == 0, traced.stderr[-3000:]
    diagnosed = run_cli("diagnose", str(out), "--format", "json", timeout=60)
    assert diagnosed.returncode == 0, diagnosed.stderr[-3000:]
    return json.loads(diagnosed.stdout)


@pytest.mark.timeout(240)
def test_two_ranks_without_ddp_is_an_error_that_leads_the_report(tmp_path):
    report = _diagnose(tmp_path, "--standalone", "--nproc-per-node", "2", str(SAMPLES / "mistake_no_ddp_on_cpu.py"))
    first = report["findings"][0]
    assert first["name"] == "ranks-never-synchronize" and first["severity"] == "error"
    assert first["evidence"]["max(collectives_per_step)"] == 0 and first["evidence"]["world_size"] == 2
    assert "DistributedSampler" in first["message"]  # it also shards the data: each model sees half
    assert report["run"]["parallelism"] == "none"
    # rules about communication are not "passed" on a run without any
    passed = set(report["passed"])
    assert not passed & {"poor-comm-compute-overlap", "rank-straggler", "low-collective-bandwidth"}
    reasons = {n["name"]: n["reason"] for n in report["not_evaluated"]}
    assert "without any synchronisation" in reasons["poor-comm-compute-overlap"]
