"""Whether the recorded window can show how often the ranks synchronise (``metrics.analysis``): a job that failed
before its first step recorded its start-up only, and a run without detected steps is recorded from its start for
``--no-step-limit`` seconds, which holds its training only where the run ended inside it. Else the per-step
collective counts are not given (ranks-never-synchronize is not evaluated), rather than counted as 0."""

from __future__ import annotations

import pytest

from ddpdoctor.metrics.analysis import _COLLECTIVE_COUNTS, _why_no_collective_count


def _captures(*ended_by):
    return {r: {"rank": r, "fallback_window": {"state": "kept", "ended_by": e}} for r, e in enumerate(ended_by)}


def test_a_start_up_failure_holds_no_training():
    why = _why_no_collective_count(_captures("end of run", "end of run"), {"startup_failed": True}, False)
    assert why is not None and why.startswith("the job failed before its first step")


@pytest.mark.parametrize(
    "ends", [("time limit", "time limit"), ("end of run", "time limit"), (None, None), ("end of run", None)]
)
def test_a_start_recorded_until_a_time_limit_or_never_finished_cannot_tell(ends):
    why = _why_no_collective_count(_captures(*ends), {"startup_failed": False}, False)
    assert why is not None and "ended before the run did" in why and "ddpdoctor.step()" in why


def test_a_recording_of_the_whole_run_can_tell():
    """The job ended inside the window on every rank: no collective there is no collective at all."""
    assert _why_no_collective_count(_captures("end of run", "end of run"), {"startup_failed": False}, False) is None


@pytest.mark.parametrize("detected", [True, None])
def test_steps_seen_or_a_foreign_trace_keep_the_count(detected):
    """Steps seen: the counts are of the profiled steps. No capture (a plain torch.profiler trace): nothing to say."""
    assert _why_no_collective_count(_captures("time limit"), {"startup_failed": False}, detected) is None
    assert _why_no_collective_count({}, {}, detected) is None


def test_the_counts_are_the_parallelism_group_s_per_step_counts():
    assert "collectives_per_step" in _COLLECTIVE_COUNTS and "p2p_per_step" in _COLLECTIVE_COUNTS
    assert "ddp_ranges" not in _COLLECTIVE_COUNTS  # DDP's ranges say the job synchronises, window or not
