"""Per-step samples from capture files: the steps the profiler disturbs are left out; the job's step is the
slowest rank's."""

from __future__ import annotations

from ddpdoctor.compare.samples import disturbed_steps, gil_samples, job_step_times


def _capture(wall_ms, profiled=((8, 12),), warmup=2, gil=None):
    return {
        "steps": {"first": 1, "wall_ms": list(wall_ms), "profiled": [list(p) for p in profiled]},
        "schedule": {"wait": 5, "warmup": warmup, "active": 5, "repeat": 1},
        "gil": {"per_step": gil or {}},
    }


def test_disturbed_steps_cover_first_warmup_active_and_export():
    # step 1: start-up; 6-7: profiler warm-up; 8-12: recorded; 13: the trace export happens in it
    assert disturbed_steps(_capture([1.0] * 30)) == {1, *range(6, 14)}


def test_job_step_is_the_slowest_rank_outside_the_window():
    r0 = [100.0] + [10.0] * 29
    r1 = [100.0] + [12.0] * 29
    r1[12] = 500.0  # step 13 (export): left out
    values, note = job_step_times([_capture(r0), _capture(r1)])
    assert values == [12.0] * (30 - 9)
    assert "steps outside the profiled windows" in note and "steps 2-30" in note


def test_short_runs_fall_back_to_every_step_but_the_first():
    values, note = job_step_times([_capture([50.0, 10, 11, 12, 13, 14, 15], profiled=((3, 5),), warmup=1)])
    assert values == [10, 11, 12, 13, 14, 15] and "too few" in note


def test_gil_samples_average_the_ranks():
    a = _capture([1.0], gil={"step": [8, 9], "contention": [0.2, 0.4]})
    b = _capture([1.0], gil={"step": [8, 9], "contention": [0.0, 0.2]})
    assert gil_samples([a, b]) == [0.1, 0.30000000000000004]
