"""The recorded run shipped in samples/ (so `diagnose` can be tried without running anything) still loads and
names its problem."""

from __future__ import annotations

import json
from pathlib import Path

from ddpdoctor.cli import main

RECORDED = Path(__file__).resolve().parents[2] / "samples" / "recorded" / "ddp_straggler"


def test_recorded_straggler_run_names_rank_1(capsys):
    # rank 1 sleeps 60 ms in each of the 8 profiled steps: 8 observations of "who was last" (the 2 all-reduces of a
    # step share its lateness count once), enough to tell it from chance with 2 ranks
    assert main(["diagnose", str(RECORDED), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["run"]["world_size"] == 2 and report["run"]["mode"] == "ddp"
    straggler = next(f for f in report["findings"] if f["name"] == "rank-straggler")
    assert straggler["ranks"] == [1] and straggler["estimated_gain_ms"] > 30
