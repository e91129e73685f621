"""``jsonable``/``clean_value``: the one policy for values written as JSON (NaN and inf become null, numpy
scalars Python numbers). Lists of plain numbers take a fast path that must agree with the element-wise one."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ddpdoctor.values import clean_value, jsonable

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
)


@given(st.lists(SCALARS, max_size=30))
def test_a_list_of_plain_values_is_the_list_of_its_clean_values(values: list) -> None:
    out = jsonable(values)
    assert out == [clean_value(v) for v in values]
    assert all(type(a) is type(clean_value(b)) for a, b in zip(out, values, strict=True))
    json.dumps(out, allow_nan=False)


def test_numpy_values_nested_structures_and_keys() -> None:
    data = {
        1: [np.float64(1.5), np.float64("nan"), np.int64(3), float("inf"), -float("inf"), 2.0],
        "t": (1.0, float("nan")),
        "a": np.array([1, 2]),
        "nested": [[1.0, float("nan")], {"x": np.float32(0.5)}],
    }
    assert jsonable(data) == {
        "1": [1.5, None, 3, None, None, 2.0],
        "t": [1.0, None],
        "a": None,
        "nested": [[1.0, None], {"x": 0.5}],
    }
    assert type(jsonable([np.float64(1.0)])[0]) is float and type(jsonable([np.int64(1)])[0]) is int
