"""Is a change between two runs more than noise? A bootstrap confidence interval of the change of a statistic.

``change_interval`` resamples the per-step samples of the baseline and of the current run independently
(``scipy.stats.bootstrap``, two samples, ``paired=False``, BCa, fixed seed so the same inputs always give
the same verdict) and returns the interval of ``stat(current) - stat(baseline)`` (absolute) or
``stat(current) / stat(baseline) - 1`` (relative). The change is not noise when the interval does not
contain 0.

Memory is bounded whatever the input: the resamples are drawn in batches of at most ``BATCH_ELEMENTS`` values
(scipy's ``batch``; inputs small enough to fit in one batch are resampled exactly as before), and a sample of
more than ``MAX_RESAMPLED`` values is first reduced to that many of its quantiles. That reduction widens the
interval (the bootstrap sees fewer values), so it can hide a small regression, never invent one; the runs'
samples are bounded before they get here (``samples.MAX_SAMPLES``, ``samples.MAX_POOLED``), so it only applies
to baselines written by earlier versions, which kept one sample per rank per step.

Caveat, said in the report: steps of one run are not independent draws (a slow minute slows many steps), so
the interval is somewhat narrower than the truth; the thresholds are what keeps the gate from failing on small
shifts.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
N_RESAMPLES = 4999
SEED = 20240601
MIN_SAMPLES = 5  # fewer per run: no interval (the gate then cannot call a timing change a regression)
MAX_RESAMPLED = 5000  # values of one sample the bootstrap resamples (= samples.MAX_POOLED)
BATCH_ELEMENTS = 1 << 20  # resampled values per batch (8 MB of float64; the index array is as large)
METHOD = f"bootstrap (scipy.stats.bootstrap, BCa, {N_RESAMPLES} resamples, fixed seed)"


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    confidence: float

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def _stat(name: str):  # noqa: ANN202 - a vectorised statistic for scipy
    if name == "median":
        return lambda x, axis: np.median(x, axis=axis)
    if name == "p90":
        return lambda x, axis: np.percentile(x, 90, axis=axis)
    return lambda x, axis: np.mean(x, axis=axis)


def _scipy_stats():  # noqa: ANN202
    """scipy.stats, imported when a gate needs it (it costs ~0.5 s; every other command stays fast)."""
    from scipy import stats

    return stats


def _rng_kwargs(seed: int) -> dict:
    params = inspect.signature(_scipy_stats().bootstrap).parameters
    key = "rng" if "rng" in params else "random_state"  # scipy >= 1.15 renamed it
    return {key: np.random.default_rng(seed)}


MIN_RUNS = 2  # baseline runs needed to estimate the spread between runs
# The run-to-run margin is this many times the range of the runs' values: one more run of the same job lands past
# 2x the range of 3 (from their median, in one direction) about 4% of the time per timing for normal noise, past 1x
# 12% (measured under load: 1x failed 37% of healthy reruns against three-run baselines, bench_gate_noise).
RANGE_FACTOR = 2.0
# A run is left out of the range when, with it, the range reaches all the metric can move (a blind baseline) and it
# lies this many times farther from the runs' median than the other runs span (and than the threshold): 3 runs of
# 0.50, 0.49 and 0.00 overlap are a baseline of 0.49 +- 0.02 with one wild run, not one that cannot see any change
# (CI: a one-big-bucket run at 0.002 passed as noise).
WILD_FACTOR = 3.0
MIN_RUNS_FOR_WILD = 3  # with 2 runs neither can be called the wild one


@dataclass(frozen=True)
class RunSpread:
    """How far the current run(s) may land from the baseline by run-to-run noise alone (``margin``, in the
    change's unit): ``RANGE_FACTOR`` times the range (largest minus smallest) of the baseline runs' own values of
    the metric (each run's median step, its overlap, ...), or of the current runs' when they are several and spread
    wider. With 3 runs a range is what the data can say; a t interval of their standard deviation (t = 9.9 at 2
    degrees of freedom) made one wild run blow the margin up to many times the metric's own range. The margin is
    never wider than the metric can move in its worse direction (``bound``: a ratio cannot fall below 0 nor rise
    above 1, a time cannot fall by more than 100%); a margin at that bound means the baseline cannot see any change
    of it, unless one wild run did that (``left_out``: see ``run_spread``)."""

    margin: float
    runs: int
    confidence: float = CONFIDENCE  # kept for readers of earlier versions; a range has no confidence level
    current: int = 1
    low: float | None = None  # the baseline runs' smallest and largest value (the metric's unit)
    high: float | None = None
    bounded: bool = False  # the margin reached the most the metric can move: no change of it can be detected
    # the baseline run left out of the range as wild (``wild_run``): its index among the runs, and its value
    left_out: int | None = None
    left_out_value: float | None = None
    # the range of all runs reached the bound, and the margin is the range once or the worse side's reach (run_spread)
    one_sided: bool = False


def _finite(values: Sequence[float | None]) -> np.ndarray:
    x = np.asarray([v for v in values if v is not None], dtype=float)
    return x[np.isfinite(x)]


def wild_run(values: Sequence[float | None], floor: float = 0.0, worse: str | None = None) -> int | None:
    """The index in ``values`` of the one run that lies more than ``WILD_FACTOR`` times farther from the runs'
    median than the other runs span and than ``floor`` (the metric's unit: the gate's threshold), or None (fewer
    than ``MIN_RUNS_FOR_WILD`` finite values, or no such run). ``worse`` ("up" | "down"): only a run on the
    metric's worse side of the median counts. A range is robust to a variance blown up by one run, not to the run
    itself: 0.50, 0.49, 0.00 span 0.50, all a ratio can fall from 0.49."""
    kept = [(i, float(v)) for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    if len(kept) < MIN_RUNS_FOR_WILD:
        return None
    x = np.asarray([v for _, v in kept])
    with np.errstate(all="ignore"):
        far = np.abs(x - np.median(x))
        k = int(np.argmax(far))
        core = float(np.ptp(np.delete(x, k)))
        if not (np.isfinite(far[k]) and np.isfinite(core)):
            return None
        side = x[k] - np.median(x)
        if worse is not None and (side > 0) != (worse == "up"):
            return None  # a wild good run stays in: left out, it would leave the baseline's value above the rest
        if far[k] > WILD_FACTOR * max(core, abs(floor)) and far[k] > 0:
            return kept[k][0]
    return None


def run_spread(
    values: Sequence[float | None],
    reference: float,
    *,
    relative: bool,
    confidence: float = CONFIDENCE,
    current: Sequence[float | None] = (),
    bound: float | None = None,
    floor: float = 0.0,
    worse: str | None = None,
) -> RunSpread | None:
    """The run-to-run margin from the baseline runs' ``values`` of one metric (and the ``current`` runs' values,
    when there are several); None with fewer than ``MIN_RUNS`` baseline runs or a relative change from a
    ``reference`` of 0. ``bound``: the most the metric can move in its worse direction (change's unit).
    ``floor``: the gate's threshold (change's unit); ``worse``: the metric's worse direction.

    Where twice the range reaches ``bound`` (the baseline could see no change of the metric at all), the margin
    is the range once, or ``2 * RANGE_FACTOR`` times the worst run's distance from the runs' median if that is
    wider (``one_sided``): a lucky run on the good side says little of how far a run can fall. Where that too
    reaches the bound and one run is wild on the worse side (``wild_run``, at least 3 runs), it is left out (of
    the baseline's and of the current runs' alike). Timings without a bound keep every run and twice the range:
    a slow run is what a busy machine does, and leaving it out would fail the next healthy run that lands as
    slow."""
    x, y = _finite(values), _finite(current)
    if len(x) < MIN_RUNS or (relative and reference == 0):
        return None
    floor_value = abs(floor * reference) if relative else abs(floor)

    def margin_of(skip: int | None, skip_current: int | None) -> float:
        with np.errstate(all="ignore"):  # values near the float limit: no margin (None), not a warning
            margin = float(np.ptp(_finite([v for i, v in enumerate(values) if i != skip])))
            if len(y) >= MIN_RUNS:
                margin = max(margin, float(np.ptp(_finite([v for i, v in enumerate(current) if i != skip_current]))))
            margin *= RANGE_FACTOR
            return margin / abs(reference) if relative else margin

    margin, wild, wild_value, one_sided = margin_of(None, None), None, None, False
    if bound is not None and worse is not None and np.isfinite(margin) and margin >= bound:
        # Blind to any change of the metric. A lucky run on the good side (overlaps 0.52, 0.44, 0.89) says little
        # of how far a run can fall: the range once, or twice the factor times the worse side's reach from the
        # median, if that is wider.
        with np.errstate(all="ignore"):
            reach = float(np.max(x) - np.median(x)) if worse == "up" else float(np.median(x) - np.min(x))
            sided = max(float(np.ptp(x)), 2 * RANGE_FACTOR * reach)
            if len(y) >= MIN_RUNS:
                sided = max(sided, float(np.ptp(y)))
            sided = sided / abs(reference) if relative else sided
        if np.isfinite(sided) and sided < bound:
            margin, one_sided = sided, True
        else:
            # if that is one wild run's doing (0.50, 0.49, 0.00), gate on the runs that agree
            wild, y_wild = wild_run(values, floor_value, worse), wild_run(current, floor_value, worse)
            narrower = margin_of(wild, y_wild)
            if (wild is not None or y_wild is not None) and narrower < bound:
                margin = narrower
                wild_value = None if wild is None else float(values[wild])  # type: ignore[arg-type]
            else:
                wild = None
    if not np.isfinite(margin):
        return None
    bounded = bound is not None and margin >= bound
    if bounded and bound is not None:
        margin = max(bound, 0.0)
    return RunSpread(
        margin,
        len(x),
        confidence,
        len(y) if len(y) >= MIN_RUNS else 1,
        float(np.min(x)),
        float(np.max(x)),
        bounded,
        wild,
        wild_value,
        one_sided,
    )


def change_interval(
    baseline: Sequence[float],
    current: Sequence[float],
    statistic: str,
    *,
    relative: bool,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
) -> Interval | None:
    """The ``confidence`` interval of the change of ``statistic`` ("median" | "p90" | "mean") from
    ``baseline`` to ``current`` (relative: a fraction, 0.05 = +5 %; absolute: in the samples' unit). None
    when either run has fewer than ``MIN_SAMPLES`` samples, a relative change from a baseline statistic
    of 0, or samples so large that their statistics overflow."""
    a = _bounded(baseline)
    b = _bounded(current)
    if len(a) < MIN_SAMPLES or len(b) < MIN_SAMPLES:
        return None
    with np.errstate(all="ignore"):  # values near the float limit overflow: no interval, not a warning
        return _interval(a, b, statistic, relative, confidence, seed)


def _bounded(values: Sequence[float]) -> np.ndarray:
    """The finite values, or ``MAX_RESAMPLED`` evenly spaced quantiles of them when they are more."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) <= MAX_RESAMPLED:
        return x
    return np.quantile(x, (np.arange(MAX_RESAMPLED) + 0.5) / MAX_RESAMPLED)


def _interval(
    a: np.ndarray, b: np.ndarray, statistic: str, relative: bool, confidence: float, seed: int
) -> Interval | None:
    f = _stat(statistic)
    fa, fb = f(a, None), f(b, None)
    if not (np.isfinite(fa) and np.isfinite(fb)) or not (np.isfinite(np.ptp(a)) and np.isfinite(np.ptp(b))):
        return None
    if relative and fa == 0:
        return None

    def change(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        fx, fy = f(x, axis), f(y, axis)
        if relative:
            with np.errstate(divide="ignore", invalid="ignore"):
                return fy / fx - 1.0
        return fy - fx

    if np.ptp(a) == 0 and np.ptp(b) == 0:  # constant samples: no spread to resample
        point = float(change(a, b))
        return Interval(point, point, confidence) if np.isfinite(point) else None
    per_resample = max(len(a), len(b))
    batch = None if per_resample * N_RESAMPLES <= BATCH_ELEMENTS else max(1, BATCH_ELEMENTS // per_resample)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DegenerateDataWarning: handled below by the percentile fallback
        for method in ("BCa", "percentile"):
            res = _scipy_stats().bootstrap(
                (a, b),
                change,
                n_resamples=N_RESAMPLES,
                paired=False,
                vectorized=True,
                confidence_level=confidence,
                method=method,
                batch=batch,
                **_rng_kwargs(seed),
            )
            low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
            if np.isfinite(low) and np.isfinite(high):
                return Interval(low, high, confidence)
    return None
