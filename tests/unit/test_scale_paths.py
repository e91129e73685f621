"""Issue 29 item 2: the per-rank steps of the cross-rank analysis that were quadratic in ranks give the same
values as the straightforward forms they replace."""

from __future__ import annotations

import random
import statistics

import pytest

from ddpdoctor.metrics.hostload import _LeaveOneOutMedian


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 33])
def test_leave_one_out_median_equals_median_of_the_others(n: int) -> None:
    rng = random.Random(n)
    cases = [
        [rng.uniform(0, 50) for _ in range(n)],
        [float(rng.randint(0, 3)) for _ in range(n)],  # many ties
        [rng.randint(0, 9) for _ in range(n)],  # ints, as statistics.median keeps them
    ]
    for values in cases:
        medians = _LeaveOneOutMedian(values)
        for i, v in enumerate(values):
            expected = statistics.median(values[:i] + values[i + 1 :])
            got = medians.without(v)
            assert got == expected and type(got) is type(expected), (values, i)


def test_leave_one_out_median_with_nan_falls_back() -> None:
    values = [1.0, float("nan"), 3.0, 2.0]
    medians = _LeaveOneOutMedian(values)
    assert medians.without(1.0) == statistics.median([float("nan"), 3.0, 2.0])


def test_leave_one_out_median_of_one_value_has_none() -> None:
    with pytest.raises(statistics.StatisticsError):
        _LeaveOneOutMedian([4.0]).without(4.0)


@pytest.mark.parametrize("user", [None, "1"])
def test_numpy_is_imported_without_huge_page_advice_unless_the_user_asks(user: str | None) -> None:
    """``diagnose`` imports numpy without huge-page advice (page faults that compact memory stalled large arrays
    for a fraction of a second) and one OpenBLAS thread; the variables are put back at once, and a user's own
    ``NUMPY_MADVISE_HUGEPAGE`` wins."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("NUMPY_MADVISE_HUGEPAGE", "OPENBLAS_NUM_THREADS")}
    if user is not None:
        env["NUMPY_MADVISE_HUGEPAGE"] = user
    code = (
        "import os, ddpdoctor.cli as c; c._import_numpy_single_threaded(); import numpy; "
        "core = getattr(numpy, '_core', None) or numpy.core; "
        "print(core.multiarray._get_madvise_hugepage(), os.environ.get('NUMPY_MADVISE_HUGEPAGE'), "
        "os.environ.get('OPENBLAS_NUM_THREADS'))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == (["False", "None", "None"] if user is None else ["True", "1", "None"])


def _union_reference(starts, ends, group):
    """Each group's union, one interval at a time (touching intervals merged, empty ones dropped)."""
    out = []
    for g in sorted(set(group)):
        spans = sorted((s, e) for s, e, k in zip(starts, ends, group, strict=True) if k == g and e > s)
        merged: list[list[float]] = []
        for s, e in spans:
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        out += [(s, e, g) for s, e in merged]
    return out


@pytest.mark.parametrize("seed", range(30))
def test_union_by_of_intervals_that_are_a_union_already_is_them(seed: int) -> None:
    """``union_by`` returns intervals that are sorted, apart and non-empty as they are (a summary's
    ``exposed_comm``: the 131,072-rank path skips its sort), and unions every other input as before."""
    import numpy as np

    from ddpdoctor.metrics.intervals import union_by

    rng = random.Random(seed)
    starts, ends, group = [], [], []
    for g in range(rng.randint(1, 5)):
        t = rng.uniform(0, 10)
        for _ in range(rng.randint(0, 6)):
            t += rng.choice([0.0, rng.uniform(0, 3)]) if seed % 3 else rng.uniform(0.1, 3)  # touching, or apart
            length = rng.choice([0.0, rng.uniform(0, 4)]) if seed % 2 else rng.uniform(0.1, 2)
            starts.append(t)
            ends.append(t + length)
            group.append(g)
            t += length
    if seed % 5 == 4 and starts:  # out of order
        order = list(range(len(starts)))
        rng.shuffle(order)
        starts, ends, group = ([x[i] for i in order] for x in (starts, ends, group))
    got = union_by(np.array(starts, dtype=np.float64), np.array(ends, dtype=np.float64), np.array(group))
    assert got[0].dtype == np.float64 and got[2].dtype == np.int64
    assert list(zip(got[0].tolist(), got[1].tolist(), got[2].tolist(), strict=True)) == _union_reference(
        starts, ends, group
    )


def test_a_passed_line_shows_per_rank_values_as_it_did_one_value_at_a_time() -> None:
    """``_rank_values`` formats each distinct value once: the same text as formatting every rank's value."""
    from ddpdoctor.diagnosis.passed import _LISTED_RANKS, _rank_values, _shown
    from ddpdoctor.diagnosis.template import format_value

    def one_at_a_time(values: dict, decided: list) -> str:  # the form it replaces
        from ddpdoctor.diagnosis.findings import format_ranks

        shown = {rank: _shown(v) for rank, v in values.items()}
        where = "" if len(values) == len(decided) else f" on {format_ranks(values)}"
        if len(set(shown.values())) == 1:
            return next(iter(shown.values())) + where
        if len(values) <= _LISTED_RANKS:
            return ", ".join(f"r{rank}={text}" for rank, text in shown.items())
        numbers = [v for v in values.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(numbers) == len(values):
            return f"{format_value(min(numbers))} to {format_value(max(numbers))}{where}"
        return ", ".join(sorted(set(shown.values()))) + where

    rng = random.Random(7)
    pools = [[0.0, -0.0], [1, 1.0, True], [2.5, 2.5, 2.5], [None, 3.0], ["a", "b"], [0.125, 7, False, None]]
    for pool in pools:
        for n in (1, 2, _LISTED_RANKS, _LISTED_RANKS + 5, 300):
            values = {r: rng.choice(pool) for r in range(n)}
            for decided in (list(values), [*values, n + 1]):
                assert _rank_values(values, decided) == one_at_a_time(values, decided), (pool, n)


@pytest.mark.parametrize("seed", range(12))
def test_segmented_searchsorted_is_numpy_s_per_segment(seed: int) -> None:
    import numpy as np

    from ddpdoctor.metrics.group_sums import segmented_searchsorted

    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 9, size=rng.integers(1, 12))
    parts = [
        np.sort(rng.choice([0.0, 1.0, 2.5, 3.0, 7.0, -1.0], size=c) if seed % 2 else rng.normal(size=c)) for c in counts
    ]
    values = np.concatenate(parts) if parts else np.zeros(0)
    first = np.cumsum(counts) - counts
    segment = rng.integers(0, len(counts), size=50)
    queries = np.where(rng.random(50) < 0.1, np.nan, rng.choice([0.0, 1.0, 2.5, 3.0, -1.0, 9.0, -5.0], size=50))
    got = segmented_searchsorted(values, first, counts, segment, queries)
    want = [np.searchsorted(parts[s], q, side="right") for s, q in zip(segment.tolist(), queries.tolist(), strict=True)]
    assert got.tolist() == want


def _intersect_by_sweep(a, b):
    """``intervals.intersect_by`` as it was: a sweep over every boundary of both, sorted by (group, time)."""
    import numpy as np

    if len(a[0]) == 0 or len(b[0]) == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64)
    pts = np.concatenate([a[0], a[1], b[0], b[1]])
    grp = np.concatenate([a[2], a[2], b[2], b[2]])
    w = np.concatenate([np.ones(len(a[0])), -np.ones(len(a[1])), np.full(len(b[0]), 2.0), np.full(len(b[1]), -2.0)])
    order = np.lexsort((pts, grp))
    pts, grp, w = pts[order], grp[order], w[order]
    level = np.cumsum(w)
    last_at_t = np.append((pts[1:] != pts[:-1]) | (grp[1:] != grp[:-1]), True)
    pts, grp, level = pts[last_at_t], grp[last_at_t], level[last_at_t]
    inside = (level[:-1] == 3) & (grp[:-1] == grp[1:])
    return pts[:-1][inside], pts[1:][inside], grp[:-1][inside]


@pytest.mark.parametrize("seed", range(40))
def test_intersect_by_is_the_sweep_s(seed: int) -> None:
    """``intersect_by`` finds each interval's overlaps by bisection: the same intervals, in the same order, as the
    sweep over every boundary it replaces (whole-number times make shared and touching boundaries common)."""
    import numpy as np

    from ddpdoctor.metrics.intervals import intersect_by, total_by, union_by

    rng = np.random.default_rng(seed)

    def sets(n: int) -> tuple:
        group = rng.integers(0, 6, n)
        start = rng.integers(0, 40, n).astype(np.float64) if seed % 2 else rng.random(n) * 40
        return union_by(start, start + rng.integers(0, 8, n), group)

    a, b = sets(int(rng.integers(0, 30))), sets(int(rng.integers(0, 30)))
    if seed % 7 == 3:  # groups only one side has
        b = (b[0], b[1], b[2] + 10)
    got, want = intersect_by(a, b), _intersect_by_sweep(a, b)
    assert [x.tolist() for x in got] == [x.tolist() for x in want]
    assert got[0].dtype == np.float64 and got[2].dtype == np.int64
    assert np.array_equal(total_by(got, 20), total_by(want, 20))


def test_all_collectives_joins_every_rank_s_columns_with_or_without_all_of_them() -> None:
    """The usual summaries (every column) are joined column by column; a rank without a column (an older summary:
    no ``issued_in``) gives None there, and the other ranks' values are the same either way."""
    import numpy as np

    from ddpdoctor.metrics.cross_rank import COLUMNS, all_collectives

    def table(rank: int, n: int) -> dict:
        cols = {c: [float(rank * 100 + i) for i in range(n)] for c in COLUMNS}
        cols.update(step=list(range(n)), index=[0] * n, kind=["all_reduce"] * n, issued_in=["backward"] * n)
        return {"rank": rank, "collectives": cols}

    full = [table(0, 3), table(1, 2), {"rank": 2, "collectives": {}}, table(3, 4)]
    older = [dict(s, collectives={k: v for k, v in s["collectives"].items() if k != "issued_in"}) for s in full]
    mixed = [full[0], older[1], full[2], full[3]]
    a, b = all_collectives(full), all_collectives(mixed)
    assert a["rank"].tolist() == b["rank"].tolist() == [0, 0, 0, 1, 1, 3, 3, 3, 3]
    for col in ("start_us", "end_us", "dur_us", "bytes", "group_size", "step", "index"):
        assert np.array_equal(a[col], b[col]), col
    assert a["issued_in"].values().tolist() == ["backward"] * 9
    assert b["issued_in"].values().tolist() == ["backward"] * 3 + [None] * 2 + ["backward"] * 4


def test_positions_within_counts_each_run_from_zero():
    import numpy as np

    from ddpdoctor.metrics.group_sums import positions_within

    assert positions_within(np.array([2, 0, 3, 1])).tolist() == [0, 1, 0, 1, 2, 0]
    assert positions_within(np.zeros(0, dtype=np.int64)).tolist() == []
    counts = np.random.default_rng(3).integers(0, 6, 200)
    assert positions_within(counts).tolist() == [i for c in counts.tolist() for i in range(c)]
