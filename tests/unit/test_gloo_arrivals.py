"""When a rank arrived at a gloo collective: its call (``c10d::*`` on the issuing thread), not the start of the
``gloo:*`` range on gloo's own thread, which on a busy host can wait for a CPU for milliseconds after the call
(``comm.gloo_arrivals``, ``cross_rank._arrivals``). A balanced job whose rank-1 communication thread starts late
every step was named a straggler (the clean-clone CI at 87f2f5b: rank 1 last at 10 of 10 collectives while its
training loop waited less for a CPU than rank 0's); a rank that calls late is still named."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from ddpdoctor.metrics.comm import gloo_arrivals
from ddpdoctor.metrics.cross_rank import cross_rank
from ddpdoctor.table import Codes, Table

STEP_US = 40_000.0


def _ops(rows: list[tuple[str, int, float, float]]) -> Table:
    """A comm_ops table of (name, tid, ts_us, dur_us) rows."""
    names = sorted({r[0] for r in rows})
    return Table(
        {
            "name": Codes(np.array([names.index(r[0]) for r in rows], dtype=np.int32), names),
            "tid": np.array([r[1] for r in rows], dtype=np.int64),
            "ts_us": np.array([r[2] for r in rows], dtype=np.float64),
            "end_us": np.array([r[2] + r[3] for r in rows], dtype=np.float64),
        }
    )


def _ranges(ops: Table) -> Table:
    """The ``gloo:*`` rows of ``ops`` with their kind, as ``comm.collectives`` passes them."""
    ranges = ops[ops["name"].startswith("gloo:")]
    kinds = {"gloo:all_reduce": "all_reduce", "gloo:broadcast": "broadcast", "gloo:all_gather": "all_gather"}
    ranges["kind"] = np.array([kinds[n] for n in ranges["name"].values()], dtype=object)
    return ranges


def test_each_range_gets_the_call_that_queued_it_in_order():
    # two buckets a step: calls on the autograd thread (7), ranges on gloo's two threads (8, 9), the second
    # range starting 6 ms after its call (its thread waited for a CPU)
    ops = _ops(
        [
            ("c10d::allreduce_", 7, 100.0, 20.0),
            ("gloo:all_reduce", 8, 150.0, 900.0),
            ("c10d::allreduce_", 7, 400.0, 20.0),
            ("gloo:all_reduce", 9, 6400.0, 500.0),
            ("c10d::broadcast_", 7, 8000.0, 10.0),
            ("gloo:broadcast", 8, 8050.0, 100.0),
        ]
    )
    ranges = _ranges(ops)
    assert gloo_arrivals(ops, ranges).tolist() == [100.0, 400.0, 8000.0]


def test_a_reduce_scatter_gloo_runs_as_an_all_reduce_pairs_with_it():
    # FSDP2 on gloo (torch 2.13): c10d::_reduce_scatter_base_ queues a gloo:all_reduce range
    ops = _ops(
        [
            ("c10d::_allgather_base_", 1, 100.0, 20.0),
            ("gloo:all_gather", 8, 130.0, 500.0),
            ("c10d::_reduce_scatter_base_", 1, 900.0, 20.0),
            ("gloo:all_reduce", 9, 3900.0, 500.0),
        ]
    )
    assert gloo_arrivals(ops, _ranges(ops)).tolist() == [100.0, 900.0]


@pytest.mark.parametrize(
    "rows",
    [
        # a call queued before the window: its range has no call here
        [
            ("gloo:all_reduce", 8, 50.0, 100.0),
            ("c10d::allreduce_", 7, 400.0, 20.0),
            ("gloo:all_reduce", 8, 450.0, 90.0),
        ],
        # the kinds do not pair in order
        [
            ("c10d::broadcast_", 7, 100.0, 20.0),
            ("gloo:all_reduce", 8, 150.0, 90.0),
            ("c10d::allreduce_", 7, 400.0, 20.0),
            ("gloo:broadcast", 8, 450.0, 90.0),
        ],
        # a call after the range it would pair with
        [("c10d::allreduce_", 7, 500.0, 20.0), ("gloo:all_reduce", 8, 450.0, 90.0)],
        # one collective op inside another on its thread: not one call each
        [
            ("c10d::allreduce_", 7, 100.0, 50.0),
            ("c10d::allreduce_", 7, 110.0, 10.0),
            ("gloo:all_reduce", 8, 150.0, 90.0),
            ("gloo:all_reduce", 8, 300.0, 90.0),
        ],
    ],
    ids=["call-before-window", "kinds-out-of-order", "call-after-range", "nested-calls"],
)
def test_calls_that_do_not_pair_leave_every_range_unknown(rows):
    ops = _ops(rows)
    got = gloo_arrivals(ops, _ranges(ops))
    assert len(got) == len(_ranges(ops)) and np.isnan(got).all()


def _summary(rank: int, call_late_us: float, thread_late_us: float, with_calls: bool = True) -> dict:
    """A rank of a 2-rank DDP job, 10 steps of one all-reduce: it calls ``call_late_us`` after 30 ms into the
    step, give or take 0.1 ms (rank 1 later in even steps, earlier in odd ones: noise), and gloo's thread starts
    ``thread_late_us`` after the call; the all-reduce ends 37 ms into the step on both ranks."""
    steps = list(range(10))
    start_step = [s * STEP_US for s in steps]
    noise = [(100.0 if s % 2 == 0 else -100.0) * rank for s in steps]
    called = [t + 30_000.0 + call_late_us + e for t, e in zip(start_step, noise, strict=True)]
    started = [c + thread_late_us for c in called]
    colls = {
        "step": steps,
        "kind": ["all_reduce"] * 10,
        "index": [0] * 10,
        "start_us": started,
        "end_us": [t + 30_000.0 + 7_000.0 for t in start_step],
        "bytes": [4e6] * 10,
        "group_size": [2] * 10,
        "issued_in": ["backward"] * 10,
    }
    colls["dur_us"] = [e - s for s, e in zip(colls["start_us"], colls["end_us"], strict=True)]
    if with_calls:
        colls["arrival_us"] = called
    per_step = {
        "step": steps,
        "start_us": start_step,
        "end_us": [t + STEP_US for t in start_step],
        "analyzed": [True] * 10,
    }
    return {"rank": rank, "per_step": per_step, "collectives": colls}


def test_a_rank_whose_gloo_thread_starts_late_is_not_a_slow_rank():
    # both ranks call at the same moment (+-0.1 ms); rank 1's gloo thread starts 4 ms after its call every step
    summaries = [_summary(0, 0.0, 100.0), _summary(1, 0.0, 4_000.0)]
    per_rank, run = cross_rank(summaries)
    assert per_rank[1]["slow_rank"] is False and run["slow_rank_count"] == 0, per_rank
    assert per_rank[1]["late_arrival_ms"] == pytest.approx(0.05, abs=0.01)  # 0.1 ms late in half the steps
    # the same collectives timed by their ranges (a summary without the calls): rank 1 last at all 10
    per_rank, _ = cross_rank([_summary(0, 0.0, 100.0, False), _summary(1, 0.0, 4_000.0, False)])
    assert per_rank[1]["slow_rank"] is True and per_rank[1]["late_arrival_ms"] == pytest.approx(3.9, abs=0.11)


def test_a_rank_that_calls_late_is_still_a_slow_rank():
    per_rank, run = cross_rank([_summary(0, 0.0, 100.0), _summary(1, 4_000.0, 100.0)])
    assert per_rank[1]["slow_rank"] is True and run["straggler_rank"] == 1, per_rank
    assert per_rank[1]["late_arrival_ms"] == pytest.approx(4.0, abs=0.11)


def test_ranges_of_one_rank_without_calls_time_the_collective_by_its_ranges_on_every_rank():
    # a rank whose calls did not pair (NaN) makes every rank of those collectives timed by their ranges: one
    # clock for all, never a call against a range
    a, b = _summary(0, 0.0, 100.0), _summary(1, 0.0, 4_000.0)
    b["collectives"]["arrival_us"] = [None] * 10
    per_rank, _ = cross_rank([a, b])
    assert per_rank[1]["late_arrival_ms"] == pytest.approx(3.9, abs=0.11)
    del b["collectives"]["arrival_us"]  # a summary written before the column, beside one with it: the same
    assert cross_rank([a, b])[0][1]["late_arrival_ms"] == per_rank[1]["late_arrival_ms"]


RECORDED = Path(__file__).resolve().parents[2] / "samples" / "recorded" / "ddp_straggler"


def test_a_real_gloo_trace_pairs_every_all_reduce_with_its_call():
    from ddpdoctor.load import load
    from ddpdoctor.metrics.comm import collectives

    run = load(RECORDED, use_summaries=False)
    for rt in run.ranks:
        c = collectives(rt)
        gloo = np.array([str(s).startswith("gloo:") for s in c["source"]])
        assert gloo.any()
        called = c["arrival_us"][gloo]
        assert np.isfinite(called).all() and (called <= c["start_us"][gloo]).all()
        # the calls are the trace's c10d ops, one each
        raw = json.loads(gzip.open(rt.files[0]).read())["traceEvents"]
        calls = sorted(e["ts"] for e in raw if e.get("ph") == "X" and str(e.get("name")).startswith("c10d::"))
        assert sorted(called.tolist()) == pytest.approx(calls)
