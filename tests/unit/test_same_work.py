"""The same work run slower on an oversubscribed shared host vs. a rank that does more or waits on its own
(ddpdoctor.metrics.same_work and hostload.same_work_slower): the numbers are those of real traces of
tests/integration/straggler_job.py and samples/ddp_train.py on a 2-CPU machine."""

from __future__ import annotations

import json
import math

import pytest
from test_hostload import _captures, _window

from ddpdoctor.metrics import hostload
from ddpdoctor.metrics.same_work import compare

# {name: [ops, top-level ops, top-level ms] per step}
BALANCED = {"aten::linear": [25.0, 5.0, 1.5], "AddmmBackward0": [25.0, 5.0, 2.0], "aten::add_": [10.0, 10.0, 0.5]}


def _scaled(work: dict, factor: float) -> dict:
    return {n: [c, t, ms * factor] for n, (c, t, ms) in work.items()}


def test_extra_ops_are_work_only_that_rank_does_and_the_same_ops_slower_are_not() -> None:
    extra = {**BALANCED, "aten::matmul": [40.0, 20.0, 14.0], "aten::tanh": [20.0, 20.0, 1.5]}
    assert compare(extra, [BALANCED]) == pytest.approx((15.5, 0.0))
    more, slower = compare(_scaled(BALANCED, 1.5), [BALANCED])
    assert more == 0.0 and slower == pytest.approx(2.0)  # 4 ms of ops, each 50% slower
    assert compare(BALANCED, [_scaled(BALANCED, 1.5)])[1] == pytest.approx(-2.0)


def _verdict(**kw) -> bool | None:
    args = dict(
        lateness_ms=2.7,
        extra_ops_ms=0.0,
        ops_slower_ms=1.0,
        cpu_excess_ms=2.6,
        wait_excess_ms=0.1,
        step_ms=24.7,
        runnable_per_cpu=3.5,
        ops_share=0.6,
    )
    return hostload.same_work_slower(**{**args, **kw})


def test_the_same_work_slower_on_an_oversubscribed_shared_host_is_not_the_ranks() -> None:
    # CI's false straggler: rank 0 2.7 ms late of a 24.7 ms step, its CPU time 2.6 ms more, the same ops slower
    assert _verdict() is True
    assert _verdict(lateness_ms=6.4, step_ms=26.9, cpu_excess_ms=5.5, wait_excess_ms=0.6, ops_slower_ms=2.5) is True


@pytest.mark.parametrize(
    "balanced",
    [
        # samples/ddp_train.py on an otherwise idle 2-core host, named a straggler in 1 run of 16: its ops carried
        # 2.5 ms of its 5.8 ms of extra CPU time beyond its extra wait (46% of their share, under the half that
        # counted as "the same work" before), which left 3.1 ms "work of its own" in a 95 ms step
        dict(lateness_ms=26.4, ops_slower_ms=8.51, cpu_excess_ms=5.77, wait_excess_ms=6.41, step_ms=95.0),
        # and in another run of 16: its ops slower by its extra wait alone, and 2.3 ms more CPU time (2.6% of an
        # 87 ms step) against a 30.3 ms lateness
        dict(lateness_ms=30.34, ops_slower_ms=7.755, cpu_excess_ms=2.286, wait_excess_ms=8.167, step_ms=87.26),
    ],
    ids=["ops-46pct-of-their-share", "ops-slower-by-the-wait-alone"],
)
def test_a_little_more_cpu_time_than_its_ops_show_is_not_work_of_its_own(balanced) -> None:
    """What its slower ops do not account for of its extra CPU time is work of its own between them, in
    proportion: a few ms of a long step are not (the Python between the ops of the same work slows too)."""
    assert _verdict(**balanced, ops_share=0.944, idle_excess_ms=0.0, runnable_per_cpu=1.17) is True
    # the same rank with 8 ms more of Python a step than its ops show is a rank with work of its own
    more = {**balanced, "cpu_excess_ms": balanced["cpu_excess_ms"] + 8.0, "lateness_ms": balanced["lateness_ms"] + 8}
    assert _verdict(**more, ops_share=0.944, idle_excess_ms=0.0, runnable_per_cpu=1.17) is False


@pytest.mark.parametrize(
    "changed",
    [
        {"cpu_excess_ms": 0.1, "wait_excess_ms": 0.2, "ops_slower_ms": 0.36, "lateness_ms": 5.1},  # sleeps
        {"extra_ops_ms": 15.4, "cpu_excess_ms": 14.0, "lateness_ms": 13.6, "ops_slower_ms": -1.6},  # extra matmuls
        {"ops_slower_ms": 0.1},  # pure Python work between the same ops: its CPU time, not the ops, grew
        # 5 ms of pure Python a step on a busy host (a real trace): preempted more, so its ops are slower too, but
        # by their share (0.62) of its extra wait (5.3 ms), not of its extra CPU time (5.4 ms)
        {"lateness_ms": 5.3, "cpu_excess_ms": 5.4, "wait_excess_ms": 5.3, "ops_slower_ms": 2.9, "ops_share": 0.62},
        {"ops_share": None},  # the others' op time or busy time unknown
        {"runnable_per_cpu": None},  # the ranks are on several hosts
        {"runnable_per_cpu": 0.6},  # fewer runnable threads than CPUs
        # sleeps 100 ms and waits 250 ms for a CPU: what the wait leaves is its own
        {"lateness_ms": 350.0, "cpu_excess_ms": 0.0, "wait_excess_ms": 250.0, "ops_slower_ms": 200.0, "step_ms": 400},
    ],
)
def test_a_rank_that_does_more_or_waits_on_its_own_is_still_its_own(changed) -> None:
    assert _verdict(**changed) is False


def test_unknown_lateness_is_not_guessed() -> None:
    assert _verdict(lateness_ms=None) is None


def test_the_own_lateness_test_is_rank_stragglers() -> None:
    from ddpdoctor.diagnosis import load_rules

    params = next(r for r in load_rules() if r.name == "rank-straggler").params
    assert (hostload.OWN_MS, hostload.OWN_STEP_SHARE, hostload.OWN_SHARE) == (
        params["min_own_ms"],
        params["min_own_share"],
        params["own_share"],
    )


def _run(slow_work: dict, *, host_b: str = "node-a"):
    """Two ranks on a busy host, rank 0 2.7 ms per step late with 26 ms more CPU time in 10 steps."""
    captures = _captures(_window(0.116, 0.02, runnable=7.0), _window(0.090, 0.02, runnable=7.0))
    captures[1]["hostname"] = host_b
    rows = [
        {
            "rank": r,
            "wait_caused_ms": w,
            "slow_rank": r == 0,
            "step_ms_median": 24.7,
            "last_arrival_share": s,
            "last_arrival_p_value": p,
        }
        for r, w, s, p in ((0, 2.7, 0.9, 0.004), (1, 0.2, 0.1, 1.0))
    ]
    run, why = hostload.hostload_metrics(captures, rows, {0: slow_work, 1: BALANCED})
    return run, why, rows


def test_a_run_whose_only_slow_rank_ran_the_same_work_slower_is_not_evaluated() -> None:
    run, why, rows = _run(_scaled(BALANCED, 1.4))
    assert rows[0]["same_work_slower"] is True and rows[1]["same_work_slower"] is False
    assert run["slow_ranks_same_work"] is True and run["slow_rank_cause_known"] is None
    assert "rank 0 arrived last at 90% of the matched collectives" in why["slow_rank_cause_known"]
    assert "0.0 ms per step in ops only it ran" in why["slow_rank_cause_known"]
    assert "+2.6 ms per step" in why["slow_rank_cause_known"]
    # on two hosts, or with an extra op of its own, it is the rank's: the rule decides as before
    run, why, rows = _run(_scaled(BALANCED, 1.4), host_b="node-b")
    assert rows[0]["same_work_slower"] is None and rows[0]["extra_ops_ms"] is None  # not compared
    assert run["slow_rank_cause_known"] is True and "only where all ranks share one host" in why["same_work_slower"]
    run, _, rows = _run({**_scaled(BALANCED, 1.4), "aten::mm": [4.0, 4.0, 2.0]})
    assert rows[0]["same_work_slower"] is False and run["slow_ranks_same_work"] is False


def test_the_rule_is_not_evaluated_with_the_numbers_or_fires_as_before() -> None:
    from test_hostload import _four_ranks

    from ddpdoctor.diagnosis import evaluate, load_rules

    doubt = _four_ranks(same_work_slower=True)
    doubt.run = {
        **doubt.run,
        "slow_ranks_same_work": True,
        "slow_rank_cause_known": None,
        "not_measured": {**doubt.run.get("not_measured", {}), "slow_rank_cause_known": "rank 2 ... 3.5 runnable"},
    }
    result = evaluate(load_rules(), doubt)
    assert "rank-straggler" not in {f.name for f in result.findings}
    reason = {n.name: n.reason for n in result.not_evaluated}["rank-straggler"]
    assert "rank 2 ... 3.5 runnable" in reason
    plain = _four_ranks(same_work_slower=False)
    plain.run = {**plain.run, "slow_ranks_same_work": False, "slow_rank_cause_known": True}
    assert {f.name: f.ranks for f in evaluate(load_rules(), plain).findings}["rank-straggler"] == (2,)


def _op(name: str, ts: float, dur: float, tid: int = 7) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def test_op_work_counts_the_training_threads_ops_per_step_top_level_and_nested(tmp_path) -> None:
    from ddpdoctor.load import load
    from ddpdoctor.metrics.summary import summarize_rank

    events = []
    for step in range(2):
        t0 = 1000.0 * step
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step}",
                "pid": 1,
                "tid": 7,
                "ts": t0,
                "dur": 900.0,
            }
        )
        events += [
            _op("aten::linear", t0 + 10, 100.0),  # top level, with two ops inside
            _op("aten::t", t0 + 20, 5.0),
            _op("aten::addmm", t0 + 30, 60.0),
            _op("aten::add_", t0 + 200, 10.0),
            _op("c10d::allreduce_", t0 + 300, 400.0),  # a collective: waiting, left out
            _op("aten::mm", t0 + 100, 50.0, tid=8),  # another thread: not the training loop's
        ]
    events.append(_op("aten::mm", 950.0, 20.0))  # between the steps
    trace = {"traceEvents": events, "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 1}}
    (tmp_path / "rank0.pt.trace.json").write_text(json.dumps(trace))
    run = load(tmp_path)
    work = summarize_rank(run.ranks[0])["op_work"]
    assert work == {
        "aten::linear": [1.0, 1.0, pytest.approx(0.1)],
        "aten::t": [1.0, 0.0, 0.0],
        "aten::addmm": [1.0, 0.0, 0.0],
        "aten::add_": [1.0, 1.0, pytest.approx(0.01)],
    }


# A balanced tensor-parallel job on a busy host (a real run, rank 0 late): its extra CPU time (8.2 ms a step) and
# run-queue wait (4.3 ms) left 5.6 ms of the others' 18.2 ms wait unexplained, but both ranks were blocked outside
# the collectives alike (6.4 and 6.6 ms a step): none of it was rank 0's own.
TP_LATE = dict(
    lateness_ms=18.16,
    extra_ops_ms=0.0,
    ops_slower_ms=9.97,
    cpu_excess_ms=8.19,
    wait_excess_ms=4.33,
    step_ms=66.8,
    runnable_per_cpu=1.6,
    ops_share=0.75,
)


def test_lateness_the_rank_was_not_blocked_for_is_not_its_own() -> None:
    assert _verdict(**TP_LATE) is False  # what the CPU time and wait leave: 5.6 ms, "its own"
    assert _verdict(**TP_LATE, idle_excess_ms=-0.2) is True
    # a rank that sleeps 5 ms a step on the busy host, its ops slowed by preemption: blocked 5 ms more, its own
    sleeper = dict(lateness_ms=8.0, cpu_excess_ms=1.0, wait_excess_ms=2.0, ops_slower_ms=2.0, ops_share=0.6)
    assert _verdict(**sleeper, idle_excess_ms=5.0) is False
    assert _verdict(**sleeper, idle_excess_ms=0.5) is True


def test_blocked_time_outside_the_collectives_comes_from_the_windows_and_the_waits() -> None:
    # 10 steps; rank 0: 41.0 ms on a CPU, 24.8 waiting for one, 73.6 of wall time a step (blocked 7.8 ms, 1.4 of it
    # in collectives); rank 1: 32.8, 20.5, 78.1 (blocked 24.8 ms, 18.3 in collectives)
    captures = _captures(
        _window(0.410, 0.248, wall_s=0.736, runnable=3.2), _window(0.328, 0.205, wall_s=0.781, runnable=3.2)
    )

    def rows(waits: bool) -> list[dict]:
        return [
            {
                "rank": r,
                "wait_caused_ms": w,
                "slow_rank": r == 0,
                "step_ms_median": 66.8,
                "last_arrival_share": s,
                "last_arrival_p_value": p,
                **({"collective_wait_ms": c} if waits else {}),
            }
            for r, w, c, s, p in ((0, 18.16, 1.36, 0.87, 0.007), (1, 0.67, 18.3, 0.13, 1.0))
        ]

    with_waits = rows(True)
    run, why = hostload.hostload_metrics(captures, with_waits, {0: _scaled(BALANCED, 1.4), 1: BALANCED})
    assert [r["loop_blocked_ms"] for r in with_waits] == pytest.approx([7.8, 24.8])
    assert with_waits[0]["same_work_slower"] is True and run["slow_rank_cause_known"] is None
    assert (
        "blocked or asleep outside the collectives 6.4 ms per step, the others 6.5 ms" in why["slow_rank_cause_known"]
    )
    without = rows(False)  # the waits unknown: the CPU time and wait alone decide, as before
    run, _ = hostload.hostload_metrics(captures, without, {0: _scaled(BALANCED, 1.4), 1: BALANCED})
    assert without[0]["same_work_slower"] is False and run["slow_rank_cause_known"] is True


def test_a_starved_ranks_own_lateness_is_what_it_worked_or_blocked_beyond_the_others() -> None:
    # a balanced tensor-parallel run on a busy host (10 steps here): rank 0 20.4 ms late, 12.9 ms of it more
    # run-queue wait; it had less CPU time than rank 1 (31.0 against 32.8 ms a step) and was blocked outside the
    # collectives 6.4 ms a step against rank 1's 4.9 ms. The lateness less the wait left 7.5 ms "of its own" (a
    # straggler); the scheduler's measure leaves 1.5 ms: it is starved.
    captures = _captures(
        _window(0.310, 0.333, wall_s=0.718, runnable=3.3), _window(0.328, 0.205, wall_s=0.786, runnable=3.3)
    )

    def rows(waits: bool, sleep_ms: float = 0.0) -> list[dict]:
        return [
            {"rank": r, "wait_caused_ms": w, "slow_rank": r == 0, "step_ms_median": 65.0}
            | ({"collective_wait_ms": c} if waits else {})
            for r, w, c in ((0, 20.37 + sleep_ms, 1.10), (1, 0.77, 20.37 + sleep_ms))
        ]

    measured = rows(True)
    hostload.hostload_metrics(captures, measured)
    assert measured[0]["cpu_starved"] is True
    assert measured[0]["late_own_ms"] == pytest.approx((7.5 - 1.10) - (25.3 - 20.37), abs=0.01)
    unknown = rows(False)  # no collective waits: the lateness less the wait, as before
    hostload.hostload_metrics(captures, unknown)
    assert unknown[0]["late_own_ms"] == pytest.approx(20.37 - 12.8, abs=0.01)
    # the same rank sleeping 10 ms a step more: 10 ms more blocked, and it is its own
    sleeper = _captures(
        _window(0.310, 0.333, wall_s=0.818, runnable=3.3), _window(0.328, 0.205, wall_s=0.886, runnable=3.3)
    )
    slept = rows(True, sleep_ms=10.0)
    hostload.hostload_metrics(sleeper, slept)
    assert slept[0]["late_own_ms"] == pytest.approx((17.5 - 1.10) - (35.3 - 30.37), abs=0.01)


def test_an_unknown_collective_wait_leaves_the_old_measure() -> None:
    captures = _captures(
        _window(0.310, 0.333, wall_s=0.718, runnable=3.3), _window(0.328, 0.205, wall_s=0.786, runnable=3.3)
    )
    rows = [
        {"rank": 0, "wait_caused_ms": 20.37, "slow_rank": True, "step_ms_median": 65.0, "collective_wait_ms": math.nan},
        {"rank": 1, "wait_caused_ms": 0.77, "slow_rank": False, "step_ms_median": 65.0, "collective_wait_ms": 20.37},
    ]
    hostload.hostload_metrics(captures, rows)
    assert rows[0]["late_own_ms"] == pytest.approx(20.37 - 12.8, abs=0.01)
