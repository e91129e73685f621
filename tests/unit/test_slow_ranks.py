"""Slow ranks: "arrives last" judged against chance (1/k) with a binomial test over the matched collectives."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from ddpdoctor.metrics.slow_ranks import SLOW_RANK_ALPHA, binomial_sf, slow_ranks


def _collectives(last: list[int], world: int, wait_us: float = 1000.0, per_step: int = 10) -> pd.DataFrame:
    """One row per rank and collective; ``last[i]`` is the rank that arrives last at collective i (the others
    wait ``wait_us`` for it)."""
    rows = []
    for i, late in enumerate(last):
        for r in range(world):
            rows.append(
                {
                    "step": i // per_step,
                    "kind": "all_reduce",
                    "index": i % per_step,
                    "rank": r,
                    "start_us": 10_000.0 * i + (5.0 if r == late else 0.01 * r),
                    "aligned_start": 10_000.0 * i + (5.0 if r == late else 0.01 * r),
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
    assert out["ranks"][6]["last_arrival_p_value"] < 1e-9
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


def test_a_rarely_last_rank_that_costs_the_others_a_lot_is_slow() -> None:
    # a pair where rank 0 is last barely more than half the time, but by milliseconds, and rank 1 by microseconds
    rows = []
    for i in range(84):
        late = 0 if i % 16 < 9 else 1  # 47 of 84
        for r in (0, 1):
            lag = (5.0 if late == 0 else 0.005) if r == late else 0.0
            rows.append(
                {
                    "step": 0,
                    "kind": "all_reduce",
                    "index": i,
                    "rank": r,
                    "start_us": 10_000.0 * i + lag * 1000,
                    "aligned_start": 10_000.0 * i + lag * 1000,
                    "wait_us": 0.0 if r == late else lag_of(late),
                }
            )
    out = slow_ranks(pd.DataFrame(rows), [0, 1])
    assert out["ranks"][0]["slow_rank"] and not out["ranks"][1]["slow_rank"]


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
