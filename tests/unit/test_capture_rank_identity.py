"""Who a traced process is (rank, world size, node) from its launcher's variables, and the step clock's start-up
trace states — the parts of the capture session that need no running job."""

from __future__ import annotations

import pytest

from ddpdoctor.capture.rank_file import Identity, identity
from ddpdoctor.capture.step_clock import StartupTrace, StepClock, ranges


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, Identity()),
        (
            {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"},
            Identity(3, 8, 1, 2, 1, "env"),
        ),
        (
            {
                "SLURM_PROCID": "5",
                "SLURM_NTASKS": "6",
                "SLURM_LOCALID": "2",
                "SLURM_NODEID": "1",
                "SLURM_NTASKS_PER_NODE": "3(x2)",
            },
            Identity(5, 6, 2, 3, 1, "slurm"),
        ),
        (
            {
                "OMPI_COMM_WORLD_RANK": "1",
                "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            },
            Identity(1, 4, 1, 4, 0, "mpi"),
        ),
        ({"PMI_RANK": "2", "PMI_SIZE": "3"}, Identity(2, 3, 0, 1, 0, "mpi")),
        # torchrun's variables win over the allocation's: `srun torchrun ...` ranks are torchrun's.
        ({"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, Identity(1, 2, 0, 1, 0, "env")),
    ],
)
def test_identity_from_launcher_variables(env, expected):
    assert identity(env) == expected


def test_process_group_decides_rank_for_a_process_without_variables():
    """mp.spawn's children have no rank variables: the process group gives rank and size, on one node."""
    assert Identity().with_process_group(1, 2) == Identity(1, 2, 1, 2, 0, "process group")
    # With launcher variables, only rank and size come from the group; local rank stays the launcher's.
    slurm = Identity(5, 6, 2, 3, 1, "slurm")
    assert slurm.with_process_group(4, 6) == Identity(4, 6, 2, 3, 1, "slurm")


def test_startup_trace_dropped_at_first_step():
    clock = StepClock()
    assert clock.startup is StartupTrace.RECORDING and clock.count == 0
    clock.tick("optimizer", recording=False)
    assert clock.startup is StartupTrace.DISCARDING
    assert clock.startup_json() == {"state": "dropped", "ended_by": "first step"}
    assert clock.take_startup_trace() is True  # the profiler hands over the start-up recording: discard it
    assert clock.take_startup_trace() is False  # later windows are kept
    assert clock.startup is StartupTrace.DROPPED
    for recording in (False, True, True):
        clock.tick("optimizer", recording=recording)
    assert clock.count == 4 and len(clock.wall_ms) == 3
    assert clock.steps_json()["profiled"] == [[2, 3]]


def test_startup_trace_kept_without_steps():
    clock = StepClock()
    assert not clock.startup_over_limit(3600)
    clock.end_startup("end of run")
    assert clock.startup is StartupTrace.KEPT and clock.take_startup_trace() is False
    assert clock.startup_json() == {"state": "kept", "ended_by": "end of run"}
    assert clock.steps_json()["source"] == "none" and clock.count == 0


def test_first_optimizer_marks_the_step_until_manual_steps_take_over():
    clock = StepClock()
    gen, disc = object(), object()
    assert clock.counts_optimizer(gen) and not clock.counts_optimizer(disc) and clock.counts_optimizer(gen)
    clock.tick("manual", recording=False)
    assert not clock.counts_optimizer(gen)


def test_ranges():
    assert ranges([3, 4, 5, 9]) == [[3, 5], [9, 9]] and ranges([]) == []
