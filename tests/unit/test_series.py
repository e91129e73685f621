"""The always-on series file (capture/series.py): the reader ignores a torn last line and bad lines, places DDP's
timings on the step they describe; the writer's thread writes within seconds without being asked (a crash loses at
most the last seconds); summary() outside a traced job; the exporters' command line and collector."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ddpdoctor.capture import series
from ddpdoctor.capture.series import SeriesRecorder, read_rank_series, read_series
from ddpdoctor.errors import DDPDoctorError, UsageError

HEADER = {"kind": "header", "version": 1, "rank": 1, "world_size": 2, "device": "cpu"}


def _row(step: int, t: float, wall: float | None, **extra):
    return {"step": step, "t": t, "wall_s": wall, "data_s": 0.001, "mem_bytes": 1000 + step, **extra}


def _write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes("".join(lines).encode())


def test_reader_ignores_a_torn_last_line_and_counts_it(tmp_path):
    path = tmp_path / "ranks" / "rank1.series.jsonl"
    full = [json.dumps(HEADER) + "\n"] + [json.dumps(_row(i, 100.0 + i, 0.5 if i else None)) + "\n" for i in range(4)]
    torn = json.dumps(_row(4, 104.0, 0.5))[:-7]  # cut inside a number: no newline
    _write(path, [*full, torn])
    s = read_series(tmp_path)[1]
    assert s.header["rank"] == 1 and [r["step"] for r in s.rows] == [0, 1, 2, 3] and s.bad_lines == 1
    assert s.rows[3]["mem_bytes"] == 1003 and s.rows[0]["wall_s"] is None and s.rows[2]["forward_s"] is None


def test_a_last_line_that_parses_but_has_no_newline_is_not_trusted(tmp_path):
    # '{"step": 5, "wall_s": 12}' may be '{"step": 5, "wall_s": 12.5}' cut short: the number could be wrong
    path = tmp_path / "ranks" / "rank0.series.jsonl"
    _write(path, [json.dumps(_row(0, 1.0, None)) + "\n", json.dumps(_row(1, 2.0, 12))])
    s = read_rank_series(path)
    assert [r["step"] for r in s.rows] == [0] and s.bad_lines == 1 and s.rank == 0


def test_garbage_in_the_middle_is_skipped_and_the_rest_kept(tmp_path):
    path = tmp_path / "ranks" / "rank0.series.jsonl"
    lines = [json.dumps(_row(0, 1.0, None)) + "\n", "\x00\x00garbage\n", "[1, 2]\n", '{"no_step": 1}\n']
    lines += [json.dumps(_row(1, 2.0, 0.25)) + "\n", '{"kind": "future-record"}\n']
    _write(path, lines)
    s = read_rank_series(path)
    assert [r["step"] for r in s.rows] == [0, 1] and s.bad_lines == 3 and s.header == {}


def test_ddp_timings_land_on_the_step_whose_span_holds_their_forward(tmp_path):
    path = tmp_path / "ranks" / "rank0.series.jsonl"
    rows = [_row(0, 10.0, None), _row(1, 11.0, 1.0), _row(2, 12.0, 1.0)]
    # step 2's line carries step 1's timing (DDP records it during the next forward), forward began at 10.2
    rows[2]["ddp"] = [1, 0.1, 0.2, 0.3, 0.05, 10.5, 10.2]
    # a CUDA-style record without timestamps: the step it names
    rows[1]["ddp"] = [0, 0.4, 0.5, 0.6, 0.07, None, None]
    _write(path, [json.dumps(r) + "\n" for r in rows])
    by_step = {r["step"]: r for r in read_rank_series(path).rows}
    assert by_step[1]["ddp_comm_s"] == 0.3 and by_step[1]["ddp_comm_start_t"] == 10.5
    assert by_step[0]["ddp_comm_s"] == 0.6 and by_step[0]["ddp_comm_start_t"] is None
    assert by_step[2]["ddp_comm_s"] is None


def test_read_series_of_a_run_without_series_and_of_a_bad_path(tmp_path):
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "rank0.json").write_text("{}")
    assert read_series(tmp_path) == {}
    with pytest.raises(DDPDoctorError, match="not a run directory"):
        read_series(tmp_path / "missing")


def test_series_frames_index_by_step(tmp_path):
    pytest.importorskip("pandas")
    path = tmp_path / "ranks" / "rank0.series.jsonl"
    _write(path, [json.dumps(_row(i, 1.0 + i, 0.1 if i else None)) + "\n" for i in range(3)])
    df = series.series_frames(tmp_path)[0]
    assert list(df.index) == [0, 1, 2] and df.loc[2, "mem_bytes"] == 1002 and "ddp_comm_s" in df.columns


def _fake_session(out: Path) -> SimpleNamespace:
    clock = SimpleNamespace(wall_ms=[])
    phase = SimpleNamespace(last_spent={}, _handles=[object()])
    return SimpleNamespace(
        clock=clock,
        phase=phase,
        memory=SimpleNamespace(_devices={}),
        claimed=True,
        out=out,
        root=out,
        rank=3,
        identity=SimpleNamespace(rank=3, world_size=4, local_rank=1),
        pid=os.getpid(),
        started_at=time.time(),
        config=SimpleNamespace(extra={}),
        capture_errors=[],
    )


def test_writer_thread_writes_within_seconds_without_close(tmp_path):
    s = _fake_session(tmp_path)
    rec = SeriesRecorder(s)
    try:
        for i in range(5):
            if i:
                s.clock.wall_ms.append(10.0 * i)
            s.phase.last_spent = {"data": 0.001 * i, "forward": 0.002, "backward": 0.003, "optimizer": 0.0005}
            rec.step(i)
        path = series.series_file(tmp_path, 3)
        deadline = time.monotonic() + 10  # flushed each second; a loaded machine may take longer to schedule it
        rows = []
        while time.monotonic() < deadline:
            rows = read_rank_series(path).rows
            if len(rows) == 5:
                break
            time.sleep(0.1)
        assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]  # written by the thread: close() was not called
        assert rows[0]["data_s"] is None and rows[0]["forward_s"] == 0.002  # step 0 has no data phase
        assert rows[4]["wall_s"] == 0.04 and rows[4]["data_s"] == 0.004
        assert rows[4]["mem_bytes"] is None or rows[4]["mem_bytes"] > 0  # RSS where /proc is there
        header = read_rank_series(path).header
        assert header["rank"] == 3 and header["world_size"] == 4 and header["local_rank"] == 1
        assert rec.latest["step"] == 4 and rec.steps == 5 and rec.wall_total_s == pytest.approx(0.1)
    finally:
        rec.close()
    assert rec._thread is not None and not rec._thread.is_alive()


def test_close_writes_the_rest_and_a_failing_step_never_raises(tmp_path):
    s = _fake_session(tmp_path)
    rec = SeriesRecorder(s)
    rec.step(0)
    rec.close()
    assert [r["step"] for r in read_rank_series(series.series_file(tmp_path, 3)).rows] == [0]
    broken = _fake_session(tmp_path / "b")
    broken.clock = None  # anything going wrong inside: the training goes on, the rank file says why
    rec2 = SeriesRecorder(broken)
    rec2.step(1)
    rec2.step(2)
    assert len(broken.capture_errors) == 1 and "series stopped at step 1" in broken.capture_errors[0]
    rec2.close()


def test_no_phase_tracking_gives_null_phases_not_zero(tmp_path):
    s = _fake_session(tmp_path)
    s.phase._handles = []  # phase tracking could not be installed
    s.phase.last_spent = {"data": 0.5}  # the whole step would look like data wait
    s.clock.wall_ms = [500.0]
    rec = SeriesRecorder(s)
    rec.step(1)
    rec.close()
    (row,) = read_rank_series(series.series_file(tmp_path, 3)).rows
    assert row["wall_s"] == 0.5 and row["data_s"] is None and row["forward_s"] is None


def test_summary_is_empty_outside_a_traced_job():
    import ddpdoctor

    assert ddpdoctor.summary() == {}


def test_metrics_port_parsing():
    from ddpdoctor.export.prometheus import parse_address

    assert parse_address("9400") == ("127.0.0.1", 9400)
    assert parse_address("0.0.0.0:9400") == ("0.0.0.0", 9400)
    assert parse_address("[::1]:9400") == ("::1", 9400)
    for bad, why in (("abc", "give PORT or HOST:PORT"), ("70000", "1-65535"), ("0", "1-65535")):
        with pytest.raises(UsageError, match=why):
            parse_address(bad)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--metrics-port", "nope", "x.py"], "--metrics-port"),
        (["--metrics-port", "99999", "x.py"], "1-65535"),
        (["--metrics-textfile", "/no/such/dir", "x.py"], "not a directory"),
    ],
)
def test_trace_rejects_bad_metrics_options_in_one_line(argv, message):
    from ddpdoctor.cli.trace_args import _parse_own, split_argv

    with pytest.raises(UsageError, match=message) as info:
        own = split_argv(argv)[0]
        _parse_own(own)
    assert "\n" not in str(info.value)


def test_collector_exposes_the_latest_row_with_rank_node_job_labels(tmp_path):
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from ddpdoctor.export.prometheus import Exporter

    s = _fake_session(tmp_path / "myjob")
    rec = SeriesRecorder(s)
    s.series = rec
    exporter = Exporter(s)
    assert b"ddpdoctor_step" not in exporter.text()  # no step yet: no samples
    s.clock.wall_ms = [20.0]
    s.phase.last_spent = {"data": 0.01, "forward": 0.004, "backward": 0.005, "optimizer": 0.001}
    rec.step(1)
    rec.close()
    fam = {f.name: f for f in text_string_to_metric_families(exporter.text().decode())}
    (step,) = fam["ddpdoctor_step"].samples
    assert step.value == 1 and step.labels["rank"] == "3" and step.labels["job"] == "myjob" and step.labels["node"]
    assert fam["ddpdoctor_steps"].type == "counter" and fam["ddpdoctor_steps"].samples[0].name.endswith("_total")
    phases = {x.labels["phase"]: x.value for x in fam["ddpdoctor_phase_seconds"].samples}
    assert phases == {"data": 0.01, "forward": 0.004, "backward": 0.005, "optimizer": 0.001}
    assert "ddpdoctor_ddp_comm_seconds" not in fam  # no DDP module: no sample, not a zero
    assert "ddpdoctor_memory_reserved_bytes" not in fam  # CPU: not measured


def test_series_file_is_in_the_run_layout(tmp_path):
    from ddpdoctor import owned

    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "rank0.series.jsonl").write_text("")
    found = owned.own_entries(tmp_path)
    assert found.foreign is None


def test_module_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, ddpdoctor.capture.series as s, ddpdoctor.export.prometheus; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_thread_safe_appends_while_flushing(tmp_path):
    s = _fake_session(tmp_path)
    rec = SeriesRecorder(s)
    stop = threading.Event()

    def flusher():
        while not stop.is_set():
            rec.flush()

    t = threading.Thread(target=flusher)
    t.start()
    for i in range(2000):
        s.clock.wall_ms.append(1.0)
        rec.step(i)
    stop.set()
    t.join()
    rec.close()
    rows = read_rank_series(series.series_file(tmp_path, 3)).rows
    assert [r["step"] for r in rows] == list(range(2000))


def test_a_taken_metrics_port_is_a_warning_and_the_series_goes_on(tmp_path, capsys):
    pytest.importorskip("prometheus_client")
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        s = _fake_session(tmp_path)
        s.identity.local_rank = 0
        s.config.extra = {"metrics_port": ["127.0.0.1", port]}
        rec = SeriesRecorder(s)
        s.series = rec
        rec.step(0)
        rec.step(1)
        rec.close()
    assert len(s.capture_errors) == 1 and f"the metrics endpoint 127.0.0.1:{port} not started" in s.capture_errors[0]
    assert f"ddpdoctor: warning: rank 3: the metrics endpoint 127.0.0.1:{port} not started" in capsys.readouterr().err
    assert [r["step"] for r in read_rank_series(series.series_file(tmp_path, 3)).rows] == [0, 1]


def test_a_fifo_in_place_of_a_series_file_is_not_read(tmp_path):
    (tmp_path / "ranks").mkdir()
    os.mkfifo(tmp_path / "ranks" / "rank0.series.jsonl")  # opening it for reading would block
    s = read_series(tmp_path)[0]
    assert s.rows == [] and s.header == {}


def test_live_events_follow_a_growing_file_line_by_line(tmp_path):
    pytest.importorskip("tensorboard")
    from ddpdoctor.tensorboard.live import SeriesEvents

    path = tmp_path / "ranks" / "rank0.series.jsonl"
    first = json.dumps(HEADER) + "\n" + json.dumps(_row(0, 1.0, None)) + "\n" + json.dumps(_row(1, 2.0, 0.5))
    _write(path, [first[:-5]])  # the second row cut short: not read yet
    live = SeriesEvents(tmp_path, tmp_path)
    assert live.sync() == 1
    with open(path, "a") as f:
        f.write(first[-5:] + "\n" + json.dumps(_row(2, 3.0, 0.25)) + "\n")
    assert live.sync() == 2 and live.sync() == 0
    live.stop()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = list((tmp_path / "tensorboard" / "rank0").glob("events.out.tfevents.*.series"))
    acc = EventAccumulator(str(events))
    acc.Reload()
    steps = [(e.step, round(e.value, 3)) for e in acc.Scalars("series/step_ms")]
    assert steps == [(1, 500.0), (2, 250.0)]
    assert [e.step for e in acc.Scalars("series/memory_bytes")] == [0, 1, 2]
