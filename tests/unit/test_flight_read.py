"""ddpdoctor.flight.read: which dumps a run directory's dumps/ gives, torch's own files, and never running code from
an input file (a pickle with globals is refused, not loaded)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from ddpdoctor.errors import TraceError
from ddpdoctor.flight import find_dumps, read_torch_dump

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "flight"


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_pickle_with_globals_is_refused_and_nothing_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"entries": [_Boom()], "pg_status": {}}))
    found = find_dumps(tmp_path)
    assert not (tmp_path / "PWNED").exists()
    assert found.dumps == {}
    (why,) = found.skipped
    assert "nccl_trace_rank_0" in why and "refuses to load posix.system" in why


def test_torch_pickle_of_plain_data_is_read(tmp_path):
    data = (FIXTURES / "desync_op" / "torch" / "nccl_trace_rank_1").read_bytes()
    dump = read_torch_dump(data, rank=1)
    (record,) = dump.flight_recorder
    assert record.source == "gloo" and dump.world_size == 2
    last = record.entries[-1]
    assert last.profiling_name == "gloo:broadcast" and last.input_sizes == [[4]]
    assert last.frames[-1].name == "broadcast"  # outermost first: torch's innermost frame last


def test_oversized_or_garbage_torch_files_are_skipped_with_the_reason(tmp_path):
    shutil.copy(FIXTURES / "desync_op" / "torch" / "nccl_trace_rank_0", tmp_path / "nccl_trace_rank_0")
    (tmp_path / "nccl_trace_rank_1").write_bytes(b"\x80\x04garbage")
    (tmp_path / "README.txt").write_text("not a dump")
    found = find_dumps(tmp_path)
    assert sorted(found.dumps) == [0]
    assert len(found.skipped) == 1 and "nccl_trace_rank_1" in found.skipped[0]


def test_run_dir_without_dumps_is_empty_and_missing_path_is_an_error(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    found = find_dumps(tmp_path)
    assert found.dumps == {} and found.notes
    with pytest.raises(TraceError, match="no such file"):
        find_dumps(tmp_path / "nope")


def test_newest_request_wins_and_an_answer_to_an_older_request_is_stale(tmp_path):
    run = tmp_path / "run"
    (run / "dumps").mkdir(parents=True)
    src = FIXTURES / "healthy" / "dumps"
    for r in (0, 1):
        shutil.copy(src / f"rank{r}.od0.json", run / "dumps")
    shutil.copy(src / "rank0.od2.json", run / "dumps")  # rank 1 did not answer the newer request
    found = find_dumps(run)
    assert found.dumps[0].request == "od2"
    assert 1 not in found.dumps and any("older request" in n for n in found.notes)


def test_bad_rank_dump_is_named_and_the_others_used(tmp_path):
    (tmp_path / "dumps").mkdir()
    shutil.copy(
        FIXTURES
        / "crash"
        / "dumps"
        / next(p.name for p in (FIXTURES / "crash" / "dumps").iterdir() if p.name.startswith("rank1.")),
        tmp_path / "dumps",
    )
    (tmp_path / "dumps" / "rank0.exception-1.json").write_text(json.dumps({"rank": 0, "step": -3}))
    (tmp_path / "dumps" / "rank5.exception-2.json").write_text(json.dumps({"rank": 4}))
    found = find_dumps(tmp_path)
    assert sorted(found.dumps) == [1]
    assert any("rank0.exception-1.json" in s and "step" in s for s in found.skipped)
    assert any("rank 4 inside, rank 5 in the name" in s for s in found.skipped)


def test_deeply_nested_files_are_skipped_not_raised(tmp_path):
    (tmp_path / "nccl_trace_rank_0.json").write_text('{"entries": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (tmp_path / "nccl_trace_rank_1").write_bytes(b"\x80\x04" + b"]" * 200_000 + b".")
    found = find_dumps(tmp_path)
    assert found.dumps == {} and len(found.skipped) == 2
    run = tmp_path / "run" / "dumps"
    run.mkdir(parents=True)
    (run / "rank0.x.json").write_text('{"threads": ' + "[" * 100_000 + "]" * 100_000 + "}")
    found = find_dumps(tmp_path / "run")
    assert found.dumps == {} and "rank0.x.json" in found.skipped[0]


def test_a_hang_request_every_rank_answered_wins_over_the_dumps_made_as_the_job_was_stopped(tmp_path):
    """After a hang, ddpdoctor stops the job and each rank writes a "signal" dump as it unwinds: the answers to the
    hang request, not those newer dumps, show where the ranks were stuck."""
    import msgspec

    from ddpdoctor.runfile_types import FlightDump

    dumps = tmp_path / "dumps"
    dumps.mkdir()

    def write(rank, dump_id, **fields):
        dump = FlightDump(rank=rank, world_size=2, **fields)
        (dumps / f"rank{rank}.{dump_id}.json").write_bytes(msgspec.json.encode(dump))

    for rank in (0, 1):
        write(rank, "hang-1", request="hang-1", reason="hang", time=100.0 + rank, phase="data" if rank else "backward")
        write(rank, f"signal-{200 + rank}", reason="signal", time=200.0 + rank, phase="outside")
    found = find_dumps(tmp_path)
    assert found.request == "hang-1"
    assert {r: d.reason for r, d in found.dumps.items()} == {0: "hang", 1: "hang"}
    assert any("signal" in n and "not" in n for n in found.notes)
    # a hang request only one rank answered: each rank's newest dump, as before
    (dumps / "rank1.hang-1.json").unlink()
    found = find_dumps(tmp_path)
    assert {r: d.reason for r, d in found.dumps.items()} == {0: "signal", 1: "signal"}


def test_a_stop_signal_that_reached_a_rank_unwinding_from_its_exception_does_not_hide_the_exception(tmp_path):
    """A rank raises (its peer went away), and the launcher's SIGTERM reaches it while it unwinds: the exception dump,
    not the later signal dump of the same process, is the rank's story. A signal dump of a later process (a restart)
    still wins."""
    import msgspec

    from ddpdoctor.runfile_types import FlightDump

    dumps = tmp_path / "dumps"
    dumps.mkdir()

    def write(rank, dump_id, **fields):
        dump = FlightDump(rank=rank, world_size=2, **fields)
        (dumps / f"rank{rank}.{dump_id}.json").write_bytes(msgspec.json.encode(dump))

    write(1, "exception-100", reason="exception", time=100.0, pid=7, phase="data")
    write(1, "signal-101", reason="signal", time=100.05, pid=7, phase="data")
    write(0, "signal-102", reason="signal", time=100.1, pid=8, phase="backward")
    found = find_dumps(tmp_path)
    assert found.dumps[1].reason == "exception" and found.dumps[0].reason == "signal"
    assert any("rank 1 exception" in n for n in found.notes), found.notes
    write(1, "signal-300", reason="signal", time=300.0, pid=9, phase="forward")
    assert find_dumps(tmp_path).dumps[1].reason == "signal"
