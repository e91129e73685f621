"""Issue 28 items 2-3 without a job: the --every schedule, the windows kept, each finding across windows (a
straggler that starts, one that moves, too few windows) and the trends of the always-on series (a leak projected
to its out-of-memory step, a jump in step time; a steady job: no drift, no leak; too few steps: not evaluated)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from ddpdoctor.capture.every import EverySchedule, parse_every
from ddpdoctor.capture.series import RankSeries
from ddpdoctor.metrics import overtime
from ddpdoctor.report import over_time as report


def _actions(sched, n):
    from torch.profiler import ProfilerAction as A

    short = {A.NONE: ".", A.WARMUP: "w", A.RECORD: "r", A.RECORD_AND_SAVE: "S"}
    return "".join(short[sched(i)] for i in range(n))


def test_every_steps_opens_a_window_every_n_steps_after_wait():
    sched = EverySchedule(wait=2, warmup=1, active=3, repeat=0, every_steps=6)
    assert _actions(sched, 20) == "..wrrS..wrrS..wrrS.."
    assert _actions(EverySchedule(wait=2, warmup=1, active=3, repeat=2, every_steps=6), 20) == "..wrrS..wrrS" + "." * 8


def test_every_seconds_opens_a_window_in_each_slot_of_the_clock_and_decides_each_step_once():
    now = [0.0]
    sched = EverySchedule(wait=1, warmup=0, active=2, repeat=0, every_s=10.0, clock=lambda: now[0])
    seen = []
    for step in range(12):
        now[0] = step * 3.0  # 3 s per step: the first window at step 1 (3 s), then the first step of each 10 s slot
        seen.append(sched(step))
        assert sched(step) == seen[-1]  # asked again (the host-load recorder asks ahead): the same answer
    assert _actions(lambda i: seen[i], 12) == ".rS.rS.rS.rS"


def test_every_shorter_than_a_window_is_refused():
    with pytest.raises(ValueError, match="shorter than a window"):
        EverySchedule(wait=0, warmup=2, active=5, repeat=0, every_steps=6)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("200", ("steps", 200.0)), ("30s", ("seconds", 30.0)), ("10m", ("seconds", 600.0)), ("1.5h", ("seconds", 5400.0))],
)
def test_parse_every(text, expected):
    assert parse_every(text) == expected


@pytest.mark.parametrize("text", ["0", "-3", "10x", "m", "nan", "1e3", "0s"])
def test_parse_every_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_every(text)


def test_trace_refuses_every_shorter_than_its_window_in_one_line():
    from ddpdoctor.cli.trace_args import parse_own
    from ddpdoctor.errors import UsageError

    with pytest.raises(UsageError, match=r"--every 6: a window takes 7 steps"):
        parse_own(["--every", "6"])
    args = parse_own(["--every", "200", "--keep", "3"])
    assert (args.every_steps, args.every_s, args.keep, args.repeat) == (200, None, 3, 0)
    assert parse_own(["--every", "10m"]).every_s == 600.0
    assert parse_own([]).repeat == 1


def test_kept_windows_cut_back_to_back_ranges_drop_removed_ones_and_match_ranks_by_first_step():
    caps = {
        0: {
            "steps": {"profiled": [[3, 10], [23, 30], [43, 50], [63, 66]]},
            "schedule": {"active": 8, "dropped": [{"first_step": 3, "last_step": 10}]},
        },
        1: {"steps": {"profiled": [[24, 31], [44, 51], [64, 67]]}, "schedule": {"active": 8}},
    }
    assert overtime.kept_windows(caps) == [(23, 31), (43, 51), (63, 67)]
    merged = {0: {"steps": {"profiled": [[3, 18]]}, "schedule": {"active": 8}}}
    assert overtime.kept_windows(merged) == [(3, 10), (11, 18)]
    # time-based windows: rank 1 a step late in one window, and one window more at the end
    t = {
        0: {"steps": {"profiled": [[3, 6], [18, 21], [40, 43]]}, "schedule": {"active": 4}},
        1: {"steps": {"profiled": [[3, 6], [19, 22], [40, 43], [60, 61]]}, "schedule": {"active": 4}},
    }
    assert overtime.kept_windows(t) == [(3, 6), (18, 22), (40, 43), (60, 61)]


WINDOWS = [(3, 10), (23, 30), (43, 50), (63, 70)]


def _straggler(ranks):
    return [{"name": "rank-straggler", "id": "DDP003", "ranks": ranks}]


def test_a_straggler_that_starts_halfway_is_reported_with_its_rank_and_when():
    per_window = [[], [], _straggler([1]), _straggler([1])]
    when = {43: 1_800_000_000.0}
    out = overtime.findings_over_time(WINDOWS, per_window, world_size=2, when=when)
    (rec,) = out["findings"]
    assert (rec["pattern"], rec["culprit"], rec["held_count"], rec["since_step"]) == ("started", 1, 2, 43)
    assert rec["absent_until_step"] == 30 and rec["same_ranks"] is True
    assert rec["since_time"] == "08:00:00 UTC"
    assert "rank 1 in 2 of 4 windows since step 43" in rec["text"]
    assert "began between step 31 and step 43" in rec["text"] and "the same rank each time" in rec["text"]


def test_a_straggler_that_moves_between_ranks_is_said_to_move():
    per_window = [_straggler([0]), _straggler([1]), _straggler([0]), _straggler([1])]
    (rec,) = overtime.findings_over_time(WINDOWS, per_window, world_size=2)["findings"]
    assert rec["pattern"] == "moved" and rec["culprit"] is None
    assert "the rank changes between windows" in rec["text"] and "not at a node" in rec["text"]


def test_one_odd_window_does_not_make_a_fixed_straggler_move():
    per_window = [_straggler([0]), [], _straggler([1]), _straggler([1])]
    (rec,) = overtime.findings_over_time(WINDOWS, per_window, world_size=2)["findings"]
    assert (rec["pattern"], rec["culprit"], rec["since_step"]) == ("started", 1, 43)
    assert rec["other_ranks"] == [{"window": 1, "ranks": [0]}] and "also rank 0 in window 1" in rec["text"]


def test_a_finding_of_every_window_and_of_all_ranks():
    per_window = [[{"name": "poor-comm-compute-overlap", "id": "DDP002", "ranks": [0, 1]}]] * 4
    (rec,) = overtime.findings_over_time(WINDOWS, per_window, world_size=2)["findings"]
    assert (rec["pattern"], rec["culprit"], rec["text"]) == ("every window", None, "in 4 of 4 windows")


def test_fewer_than_three_windows_are_not_evaluated():
    out = overtime.findings_over_time(WINDOWS[:2], [[], _straggler([1])], world_size=2)
    assert out["evaluated"] is False and "2 profiled window(s) kept; 3 are needed" in out["reason"]


# ---- trends -----------------------------------------------------------------------------------------------------
CAP = 8 * 2**30


def _series(wall_ms, mem, *, ranks=2, t0=1_800_000_000.0, capacity=CAP, device="cpu"):
    out = {}
    for rank in range(ranks):
        rows, t = [], t0
        for step, (w, m) in enumerate(zip(wall_ms, mem, strict=True)):
            t += w / 1000
            rows.append({"step": step, "t": t, "wall_s": w / 1000, "mem_bytes": m, "mem_reserved_bytes": None})
        header = {"rank": rank, "node": "vm", "device": device, "mem_capacity_bytes": capacity}
        out[rank] = RankSeries(rank=rank, path=None, header=header, rows=rows)
    return out


CAPS = {r: {"steps": {"first": 1, "wall_ms": [], "profiled": [[3, 10]]}, "schedule": {"warmup": 1}} for r in (0, 1)}
rng = np.random.default_rng(0)


def test_a_steady_job_has_no_drift_and_no_leak():
    n = 200
    wall = 20 + rng.normal(0, 2, n).clip(-5, 5)
    mem = 300 * 2**20 + rng.integers(-(2**20), 2**20, n)  # RSS wobbles by a MiB
    out = overtime.trends(_series(wall, mem), CAPS)
    assert out["step_time"]["evaluated"] and out["step_time"]["drift"] is False
    assert out["memory"]["evaluated"] and out["memory"]["leak"] is False and "oom_step" not in out["memory"]
    assert "steady" in out["step_time"]["text"] and "memory steady" in out["memory"]["devices"][0]["text"]


def test_a_leak_is_projected_to_its_out_of_memory_step():
    n = 200
    leak = 2 * 2**20  # per rank per step: the host's memory grows 4 MiB per step
    mem = [300 * 2**20 + leak * i for i in range(n)]
    out = overtime.trends(_series([20.0] * n, mem), CAPS)["memory"]
    assert out["leak"] is True
    (dev,) = out["devices"]
    assert dev["bytes_per_1000_steps"] == pytest.approx(2 * leak * 1000, rel=1e-6)
    expected = (n - 1) + (CAP - 2 * mem[-1]) / (2 * leak)
    assert out["oom_step"] == pytest.approx(expected, abs=2)
    assert f"step ~{out['oom_step']:,}" in dev["text"] and "MemTotal" in dev["text"]


def test_a_jump_in_step_time_is_a_drift_with_its_step():
    n = 120
    wall = [20.0 + rng.normal(0, 1) if i < 60 else 80.0 + rng.normal(0, 1) for i in range(n)]
    out = overtime.trends(_series(wall, [2**28] * n), CAPS)["step_time"]
    assert out["drift"] is True and abs(out["jump_step"] - 60) <= 1 and "rose" in out["text"]


def test_a_gradual_drift_has_no_jump():
    n = 120
    wall = [20.0 + 0.3 * i + rng.normal(0, 0.5) for i in range(n)]
    out = overtime.trends(_series(wall, [2**28] * n), CAPS)["step_time"]
    assert out["drift"] is True and "jump_step" not in out
    assert out["ms_per_1000_steps"] == pytest.approx(300, rel=0.1)


def test_too_few_steps_and_no_series_are_not_evaluated():
    out = overtime.trends(_series([20.0] * 15, [2**28] * 15), CAPS)
    assert out["step_time"]["evaluated"] is False and "20 are needed" in out["step_time"]["reason"]
    assert out["memory"]["evaluated"] is False
    none = overtime.trends({}, CAPS)
    assert none["memory"]["evaluated"] is False and "no always-on series" in none["memory"]["reason"]


def test_the_section_joins_the_jump_to_the_finding_that_started_in_that_gap():
    n = 80
    wall = [20.0 if i < 36 else 80.0 for i in range(n)]
    section = overtime.over_time(
        WINDOWS,
        [[], [], _straggler([1]), _straggler([1])],
        _series(wall, [2**28] * n),
        CAPS,
        world_size=2,
    )
    (rec,) = section["findings"]["findings"]
    assert rec["started_step"] == 36 and "the step time jumped at step 36" in rec["text"]
    doc = {"run": {"over_time": section}}
    text = report.lines(doc)
    assert text[0] == "findings over 4 windows (steps 3-70):"
    assert any("rank-straggler: rank 1 in 2 of 4 windows" in line for line in text)
    md = report.markdown_lines(doc)
    assert md[0] == "## Over time" and any("rank-straggler: rank 1" in line for line in md)
    assert "<li>" in report.html_items(doc) and report.lines({"run": {}}) == []


def test_steps_without_an_rss_reading_take_their_ranks_last_one():
    n = 200
    leak = 2 * 2**20
    series = _series([20.0] * n, [300 * 2**20 + leak * i for i in range(n)])
    for rank, s in series.items():  # the RSS is read at most every 50 ms: each rank has it on other steps
        for r in s.rows:
            if (r["step"] + rank) % 3:
                r["mem_bytes"] = None
    out = overtime.trends(series, CAPS)["memory"]
    (dev,) = out["devices"]
    assert dev["steps"] >= n - 5 and out["leak"] is True
    assert dev["bytes_per_1000_steps"] == pytest.approx(2 * leak * 1000, rel=0.05)
