"""The dashboard's always-on series (``ddpdoctor.tensorboard.report._series``): every step of a short run, a long
run thinned to the slowest step of each bucket with its last step kept, a rank still running flagged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.tensorboard import report


def _write_series(run: Path, rank: int, walls: list[float | None], mems: list[int | None]) -> None:
    ranks = run / "ranks"
    ranks.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"kind": "header", "version": 1, "rank": rank, "world_size": 2})]
    for step, (wall, mem) in enumerate(zip(walls, mems, strict=True)):
        row = {"step": step, "t": 1000.0 + step, "wall_s": wall, "data_s": wall and wall / 2, "mem_bytes": mem}
        lines.append(json.dumps(row))
    (ranks / f"rank{rank}.series.jsonl").write_text("\n".join(lines) + "\n" + '{"step": 99')  # a torn last line


def test_a_short_series_is_every_step(tmp_path):
    _write_series(tmp_path, 0, [None, 0.010, 0.030, 0.020], [100, None, 300, None])
    _write_series(tmp_path, 1, [None, 0.011], [5, 6])
    out = report._series(tmp_path)
    assert out["ranks"] == [
        {"rank": 0, "steps": 4, "last_step": 3, "last_step_ms": 20.0, "memory_bytes": 300, "stride": 1},
        {"rank": 1, "steps": 2, "last_step": 1, "last_step_ms": 11.0, "memory_bytes": 6, "stride": 1},
    ]
    rows0 = [r for r in out["rows"] if r["rank"] == 0]
    assert [(r["step"], r["step_ms"], r["data_wait_ms"]) for r in rows0] == [
        (0, None, None),
        (1, 10.0, 5.0),
        (2, 30.0, 15.0),
        (3, 20.0, 10.0),
    ]


def test_a_long_series_keeps_each_buckets_slowest_step_and_the_last(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "SERIES_POINTS", 10)
    walls = [None] + [0.001 * (1 + (k % 7)) for k in range(1, 95)]  # 95 steps: stride 10
    walls[42] = 0.5  # one slow step
    _write_series(tmp_path, 0, walls, [k if k % 3 == 0 else None for k in range(95)])
    out = report._series(tmp_path)
    (rank,) = out["ranks"]
    assert rank["steps"] == 95 and rank["stride"] == 10 and rank["last_step"] == 94
    steps = [r["step"] for r in out["rows"]]
    assert len(steps) == 11 and steps[-1] == 94  # 94 steps in 10 buckets, then the last step itself
    assert 42 in steps and out["rows"][steps.index(42)]["step_ms"] == pytest.approx(500.0)
    for i, r in enumerate(out["rows"][:-1]):  # each point is the slowest step of its bucket
        bucket = [w for w in walls[i * 10 : i * 10 + 10] if w is not None]
        assert r["step_ms"] == pytest.approx(max(bucket) * 1e3)
        assert r["memory_bytes"] == max(k for k in range(i * 10, min(94, i * 10 + 10)) if k % 3 == 0)


def test_no_series_is_null_and_running_reads_the_ranks_states(tmp_path):
    assert report._series(tmp_path) is None
    running = {"run": {"health": {"ranks": [{"rank": 0, "state": "running"}, {"rank": 1, "state": "exited"}]}}}
    assert report._running(running) is True
    assert report._running({"run": {"health": {"ranks": [{"rank": 0, "state": "exited"}]}}}) is False
    assert report._running({"run": {}}) is False
