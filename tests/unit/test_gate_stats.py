"""The noise test: a bootstrap interval of the change of a statistic between two runs' per-step samples."""

from __future__ import annotations

import numpy as np
import pytest

from ddpdoctor.compare.stats import MIN_SAMPLES, change_interval


def _steps(median_ms: float, n: int = 25, seed: int = 1) -> np.ndarray:
    # step times of a noisy runner: a floor plus right-skewed jitter (occasional slow steps)
    rng = np.random.default_rng(seed)
    return median_ms + rng.gamma(2.0, 0.8, n)


def test_same_distribution_is_noise():
    interval = change_interval(_steps(30, seed=1), _steps(30, seed=2), "median", relative=True)
    assert interval is not None and interval.low < 0 < interval.high
    assert not interval.excludes_zero()


def test_real_slowdown_is_not_noise():
    interval = change_interval(_steps(30, seed=1), _steps(70, seed=2), "median", relative=True)
    assert interval is not None and interval.excludes_zero()
    assert 1.0 < interval.low < interval.high < 1.7  # about +130 %


def test_absolute_change_is_in_the_samples_unit():
    interval = change_interval(_steps(30, seed=1), _steps(35, seed=2), "mean", relative=False)
    assert interval is not None and 3.5 < interval.low < 5 < interval.high < 6.5


def test_p90_statistic():
    base = _steps(30, seed=3)
    slow_tail = np.concatenate([_steps(30, n=20, seed=4), np.full(6, 80.0)])
    interval = change_interval(base, slow_tail, "p90", relative=True)
    assert interval is not None and interval.excludes_zero()


def test_deterministic():
    a, b = _steps(30, seed=5), _steps(31, seed=6)
    assert change_interval(a, b, "median", relative=True) == change_interval(a, b, "median", relative=True)


def test_too_few_samples_gives_no_interval():
    assert change_interval([1.0] * (MIN_SAMPLES - 1), [2.0] * 10, "median", relative=True) is None


def test_constant_samples():
    interval = change_interval([2.0] * 8, [3.0] * 8, "mean", relative=False)
    assert interval is not None and interval.low == interval.high == pytest.approx(1.0)


def test_relative_change_from_zero_has_no_interval():
    assert change_interval([0.0] * 8, [1.0, 2.0] * 4, "median", relative=True) is None
