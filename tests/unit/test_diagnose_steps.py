"""``diagnose --steps N..M`` outside the run's steps: one line that lists the steps the run has (exit 2)."""

from __future__ import annotations

import json

from helpers import SAMPLES, run_cli


def test_steps_the_run_does_not_have_list_the_steps_it_has():
    done = run_cli("diagnose", str(SAMPLES / "recorded" / "ddp_straggler"), "--steps", "40..50")
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1
    assert "the run's profiled steps are 4-11" in done.stderr


def test_a_range_that_holds_some_steps_is_analysed():
    done = run_cli("diagnose", str(SAMPLES / "recorded" / "ddp_straggler"), "--steps", "9..40", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["run"]["steps_analyzed"] == 3  # 9, 10, 11
