"""Values made plain: numpy/pandas scalars to Python numbers, NaN/inf/NA to None (JSON has neither).

``clean_value`` for one value (the rule engine reads metrics through it); ``jsonable`` for a whole structure
(every JSON document ddpdoctor writes goes through it). The one place this policy lives.
"""

from __future__ import annotations

import math
from typing import Any

from ddpdoctor.ranklist import RankRanges


def clean_value(value: Any) -> Any:
    """A Python scalar for ``value``: numpy scalars unwrapped, NaN/inf/pandas NA as None; others unchanged."""
    t = type(value)
    if t is float:  # nearly every metric: a plain float (the rule engine reads millions of them at scale)
        return value if value - value == 0.0 else None  # inf - inf and nan - nan are nan
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if hasattr(value, "item") and not isinstance(value, (bytes, bytearray)):
        try:
            value = value.item()
        except (TypeError, ValueError):  # not a scalar (an array of several values): no metric value
            return None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if type(value).__name__ in ("NAType", "NaTType"):  # pandas.NA / NaT without importing pandas
        return None
    return value


_PLAIN = frozenset({int, str, bool, type(None)})
_PLAIN_OR_FLOAT = _PLAIN | {float}


def jsonable(value: Any) -> Any:
    """``value`` ready for ``json.dumps``: dict keys as strings, tuples as lists, scalars through
    ``clean_value``, anything else that JSON cannot hold as its ``str``."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        kinds = set(map(type, value))  # exact types: numpy scalars (even np.float64) take the slow path
        if kinds <= _PLAIN:
            return list(value)
        if kinds <= _PLAIN_OR_FLOAT:  # a column of numbers: NaN and inf (v - v is not 0) become None
            return [None if v.__class__ is float and v - v != 0 else v for v in value]
        return [jsonable(v) for v in value]
    if isinstance(value, RankRanges):  # a rank list as it is written: its ranges (ranklist.py)
        return value.to_json()
    value = clean_value(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
