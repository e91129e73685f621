"""ddpdoctor.table against pandas: the same groups, reductions and orders on random data with ties and NaN."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ddpdoctor import table as tb


@pytest.fixture
def data() -> pd.DataFrame:
    rng = np.random.default_rng(7)
    n = 500
    v = rng.normal(size=n)
    v[rng.random(n) < 0.1] = np.nan
    return pd.DataFrame(
        {
            "a": rng.integers(0, 6, n),
            "b": rng.choice(["x", "y", "z"], n),
            "v": v,
        }
    )


def _ids(df: pd.DataFrame, keys: list[str]) -> tuple[np.ndarray, int]:
    cols = [tb.Codes.from_values(df[k]) if df[k].dtype == object else df[k].to_numpy() for k in keys]
    return tb.group_ids(*cols)


@pytest.mark.parametrize("keys", [["a"], ["a", "b"], ["b"]])
def test_group_reductions_match_pandas(data: pd.DataFrame, keys: list[str]) -> None:
    ids, n = _ids(data, keys)
    g = data.groupby(keys)["v"]
    # groups are numbered in sorted key order, like pandas' sorted groupby
    assert n == g.ngroups
    np.testing.assert_allclose(tb.group_min(data["v"].to_numpy(), ids, n), g.min().to_numpy())
    np.testing.assert_allclose(tb.group_max(data["v"].to_numpy(), ids, n), g.max().to_numpy())
    np.testing.assert_allclose(tb.group_sum(data["v"].to_numpy(), ids, n), g.sum().to_numpy())
    np.testing.assert_allclose(tb.group_median(data["v"].to_numpy(), ids, n), g.median().to_numpy())
    np.testing.assert_array_equal(tb.group_count(ids, n), g.size().to_numpy())
    np.testing.assert_array_equal(tb.cumcount(ids), data.groupby(keys).cumcount().to_numpy())


def test_nunique_and_all_nan_group() -> None:
    ids = np.array([0, 0, 1, 1, 2])
    vals = np.array([5, 5, 1, 2, 9])
    np.testing.assert_array_equal(tb.group_nunique(vals, ids, 3), [1, 2, 1])
    out = tb.group_min(np.array([np.nan, 1.0, np.nan, np.nan, -np.inf]), ids, 3)
    assert out[0] == 1.0 and np.isnan(out[1]) and out[2] == -np.inf


def test_codes_selection_and_concat() -> None:
    a = tb.Codes.from_values(["gloo:all_reduce", "aten::mm", "ProfilerStep#3", "aten::mm"])
    assert a.isin(["aten::mm"]).tolist() == [False, True, False, True]
    assert a.startswith("gloo:").tolist() == [True, False, False, False]
    assert a.matches(r"ProfilerStep#\d+$").tolist() == [False, False, True, False]
    assert a.map({"aten::mm": 1}, default=0, dtype=np.int64).tolist() == [0, 1, 0, 1]
    assert a[np.array([False, True, True, False])].used() == ["aten::mm", "ProfilerStep#3"]
    t1 = tb.Table({"name": a, "ts": np.arange(4.0)})
    t2 = tb.Table({"name": tb.Codes.from_values(["x", "aten::mm"]), "ts": np.array([9.0, 8.0])})
    both = tb.Table.concat([t1, t2])
    assert both["name"].tolist() == ["gloo:all_reduce", "aten::mm", "ProfilerStep#3", "aten::mm", "x", "aten::mm"]
    assert both.sort("ts")["ts"].tolist() == [0.0, 1.0, 2.0, 3.0, 8.0, 9.0]
    frame = both.to_pandas()
    assert isinstance(frame["name"].dtype, pd.CategoricalDtype) and frame["name"].tolist() == both["name"].tolist()


def test_sort_by_two_keys_is_stable_like_pandas(data: pd.DataFrame) -> None:
    t = tb.Table({"a": data["a"].to_numpy(), "b": tb.Codes.from_values(data["b"]), "v": data["v"].to_numpy()})
    expected = data.sort_values(["a", "b"], kind="stable")
    got = t.sort("a", "b")
    np.testing.assert_array_equal(got["a"], expected["a"].to_numpy())
    assert got["b"].tolist() == expected["b"].tolist()
    np.testing.assert_array_equal(got["v"], expected["v"].to_numpy())


def test_records_and_lengths() -> None:
    t = tb.Table.from_records([{"rank": 0, "x": 1.5}, {"rank": 1, "x": None}], ["rank", "x"])
    assert t["rank"].dtype == np.int64 and np.isnan(t["x"][1])
    assert t.records()[0] == {"rank": 0, "x": 1.5}
    with pytest.raises(ValueError):
        tb.Table({"a": [1, 2], "b": [1]})


def test_shared_codes_keep_their_list_and_rows_share_it() -> None:
    names = ["a", "b", "c"]
    codes = tb.Codes.shared(np.array([2, 0, 2, -1]), names)
    assert codes.categories is names and codes.tolist() == ["c", "a", "c", None]
    assert codes[1:].categories is names and codes[np.array([True, False, True, False])].tolist() == ["c", "c"]
    # the constructor still copies
    assert tb.Codes(np.array([0]), names).categories is not names


def test_distinct_is_np_unique() -> None:
    rng = np.random.default_rng(5)
    for values in (rng.integers(-3, 3, 40), rng.random(10), np.zeros(0, dtype=np.int64)):
        np.testing.assert_array_equal(tb.distinct(values), np.unique(values))


def _lexsorted_ids(*keys: np.ndarray) -> tuple[np.ndarray, int]:
    """Group numbers by sorting the rows on every key (``group_ids``' way for keys of a wide range)."""
    order = np.lexsort(keys[::-1])
    changed = np.zeros(len(order), dtype=bool)
    changed[0] = True
    for a in keys:
        changed[1:] |= a[order][1:] != a[order][:-1]
    ids = np.empty(len(order), dtype=np.int64)
    ids[order] = np.cumsum(changed) - 1
    return ids, int(ids.max()) + 1


def test_group_ids_of_small_integer_keys_counted_not_sorted_are_the_same() -> None:
    rng = np.random.default_rng(3)
    for trial in range(300):
        n = int(rng.integers(1, 200))
        keys = [rng.integers(-3, int(rng.integers(1, 40)), n) for _ in range(int(rng.integers(2, 4)))]
        if trial % 3 == 0:
            keys.append(rng.integers(0, 2, n).astype(bool))
        if trial % 5 == 0:  # a wide key: sorted, not counted
            keys[0] = keys[0] * 10**9
        ids, n_groups = tb.group_ids(*keys)
        want, n_want = _lexsorted_ids(*[k.astype(np.int64) for k in keys])
        assert n_groups == n_want and np.array_equal(ids, want) and ids.dtype == np.int64
