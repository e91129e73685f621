"""The always-on series' arrivals (issue 28 item 1, issue 25 item 5): which DDP rank reached its backward last,
step after step, and since when; nothing said of a balanced job, however noisy, nor of a job that is not DDP."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from ddpdoctor.metrics import arrivals

DDP = {"ddp": [{"module": "DistributedDataParallel"}]}


def _series(arrive_ms, steps=200, world=2, step_ms=60.0, cpu=None):
    """``arrive_ms(rank, step)``: the rank's data + forward time (ms) in that step; optimizer 2 ms, backward the
    rest of the step."""
    out = {}
    for rank in range(world):
        rows = []
        for step in range(steps):
            a = arrive_ms(rank, step)
            rows.append(
                {
                    "step": step,
                    "t": 1_800_000_000.0 + step * step_ms / 1000,
                    "wall_s": step_ms / 1000,
                    "data_s": a / 2000,
                    "forward_s": a / 2000,
                    "backward_s": max(step_ms - a - 2.0, 0.0) / 1000,
                    "optimizer_s": 0.002,
                    "cpu_s": (cpu(rank, step) if cpu else step_ms) / 1000,
                }
            )
        out[rank] = SimpleNamespace(rows=rows, header={})
    return out


def _run(series, captures=None):
    world = len(series)
    caps = captures if captures is not None else dict.fromkeys(range(world), {**DDP, "steps": {"first": 0}})
    return arrivals.arrivals(series, caps)


def test_a_straggler_from_halfway_is_named_with_the_step_it_began():
    rng = random.Random(1)
    got = _run(_series(lambda r, s: 10 + rng.uniform(0, 2) + (30 if r == 1 and s >= 100 else 0)))
    assert got["evaluated"] and got["ranks"] == [1] and got["pattern"] == "started", got
    (stretch,) = got["stretches"]
    assert stretch["first"] == 100 and stretch["last"] == 199 and stretch["late"] == 100
    assert stretch["late_ms"] == pytest.approx(30, abs=2)
    assert got["p_value"] < arrivals.ARRIVAL_ALPHA
    assert "rank 1 in 100 of 100 steps since step 100" in got["text"] and "before, no rank" in got["text"]


def test_a_rank_that_does_more_work_and_one_that_waits_are_told_apart():
    rng = random.Random(2)
    work = _run(
        _series(
            lambda r, s: 10 + rng.uniform(0, 2) + (30 if r == 0 else 0), cpu=lambda r, s: 60 + (30 if r == 0 else 0)
        )
    )
    assert work["pattern"] == "throughout" and "more work on that rank" in work["text"], work["text"]
    wait = _run(_series(lambda r, s: 10 + rng.uniform(0, 2) + (30 if r == 0 else 0), cpu=lambda r, s: 40))
    assert "it waited for something rather than working more" in wait["text"], wait["text"]


def test_a_straggler_that_moves_between_ranks_is_said_to_move():
    rng = random.Random(3)
    got = _run(_series(lambda r, s: 10 + rng.uniform(0, 2) + (30 if r == (s // 50) % 2 else 0)))
    assert got["pattern"] == "moved" and got["ranks"] == [0, 1], got
    assert [(x["rank"], x["first"]) for x in got["stretches"]] == [
        (0, 2),
        (1, 50),
        (0, 100),
        (1, 150),
    ]  # step 1 has no step before it in the analysis
    assert "not at a node" in got["text"]


def _hiccups(rng, steps, world, rate, max_len, ms):
    """Hiccups on a random rank: from ``rate`` of the steps, 1 to ``max_len`` steps long, ``ms()`` late each."""
    out: dict[tuple[int, int], float] = {}
    for step in range(steps):
        if rng.random() < rate:
            rank, length, late = rng.randrange(world), rng.randint(1, max_len), ms()
            for k in range(length):
                out[(rank, step + k)] = late
    return out


def _named_in_null_jobs(seeds, steps, world, rate, max_len, ms, base, step_ms=60.0):
    """The texts of the null jobs (balanced, jitter from ``base(rng)``, hiccups) in which a rank was named."""
    named = []
    for seed in range(seeds):
        rng = random.Random(seed)
        h = _hiccups(rng, steps, world, rate, max_len, lambda rng=rng: ms(rng))
        got = _run(
            _series(
                lambda r, s, rng=rng, h=h: base(rng) + h.get((r, s), 0.0), steps=steps, world=world, step_ms=step_ms
            )
        )
        assert got["evaluated"], got
        if got.get("ranks"):
            named.append((seed, got["text"]))
    return named


@pytest.mark.parametrize("world", [2, 4, 8])
def test_balanced_jobs_with_hiccups_name_no_rank(world):
    """Noisy balanced jobs: jitter, and hiccups of up to 4 steps on a random rank (a rank off its CPU for a while,
    as on a busy host) in 10% of the steps; 30 seeds each, none may name a rank."""
    named = _named_in_null_jobs(
        30, 400, world, 0.10, 4, lambda rng: rng.uniform(10, 60), lambda rng: 10 + rng.expovariate(1 / 3)
    )
    assert not named, named


def test_not_evaluated_without_ddp_or_with_too_few_steps():
    rng = random.Random(4)
    series = _series(lambda r, s: 10 + rng.uniform(0, 2) + (30 if r == 1 else 0))
    fsdp = _run(series, captures={0: {"ddp": []}, 1: {"ddp": []}})
    assert not fsdp["evaluated"]
    assert not fsdp["evaluated"] and "DistributedDataParallel" in fsdp["reason"]
    short = _run(_series(lambda r, s: 10 + (30 if r == 1 else 0), steps=15))
    assert not short["evaluated"] and "20 are needed" in short["reason"]
    one = arrivals.arrivals({0: series[0]}, {0: DDP})
    assert not one["evaluated"]


def test_the_profilers_start_and_export_steps_are_left_out_the_windows_steps_kept():
    caps = {r: {**DDP, "steps": {"first": 1, "profiled": [[10, 14]]}, "schedule": {"warmup": 1}} for r in (0, 1)}
    assert arrivals.arrival_skipped(caps) == {1, 8, 9, 14, 15, 16}
    rng = random.Random(5)
    # rank 0 writes a bigger trace: late after the window's end only; nothing else
    series = _series(lambda r, s: 10 + rng.uniform(0, 2) + (80 if r == 0 and s in (15, 16) else 0), steps=60)
    got = arrivals.arrivals(series, caps)
    # steps 0-59 but 0, the 6 skipped and the 3 whose step before was skipped (2, 10, 17)
    assert got["evaluated"] and got["steps"] == 50 and not got.get("ranks"), got


def test_long_hiccups_of_a_fast_job_name_no_rank():
    """10 ms steps and hiccups of up to 150 ms (15 steps) on a random rank: steps 200 ms apart are compared."""
    assert _run(_series(lambda r, s: 2.0, steps=100, step_ms=10))["lag_steps"] == 20  # 0.2 s of 10 ms steps
    named = _named_in_null_jobs(20, 1000, 2, 0.03, 15, lambda rng: 8.0, lambda rng: 2 + rng.uniform(0, 0.3), 10)
    assert not named, named


def test_a_long_run_is_decided_without_overflow():
    """5,000 steps (the binomial tail of thousands of trials: an exact sum of huge integers overflowed a float)."""
    rng = random.Random(6)
    got = _run(_series(lambda r, s: 10 + rng.uniform(0, 2) + (30 if r == 1 and s >= 4000 else 0), steps=5000))
    assert got["ranks"] == [1] and got["pattern"] == "started" and got["stretches"][0]["first"] == 4000, got
    quiet = _run(_series(lambda r, s: 10 + rng.uniform(0, 2), steps=5000))
    assert not quiet.get("ranks") and "no rank shown to keep arriving last" in quiet["text"], quiet
    assert quiet["late_steps"] == 0 and "in none of 4998 steps did a rank reach its backward" in quiet["text"]
    # no late step: the text says so and stops (no "0 of 0" counts of the tests that had nothing to test)
    assert "0 of 0" not in quiet["text"] and "p =" not in quiet["text"]


def test_a_rank_late_every_few_steps_is_named():
    rng = random.Random(7)
    every3 = _run(_series(lambda r, s: 10 + rng.uniform(0, 2) + (30 if r == 1 and s % 3 == 0 else 0), steps=400))
    assert every3["ranks"] == [1] and every3["pattern"] == "throughout", every3  # gaps of 2 steps are bridged
    every5 = _run(_series(lambda r, s: 10 + rng.uniform(0, 2) + (30 if r == 1 and s % 5 == 0 else 0), steps=400))
    assert every5["ranks"] == [1] and every5["pattern"] == "intermittent" and "on and off" in every5["text"], every5


@pytest.mark.parametrize("period", [2, 4, 8])
def test_a_rank_late_every_even_number_of_steps_is_named_whatever_its_phase(period):
    """Evaluation or logging every N steps, N even: at steps 4 apart (this job's lag) the late steps fall in one
    phase of the 4. Counted from the first step only, 3 phases of 4 named no rank though every late step was rank
    1's ("no rank shown to keep arriving last (p = 1)", 100 of 398 steps late)."""
    for phase in range(period):
        rng = random.Random(8 + phase)
        got = _run(
            _series(
                lambda r, s, rng=rng, phase=phase: (
                    10 + rng.uniform(0, 2) + (30 if r == 1 and s % period == phase else 0)
                ),
                steps=400,
            )
        )
        assert got["lag_steps"] == 4
        assert got.get("ranks") == [1], (period, phase, got["text"])
        assert got["most_late_count"] == got["sampled_late_steps"] > 0, got
