"""The reports' header line: "1 step analysed", not "1 steps" (a job that failed at start-up has a one-window trace
analysed as one step)."""

from __future__ import annotations

import pytest

from ddpdoctor.report import fmt


@pytest.mark.parametrize(
    ("n", "said"),
    [(1, "1 step analysed"), (5, "5 steps analysed"), (0, "0 steps analysed"), (None, "? steps analysed")],
)
def test_steps_analysed(n, said) -> None:
    assert fmt.steps_analysed(n) == said
