"""Issue 25 item 4: a rank starved of CPU by a busy host is not called a straggler without the load named; a rank
that sleeps every step beside the same burners still is; a job the host's load did not hold back says so.

Three real 2-rank jobs (tests/integration/hostload_job.py, CPU + gloo, 8 profiled steps each): rank 0 pinned to
CPU 0 beside two CPU burners pinned there too (started by rank 0 once its model is built, so that the start-up
runs at full speed), at a lower priority (``NICE``: on this shared machine the kernel
moves other work to CPU 1, and without it both ranks starve alike), rank 1 on CPU 1 -- once with equal work,
once with rank 0 also sleeping 100 ms per step; and a job that needs little CPU (a tiny model, 100 ms of sleep
a step) with no burner: on this busy machine its training loop waits a few ms per step for a CPU, well under
the 10% of the window that makes a contended host.
"""

from __future__ import annotations

import json
import os

import pytest
from helpers import REPO, run_cli

from ddpdoctor.metrics.hostload import CONTENDED_STEAL_SHARE, CONTENDED_WAIT_SHARE
from ddpdoctor.metrics.hostload import HOSTLOAD_RANK_METRICS as SHOWN
from ddpdoctor.pipeline import analyze_run

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not hasattr(os, "sched_setaffinity")
        or not {0, 1} <= os.sched_getaffinity(0)
        or not os.path.exists("/proc/self/task"),
        reason="needs Linux and CPUs 0 and 1",
    ),
]

JOB = str(REPO / "tests" / "integration" / "hostload_job.py")
STARVED = {"PIN_CPUS": "0,1", "BURNERS": "2", "NICE": "3", "WIDTH": "256", "STEPS": "11"}


def _trace(out, env: dict[str, str]) -> dict:
    args = ["trace", "-q", "--out", str(out), "--wait", "1", "--warmup", "1", "--active", "8"]
    args += ["--standalone", "--nproc-per-node", "2", JOB]
    traced = run_cli(*args, env=env, timeout=240)
    assert traced.returncode == 0, traced.stderr[-3000:]
    diagnosed = run_cli("diagnose", str(out), "--format", "json", timeout=120)
    assert diagnosed.returncode == 0, diagnosed.stderr[-3000:]
    report = json.loads(diagnosed.stdout)
    # the metrics the verdicts rest on, to say what happened when an assertion fails
    ranks = analyze_run(out).metrics.ranks
    report["_metrics"] = [
        {k: r.get(k) for k in ("rank", "slow_rank", "wait_caused_ms", "late_own_ms", "cpu_wait_share", *SHOWN)}
        for r in ranks
    ]
    return report


def _findings(report: dict, name: str) -> list[dict]:
    return [f for f in report["findings"] if f["name"] == name]


@pytest.fixture(scope="module")
def starved(tmp_path_factory) -> dict:
    return _trace(tmp_path_factory.mktemp("hostload") / "starved", STARVED)


@pytest.fixture(scope="module")
def slow(tmp_path_factory) -> dict:
    env = {**STARVED, "SLOW_RANK": "0", "SLOW_MS": "100"}
    return _trace(tmp_path_factory.mktemp("hostload") / "slow", env)


@pytest.fixture(scope="module")
def quiet(tmp_path_factory) -> dict:
    env = {"WIDTH": "32", "SLEEP_MS": "100", "STEPS": "11"}
    return _trace(tmp_path_factory.mktemp("hostload") / "quiet", env)


@pytest.mark.timeout(300)
def test_a_rank_starved_by_the_burners_is_named_starved_not_a_straggler(starved) -> None:
    why = (starved["run"]["notes"], starved["findings"], starved["_metrics"])
    # Both ranks do the same work: neither is a straggler, whichever the host starved
    assert not _findings(starved, "rank-straggler"), why
    shares = {r["rank"]: r["cpu_wait_share"] for r in starved["_metrics"]}
    # the burners took CPU 0 from rank 0; on a machine where other sessions' work loads CPU 1 more (a clean-clone
    # suite beside two benchmarks, 2026-12-05: rank 0 waited 1.6% of the window, rank 1 22%), rank 1 is the one
    assert max(shares.values()) >= 0.1, why
    # last at the collectives more often than chance (the usual case) and keeping the others waiting 2 ms a step or
    # more (the rule's min_wait_ms): named starved. A clean-clone suite (2026-12-05) had rank 1 last at 8 of 8 but
    # costing the others 1.7 ms a step (it waited 13% of the window): too little to name, the rule passed on that
    slow = [r for r in starved["_metrics"] if r["slow_rank"]]
    starved_ranks = sorted(r["rank"] for r in slow if (r["wait_caused_ms"] or 0) >= 2)
    if slow and not starved_ranks:
        assert "rank-starved-of-cpu" in starved["passed"], why
    if starved_ranks:
        (found,) = _findings(starved, "rank-starved-of-cpu")
        assert found["ranks"] == starved_ranks and all(shares[r] >= 0.1 for r in starved_ranks), why
        assert "waited for a CPU, not on work of its own" in found["message"]
        assert "The host was busy, not this rank's work" in found["message"]
    # (when the host starved both ranks alike, neither is late more often than chance)
    # the header says so in every format (the notes): a fact about the host, not a finding about the job
    assert any(n.startswith("The host was busy: rank ") for n in starved["run"]["notes"]), why


@pytest.mark.timeout(300)
def test_a_rank_that_sleeps_every_step_is_still_a_straggler_beside_the_burners(slow) -> None:
    found = _findings(slow, "rank-straggler")
    assert len(found) == 1 and found[0]["ranks"] == [0], (slow["run"]["notes"], slow["findings"], slow["_metrics"])
    finding = found[0]
    rank0 = slow["_metrics"][0]
    # The load is named where it held the rank back: sleeping 100 ms a step, rank 0 is runnable only a few ms of
    # each step, and how long it then waits beside the burners varies with the host (CI: under the 10% of the
    # window that names it; 3.6-5.3% in three runs here). The clause follows the measured share, both ways.
    named = "The host was busy too: rank 0's training loop waited" in finding["message"]
    assert named == (rank0["cpu_wait_share"] >= 0.1), (rank0, finding["message"])
    if named:
        assert "ms per step of its lateness are its own" in finding["message"]
    assert rank0["late_own_ms"] >= 50, rank0  # its lateness is its own sleep, not the host's
    assert not _findings(slow, "rank-starved-of-cpu"), slow["findings"]


@pytest.mark.timeout(300)
def test_a_job_the_load_did_not_hold_back_says_no_contention(quiet) -> None:
    why = (quiet["run"]["notes"], quiet["_metrics"])
    assert all(r["cpu_wait_share"] < CONTENDED_WAIT_SHARE for r in quiet["_metrics"]), why  # its loop hardly waited
    steal = max((r["host_steal_ratio"] or 0.0) for r in quiet["_metrics"])
    if steal >= CONTENDED_STEAL_SHARE:
        # the hypervisor took CPU time from this whole VM (CI, 2026-12-04: the loop waited 1% of the window): the
        # host was contended all the same, and the note says why
        assert any(n.startswith("The host was busy: ") and "(steal)" in n for n in quiet["run"]["notes"]), why
    else:  # under the bar: "no contention", or "some" where the loop waited from 2% of the window
        lines = ("No CPU contention for this job: ", "Some CPU contention, below the 10% at which timing verdicts")
        assert any(n.startswith(lines) for n in quiet["run"]["notes"]), why
    assert not _findings(quiet, "rank-starved-of-cpu")
    assert "rank-starved-of-cpu" in quiet["passed"]
