"""The recorded run shipped in samples/ (so `diagnose` can be tried without running anything) still loads and
names its problem."""

from __future__ import annotations

import json
from pathlib import Path

from ddpdoctor.cli import main

RECORDED = Path(__file__).resolve().parents[2] / "samples" / "recorded" / "ddp_straggler"


def test_recorded_straggler_run_is_read_and_says_its_window_is_too_short(capsys):
    assert main(["diagnose", str(RECORDED), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["run"]["world_size"] == 2 and report["run"]["mode"] == "ddp"
    # rank 1 sleeps 60 ms in each of the 4 profiled steps: 4 observations of "who was last" (the 2 all-reduces of
    # a step share its lateness) cannot tell it from chance or from a rank the host starved, and it says so
    reason = next(n["reason"] for n in report["not_evaluated"] if n["name"] == "rank-straggler")
    assert "4 independent block(s)" in reason and "--active" in reason
