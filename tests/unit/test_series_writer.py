"""The always-on series' cheap per-step path (capture/series.py): the writer thread's bulk encoding writes each step
as ``_row`` makes it (the live numbers and the file agree), DDP's timing is read at most at its budget of the step
time, steps kept before the rank is known are written once it is (at most ``_MAX_PENDING``, the newest), and a rank
that changes moves its file."""

from __future__ import annotations

import json
import math
import os
import time
from types import SimpleNamespace

import pytest

from ddpdoctor.capture import ddp as ddp_capture
from ddpdoctor.capture import series
from ddpdoctor.capture.series import SeriesRecorder, read_rank_series

SPENT = {"data": 0.00012345678, "forward": 0.0012345, "backward": 0.00234567891, "optimizer": 0.0004999995}


def _session(out, rank=3, claimed=True):
    return SimpleNamespace(
        clock=SimpleNamespace(wall_ms=[]),
        phase=SimpleNamespace(last_spent={}, _handles=[object()]),
        memory=SimpleNamespace(_devices={}),
        claimed=claimed,
        out=out,
        root=out,
        rank=rank,
        identity=SimpleNamespace(rank=rank, world_size=4, local_rank=0),
        pid=os.getpid(),
        started_at=time.time(),
        config=SimpleNamespace(extra={}),
        capture_errors=[],
    )


@pytest.mark.parametrize(
    "raw",
    [
        (0, 1796235929.67925, None, SPENT, 123456789, None, None),  # step 0: no wall, no data phase
        (7, 1796235929.12345, 0.0021234, SPENT, None, None, [6, 0.001, 0.002, 0.0015, 0.0005, 17.5, 17.25]),
        (8, 1796235929.5, 2.00000005, {}, 10, 20, None),  # no phase tracked: nulls, not zeros
        (9, 1796235929.5, 0.5, None, None, None, None),
        (10, 1796235929.5, 0.25, {"forward": 0.1}, None, None, None),  # a phase that did not run
        (11, 1796235929.5, 0.25, None, None, None, None, 0.1234567),  # the process's CPU time in the step
    ],
)
def test_each_line_is_the_row_of_its_step(raw):
    (line,) = series._lines([raw]).decode().splitlines()
    assert json.loads(line) == series._row(raw)
    row = json.loads(line)
    assert list(row)[: len(series.ROW_FIELDS) - len(series.DDP_FIELDS)] == list(series.ROW_FIELDS[:10])
    if raw[3] is SPENT:  # seconds to the microsecond (the file stays compact), the step's end to 0.1 ms
        assert row["backward_s"] == 0.002346 and row["optimizer_s"] == 0.0005 and row["t"] == round(raw[1], 4)
    if raw[2] is not None:
        assert row["wall_s"] == round(raw[2], 7)


def test_a_nan_is_written_as_null_and_the_line_stays_json():
    spent = {"data": float("nan"), "forward": float("inf")}
    (line,) = series._lines([(3, 10.0, 0.01, spent, None, None, None)]).splitlines()
    row = json.loads(line)
    assert row["data_s"] is None and row["forward_s"] is None and row["wall_s"] == 0.01


def test_many_lines_in_one_call_are_newline_terminated():
    raws = [(i, 100.0 + i, 0.001 * i, SPENT, None, None, None) for i in range(1, 501)]
    data = series._lines(raws)
    assert data.endswith(b"\n") and data.count(b"\n") == 500
    assert [json.loads(line)["step"] for line in data.splitlines()] == list(range(1, 501))


class _FakeDDP:
    """A DDP module whose logging data costs ``cost_s`` of CPU time a read and times a new step each read."""

    def __init__(self, cost_s: float) -> None:
        self.cost_s, self.reads, self.cpu_s = cost_s, 0, 0.0

    def _get_ddp_logging_data(self) -> dict:
        t0 = time.thread_time()
        while time.thread_time() - t0 < self.cost_s:
            pass
        self.reads += 1
        self.cpu_s += time.thread_time() - t0
        start = time.time_ns()  # inside the step being recorded: its row gets the timing
        return {"backward_comm_time": 2_000_000, "forward_compute_time_start": start, "forward_compute_time": 10**6}


def test_ddp_timing_is_read_at_most_at_its_share_of_the_fastest_step(tmp_path):
    s = _session(tmp_path)
    fake = _FakeDDP(cost_s=0.002)
    ddp_capture._instances.add(fake)
    rec = SeriesRecorder(s)
    try:
        steps = 60
        for i in range(steps):
            if i:
                s.clock.wall_ms.append(1000.0)  # 1 s steps: a budget of 1 ms of reading per step
            s.phase.last_spent = dict(SPENT)
            time.sleep(0.001)  # the steps' ends (to 0.1 ms in the file) apart: each timing lands on its own step
            rec.step(i * 3)  # recorded steps count, not iterations: a rank records every one of its steps
        budget = series.DDP_READ_SHARE * 1.0 * (steps - 1)
        # each read waits as many recorded steps as its own CPU time needs: the reads' CPU time stays within the
        # budget, but for the read that starts it
        assert fake.cpu_s <= budget + fake.cpu_s / fake.reads
        assert fake.reads >= (steps - 1) // math.ceil(fake.cpu_s / fake.reads / 1e-3) // 2  # and reads do happen
    finally:
        rec.close()
        ddp_capture._instances.discard(fake)
    rows = read_rank_series(series.series_file(tmp_path, 3)).rows
    timed = [r for r in rows if r["ddp_comm_s"] is not None]
    assert len(timed) == fake.reads and all(r["ddp_comm_s"] == 0.002 for r in timed)
    assert rec.last_ddp is not None and rec.last_ddp[3] == 0.002


def test_steps_before_the_rank_is_known_are_written_once_it_is_the_newest_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(series, "_MAX_PENDING", 5)
    s = _session(tmp_path, claimed=False)
    rec = SeriesRecorder(s)
    for i in range(8):
        s.clock.wall_ms.append(10.0)
        rec.step(i)
    rec.flush()  # not a rank yet: nothing written, the steps kept
    assert not series.series_file(tmp_path, 3).exists()
    s.claimed = True
    rec.close()
    rows = read_rank_series(series.series_file(tmp_path, 3)).rows
    assert [r["step"] for r in rows] == [3, 4, 5, 6, 7] and rec.steps == 8


def test_a_rank_that_changes_moves_its_file(tmp_path):
    s = _session(tmp_path, rank=0)
    rec = SeriesRecorder(s)
    try:
        rec.step(0)
        rec.flush()
        first = series.series_file(tmp_path, 0)
        assert [r["step"] for r in read_rank_series(first).rows] == [0]
        s.rank = s.identity.rank = 2  # it joined a process group: its rank there
        s.clock.wall_ms.append(5.0)
        rec.step(1)
        rec.flush()
    finally:
        rec.close()
    moved = read_rank_series(series.series_file(tmp_path, 2))
    assert not first.exists() and [r["step"] for r in moved.rows] == [0, 1] and moved.header["rank"] == 0
