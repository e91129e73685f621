"""Slow ranks: "arrives last" judged against chance (1/k) with a binomial test over the matched collectives."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from ddpdoctor.metrics.slow_ranks import SLOW_RANK_ALPHA, binomial_sf, slow_ranks


def _collectives(
    last: list[int],
    world: int,
    wait_us: float = 1000.0,
    per_step: int = 10,
    overlapping: bool = False,
    lateness_us: list[float] | None = None,
) -> pd.DataFrame:
    """One row per rank and collective; ``last[i]`` is the rank that arrives last at collective i (the others
    wait ``wait_us`` for it). Each collective ends before the next one starts (synchronous collectives: each
    one's lateness is its own), or, ``overlapping``, the collectives of a step are all in flight together (DDP's
    bucket all-reduces: one step's lateness is shared by all of them). ``lateness_us``: how late the last rank
    is, per step (default 5 us)."""
    rows = []
    for i, late in enumerate(last):
        step = i // per_step
        lag = lateness_us[step] if lateness_us is not None else 5.0
        base = 10_000.0 * (step * per_step if overlapping else i) + (i % per_step if overlapping else 0)
        for r in range(world):
            start = base + (lag if r == late else 0.01 * r)
            rows.append(
                {
                    "step": step,
                    "kind": "all_reduce",
                    "index": i % per_step,
                    "rank": r,
                    "start_us": start,
                    "end_us": base + (10_000.0 * per_step - 1 if overlapping else 9_000.0),
                    "aligned_start": start,
                    "wait_us": 0.0 if r == late else wait_us,
                }
            )
    return pd.DataFrame(rows)


@pytest.mark.parametrize(("x", "n", "p"), [(0, 10, 0.5), (8, 10, 0.5), (32, 84, 0.125), (84, 84, 0.125), (3, 3, 0.5)])
def test_binomial_tail_matches_scipy(x: int, n: int, p: float) -> None:
    assert binomial_sf(x, n, p) == pytest.approx(scipy.stats.binom.sf(x - 1, n, p), rel=1e-9, abs=1e-300)


def test_two_slow_ranks_of_eight_are_both_named() -> None:
    # the Megatron shape: 84 collectives, ranks 0 and 6 last at 32 and 34, the rest spread over the others
    rng = np.random.default_rng(0)
    last = [0] * 32 + [6] * 34 + list(rng.choice([1, 2, 3, 4, 5, 7], size=18))
    rng.shuffle(last)
    out = slow_ranks(_collectives(last, 8), list(range(8)))
    assert out["undecidable"] is None and out["count"] == 2
    assert [r for r, v in out["ranks"].items() if v["slow_rank"]] == [0, 6]
    assert out["ranks"][0]["last_arrival_share"] == pytest.approx(32 / 84)
    # (< 1e-9 counting the blocks as independent; a shuffled order's lag-1 autocorrelation is a little above zero
    # by chance, and the test weighs it)
    assert out["ranks"][6]["last_arrival_p_value"] < 1e-8
    # the wait each costs the others: 1 ms per collective it was last at, over 9 steps
    assert out["ranks"][6]["wait_caused_ms"] == pytest.approx(34 * 1.0 / 9)


def test_one_straggler_of_eight_is_named_alone() -> None:
    rng = np.random.default_rng(1)
    last = [3 if rng.random() < 0.6 else int(rng.integers(0, 8)) for _ in range(60)]
    out = slow_ranks(_collectives(last, 8), list(range(8)))
    assert [r for r, v in out["ranks"].items() if v["slow_rank"]] == [3]


def test_two_ranks_last_at_8_of_10_is_scheduling_noise_not_a_straggler() -> None:
    # a healthy 2-rank run on a busy host: being last is a coin flip, 8 of 10 happens with p = 0.055
    out = slow_ranks(_collectives([1, 1, 0, 1, 1, 1, 0, 1, 1, 1], 2), [0, 1])
    assert out["undecidable"] is None
    # binomial P(X >= 8) = 56/1024, doubled for the two tests (how often, at what cost)
    assert out["ranks"][1]["last_arrival_p_value"] == pytest.approx(2 * 56 / 1024)
    assert out["count"] == 0 and not out["ranks"][1]["slow_rank"]


def test_one_step_window_cannot_decide() -> None:
    out = slow_ranks(_collectives([1, 1], 2, per_step=2), [0, 1])
    assert out["count"] is None and all(v["slow_rank"] is None for v in out["ranks"].values())
    assert "2 collective(s)" in out["undecidable"] and "1 analysed step" in out["undecidable"]
    assert "--active" in out["undecidable"]


def _pairs(late_of: list[int], lag_ms: dict[int, float], per_step: int) -> pd.DataFrame:
    """Two ranks, synchronous collectives, ``per_step`` of them a step; ``late_of[i]`` arrives last at collective
    i by ``lag_ms[late]`` and the other waits that long."""
    rows = []
    for i, late in enumerate(late_of):
        lag = lag_ms[late]
        for r in (0, 1):
            start = 10_000.0 * i + (lag * 1000 if r == late else 0.0)
            rows.append(
                {
                    "step": i // per_step,
                    "kind": "all_reduce",
                    "index": i % per_step,
                    "rank": r,
                    "start_us": start,
                    "end_us": 10_000.0 * i + 9_000.0,
                    "aligned_start": start,
                    "wait_us": 0.0 if r == late else lag * 1000,
                }
            )
    return pd.DataFrame(rows)


def test_a_rarely_last_rank_that_costs_the_others_a_lot_is_slow() -> None:
    # a pair where rank 0 is last barely more than half the time, but by milliseconds, and rank 1 by microseconds;
    # rank 0 is late at the same run of collectives in every step (its slower phase): a pattern of its own
    late = [0 if i % 14 < 8 else 1 for i in range(84)]  # 48 of 84, 6 steps
    out = slow_ranks(_pairs(late, {0: 5.0, 1: 0.005}, per_step=14), [0, 1])
    assert out["ranks"][0]["slow_rank"] and not out["ranks"][1]["slow_rank"]


def test_runs_of_lateness_that_move_from_step_to_step_are_the_hosts_not_a_slow_rank() -> None:
    # A balanced job on a shared host: whichever rank shares its CPU with another process is late at every
    # collective for a while, then the other one is (a balanced FSDP2 job here: one rank last at 16-19 collectives
    # in a row, then the other). Runs of 2-19 collectives at different places in each step; rank 1 last at 56
    # of 85 (66%), each time by as much as rank 0 when it is last.
    runs = [(1, 19), (0, 2), (0, 6), (1, 4), (0, 3), (1, 10), (0, 4), (1, 15), (0, 2), (1, 4), (1, 10), (0, 3)]
    late = [r for r, n in runs for _ in range(n)][:85]
    assert len(late) == 82 and sum(late) == 62  # the runs as written
    late += [0, 1, 0]
    n_late = sum(late)
    out = slow_ranks(_pairs(late, {0: 1.0, 1: 1.0}, per_step=17), [0, 1])
    assert out["undecidable"] is None
    assert out["ranks"][1]["last_arrival_share"] == pytest.approx(n_late / 85)
    # counted as 85 independent trials, 63 of 85 is p ~ 1e-5: the runs are what make it look significant
    assert binomial_sf(n_late, 85, 0.5) < 1e-4
    assert out["count"] == 0 and not out["ranks"][1]["slow_rank"]


def test_a_steady_straggler_keeps_its_strength_when_blocks_are_many() -> None:
    # last at 85% of the collectives, its 15% misses scattered: no runs, no pattern taken out, full strength
    rng = np.random.default_rng(3)
    late = [1 if rng.random() < 0.85 else 0 for _ in range(85)]
    out = slow_ranks(_pairs(late, {0: 1.0, 1: 1.0}, per_step=17), [0, 1])
    assert out["ranks"][1]["slow_rank"]
    assert out["ranks"][1]["last_arrival_p_value"] < 1e-6


def lag_of(late: int) -> float:
    return 5000.0 if late == 0 else 5.0


def test_one_long_stall_is_not_a_slow_rank() -> None:
    # rank 1 descheduled once for 200 ms, otherwise a coin flip who is last
    last = [0, 1] * 10
    frame = _collectives(last, 2, wait_us=100.0)
    frame.loc[(frame["index"] == 3) & (frame["step"] == 0) & (frame["rank"] == 0), "wait_us"] = 200_000.0
    out = slow_ranks(frame, [0, 1])
    assert out["count"] == 0


def test_noise_alone_rarely_names_a_slow_rank() -> None:
    # 200 healthy 8-rank runs of 100 collectives with a random last rank: the family-wise rate is about alpha
    named = 0
    for seed in range(200):
        last = list(np.random.default_rng(seed).integers(0, 8, size=100))
        named += bool(slow_ranks(_collectives(last, 8), list(range(8)))["count"])
    assert named <= 200 * SLOW_RANK_ALPHA * 2


def test_collectives_of_one_step_count_once_not_once_each() -> None:
    # issue 25: a balanced 2-rank job, 5 steps of 2 bucket all-reduces in flight together; rank 1 happened to be
    # last in every step (a coin flip per step: 5 of 5 is p = 1/32), by a lateness that varies from step to step
    lateness = [900.0, 7000.0, 2500.0, 15000.0, 400.0]
    out = slow_ranks(_collectives([1] * 10, 2, per_step=2, overlapping=True, lateness_us=lateness), [0, 1])
    assert out["ranks"][1]["last_arrival_share"] == 1.0
    assert out["ranks"][1]["last_arrival_p_value"] > 0.05  # was 2 * 2**-10 = 0.002: ten "independent" trials
    assert not out["ranks"][1]["slow_rank"] and out["count"] in (0, None)


def test_static_graph_buckets_sharing_the_last_rank_are_five_observations_not_35() -> None:
    # issue 25: 7 bucket all-reduces per step, the same rank last in all of a step's: rank 0 in 4 of 5 steps
    last = [r for r in (0, 0, 0, 0, 1) for _ in range(7)]
    lateness = [3000.0, 800.0, 5000.0, 1200.0, 2000.0]
    out = slow_ranks(_collectives(last, 2, per_step=7, overlapping=True, lateness_us=lateness), [0, 1])
    assert out["count"] in (0, None) and not any(v["slow_rank"] for v in out["ranks"].values())


def test_a_rank_late_by_the_same_60_ms_in_each_of_4_steps_cannot_be_told_from_a_starved_one() -> None:
    # the recorded straggler sample's shape (4 steps, 2 overlapping all-reduces each): 4 observations of a coin
    # flip cannot reach significance, and a steady lateness is what a rank starved by a busy host shows too
    lateness = [60_200.0, 59_100.0, 60_900.0, 58_700.0]
    out = slow_ranks(
        _collectives([1] * 8, 2, wait_us=60_000.0, per_step=2, overlapping=True, lateness_us=lateness), [0, 1]
    )
    assert out["count"] is None and out["blocks"] == 4 and "4 independent block(s)" in out["undecidable"]


def test_eight_steps_of_a_rank_last_in_each_name_it() -> None:
    out = slow_ranks(_collectives([1] * 16, 2, wait_us=60_000.0, per_step=2, overlapping=True), [0, 1])
    assert out["blocks"] == 8 and out["ranks"][1]["slow_rank"] and not out["ranks"][0]["slow_rank"]


# each rank's time outside the model's phases in 5 analysed steps: rank 0 runs 20 ms of its own code in each
_OUTSIDE = {0: dict.fromkeys(range(8, 13), 20.4), 1: dict.fromkeys(range(8, 13), 0.4)}


def _rows(**rank0) -> tuple[list[dict], dict]:
    """Rank 0 of two, late by work of its own (ops only it runs), no rank named by the arrival tests."""
    base = {"ddp_ranges": True, "p2p_per_step": 0.0, "tp_collectives_per_step": 0.0, "slow_rank": None}
    r0 = {**base, "rank": 0, "wait_caused_ms": 40.0, "last_arrival_share": 0.8, "extra_ops_ms": 20.0, **rank0}
    r1 = {**base, "rank": 1, "wait_caused_ms": 0.5, "last_arrival_share": 0.2, "extra_ops_ms": 0.0}
    run = {"straggler_rank": 0, "slow_ranks_same_work": False, "not_measured": {"slow_rank": "too few blocks"}}
    return [r0, r1], run


def test_a_rank_late_by_work_only_it_does_is_slow() -> None:
    from ddpdoctor.metrics.slow_ranks import slow_by_own_work

    rows, run = _rows()
    assert slow_by_own_work(rows, run, _OUTSIDE.get) == [0]
    assert [r["slow_rank"] for r in rows] == [True, False]
    assert [r["slow_rank_by_own_work"] for r in rows] == [True, False]
    assert run["slow_rank_count"] == 1 and "slow_rank" not in run["not_measured"]


@pytest.mark.parametrize(
    "change",
    [
        {"extra_ops_ms": 0.0},  # the same ops as the other: a balanced job on a busy host
        {"extra_ops_ms": 5.0},  # under 20% of the 40 ms it makes the others wait
        {"extra_ops_ms": 1.5, "wait_caused_ms": 3.0},  # 2 ms or less
        {"last_arrival_share": 0.5},  # last no more often than chance
        {"p2p_per_step": 4.0},  # a pipeline: its stages differ by design
        {"tp_collectives_per_step": 6.0},  # tensor parallelism
        {"ddp_ranges": False},  # no DDP (FSDP, a plain trace without DDP's ranges)
        {"same_work_slower": True},  # the same work, slower on the shared host
        {"slow_rank": True},  # named by the arrival tests already: nothing to add
    ],
)
def test_nothing_else_makes_a_rank_slow_by_its_work(change) -> None:
    from ddpdoctor.metrics.slow_ranks import slow_by_own_work

    rows, run = _rows(**change)
    before = [dict(r) for r in rows]
    assert slow_by_own_work(rows, run, _OUTSIDE.get) == []
    assert rows == before


def test_work_the_others_do_too_or_a_shared_wait_do_not_set_a_rank_apart() -> None:
    from ddpdoctor.metrics.slow_ranks import slow_by_own_work

    rows, run = _rows()
    rows[1]["extra_ops_ms"] = 5.0  # the other rank runs ops of its own too (a quarter of rank 0's)
    assert slow_by_own_work(rows, run, _OUTSIDE.get) == []
    rows, run = _rows()
    rows[1]["wait_caused_ms"] = 15.0  # rank 0 causes 73% of the waiting, under 80%
    assert slow_by_own_work(rows, run, _OUTSIDE.get) == []
    rows, run = _rows()
    run["straggler_rank"] = 1  # not the rank the others wait for most
    assert slow_by_own_work(rows, run, _OUTSIDE.get) == []
    rows, run = _rows()
    assert slow_by_own_work(rows, run) == []  # no time by step outside the model: not decided by work


def test_more_of_the_models_own_ops_or_work_that_alternates_is_the_data_not_the_rank() -> None:
    """Data-dependent work (a block applied a data-dependent number of times; a loss term per object) gives one
    rank more ops than the other in a few steps by chance: inside the model's phases, or outside them but taking
    turns between the ranks. Neither is work of the rank's own."""
    from ddpdoctor.metrics.slow_ranks import slow_by_own_work

    rows, run = _rows()
    inside = {0: dict.fromkeys(range(8, 13), 0.4), 1: dict.fromkeys(range(8, 13), 0.4)}  # same time outside
    assert slow_by_own_work(rows, run, inside.get) == []
    taking_turns = {0: {8: 40.0, 9: 40.0, 10: 40.0, 11: 0.4, 12: 0.4}, 1: {8: 0.4, 9: 0.4, 10: 0.4, 11: 0.4, 12: 9.0}}
    rows, run = _rows()
    assert slow_by_own_work(rows, run, taking_turns.get) == []  # rank 1 outdid rank 0 by 8.6 ms at step 12
    every_other = {0: {8: 40.0, 9: 0.4, 10: 40.0, 11: 0.4, 12: 40.0}, 1: dict.fromkeys(range(8, 13), 0.5)}
    rows, run = _rows()
    assert slow_by_own_work(rows, run, every_other.get) == [0]  # evaluation every other step: its own
    # post-processing every rank does, its amount varying with the data, fell on rank 0 in all 5 steps by chance:
    # rank 1's own time there varies by 14 ms from step to step, more than half rank 0's 24 ms excess
    by_chance = {0: {8: 30.0, 9: 26.0, 10: 35.0, 11: 28.0, 12: 33.0}, 1: {8: 2.0, 9: 16.0, 10: 6.0, 11: 3.0, 12: 5.0}}
    rows, run = _rows()
    assert slow_by_own_work(rows, run, by_chance.get) == []
