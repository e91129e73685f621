"""The rule aggregates mean and median are statistics.fmean and statistics.median, to the last bit."""

from __future__ import annotations

import math
import random
import statistics

from ddpdoctor.diagnosis import expr


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))


def test_mean_and_median_are_the_statistics_module_s() -> None:
    rng = random.Random(17)
    specials = [0.0, -0.0, 1e308, -1e308, 5e-324, math.inf, -math.inf, 0.1, 1 / 3]
    for _ in range(2000):
        n = rng.randrange(1, 12)
        values = [
            rng.choice(specials) if rng.random() < 0.1 else rng.uniform(-1e3, 1e3) * 10 ** rng.randrange(-5, 5)
            for _ in range(n)
        ]
        if rng.random() < 0.05:
            values[rng.randrange(n)] = math.nan
        try:
            want_mean = statistics.fmean(values)
        except (OverflowError, ValueError):
            want_mean = None
        if want_mean is not None:
            assert _same(expr.aggregate("mean", values), want_mean), values
        if not any(math.isnan(v) for v in values):  # sorted() order with a NaN is the same list either way
            assert _same(expr.aggregate("median", values), statistics.median(values)), values


def test_aggregates_import_no_statistics() -> None:
    import subprocess
    import sys

    code = "import sys, ddpdoctor.diagnosis.expr as e; e.aggregate('mean', [1.0]); print('statistics' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
