"""``Table``: named numpy columns of one length, the little of a DataFrame that the metrics need.

The metrics run on these instead of pandas frames: importing pandas alone costs ~0.3 s and every pandas
operation ~50-100 µs of overhead, which dominated small traces and runs of many ranks. ``to_pandas()`` gives the
DataFrame where a user asks for one (``ddpdoctor.load()``).

Categorical columns (event ``name`` and ``cat``) are ``Codes``: int32 codes into a list of strings, so that
selecting by name tests each distinct string once, not each event.

Grouping: ``group_ids(*keys)`` numbers the distinct key tuples (in sorted order) and the ``group_*`` functions
reduce or broadcast a column over those groups, as ``groupby(...).transform``/``agg`` would.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np


class Codes:
    """A categorical column: ``codes`` (int32, -1 = missing) into ``categories`` (a list of strings)."""

    __slots__ = ("codes", "categories")

    def __init__(self, codes: np.ndarray, categories: list[str] | tuple[str, ...]) -> None:
        self.codes = np.asarray(codes, dtype=np.int32)
        self.categories = list(categories)

    @classmethod
    def shared(cls, codes: np.ndarray, categories: list[str]) -> Codes:
        """Codes over the list ``categories`` itself (not a copy: columns of one rank share their names)."""
        out = cls.__new__(cls)
        out.codes = np.asarray(codes, dtype=np.int32)
        out.categories = categories
        return out

    @classmethod
    def from_values(cls, values: Iterable[str]) -> Codes:
        index: dict[str, int] = {}
        codes = np.fromiter((index.setdefault(v, len(index)) for v in values), dtype=np.int32)
        return cls(codes, list(index))

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, rows: Any) -> Codes:
        return Codes.shared(self.codes[rows], self.categories)

    def _table(self, wanted: Iterable[bool]) -> np.ndarray:
        # one flag per category, plus a False for code -1 (indexed from the end)
        return np.fromiter([*wanted, False], dtype=bool, count=len(self.categories) + 1)

    def isin(self, values: Iterable[str]) -> np.ndarray:
        """Rows whose value is one of ``values``."""
        wanted = set(values)
        return self._table(c in wanted for c in self.categories)[self.codes]

    def matches(self, pattern: re.Pattern[str] | str) -> np.ndarray:
        """Rows whose value matches ``pattern`` (``re.match``: anchored at the start)."""
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        return self._table(bool(rx.match(c)) for c in self.categories)[self.codes]

    def searches(self, pattern: re.Pattern[str] | str) -> np.ndarray:
        """Rows whose value contains a match of ``pattern`` (``re.search``)."""
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        return self._table(bool(rx.search(c)) for c in self.categories)[self.codes]

    def startswith(self, prefix: str | tuple[str, ...]) -> np.ndarray:
        return self._table(c.startswith(prefix) for c in self.categories)[self.codes]

    def map(self, mapping: Mapping[str, Any], default: Any = None, dtype: Any = object) -> np.ndarray:
        """Each row's value looked up in ``mapping`` (``default`` where absent or missing)."""
        table = np.array([*(mapping.get(c, default) for c in self.categories), default], dtype=dtype)
        return table[self.codes]

    def used(self) -> list[str]:
        """The categories that occur, in category order."""
        if not len(self.codes):
            return []
        present = np.zeros(len(self.categories) + 1, dtype=bool)
        present[self.codes] = True
        return [c for c, p in zip(self.categories, present[:-1], strict=True) if p]

    def values(self) -> np.ndarray:
        """The strings, as an object array (None where missing)."""
        return np.array([*self.categories, None], dtype=object)[self.codes]

    def tolist(self) -> list[str | None]:
        return self.values().tolist()

    def at(self, i: int) -> str | None:
        code = int(self.codes[i])
        return self.categories[code] if code >= 0 else None


Column = np.ndarray | Codes


class Table:
    """Columns of equal length. ``t["col"]`` is a column; ``t[mask]`` / ``t[indices]`` / ``t.rows(...)`` a new
    Table of those rows (columns are views or copies, never shared for writing)."""

    __slots__ = ("_cols",)

    def __init__(self, columns: Mapping[str, Column | list[Any]] | None = None) -> None:
        cols: dict[str, Column] = {}
        n = None
        for name, values in (columns or {}).items():
            col = values if isinstance(values, (np.ndarray, Codes)) else np.asarray(values)
            if n is not None and len(col) != n:
                raise ValueError(f"column {name!r} has {len(col)} rows, not {n}")
            n = len(col)
            cols[name] = col
        self._cols = cols

    @classmethod
    def empty(cls, columns: Iterable[str], dtype: Any = np.float64) -> Table:
        return cls({c: np.zeros(0, dtype=dtype) for c in columns})

    @classmethod
    def from_records(cls, records: list[Mapping[str, Any]], columns: Iterable[str]) -> Table:
        """Rows given as dicts (missing keys become None); numeric columns become numeric arrays."""
        columns = list(columns)
        return cls({c: column([r.get(c) for r in records]) for c in columns})

    @classmethod
    def concat(cls, tables: list[Table]) -> Table:
        """Rows of ``tables`` one after the other (the columns of the first; categoricals re-coded)."""
        tables = [t for t in tables if t is not None]
        if not tables:
            return cls()
        if len(tables) == 1:
            return tables[0].copy()
        out: dict[str, Column] = {}
        for name in tables[0].columns:
            parts = [t[name] for t in tables]
            if isinstance(parts[0], Codes):
                cats: dict[str, int] = {}
                coded = []
                for p in parts:
                    assert isinstance(p, Codes)
                    remap = np.array([*(cats.setdefault(c, len(cats)) for c in p.categories), -1], dtype=np.int32)
                    coded.append(remap[p.codes])
                out[name] = Codes(np.concatenate(coded), list(cats))
            else:
                out[name] = np.concatenate(parts)
        return cls(out)

    @property
    def columns(self) -> list[str]:
        return list(self._cols)

    def __len__(self) -> int:
        for col in self._cols.values():
            return len(col)
        return 0

    def __contains__(self, name: object) -> bool:
        return name in self._cols

    def __iter__(self) -> Iterator[str]:
        return iter(self._cols)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return self._cols[key]
        return self.rows(key)

    def __setitem__(self, name: str, values: Column | list[Any] | float) -> None:
        n = len(self)
        if np.isscalar(values) or values is None:
            col: Column = np.full(n, values)
        else:
            col = values if isinstance(values, (np.ndarray, Codes)) else np.asarray(values)
        if self._cols and len(col) != n:
            raise ValueError(f"column {name!r} has {len(col)} rows, not {n}")
        self._cols[name] = col

    def get(self, name: str, default: Any = None) -> Any:
        return self._cols.get(name, default)

    def rows(self, key: Any) -> Table:
        """The rows selected by a boolean mask, an index array or a slice."""
        if (
            len(self._cols) > 2
            and isinstance(key, np.ndarray)
            and key.dtype == bool
            and key.ndim == 1
            and len(key) == len(self)
        ):
            key = np.flatnonzero(key)  # once, not once per column
        out = Table()
        out._cols = {name: col[key] for name, col in self._cols.items()}
        return out

    def select(self, columns: Iterable[str]) -> Table:
        out = Table()
        out._cols = {c: self._cols[c] for c in columns}
        return out

    def copy(self) -> Table:
        out = Table()
        out._cols = {n: (c[:] if isinstance(c, Codes) else c.copy()) for n, c in self._cols.items()}
        return out

    def assign(self, **columns: Column | list[Any] | float) -> Table:
        out = Table()
        out._cols = dict(self._cols)
        for name, values in columns.items():
            out[name] = values
        return out

    def sort(self, *by: str) -> Table:
        """Rows ordered by the columns ``by`` (the first the primary key), stable."""
        if len(self) < 2 or not by:
            return self.rows(slice(None))
        keys = [_sort_key(self._cols[c]) for c in reversed(by)]
        return self.rows(np.lexsort(keys) if len(keys) > 1 else np.argsort(keys[0], kind="stable"))

    def records(self) -> list[dict[str, Any]]:
        """One dict per row, with Python values (categoricals as strings)."""
        lists = {n: (c.tolist()) for n, c in self._cols.items()}
        names = list(lists)
        return [dict(zip(names, row, strict=True)) for row in zip(*lists.values(), strict=True)]

    def to_lists(self) -> dict[str, list[Any]]:
        return {n: c.tolist() for n, c in self._cols.items()}

    def to_pandas(self) -> Any:
        """A pandas DataFrame of the same columns (categoricals as pandas categoricals)."""
        import pandas as pd

        cols = {}
        for name, col in self._cols.items():
            if isinstance(col, Codes):
                cols[name] = pd.Categorical.from_codes(col.codes, categories=pd.Index(col.categories, dtype=object))
            else:
                cols[name] = col
        return pd.DataFrame(cols, copy=False)

    def __repr__(self) -> str:
        return f"Table({len(self)} rows: {', '.join(self.columns)})"


def column(values: list[Any]) -> np.ndarray:
    """A list of Python values as the column a DataFrame makes of it: int64 or bool when all are, float64 with NaN
    for None among numbers, else object (one element per value, lists included), with the types found in one pass."""
    if not values:
        return np.zeros(0, dtype=np.float64)
    kinds = set(map(type, values))
    if kinds <= {int}:
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            return np.array(values, dtype=object)
    if kinds <= {bool}:
        return np.array(values, dtype=bool)
    if kinds <= {int, float, type(None)} and kinds != {type(None)}:
        return np.array(values, dtype=np.float64)  # None becomes NaN
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _sort_key(col: Column) -> np.ndarray:
    if isinstance(col, Codes):
        order = np.argsort(np.array(col.categories, dtype=object), kind="stable")
        rank = np.empty(len(order) + 1, dtype=np.int64)
        rank[order] = np.arange(len(order))
        rank[-1] = -1
        return rank[col.codes]
    return col


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted: ``np.unique(values)`` without importing ``numpy.ma`` (which ``np.unique``
    with a single output does, ~10 ms)."""
    return np.unique(values, return_counts=True)[0]


def group_ids(*keys: Column) -> tuple[np.ndarray, int]:
    """For rows keyed by the columns ``keys``: each row's group number (groups numbered in sorted key order)
    and the number of groups."""
    if not keys or not len(keys[0]):
        return np.zeros(len(keys[0]) if keys else 0, dtype=np.int64), 0
    arrays = [_sort_key(k) for k in keys]
    if len(arrays) == 1:
        uniques, inverse = np.unique(arrays[0], return_inverse=True)
        return inverse.reshape(-1), len(uniques)
    combined = _mixed_radix(arrays, limit=4 * len(arrays[0]) + 1024)
    if combined is not None:  # one small integer per row, ordered as the keys are: numbered by counting, no sort
        present = np.bincount(combined) > 0
        number = np.cumsum(present) - 1
        return number[combined], int(number[-1]) + 1
    order = np.lexsort(arrays[::-1])
    changed = np.zeros(len(order), dtype=bool)
    changed[0] = True
    for a in arrays:
        s = a[order]
        changed[1:] |= s[1:] != s[:-1]
    ids_sorted = np.cumsum(changed) - 1
    ids = np.empty(len(order), dtype=np.int64)
    ids[order] = ids_sorted
    return ids, int(ids_sorted[-1]) + 1


def _mixed_radix(arrays: list[np.ndarray], limit: int) -> np.ndarray | None:
    """Integer keys as one int64 per row, 0 to the product of their spans, whose order is the keys' order (the first
    key the most significant), or None where a key is not integer or that product exceeds ``limit``."""
    if not all(a.dtype.kind in "ib" for a in arrays):
        return None
    out = np.zeros(len(arrays[0]), dtype=np.int64)
    total = 1
    for a in arrays:
        lo, hi = int(a.min()), int(a.max())
        span = hi - lo + 1
        total *= span
        if total > limit:
            return None
        out *= span
        out += a.astype(np.int64, copy=False) - lo
    return out


def group_min(values: np.ndarray, ids: np.ndarray, n: int) -> np.ndarray:
    """Per group: the smallest value (NaN values ignored; NaN when the group has none)."""
    v = np.asarray(values, dtype=np.float64)
    ok = ~np.isnan(v)
    out = np.full(n, np.inf)
    np.minimum.at(out, ids[ok], v[ok])
    out[np.bincount(ids[ok], minlength=n) == 0] = np.nan
    return out


def group_max(values: np.ndarray, ids: np.ndarray, n: int) -> np.ndarray:
    """Per group: the largest value (NaN values ignored; NaN when the group has none)."""
    return -group_min(-np.asarray(values, dtype=np.float64), ids, n)


def group_sum(values: np.ndarray, ids: np.ndarray, n: int) -> np.ndarray:
    """Per group: the sum (NaN values count as 0, as pandas' ``sum``)."""
    v = np.asarray(values, dtype=np.float64)
    return np.bincount(ids, weights=np.where(np.isnan(v), 0.0, v), minlength=n)


def group_count(ids: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(ids, minlength=n)


def group_nunique(values: np.ndarray, ids: np.ndarray, n: int) -> np.ndarray:
    """Per group: the number of distinct values."""
    if not len(ids):
        return np.zeros(n, dtype=np.int64)
    pair_ids, _ = group_ids(ids, values)
    first = np.zeros(int(pair_ids.max()) + 1, dtype=np.int64)
    first[pair_ids] = ids
    return np.bincount(first, minlength=n)


def group_median(values: np.ndarray, ids: np.ndarray, n: int) -> np.ndarray:
    """Per group: the median (NaN values ignored; NaN when the group has none)."""
    v = np.asarray(values, dtype=np.float64)
    ok = ~np.isnan(v)
    v, g = v[ok], ids[ok]
    out = np.full(n, np.nan)
    if not len(v):
        return out
    order = np.lexsort((v, g))
    v, g = v[order], g[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    ends = np.r_[starts[1:], len(g)]
    lo = starts + (ends - starts - 1) // 2
    hi = starts + (ends - starts) // 2
    out[g[starts]] = (v[lo] + v[hi]) / 2.0
    return out


def cumcount(ids: np.ndarray) -> np.ndarray:
    """Each row's position among the earlier rows of its group (pandas' ``groupby().cumcount()``)."""
    n = len(ids)
    if not n:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    s = ids[order]
    starts = np.r_[True, s[1:] != s[:-1]]
    start_pos = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    out = np.empty(n, dtype=np.int64)
    out[order] = np.arange(n) - start_pos
    return out
