"""The library API as the README promises it, on a real recorded 2-rank gloo run."""

from __future__ import annotations

from pathlib import Path

import ddpdoctor
from ddpdoctor.metrics import analyze

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ddp_gloo_2rank"


def test_ddpdoctor_load_is_callable_even_after_the_subpackage_is_imported():
    import ddpdoctor.load  # noqa: F401  (rebinds the attribute to the subpackage)

    run = ddpdoctor.load(FIXTURE, workers=1)
    assert [r.rank for r in run.ranks] == [0, 1] and run.world_size == 2


def test_overlap_agrees_with_ddps_own_logging_in_order_of_magnitude():
    """ddpdoctor measures overlap from the trace (gloo ranges vs backward compute); DDP times it itself with its
    reducer timers (avg_backward_compute_comm_overlap_time / avg_backward_comm_time). They time different things
    (DDP: from the first bucket being ready; ddpdoctor: the collective ranges), so only the order of magnitude
    must agree: within a factor of 3, both in 0-1."""
    metrics = analyze(ddpdoctor.load(FIXTURE, workers=1))
    for rank in metrics.ranks:
        ours, ddps = rank["overlap_ratio"], rank["ddp_reported_overlap_ratio"]
        assert ours is not None and ddps is not None
        assert 0 < ours <= 1 and 0 < ddps <= 1
        assert 1 / 3 <= ours / ddps <= 3, (rank["rank"], ours, ddps)
